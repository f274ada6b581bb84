//! Operation keys: what makes a key acceptable, stated once for every binding.
//!
//! **Keys are compared byte for byte.** An operation key names a business record (an
//! order, a payment); two different byte strings may be two different records, so the
//! gem never normalises them: Unicode NFC and NFD forms of "é", full-width and ASCII
//! digits, `"A1 "` and `"A1"` are different operations. An application that wants them
//! to be one normalises in its key declaration (or before it enqueues). A key must be
//! valid UTF-8 (it is PostgreSQL text), hold no NUL character, and fit with its job
//! type in [`MAX_KEY_BYTES`] bytes.

/// Longest `job_type` + `operation_key`, in bytes, that the unique index accepts
/// with room to spare (a btree entry must fit in a third of a page).
pub const MAX_KEY_BYTES: usize = 2000;

/// What is wrong with the text of a key part (a string inside a key value, or the
/// finished key), or `None`: it must be valid UTF-8. The message says where the first
/// invalid byte is, never the bytes around it.
pub fn text_problem(bytes: &[u8]) -> Option<String> {
    std::str::from_utf8(bytes).err().map(|e| {
        format!(
            "the operation key is not valid UTF-8 (an invalid byte at offset {}): keys are text, \
             compared byte for byte; convert it to UTF-8 (or pass its hex/Base64) first",
            e.valid_up_to()
        )
    })
}

/// What is wrong with a finished operation key of `job_type`, or `None`: invalid
/// UTF-8 ([`text_problem`]), job type and key together longer than [`MAX_KEY_BYTES`]
/// bytes, or a NUL character (PostgreSQL text cannot store one). The message starts
/// lower-case, for the binding to prefix with the job's name.
pub fn problem(job_type: &[u8], operation_key: &[u8]) -> Option<String> {
    if let Some(problem) = text_problem(operation_key) {
        return Some(problem);
    }
    let size = job_type.len() + operation_key.len();
    if size > MAX_KEY_BYTES {
        return Some(format!(
            "job type and operation key are {size} bytes together, more than {MAX_KEY_BYTES}: \
             declare a narrower key (or hash a long one yourself)"
        ));
    }
    if operation_key.contains(&0) {
        return Some(
            "the operation key contains a NUL character, which PostgreSQL text cannot store".into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_taken_byte_for_byte_and_must_be_utf8() {
        assert_eq!(problem(b"Job", "caf\u{e9}".as_bytes()), None);
        assert_eq!(problem(b"Job", "cafe\u{301}".as_bytes()), None);
        assert_eq!(problem(b"Job", b"A1 "), None);
        let bad = problem(b"Job", b"ab\xff").unwrap();
        assert!(
            bad.contains("not valid UTF-8 (an invalid byte at offset 2)"),
            "{bad}"
        );
        assert!(problem(b"Job", b"a\0b").unwrap().contains("NUL"));
        assert!(problem(b"Job", &[b'k'; 1998])
            .unwrap()
            .contains("2001 bytes"));
        assert_eq!(problem(b"Jo", &[b'k'; 1998]), None);
    }
}
