//! Operation keys: what makes a key acceptable, stated once for every binding.
//!
//! **Keys are compared byte for byte.** An operation key names a business record (an
//! order, a payment); two different byte strings may be two different records, so the
//! gem never normalises them: Unicode NFC and NFD forms of "é", full-width and ASCII
//! digits, `"A1 "` and `"A1"` are different operations. An application that wants them
//! to be one normalises in its key declaration (or before it enqueues). A key must be
//! valid UTF-8 (it is PostgreSQL text), hold no NUL character, and fit with its job
//! type in [`MAX_KEY_BYTES`] bytes.
//!
//! **How a key value becomes the operation key's text** ([`value_text`], and
//! [`part`] + [`composite_text`] for a key declared as a list of parts), the same in
//! every language so a Ruby job and a Python task name one record:
//!
//! * a string as it is (`"A-17"` → `A-17`), except one that starts like JSON (`[`, `{`
//!   or `"`), which is written as a JSON string (`"[1]"` → `"[1]"` quoted) so it never
//!   equals the key of a list or map value;
//! * an integer in decimal (`42` and `"42"` are the same operation);
//! * a non-empty list or map as its canonical JSON ([`crate::canonical`]: map keys
//!   sorted, integral floats as integers);
//! * a composite key as the canonical JSON list of its parts, each a string, an
//!   integer's decimal text, or a list/map value (`["a:b","c"]` and `["a","b:c"]`
//!   stay different);
//! * refused: null, a boolean, a float (ambiguous: `2.0` or `2`?), an empty string,
//!   list or map, and anything JSON cannot carry.
//!
//! The binding converts the host value to a [`serde_json::Value`] (a float at the top
//! level stays a float, so it can be refused) and names the host's types in messages
//! through its [`Words`].

use serde_json::Value;

use crate::canonical;

/// How a host language names the values a key message mentions.
#[derive(Debug, Clone, Copy)]
pub struct Words {
    /// The null value (`nil`, `None`).
    pub nil: &'static str,
    /// The type of `true` (`TrueClass`, `bool`).
    pub true_type: &'static str,
    /// The type of `false` (`FalseClass`, `bool`).
    pub false_type: &'static str,
    /// The float type (`Float`, `float`).
    pub float: &'static str,
    /// The string type (`String`, `str`).
    pub string: &'static str,
    /// The list type (`Array`, `list`).
    pub list: &'static str,
    /// The map type (`Hash`, `dict`).
    pub map: &'static str,
    /// The accepted kinds, after "use " (`a String, an Integer, or a Hash/Array of JSON
    /// values`).
    pub accepted: &'static str,
    /// What to pass instead of a float, after "floats are ambiguous as keys: "
    /// (`pass an Integer or a String`).
    pub instead_of_float: &'static str,
}

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
    if let Some(problem) = size_problem(job_type, operation_key) {
        return Some(problem);
    }
    if operation_key.contains(&0) {
        return Some(
            "the operation key contains a NUL character, which PostgreSQL text cannot store".into(),
        );
    }
    None
}

/// What is wrong with the size of `job_type` and `operation_key` together, or `None`:
/// the one key size check ([`MAX_KEY_BYTES`] bytes at most), for [`problem`] and the
/// claim request's check. The message starts lower-case.
pub fn size_problem(job_type: &[u8], operation_key: &[u8]) -> Option<String> {
    let size = job_type.len() + operation_key.len();
    (size > MAX_KEY_BYTES).then(|| {
        format!(
            "job type and operation key are {size} bytes together, more than {MAX_KEY_BYTES}: \
             declare a narrower key (or hash a long one yourself)"
        )
    })
}

/// The text of an operation key refused before anything is claimed, one wording for
/// every binding: `"{job}: {problem}; the {noun} was not run and nothing was recorded"`.
/// `job` names the job (its class or type), `problem` is the core's words for what is
/// wrong ([`problem`], [`refused`], a declaration's walk), after what the host names as
/// the key when that is not the finished key itself (`"idempotency key :order_id
/// (order_id): "`; [`value_refusal`] for a key value given directly), `noun` the host's
/// word for a job (`"job"`; Celery's `"task"`).
pub fn refusal(job: &str, problem: &str, noun: &str) -> String {
    format!("{job}: {problem}; the {noun} {}", crate::error::NOT_RUN)
}

/// The [`refusal`] of a key value given directly (the plain API, the Rust door, the
/// Python package's `operation_key`): `"{job}: operation key: {problem}; the job was not
/// run and nothing was recorded"`.
pub fn value_refusal(job: &str, problem: &str) -> String {
    refusal(job, &format!("operation key: {problem}"), "job")
}

/// Why a value cannot be (part of) an operation key: `what` is the value as the host
/// names it (`a Time`, `a value of type datetime`); `float` adds why floats are
/// refused.
pub fn refused(what: &str, float: bool, words: &Words) -> String {
    let hint = if float {
        format!(
            " (floats are ambiguous as keys: {})",
            words.instead_of_float
        )
    } else {
        String::new()
    };
    format!(
        "{what} cannot be an operation key{hint}; use {}",
        words.accepted
    )
}

/// A key value checked by the rules of the module documentation: the value itself, or
/// why it cannot be a key (a message starting lower-case, for the binding to prefix
/// with the job and the declaration).
fn checked<'a>(value: &'a Value, words: &Words) -> Result<&'a Value, String> {
    match value {
        Value::Null => Err(format!("the value is {}", words.nil)),
        Value::Bool(b) => Err(refused(
            &format!(
                "a {}",
                if *b {
                    words.true_type
                } else {
                    words.false_type
                }
            ),
            false,
            words,
        )),
        Value::Number(n) if n.is_f64() => Err(refused(&format!("a {}", words.float), true, words)),
        Value::String(s) if s.is_empty() => Err(format!("the value is an empty {}", words.string)),
        Value::Array(a) if a.is_empty() => Err(format!("the value is an empty {}", words.list)),
        Value::Object(o) if o.is_empty() => Err(format!("the value is an empty {}", words.map)),
        // Deeper than the core's nesting limit, or a number no language reads alike
        // (the bindings refuse these while converting; a value built in Rust gets here).
        Value::Array(_) | Value::Object(_) | Value::Number(_) => match canonical::problem(value) {
            Some(problem) => Err(format!("the value holds {problem}")),
            None => Ok(value),
        },
        _ => Ok(value),
    }
}

/// The operation key's text for one key value (see the module documentation).
///
/// Errors: why the value cannot be a key (null, a boolean, a float, an empty value).
/// The finished key is checked separately by [`problem`].
pub fn value_text(value: &Value, words: &Words) -> Result<String, String> {
    Ok(match checked(value, words)? {
        Value::String(text) if text.starts_with(['[', '{', '"']) => canonical::to_string(value),
        Value::String(text) => text.clone(),
        other => canonical::to_string(other),
    })
}

/// One part of a composite key, ready for [`composite_text`]: a string as itself, an
/// integer as its decimal text, a list or map as itself.
///
/// Errors: as [`value_text`].
pub fn part(value: &Value, words: &Words) -> Result<Value, String> {
    Ok(match checked(value, words)? {
        Value::Number(_) => Value::String(canonical::to_string(value)),
        other => other.clone(),
    })
}

/// A composite key's text: the canonical JSON list of its parts (each from [`part`]).
pub fn composite_text(parts: Vec<Value>) -> String {
    canonical::to_string(&Value::Array(parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RUBY: Words = Words {
        nil: "nil",
        true_type: "TrueClass",
        false_type: "FalseClass",
        float: "Float",
        string: "String",
        list: "Array",
        map: "Hash",
        accepted: "a String, an Integer, or a Hash/Array of JSON values",
        instead_of_float: "pass an Integer or a String",
    };

    #[test]
    fn a_value_becomes_the_keys_text() {
        let text = |v: Value| value_text(&v, &RUBY).unwrap();
        assert_eq!(text(json!("A-17")), "A-17");
        assert_eq!(text(json!("42")), "42");
        assert_eq!(text(json!(42)), "42");
        assert_eq!(text(json!(-7)), "-7");
        assert_eq!(text(json!(u64::MAX)), "18446744073709551615");
        assert_eq!(text(json!("[1]")), r#""[1]""#);
        assert_eq!(text(json!(r#"{"id":7}"#)), r#""{\"id\":7}""#);
        assert_eq!(text(json!("\"q")), r#""\"q""#);
        assert_eq!(text(json!([1, "a"])), r#"[1,"a"]"#);
        assert_eq!(text(json!({"b": 2.0, "a": [1]})), r#"{"a":[1],"b":2}"#);
        assert_eq!(text(json!("café")), "café");
    }

    #[test]
    fn a_composite_key_is_the_json_list_of_its_parts() {
        let composite = |parts: Vec<Value>| {
            composite_text(parts.iter().map(|p| part(p, &RUBY).unwrap()).collect())
        };
        assert_eq!(composite(vec![json!(42), json!("dhl")]), r#"["42","dhl"]"#);
        assert_eq!(composite(vec![json!("a:b"), json!("c")]), r#"["a:b","c"]"#);
        assert_ne!(
            composite(vec![json!("a:b"), json!("c")]),
            composite(vec![json!("a"), json!("b:c")])
        );
        assert_eq!(
            composite(vec![json!({"z": 1, "a": 2}), json!(7)]),
            r#"[{"a":2,"z":1},"7"]"#
        );
    }

    #[test]
    fn values_that_cannot_be_keys_are_refused_in_the_hosts_words() {
        let bad = |v: Value| value_text(&v, &RUBY).unwrap_err();
        assert_eq!(bad(Value::Null), "the value is nil");
        assert_eq!(bad(json!("")), "the value is an empty String");
        assert_eq!(bad(json!([])), "the value is an empty Array");
        assert_eq!(bad(json!({})), "the value is an empty Hash");
        assert_eq!(
            bad(json!(true)),
            "a TrueClass cannot be an operation key; use a String, an Integer, or a Hash/Array \
             of JSON values"
        );
        assert_eq!(
            bad(json!(2.0)),
            "a Float cannot be an operation key (floats are ambiguous as keys: pass an Integer \
             or a String); use a String, an Integer, or a Hash/Array of JSON values"
        );
        assert_eq!(
            part(&json!(false), &RUBY).unwrap_err(),
            refused("a FalseClass", false, &RUBY)
        );
        assert_eq!(part(&Value::Null, &RUBY).unwrap_err(), "the value is nil");
    }

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

    #[test]
    fn a_refused_key_is_worded_once_for_every_binding() {
        assert_eq!(
            value_refusal("ChargeJob", "the value is nil"),
            "ChargeJob: operation key: the value is nil; the job was not run and nothing was \
             recorded"
        );
        assert_eq!(
            refusal(
                "charge",
                "idempotency key 'id' (id): the value is None",
                "task"
            ),
            "charge: idempotency key 'id' (id): the value is None; the task was not run and \
             nothing was recorded"
        );
    }
}
