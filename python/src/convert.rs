//! Python values → JSON values, the payload's canonical JSON and digest, and the
//! operation key's text, by the same rules as the Ruby gem (`lib/idempotent_job/key.rb`,
//! `canonical_json.rb`, `args_digest.rb`), so both languages name one record.
//!
//! The canonical JSON text itself is the core's (`idempotent_job_core::canonical`, one
//! writer for every language); this file converts Python values to JSON values and
//! applies the key's rules. TODO: the digest and the key's text rules move into the core
//! too (issue 21), leaving only the Python → JSON conversion here.

use idempotent_job_core::canonical;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// A JSON value for a Python one: None, bool, int (64-bit), float (finite; an integral
/// float becomes an integer, as in the Ruby gem's canonical JSON, so `2.0` and `2`
/// agree), str, list/tuple, dict with str keys (sorted). Anything else is an error text
/// naming its type.
pub fn to_json(obj: &Bound<'_, PyAny>) -> Result<Value, String> {
    if obj.is_none() {
        Ok(Value::Null)
    } else if let Ok(b) = obj.cast::<PyBool>() {
        Ok(Value::Bool(b.is_true()))
    } else if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            Ok(Value::from(i))
        } else if let Ok(u) = obj.extract::<u64>() {
            Ok(Value::from(u))
        } else {
            Err("an int beyond 64 bits".into())
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        float(f.value())
    } else if let Ok(s) = obj.cast::<PyString>() {
        Ok(Value::String(
            s.to_cow().map_err(|e| e.to_string())?.into_owned(),
        ))
    } else if let Ok(list) = obj.cast::<PyList>() {
        list.iter()
            .map(|v| to_json(&v))
            .collect::<Result<_, _>>()
            .map(Value::Array)
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        tuple
            .iter()
            .map(|v| to_json(&v))
            .collect::<Result<_, _>>()
            .map(Value::Array)
    } else if let Ok(dict) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in dict.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(format!("a dict key of type {}", type_name(&k)));
            };
            map.insert(
                key.to_cow().map_err(|e| e.to_string())?.into_owned(),
                to_json(&v)?,
            );
        }
        Ok(Value::Object(map))
    } else {
        Err(format!("a value of type {}", type_name(obj)))
    }
}

fn float(f: f64) -> Result<Value, String> {
    if !f.is_finite() {
        return Err(format!("the float {f} (JSON has no such number)"));
    }
    // Within i64's range (Ruby's `to_i` goes further, into Bignum: beyond 2^63 the two
    // may digest differently).
    if f == f.trunc() && f.abs() < 9.2e18 {
        return Ok(Value::from(f as i64));
    }
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| format!("the float {f}"))
}

/// The name of a Python value's type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The payload's JSON text (keys sorted, integral floats as integers) and its SHA-256
/// hex digest, as the Ruby gem computes them for the same value.
pub fn json_and_digest(value: &Value) -> (String, String) {
    let json = canonical::to_string(value);
    let digest = Sha256::digest(json.as_bytes());
    let hex = digest.iter().map(|b| format!("{b:02x}")).collect();
    (json, hex)
}

/// Why a value cannot be an operation key, or the key's text.
pub enum KeyText {
    Text(String),
    Bad(String),
}

/// The operation key's text for one value: a str as it is (JSON-quoted when it starts
/// like JSON: `[`, `{` or `"`), an int in decimal, a non-empty dict or list as its
/// canonical JSON. None, bool, float, an empty str/dict/list are refused.
pub fn key_text(value: &Bound<'_, PyAny>) -> KeyText {
    match key_part(value) {
        Ok(Value::String(text)) => {
            if text.starts_with(['[', '{', '"']) {
                KeyText::Text(canonical::to_string(&Value::String(text)))
            } else {
                KeyText::Text(text)
            }
        }
        Ok(other) => KeyText::Text(canonical::to_string(&other)),
        Err(problem) => KeyText::Bad(problem),
    }
}

/// A composite key's text: the JSON array of its parts (each a str, an int's decimal
/// text, or a container's canonical JSON).
pub fn composite_text(values: &[Bound<'_, PyAny>]) -> KeyText {
    let mut parts = Vec::with_capacity(values.len());
    for value in values {
        match key_part(value) {
            Ok(Value::Number(n)) => parts.push(Value::String(n.to_string())),
            Ok(part) => parts.push(part),
            Err(problem) => return KeyText::Bad(problem),
        }
    }
    KeyText::Text(canonical::to_string(&Value::Array(parts)))
}

fn key_part(value: &Bound<'_, PyAny>) -> Result<Value, String> {
    if value.is_none() {
        return Err("the value is None".into());
    }
    if value.is_instance_of::<PyBool>() || value.is_instance_of::<PyFloat>() {
        let hint = if value.is_instance_of::<PyFloat>() {
            " (floats are ambiguous as keys: pass an int or a str)"
        } else {
            ""
        };
        return Err(format!(
            "a {} cannot be an operation key{hint}; use a str, an int, or a dict/list of JSON values",
            type_name(value)
        ));
    }
    let json = to_json(value).map_err(|what| {
        format!(
            "{what} cannot be an operation key; use a str, an int, or a dict/list of JSON values"
        )
    })?;
    match &json {
        Value::String(s) if s.is_empty() => Err("the value is an empty str".into()),
        Value::Array(a) if a.is_empty() => Err("the value is an empty list".into()),
        Value::Object(o) if o.is_empty() => Err("the value is an empty dict".into()),
        _ => Ok(json),
    }
}
