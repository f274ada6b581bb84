//! `Native.key_declaration(parts)`: the core's parse of a key declaration, and
//! `Native.declared_key(parts, args, composite)`: the core's resolve of its paths over a
//! delivery's arguments ([`idempotent_job_core::declaration`]), with Ruby's names for
//! its types.

use magnus::rb_sys::{AsRawValue, FromRawValue};
use magnus::{prelude::*, Integer, RArray, RHash, RString, Ruby, Symbol, Value};

use idempotent_job_core::declaration::{
    self, DeclarationWords, Head, Node, Part, PathWords, Shape,
};

/// How declaration messages name Ruby's types.
const WORDS: DeclarationWords = DeclarationWords {
    list: "Array",
    a_list: "an Array",
    name_types: "Symbol/String",
    index_type: "Integer",
};

/// The String's text (invalid UTF-8 replaced: a name or path, for messages and lookup).
fn owned(s: RString) -> String {
    // SAFETY: the text is copied before any Ruby code runs again.
    unsafe { s.to_string_lossy() }.into_owned()
}

/// A declaration part for the core: an Integer an index (a Bignum clamped: refused if
/// negative, else missing later), a Symbol or String a name or path shown by the
/// String's `inspect`, anything else by its class.
fn part(value: Value) -> Result<Part, magnus::Error> {
    if let Some(i) = Integer::from_value(value) {
        let negative: bool = i.funcall("negative?", ())?;
        let index = i.to_i64().unwrap_or(if negative { -1 } else { i64::MAX });
        return Ok(Part::Index(index));
    }
    if Symbol::from_value(value).is_some() || RString::from_value(value).is_some() {
        let text: RString = value.funcall("to_s", ())?;
        let shown: RString = text.funcall("inspect", ())?;
        return Ok(Part::Text {
            text: owned(text),
            shown: owned(shown),
        });
    }
    let class: Value = value.funcall("class", ())?;
    let name: RString = class.funcall("to_s", ())?;
    Ok(Part::Other(owned(name)))
}

/// `Native.key_declaration(parts)` → `[paths, nil]`, each path `[label, index or nil,
/// parameter name or nil, segments]`, or `[nil, problem]` (the text after
/// "<job>: idempotency key <declaration> "). The caller maps a name to a position.
pub fn key_declaration(
    ruby: &Ruby,
    parts: RArray,
) -> Result<(Option<RArray>, Option<String>), magnus::Error> {
    let parts = parts.into_iter().map(part).collect::<Result<Vec<_>, _>>()?;
    let paths = match declaration::parse(&parts, &WORDS) {
        Ok(paths) => paths,
        Err(problem) => return Ok((None, Some(problem))),
    };
    let out = ruby.ary_new_capa(paths.len());
    for path in paths {
        let (index, name) = match path.head {
            Head::Index(i) => (Some(i), None),
            Head::Name(n) => (None, Some(n)),
        };
        out.push((path.label, index, name, path.segments))?;
    }
    Ok((Some(out), None))
}

/// How path messages name Ruby's types; a segment is quoted as `String#inspect` writes
/// a plain name (Rust's `Debug` of a str: the same for printable text).
const PATH_WORDS: PathWords = PathWords {
    map: "Hash",
    list: "Array",
    a_list: "an Array",
    nil: "nil",
    quote: |segment| format!("{segment:?}"),
};

/// A Ruby value a key path walks through: a Hash by a String key, else the Symbol of
/// that name, else the Integer of that text ([`declaration::integer_key`]); an Array
/// by index. Lookups never call a default proc.
#[derive(Clone, Copy)]
struct Rb(Value);

impl Node for Rb {
    fn shape(&self) -> Shape {
        if RHash::from_value(self.0).is_some() {
            Shape::Map
        } else if let Some(array) = RArray::from_value(self.0) {
            Shape::List(array.len())
        } else if self.0.is_nil() {
            Shape::Null
        } else {
            Shape::Other(super::convert::class_name(self.0))
        }
    }

    fn entry(&self, key: &str) -> Option<Self> {
        let hash = RHash::from_value(self.0)?;
        if let Some(value) = hash.get(key) {
            return Some(Rb(value));
        }
        let ruby = Ruby::get_with(self.0);
        if let Some(value) = hash.get(ruby.to_symbol(key)) {
            return Some(Rb(value));
        }
        if !declaration::integer_key(key) {
            return None;
        }
        let integer = match key.parse::<i64>() {
            Ok(i) => ruby.integer_from_i64(i).as_value(),
            // SAFETY: `rb_str_to_inum` reads the String's digits (checked by the core) and
            // calls no Ruby method; the GVL is held.
            Err(_) => unsafe {
                Value::from_raw(rb_sys::rb_str_to_inum(ruby.str_new(key).as_raw(), 10, 0))
            },
        };
        hash.get(integer).map(Rb)
    }

    fn element(&self, index: usize) -> Option<Self> {
        let array = RArray::from_value(self.0)?;
        let index = isize::try_from(index).ok()?;
        array.entry::<Value>(index).ok().map(Rb)
    }
}

/// `Native.declared_key(parts, args, composite)` → `[text, nil, nil]`: the operation
/// key's text of a declared key over a delivery's `args` (an Array), each part
/// `[argument index, [segment, …]]` (names already mapped to positions), by the core's
/// [`declaration::resolve_args`] and key rules (Strings by their bytes); or
/// `[nil, part, problem]`: the part (its position in the declaration) and why it yields
/// no key, in the core's words (a missing argument, a segment reaching nothing, nil, a
/// value that cannot be a key). The caller words the error with the job and the part.
pub fn declared_key(
    parts: Vec<(usize, Vec<String>)>,
    args: Value,
    composite: bool,
) -> (Option<String>, Option<usize>, Option<String>) {
    let got = declaration::resolve_args(
        &Rb(args),
        &parts,
        composite,
        &PATH_WORDS,
        &super::KEY_WORDS,
        |value| super::convert::key_json_of(value.0, &super::KEY_WORDS),
    );
    match got {
        Ok(text) => (Some(text), None, None),
        Err(e) => (None, Some(e.part), Some(e.problem)),
    }
}
