//! `Native.key_declaration(parts)`: the core's parse of a key declaration
//! ([`idempotent_job_core::declaration`]), with Ruby's names for its types.

use magnus::{prelude::*, Integer, RArray, RString, Ruby, Symbol, Value};

use idempotent_job_core::declaration::{self, DeclarationWords, Head, Part};

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
