//! Python values → JSON values, for the core's canonical JSON, payload digest and
//! operation key rules (`idempotent_job_core::{canonical, keys}`: one writer and one
//! rule set for every language, so a Ruby job and a Python task name one record). This
//! file only converts values and names Python's types in key messages.

use idempotent_job_core::{canonical, declaration, keys};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// A JSON value for a Python one: None, bool, int (any width up to the core's
/// [`canonical::MAX_INTEGER_DIGITS`] digits: its decimal text, as the Ruby gem's
/// Integer), float (finite; the canonical text writes an integral float as the integer
/// it equals, so `2.0` and `2` agree), str, list/tuple, dict with str or int keys (an
/// int key as its decimal text, as `json.dumps` writes it; another key type, or an int
/// and a str key of one text, is refused: [`canonical::map_key_refused`],
/// [`canonical::insert_entry`]). Anything else (a Decimal, a
/// set, bytes, NaN), or lists and dicts nested deeper than the core's
/// [`canonical::MAX_NESTING`] (refused before the conversion recurses further, so no
/// value can exhaust the stack), is an error text naming what it holds.
pub fn to_json(obj: &Bound<'_, PyAny>) -> Result<Value, String> {
    to_json_at(obj, 0)
}

/// A str as UTF-8 text. Errors: what it is when it holds a lone surrogate (as
/// `surrogateescape` decoding of foreign bytes leaves), which UTF-8 cannot encode, in the
/// library's words rather than Python's codec message.
fn text(s: &Bound<'_, PyString>) -> Result<String, String> {
    s.to_cow().map(|t| t.into_owned()).map_err(|_| {
        "a str that is not valid UTF-8 (a lone surrogate, as decoding foreign bytes with \
         surrogateescape leaves)"
            .to_string()
    })
}

fn to_json_at(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, String> {
    let inner = |v: &Bound<'_, PyAny>| to_json_at(v, depth + 1);
    let container = obj.is_instance_of::<PyList>()
        || obj.is_instance_of::<PyTuple>()
        || obj.is_instance_of::<PyDict>();
    if container && depth >= canonical::MAX_NESTING {
        return Err(canonical::too_deep());
    }
    if obj.is_none() {
        Ok(Value::Null)
    } else if let Ok(b) = obj.cast::<PyBool>() {
        Ok(Value::Bool(b.is_true()))
    } else if obj.is_instance_of::<PyInt>() {
        int(obj).map(Value::Number)
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        canonical::float(f.value()).map(Value::Number)
    } else if let Ok(s) = obj.cast::<PyString>() {
        Ok(Value::String(text(s)?))
    } else if let Ok(list) = obj.cast::<PyList>() {
        list.iter()
            .map(|v| inner(&v))
            .collect::<Result<_, _>>()
            .map(Value::Array)
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        tuple
            .iter()
            .map(|v| inner(&v))
            .collect::<Result<_, _>>()
            .map(Value::Array)
    } else if let Ok(dict) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in dict.iter() {
            let key = if let Ok(key) = k.cast::<PyString>() {
                text(key)?
            } else if k.is_instance_of::<PyInt>() && !k.is_instance_of::<PyBool>() {
                int(&k)?.to_string()
            } else {
                return Err(canonical::map_key_refused(&type_name(&k)));
            };
            canonical::insert_entry(&mut map, key, inner(&v)?)?;
        }
        Ok(Value::Object(map))
    } else {
        Err(format!("a value of type {}", type_name(obj)))
    }
}

/// An int as the core's number ([`canonical::integer`]: any width, by its decimal
/// text). Errors: an int longer than Python converts to text (its `int_max_str_digits`)
/// or than the core's [`canonical::MAX_INTEGER_DIGITS`].
fn int(obj: &Bound<'_, PyAny>) -> Result<Number, String> {
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(Number::from(i));
    }
    if let Ok(u) = obj.extract::<u64>() {
        return Ok(Number::from(u));
    }
    // By value: an int subclass's own __str__ (or __repr__) never writes the number.
    let exact = exact_int(obj).map_err(|e| format!("an int that cannot be read ({e})"))?;
    let text = exact.str().map_err(|e| {
        format!(
            "an int too long to write as text ({e}; the core takes at most {} digits)",
            canonical::MAX_INTEGER_DIGITS
        )
    })?;
    canonical::integer(&text.to_cow().map_err(|e| e.to_string())?)
}

/// An int (or an int subclass's value) as an exact `int`, by `int.__index__`: never
/// the subclass's own `__str__`, `__index__` or comparison methods, so its decimal
/// text and its sign are the value's.
pub fn exact_int<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    obj.py()
        .get_type::<PyInt>()
        .getattr("__index__")?
        .call1((obj,))
}

/// A count's decimal text for the core's count rules: an int's (by value,
/// [`exact_int`]; not a bool), a str as it is; `None` for anything else or an int too
/// long to write.
pub fn count_text(obj: &Bound<'_, PyAny>) -> Option<String> {
    if obj.is_instance_of::<PyBool>() {
        return None;
    }
    if obj.is_instance_of::<PyInt>() {
        return exact_int(obj).ok()?.str().ok().map(|t| t.to_string());
    }
    obj.cast::<PyString>()
        .ok()?
        .to_cow()
        .ok()
        .map(|t| t.into_owned())
}

/// A number of seconds for the core's range rules: an int's (by value, [`exact_int`])
/// or a float's value as f64 (NaN stays NaN); `None` for a bool, anything else, or an
/// int beyond the float range (the core then refuses it, showing [`shown`]).
pub fn seconds(obj: &Bound<'_, PyAny>) -> Option<f64> {
    if obj.is_instance_of::<PyBool>() {
        return None;
    }
    if obj.is_instance_of::<PyInt>() {
        return exact_int(obj).ok()?.extract::<f64>().ok();
    }
    obj.cast::<PyFloat>().ok().map(|f| f.value())
}

/// A value as messages show it: its `repr` (an int by value), cut to 100 characters;
/// for a value without one (an int longer than Python writes), its type.
pub fn shown(obj: &Bound<'_, PyAny>) -> String {
    let exact = if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        exact_int(obj).ok()
    } else {
        None
    };
    match exact.as_ref().unwrap_or(obj).repr() {
        Ok(text) => {
            let text = text.to_string();
            match text.char_indices().nth(100) {
                Some((at, _)) => format!("{}...", &text[..at]),
                None => text,
            }
        }
        Err(_) if exact.is_some() => "an int too long to write as text".to_string(),
        Err(_) => format!("a value of type {} that cannot be shown", type_name(obj)),
    }
}

/// The name of a Python value's type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// How key messages name Python's types (the rules and their wording are the core's,
/// [`keys`]).
pub const KEY_WORDS: keys::Words = keys::Words {
    nil: "None",
    true_type: "bool",
    false_type: "bool",
    float: "float",
    string: "str",
    list: "list",
    map: "dict",
    accepted: "a str, an int, or a dict/list of JSON values",
    instead_of_float: "pass an int or a str",
};

/// A key value as JSON for the core's key rules: a float at the top level stays a
/// float (so the core refuses it: `2.0` would otherwise read as the key `2`); below
/// it, as [`to_json`]. Errors: the core's message for a value JSON cannot carry.
fn key_value(value: &Bound<'_, PyAny>) -> Result<Value, String> {
    if let Ok(f) = value.cast::<PyFloat>() {
        return canonical::float(f.value())
            .map(Value::Number)
            .map_err(|what| keys::refused(&what, false, &KEY_WORDS));
    }
    to_json(value).map_err(|what| keys::refused(&what, false, &KEY_WORDS))
}

/// The operation key's text for one value, by the core's rules
/// ([`keys::value_text`]): a str as it is (JSON-quoted when it starts like JSON), an
/// int in decimal, a non-empty dict or list as its canonical JSON. Errors: why the
/// value cannot be a key.
pub fn key_text(value: &Bound<'_, PyAny>) -> Result<String, String> {
    keys::value_text(&key_value(value)?, &KEY_WORDS)
}

/// A composite key's text by the core's rules ([`keys::part`],
/// [`keys::composite_text`]): the JSON list of its parts.
pub fn composite_text(values: &[Bound<'_, PyAny>]) -> Result<String, String> {
    let parts = values
        .iter()
        .map(|v| keys::part(&key_value(v)?, &KEY_WORDS))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(keys::composite_text(parts))
}

/// How declaration messages name Python's types (the rules and their wording are the
/// core's, [`declaration`]).
const DECLARATION_WORDS: declaration::DeclarationWords = declaration::DeclarationWords {
    list: "list",
    a_list: "a list",
    name_types: "str",
    index_type: "int",
};

/// A declaration part for the core: a bool is of another type (not an index), an int
/// an index (one beyond 64 bits clamped: refused if negative, else missing later), a
/// str a name or path shown by its `repr`.
fn declaration_part(part: &Bound<'_, PyAny>) -> PyResult<declaration::Part> {
    if part.is_instance_of::<PyBool>() {
        return Ok(declaration::Part::Other("bool".into()));
    }
    if part.is_instance_of::<PyInt>() {
        let i = exact_int(part)?;
        let negative = i.lt(0)?;
        let index = i
            .extract::<i64>()
            .unwrap_or(if negative { -1 } else { i64::MAX });
        return Ok(declaration::Part::Index(index));
    }
    if let Ok(s) = part.cast::<PyString>() {
        return Ok(declaration::Part::Text {
            text: s.to_string(),
            shown: part.repr()?.to_string(),
        });
    }
    Ok(declaration::Part::Other(
        part.get_type().name()?.to_string(),
    ))
}

/// A parsed declaration part for Python: `(label, index or None, name or None,
/// segments)`.
type PathTuple = (String, Option<usize>, Option<String>, Vec<String>);

/// `key_declaration(parts)` → `(paths, None)` with each path `(label, index or None,
/// parameter name or None, segments)`, or `(None, problem)`: the core's parse of a key
/// declaration's parts ([`declaration::parse`]); the caller maps a name to a position.
#[pyfunction]
pub fn key_declaration(
    parts: Vec<Bound<'_, PyAny>>,
) -> PyResult<(Option<Vec<PathTuple>>, Option<String>)> {
    let parts = parts
        .iter()
        .map(declaration_part)
        .collect::<PyResult<Vec<_>>>()?;
    Ok(match declaration::parse(&parts, &DECLARATION_WORDS) {
        Ok(paths) => (
            Some(
                paths
                    .into_iter()
                    .map(|p| match p.head {
                        declaration::Head::Index(i) => (p.label, Some(i), None, p.segments),
                        declaration::Head::Name(n) => (p.label, None, Some(n), p.segments),
                    })
                    .collect(),
            ),
            None,
        ),
        Err(problem) => (None, Some(problem)),
    })
}

/// How path messages name Python's types; a segment is quoted as `repr` writes a str.
const PATH_WORDS: declaration::PathWords = declaration::PathWords {
    map: "dict",
    list: "list",
    a_list: "a list",
    nil: "None",
    quote: repr,
};

/// A str as Python's `repr` writes it: in single quotes (double when it holds a single
/// quote and no double one), backslash, the quote and control characters escaped.
fn repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// A Python value a key path walks through: a dict by str key, else the int of that
/// text ([`declaration::integer_key`]); a list or tuple by index.
#[derive(Clone)]
struct PyNode<'py>(Bound<'py, PyAny>);

impl declaration::Node for PyNode<'_> {
    fn shape(&self) -> declaration::Shape {
        use declaration::Shape;
        let value = &self.0;
        if value.is_instance_of::<PyDict>() {
            Shape::Map
        } else if let Ok(list) = value.cast::<PyList>() {
            Shape::List(list.len())
        } else if let Ok(tuple) = value.cast::<PyTuple>() {
            Shape::List(tuple.len())
        } else if value.is_none() {
            Shape::Null
        } else {
            Shape::Other(type_name(value))
        }
    }

    fn entry(&self, key: &str) -> Option<Self> {
        let dict = self.0.cast::<PyDict>().ok()?;
        if let Some(value) = dict.get_item(key).ok().flatten() {
            return Some(PyNode(value));
        }
        if !declaration::integer_key(key) {
            return None;
        }
        // An int key of that text (`{1: …}`, written `{"1":…}`): found by a walk, not
        // `dict[int(key)]`, which would also take a bool or float key equal to it
        // (`True`, `1.0`), keys the canonical text refuses.
        dict.iter()
            .find(|(k, _)| {
                k.is_instance_of::<PyInt>()
                    && !k.is_instance_of::<PyBool>()
                    && int(k).is_ok_and(|n| n.to_string() == key)
            })
            .map(|(_, value)| PyNode(value))
    }

    fn element(&self, index: usize) -> Option<Self> {
        if let Ok(list) = self.0.cast::<PyList>() {
            return list.get_item(index).ok().map(PyNode);
        }
        let tuple = self.0.cast::<PyTuple>().ok()?;
        tuple.get_item(index).ok().map(PyNode)
    }
}

/// `declared_key(job, starts, composite)` → `(text, None, None)`: the operation key of a
/// declared key by the core's resolve ([`declaration::resolve`]: the walk of each
/// part's path, None refused, a single or `composite` key's text by [`keys`]) and the
/// finished key's check; each of `starts` is a part's `(first value, segments,
/// missing)`, `missing` the door's words for why the part has no first value (else
/// None). Returns `(None, part, problem)` when a part reaches no value (the problem in
/// the core's words, for the door to word with the part); raises `OperationKeyError`
/// naming `job` for a value that cannot be a key or a finished key the core refuses.
#[pyfunction]
pub fn declared_key<'py>(
    py: Python<'py>,
    job: &str,
    starts: Vec<(Bound<'py, PyAny>, Vec<String>, Option<String>)>,
    composite: bool,
) -> PyResult<(Option<String>, Option<usize>, Option<String>)> {
    let got = declaration::resolve(
        starts
            .iter()
            .map(|(value, segments, missing)| {
                let start = match missing {
                    Some(why) => Err(why.clone()),
                    None => Ok(PyNode(value.clone())),
                };
                (start, segments.as_slice())
            })
            .collect(),
        composite,
        &PATH_WORDS,
        &KEY_WORDS,
        |value| key_value(&value.0),
    );
    match got {
        Ok(text) => Ok((
            Some(crate::errors::checked_key(py, job, Ok(text))?),
            None,
            None,
        )),
        Err(e) if e.reached => {
            crate::errors::checked_key(py, job, Err(e.problem)).map(|_| (None, None, None))
        }
        Err(e) => Ok((None, Some(e.part), Some(e.problem))),
    }
}
