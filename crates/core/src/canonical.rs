//! The canonical JSON of operation keys and payload digests: one text for one value,
//! whatever the language or JSON library that produced the value, so every binding
//! derives the same operation key and the same digest. The form (see
//! `docs/canonical-json.md`) is the one the Ruby gem has always written, byte for byte,
//! so existing records keep their keys and digests:
//!
//! * objects: keys sorted by their UTF-8 bytes, no spaces (`{"a":1,"b":2}`);
//! * arrays in order, no spaces;
//! * strings: UTF-8 as is (no `\u` escapes for non-ASCII, `/` not escaped); `"` and `\`
//!   escaped; control characters below U+0020 as `\b \f \n \r \t` or `\u00XX` (lower-case
//!   hex);
//! * numbers: integers of any width (up to [`MAX_INTEGER_DIGITS`] digits: `2**64` is
//!   `18446744073709551616`, in every language) as their decimal digits; a float with no
//!   fractional part as the integer it exactly equals (`1.0` is `1`, `-0.0` is `0`, `1e20`
//!   is `100000000000000000000`: JSON producers in other languages do not tell them
//!   apart; but `1e23` is `99999999999999991611392`, the float's exact value, not
//!   `10**23`); any other float as Ruby's `Float#to_s` writes it (on every Ruby: the
//!   core writes it, not the host's JSON): the shortest digits that round-trip, in fixed
//!   notation when the decimal exponent is from -4 to 16 (`0.0001`, `123456.789`), else
//!   `d.ddde±XX` with at least two exponent digits (`1.5e-07`, `1.0e-05`). NaN and the
//!   infinities are no JSON numbers: the bindings refuse them ([`float`], [`problem`]);
//! * `true`, `false`, `null`.
//!
//! The payload digest stored with each claim ([`digest`]) is the hex SHA-256 of that
//! text, so a Ruby job and a Python task with equal arguments store equal digests.

use serde_json::{Number, Value};
use sha2::{Digest, Sha256};

/// The most levels of nested arrays and objects a value crossing the core may hold (an
/// operation key, a payload, facts, a stored result): `[1]` is one level, `[[1]]` two.
/// The deepest serde_json reads (its recursion limit of 128 counts the value itself),
/// so whatever the core accepts it can also read back.
/// Each binding checks it while converting a host value, without recursion deeper than
/// this, so no value can exhaust a worker's stack; a key or payload over it is refused
/// before anything is claimed, a result over it is recorded as not storable.
pub const MAX_NESTING: usize = 127;

/// What a value over [`MAX_NESTING`] is called in messages ("… holds {this}").
pub fn too_deep() -> String {
    format!("a value nested deeper than {MAX_NESTING} levels of arrays and objects")
}

/// The refusal of a delivery whose `what` (`"payload"` or `"facts"`) holds `problem`
/// (what JSON cannot carry, e.g. [`too_deep`]'s words): an [`crate::error::Error::Config`]
/// naming the job type, raised before anything is claimed.
pub fn unwritable(job_type: &str, what: &str, problem: &str) -> crate::error::Error {
    crate::error::Error::Config(format!(
        "{job_type}: the {what} cannot be written as JSON (it holds {problem}); the job {}",
        crate::error::NOT_RUN
    ))
}

/// What a mapping key JSON cannot carry is called in messages ("… holds {this}"), for
/// every binding alike: a JSON object's keys are text, so a Hash/dict key must be a
/// string (a Ruby Symbol is its name) or an integer (its decimal text, as
/// `JSON.generate` and `json.dumps` write it). A float, `nil`/`None`, a boolean, an
/// Array/tuple or any object as a key is refused rather than written as some text
/// (`JSON.generate` writes `{nil => 1}` as `{"":1}`, `json.dumps` as `{"null": 1}`:
/// the languages would name two operations). `type_name` is the host's name of the
/// key's class or type.
pub fn map_key_refused(type_name: &str) -> String {
    format!(
        "a map key of type {type_name} (a Hash or dict key must be a string, a Symbol or an \
         integer)"
    )
}

/// Adds one converted entry of a host mapping to `map`. Errors: a key whose text is
/// already there — two keys of one Hash/dict that write the same text (Ruby `{1 => …,
/// "1" => …}` or `{:a => …, "a" => …}`, Python `{1: …, "1": …}`): keeping either value
/// would depend on the mapping's insertion order, so two equal Hashes could name two
/// operations, and the other value would be dropped unseen.
pub fn insert_entry(
    map: &mut serde_json::Map<String, Value>,
    key: String,
    value: Value,
) -> Result<(), String> {
    match map.entry(key) {
        serde_json::map::Entry::Vacant(slot) => {
            slot.insert(value);
            Ok(())
        }
        serde_json::map::Entry::Occupied(slot) => Err(format!(
            "a map with two keys written as {:?} (a string key and an integer or Symbol key \
             of the same text)",
            slot.key()
        )),
    }
}

/// The most decimal digits of an integer crossing the core (its sign not counted):
/// Python's default limit on converting an int to and from text
/// (`sys.get_int_max_str_digits()`), so an integer one language accepts every other
/// language can read and write. A longer one is refused like any value JSON cannot
/// carry ([`integer`]).
pub const MAX_INTEGER_DIGITS: usize = 4300;

/// A JSON number for a host integer given as its decimal text (an optional `-` and
/// digits, as Ruby's `Integer#to_s` and Python's `str(int)` write it): the same number
/// whatever its width, so `2**64` from Ruby and from Python is one value.
///
/// Errors: what the value is ("an integer of 5000 digits …") when it has more than
/// [`MAX_INTEGER_DIGITS`] digits or is not such a text.
pub fn integer(text: &str) -> Result<Number, String> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the integer text {text:?}"));
    }
    if digits.len() > MAX_INTEGER_DIGITS {
        return Err(format!(
            "an integer of {} digits (at most {MAX_INTEGER_DIGITS})",
            digits.len()
        ));
    }
    if let Ok(i) = text.parse::<i64>() {
        return Ok(Number::from(i));
    }
    if let Ok(u) = text.parse::<u64>() {
        return Ok(Number::from(u));
    }
    let trimmed = digits.trim_start_matches('0');
    Ok(Number::from_string_unchecked(if text.starts_with('-') {
        format!("-{trimmed}")
    } else {
        trimmed.to_owned()
    }))
}

/// A JSON number for a host float: finite ones only (the canonical text writes an
/// integral one as its integer).
///
/// Errors: what the value is ("the float NaN …") for NaN and the infinities, which JSON
/// has no number for.
pub fn float(f: f64) -> Result<Number, String> {
    Number::from_f64(f).ok_or_else(|| format!("the float {f} (JSON has no such number)"))
}

/// Why `value` cannot cross the core, or None: nested deeper than [`MAX_NESTING`]
/// ([`too_deep`]), or a number no language reads alike (an integer over
/// [`MAX_INTEGER_DIGITS`] digits, a number text whose float is not finite, such as
/// `1e400`). Walks the value without recursion, so any depth is judged in bounded
/// stack: a door checks a value built in Rust with it before writing it.
pub fn problem(value: &Value) -> Option<String> {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            Value::Number(n) => {
                if let Some(problem) = number_problem(n) {
                    return Some(problem);
                }
                continue;
            }
            _ => continue,
        };
        if depth + 1 > MAX_NESTING {
            return Some(too_deep());
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    None
}

/// Why a number (as parsed or built) cannot cross the core, or None.
fn number_problem(n: &Number) -> Option<String> {
    let text = n.as_str();
    if integer_literal(text) {
        return integer(text).err();
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => None,
        _ => Some(format!(
            "the number {text} (beyond a float's range: no language reads it alike)"
        )),
    }
}

/// Whether a number's text is an integer literal (`-` and digits, no fraction or
/// exponent).
fn integer_literal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// How many levels of nested arrays and objects JSON `text` holds (`[1]` is one), read
/// without recursion and without parsing (strings are skipped, escapes included); a
/// malformed text is judged by its brackets alone (parsing it reports what is wrong).
pub fn text_nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Parses JSON `text` that holds values the core accepted ([`MAX_NESTING`] levels at most)
/// wrapped in `wrapping` more levels (the repeats report's `repeat_facts` array holds each
/// delivery's facts inside an element object: two levels), which serde_json's own limit
/// (128 levels in all) would refuse. The depth is checked first without recursion, so a
/// hand-edited text deeper still is refused, never parsed recursively.
///
/// Errors: the parser's message, or [`too_deep`]'s words (with the levels found) for a
/// text nested deeper than `MAX_NESTING + wrapping`.
pub fn parse_nested(text: &str, wrapping: usize) -> Result<Value, String> {
    let levels = text_nesting(text);
    if levels > MAX_NESTING + wrapping {
        return Err(format!(
            "it holds {} ({levels} levels, {wrapping} of them the record's own)",
            too_deep()
        ));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let value = serde::Deserialize::deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// Whether `value` holds more than [`MAX_NESTING`] levels of nested arrays and objects.
/// Walks the value without recursion (a value built in Rust can be arbitrarily deep).
pub fn nested_too_deep(value: &Value) -> bool {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth + 1 > MAX_NESTING {
            return true;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    false
}

/// The canonical JSON text of `value` (see the module documentation).
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write(&mut out, value);
    out
}

/// The payload digest of `value`: the lower-case hex SHA-256 (64 characters) of its
/// canonical JSON text ([`to_string`]), as stored in the record's `args_digest` to
/// notice a later delivery of the same operation with different arguments.
pub fn digest(value: &Value) -> String {
    digest_text(&to_string(value))
}

/// The canonical JSON text of `value` and its digest, from one canonicalisation (as
/// [`to_string`] and [`digest`] give them): what a claim stores as `args_json` and
/// `args_digest`.
pub fn text_and_digest(value: &Value) -> (String, String) {
    let text = to_string(value);
    let digest = digest_text(&text);
    (text, digest)
}

/// The lower-case hex SHA-256 (64 characters) of `text`, which the caller knows to be
/// canonical JSON already (e.g. arguments that are only strings, integers, booleans
/// and nulls, written by a JSON library that escapes as [`to_string`] does).
pub fn digest_text(text: &str) -> String {
    digest_bytes(text.as_bytes())
}

/// The lower-case hex SHA-256 (64 characters) of `bytes` (a host string's bytes that
/// the caller knows to be canonical JSON text; see [`digest_text`]).
pub fn digest_bytes(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let hash = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in hash {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

fn write(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => number(out, n),
        Value::String(s) => string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(out, key);
                out.push(':');
                write(out, item);
            }
            out.push('}');
        }
    }
}

/// A JSON string: serde_json's escaping is the canonical one (quote, backslash and
/// control characters only; lower-case hex).
fn string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).expect("a str always serializes"));
}

/// A number: an integer literal as its digits (any width; `-0` as `0`, leading zeros
/// dropped), a finite float as [`float_text`]. A number text whose float is not finite
/// (`1e400`, only from parsing JSON text; [`problem`] refuses it) is written as parsed.
fn number(out: &mut String, n: &Number) {
    let text = n.as_str();
    if integer_literal(text) {
        let (sign, digits) = match text.strip_prefix('-') {
            Some(digits) => ("-", digits),
            None => ("", text),
        };
        let digits = digits.trim_start_matches('0');
        if digits.is_empty() {
            out.push('0');
        } else {
            out.push_str(sign);
            out.push_str(digits);
        }
        return;
    }
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() => out.push_str(&float_text(f)),
        _ => out.push_str(text),
    }
}

/// A finite float: integral ones as their exact integer digits, others as Ruby's
/// `Float#to_s` writes them.
fn float_text(f: f64) -> String {
    if f == 0.0 {
        return "0".into(); // -0.0 too
    }
    if f.fract() == 0.0 {
        return format!("{f:.0}");
    }
    // Shortest round-trip digits and the decimal exponent, from Rust's `{:e}`
    // ("-1.5e-7" → digits "15", exponent -7).
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i32 = exponent.parse().expect("{:e}'s exponent is an integer");
    let decpt = exponent + 1; // the value is 0.<digits> × 10^decpt
    let sign = if f < 0.0 { "-" } else { "" };
    let len = digits.len() as i32;
    let body = if decpt > 0 && decpt <= 16 {
        if len > decpt {
            format!(
                "{}.{}",
                &digits[..decpt as usize],
                &digits[decpt as usize..]
            )
        } else {
            format!("{digits}{}.0", "0".repeat((decpt - len) as usize))
        }
    } else if decpt <= 0 && decpt > -4 {
        format!("0.{}{digits}", "0".repeat((-decpt) as usize))
    } else {
        let rest = if len > 1 { &digits[1..] } else { "0" };
        format!("{}.{rest}e{:+03}", &digits[..1], decpt - 1)
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> Value {
        let mut value = json!(1);
        for _ in 0..levels {
            value = Value::Array(vec![value]);
        }
        value
    }

    #[test]
    fn nesting_is_allowed_up_to_the_limit_and_refused_past_it() {
        assert!(!nested_too_deep(&json!(1)));
        assert!(!nested_too_deep(&nested(MAX_NESTING)));
        assert!(nested_too_deep(&nested(MAX_NESTING + 1)));
        assert!(nested_too_deep(&json!({"a": [nested(MAX_NESTING)]})));
        // serde_json reads back exactly what the rule lets through.
        let text = to_string(&nested(MAX_NESTING));
        assert!(serde_json::from_str::<Value>(&text).is_ok());
        let deeper = format!("[{text}]");
        assert!(serde_json::from_str::<Value>(&deeper).is_err());
        // A value far deeper than any stack allows is judged without recursion.
        let deep = nested(200_000);
        assert!(nested_too_deep(&deep));
        std::mem::forget(deep); // serde_json's Drop recurses
    }

    #[test]
    fn the_canonical_form_is_the_gems_historical_one() {
        // Each expected text is what the Ruby gem's JSON.generate of its normalised
        // value writes (json 2.6, Ruby 3.1).
        let table = [
            (json!({"b": 1, "a": [1, "x"]}), r#"{"a":[1,"x"],"b":1}"#),
            (json!(1.0), "1"),
            (json!(-0.0), "0"),
            (json!(1e20), "100000000000000000000"),
            (json!(-0.5), "-0.5"),
            (json!(1.5e-7), "1.5e-07"),
            (json!(0.0001), "0.0001"),
            (json!(0.00001), "1.0e-05"),
            (json!(123456.789), "123456.789"),
            (json!(1e15 + 0.5), "1000000000000000.5"),
            (json!(12345678901234.5), "12345678901234.5"),
            (json!(u64::MAX), "18446744073709551615"),
            (
                json!("\u{1}\u{1f}\u{7f}/\u{2028}é\u{8}\u{c}\n\r\t\"\\"),
                "\"\\u0001\\u001f\u{7f}/\u{2028}é\\b\\f\\n\\r\\t\\\"\\\\\"",
            ),
            (json!({"é": 1, "z": 2, "Z": 3}), r#"{"Z":3,"z":2,"é":1}"#),
            (json!([null, true, false]), "[null,true,false]"),
        ];
        for (value, expected) in table {
            assert_eq!(to_string(&value), expected, "{value:?}");
        }
    }

    #[test]
    fn numbers_of_any_width_are_their_digits() {
        let wide: Value = serde_json::from_str("[18446744073709551616, -340282366920938463463374607431768211456, 1e23, 1e20, -0, 2.50]").unwrap();
        assert_eq!(
            to_string(&wide),
            "[18446744073709551616,-340282366920938463463374607431768211456,99999999999999991611392,100000000000000000000,0,2.5]"
        );
        assert_eq!(problem(&wide), None);
        // A host's wide integer (its decimal text) is the parsed one.
        let from_host = Value::Array(vec![Value::Number(
            integer("18446744073709551616").unwrap(),
        )]);
        assert_eq!(to_string(&from_host), "[18446744073709551616]");
        assert_eq!(integer("-5").unwrap(), Number::from(-5));
        assert_eq!(
            integer("18446744073709551615").unwrap(),
            Number::from(u64::MAX)
        );
        let long = "9".repeat(MAX_INTEGER_DIGITS + 1);
        assert!(integer(&long).unwrap_err().contains("4301 digits"));
        assert!(integer(&"9".repeat(MAX_INTEGER_DIGITS)).is_ok());
        let too_long: Value = serde_json::from_str(&format!("[{long}]")).unwrap();
        assert!(problem(&too_long).unwrap().contains("4301 digits"));
        let beyond: Value = serde_json::from_str("[1e400]").unwrap();
        assert!(problem(&beyond).unwrap().contains("1e+400"));
        assert!(float(f64::NAN).unwrap_err().contains("NaN"));
        assert!(float(f64::INFINITY).unwrap_err().contains("inf"));
        assert_eq!(to_string(&Value::Number(float(-0.0).unwrap())), "0");
        assert_eq!(problem(&nested(MAX_NESTING + 1)), Some(too_deep()));
    }

    #[test]
    fn the_digest_is_the_sha256_of_the_canonical_text() {
        // SHA-256 of "[]" and of the canonical text of a payload, as `sha256sum` and
        // Ruby's Digest::SHA256.hexdigest write them.
        assert_eq!(
            digest(&json!([])),
            "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"
        );
        let payload = json!([42, 2.0, {"b": 1, "a": "x"}]);
        assert_eq!(to_string(&payload), r#"[42,2,{"a":"x","b":1}]"#);
        assert_eq!(
            digest(&payload),
            "0109651b06da6f4daaa49b885ed0b90f205d183ef3ee36cc81a136ae8c6efac7"
        );
        assert_eq!(
            digest(&payload),
            digest(&json!([42, 2, {"a": "x", "b": 1}])),
            "hash order and 2.0 against 2 do not change the digest"
        );
        assert_ne!(
            digest(&payload),
            digest(&json!([42, 2.5, {"a": "x", "b": 1}]))
        );
        assert_eq!(digest(&payload).len(), 64);
        assert_eq!(
            text_and_digest(&payload),
            (to_string(&payload), digest(&payload))
        );
    }
}
