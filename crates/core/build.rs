// Rebuild when a migration changes: refinery embeds migrations/ at compile time.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
    println!("cargo:rerun-if-changed=build.rs");
}
