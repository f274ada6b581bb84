use magnus::Ruby;
pub fn init(_r: &Ruby) -> Result<(), magnus::Error> {
    Ok(())
}
