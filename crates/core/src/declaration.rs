//! Key declarations: how a job says where its operation key is, stated once for every
//! binding and door. A declaration is a part or a list of parts (a composite key); a
//! part is an argument index (`0`), a parameter name (`"order_id"`), or a dotted path
//! into a map or list argument (`"payload.order.id"`, `"0.id"`) whose first segment is a
//! parameter name or an index. [`parse`] checks the shape and splits each part into a
//! [`Path`]; the binding maps a [`Head::Name`] to a position by its host's parameters
//! (the only thing it knows that the core does not). [`resolve`] (and [`resolve_args`]
//! for a host whose arguments are one positional list) then walks each part's segments
//! over the delivery's values, in place through the host's own values ([`Node`]: only
//! the value a part reaches is converted, so an argument the key does not read never
//! matters) and makes the operation key's text by [`crate::keys`]. The texts are the
//! problems after "`<job>`: idempotency key `<declaration>` ", naming the host's types
//! through [`DeclarationWords`] and [`PathWords`].

/// How a host language names the types a declaration message mentions.
#[derive(Debug, Clone, Copy)]
pub struct DeclarationWords {
    /// The list type (`Array`, `list`).
    pub list: &'static str,
    /// The list type with its article (`an Array`, `a list`).
    pub a_list: &'static str,
    /// The types a parameter name may be (`Symbol/String`, `str`).
    pub name_types: &'static str,
    /// The type of an argument index (`Integer`, `int`).
    pub index_type: &'static str,
}

/// One part of a declaration as the host hands it over.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// An integer (an argument index; negative ones are refused).
    Index(i64),
    /// A name or dotted path, with `shown` its text as the host writes it in messages
    /// (Ruby's `inspect`, Python's `repr`).
    Text {
        /// The text itself.
        text: String,
        /// The text as the host writes it.
        shown: String,
    },
    /// Anything else, by its host type name.
    Other(String),
}

/// Where a path starts: an argument position, or a parameter the binding maps.
#[derive(Debug, Clone, PartialEq)]
pub enum Head {
    /// The argument at this position.
    Index(usize),
    /// The parameter of this name (the binding maps it to an argument).
    Name(String),
}

/// One part of a parsed declaration.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    /// How messages name the part: `argument 0`, or the text as declared.
    pub label: String,
    /// The argument it starts at.
    pub head: Head,
    /// The map keys or list indexes walked from there, in order.
    pub segments: Vec<String>,
}

/// Whether a path segment is a list index (decimal digits only): a segment that walks
/// into a list must be one.
pub fn list_index(segment: &str) -> Option<usize> {
    if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
        segment.parse().ok().or(Some(usize::MAX))
    } else {
        None
    }
}

/// Whether a path segment is the text an integer map key is written as (canonical
/// JSON writes Ruby `{1 => …}` and Python `{1: …}` as `{"1":…}`), so that it reaches an
/// integer key of that value when the map has no string (or Symbol) key of that text
/// ([`Node::entry`]): decimal digits with no leading zero, after an optional `-`
/// (`"0"`, `"17"`, `"-3"`; not `"01"`, `"+1"`, `"-0"`, `"1.0"`, `"1e3"`), at most
/// [`crate::canonical::MAX_INTEGER_DIGITS`] digits. The binding makes its host's
/// integer from the text.
pub fn integer_key(segment: &str) -> bool {
    let digits = segment.strip_prefix('-').unwrap_or(segment);
    let written = if digits == "0" {
        digits.len() == segment.len() // "0", never "-0"
    } else {
        !digits.starts_with('0')
    };
    written
        && !digits.is_empty()
        && digits.len() <= crate::canonical::MAX_INTEGER_DIGITS
        && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Parses a declaration's parts (one part for a single key, each part of a composite
/// key's list).
///
/// Errors: the problem, after "`<job>`: idempotency key `<declaration>` ": an empty list,
/// a negative index, a part of another type, or an empty name or path segment.
pub fn parse(parts: &[Part], words: &DeclarationWords) -> Result<Vec<Path>, String> {
    if parts.is_empty() {
        return Err(format!("is an empty {}", words.list));
    }
    parts.iter().map(|part| parse_part(part, words)).collect()
}

fn parse_part(part: &Part, words: &DeclarationWords) -> Result<Path, String> {
    match part {
        Part::Index(i) if *i < 0 => Err(format!("uses a negative argument index {i}")),
        Part::Index(i) => Ok(Path {
            label: format!("argument {i}"),
            head: Head::Index(usize::try_from(*i).unwrap_or(usize::MAX)),
            segments: Vec::new(),
        }),
        Part::Text { text, shown } => {
            let mut segments: Vec<String> = text.split('.').map(str::to_string).collect();
            if segments.iter().any(String::is_empty) {
                return Err(format!("contains an empty name or path segment in {shown}"));
            }
            let head = segments.remove(0);
            let head = match list_index(&head) {
                Some(i) => Head::Index(i),
                None => Head::Name(head),
            };
            Ok(Path {
                label: text.clone(),
                head,
                segments,
            })
        }
        Part::Other(type_name) => Err(format!(
            "has a part of type {type_name}: use a parameter name ({}), an argument index ({}), \
             a dotted path (\"payload.id\") or {} of those",
            words.name_types, words.index_type, words.a_list
        )),
    }
}

/// How a host language names what a path walks through, for the messages of [`walk`].
#[derive(Debug, Clone, Copy)]
pub struct PathWords {
    /// The map type (`Hash`, `dict`).
    pub map: &'static str,
    /// The list type (`Array`, `list`).
    pub list: &'static str,
    /// The list type with its article (`an Array`, `a list`).
    pub a_list: &'static str,
    /// The null value (`nil`, `None`).
    pub nil: &'static str,
    /// A path segment as the host writes a string literal in messages (Ruby's
    /// `inspect`, Python's `repr`).
    pub quote: fn(&str) -> String,
}

/// What a host value is, for walking a path through it.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A map (Hash, dict, JSON object): a segment is one of its keys.
    Map,
    /// A list (Array, list or tuple, JSON array) of this many elements: a segment is an index.
    List(usize),
    /// The null value (`nil`, `None`, JSON null).
    Null,
    /// Anything else, by its host type name (`Integer`, `str`).
    Other(String),
}

/// A host value a key path walks through in place (the binding's view of its values:
/// Ruby's, Python's, or JSON data for the conformance vectors). Reading it never runs
/// the host's code beyond a lookup.
pub trait Node: Sized {
    /// What the value is.
    fn shape(&self) -> Shape;
    /// A map's value under `key`: the key written as that text in canonical JSON — a
    /// string key first, then (a Ruby Hash) the Symbol of that name, then, when
    /// [`integer_key`] says the segment is an integer's text, the integer key (Ruby
    /// `{1 => …}`, Python `{1: …}`: `"0.1"` reaches it as a value key writes it, `"1"`);
    /// `None` when it has no such key.
    fn entry(&self, key: &str) -> Option<Self>;
    /// A list's element `index` (below [`Shape::List`]'s length).
    fn element(&self, index: usize) -> Option<Self>;
}

impl Node for &serde_json::Value {
    fn shape(&self) -> Shape {
        use serde_json::Value;
        match self {
            Value::Object(_) => Shape::Map,
            Value::Array(items) => Shape::List(items.len()),
            Value::Null => Shape::Null,
            Value::Bool(_) => Shape::Other("boolean".into()),
            Value::Number(_) => Shape::Other("number".into()),
            Value::String(_) => Shape::Other("string".into()),
        }
    }
    fn entry(&self, key: &str) -> Option<Self> {
        self.as_object().and_then(|map| map.get(key))
    }
    fn element(&self, index: usize) -> Option<Self> {
        self.as_array().and_then(|items| items.get(index))
    }
}

/// The value `segments` reach from `value`: a map's by key, a list's by a decimal index
/// ([`list_index`]).
///
/// Errors: the problem, naming the segment that reaches nothing: a key the map lacks, a
/// list segment that is not a number or past the end, a segment into a value that is
/// neither a map nor a list (null included).
pub fn walk<N: Node>(value: N, segments: &[String], words: &PathWords) -> Result<N, String> {
    let mut value = value;
    for segment in segments {
        let quoted = || (words.quote)(segment);
        value = match value.shape() {
            Shape::Map => value
                .entry(segment)
                .ok_or_else(|| format!("the {} has no key {}", words.map, quoted()))?,
            Shape::List(len) => {
                let Some(i) = list_index(segment) else {
                    return Err(format!(
                        "segment {} indexes {}, so it must be a number",
                        quoted(),
                        words.a_list
                    ));
                };
                let shown = if i == usize::MAX {
                    segment.trim_start_matches('0').to_string()
                } else {
                    i.to_string()
                };
                let missing = || format!("the {} has no element {shown}", words.list);
                if i >= len {
                    return Err(missing());
                }
                value.element(i).ok_or_else(missing)?
            }
            Shape::Null => {
                return Err(format!(
                    "segment {} reaches into {}, not a {} or {}",
                    quoted(),
                    words.nil,
                    words.map,
                    words.list
                ))
            }
            Shape::Other(type_name) => {
                return Err(format!(
                    "segment {} reaches into {}, not a {} or {}",
                    quoted(),
                    crate::words::with_article(&type_name),
                    words.map,
                    words.list
                ))
            }
        };
    }
    Ok(value)
}

/// Why a declared key yields no operation key for a delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyError {
    /// The part (its position in the declaration) the problem is about.
    pub part: usize,
    /// Whether the part reached a value (the value cannot be a key: [`crate::keys`]'s
    /// refusal) or not (its argument is missing, a segment reaches nothing, the value is
    /// null).
    pub reached: bool,
    /// The problem, starting lower-case, for the binding to prefix with the job, the
    /// declaration and the part.
    pub problem: String,
}

/// The operation key's text of a declared key: `starts[i]` is part `i`'s first value
/// (the argument its head names) or why there is none (its missing argument, in the
/// host's words, as [`resolve_args`] says it for positional arguments), walked by that
/// part's `segments`; a single key is the one value's [`crate::keys::value_text`], a
/// composite key (`composite`) the [`crate::keys::composite_text`] of its parts.
/// `json` converts a reached value to the core's value type (the binding's key
/// conversion: strings by their bytes, which must be UTF-8; nesting limited), or says
/// what it holds that cannot be a key.
///
/// Every part is walked before any value is converted, so a part that reaches nothing
/// is reported before another part's unacceptable value; then the first part whose
/// value is refused. The finished key's own check ([`crate::keys::problem`]: size, NUL)
/// is the caller's.
///
/// Errors: [`KeyError`], naming the part.
pub fn resolve<N: Node>(
    starts: Vec<(Result<N, String>, &[String])>,
    composite: bool,
    words: &PathWords,
    keys_words: &crate::keys::Words,
    mut json: impl FnMut(&N) -> Result<serde_json::Value, String>,
) -> Result<String, KeyError> {
    let reach_error = |part, problem| KeyError {
        part,
        reached: false,
        problem,
    };
    let mut values = Vec::with_capacity(starts.len());
    for (part, (start, segments)) in starts.into_iter().enumerate() {
        let value = walk(start.map_err(|p| reach_error(part, p))?, segments, words)
            .map_err(|p| reach_error(part, p))?;
        if value.shape() == Shape::Null {
            return Err(reach_error(part, format!("the value is {}", words.nil)));
        }
        values.push(value);
    }
    let value_error = |part, problem| KeyError {
        part,
        reached: true,
        problem,
    };
    if !composite {
        let Some(value) = values.first() else {
            return Err(reach_error(0, "the declaration has no part".into()));
        };
        let json = json(value).map_err(|p| value_error(0, p))?;
        return crate::keys::value_text(&json, keys_words).map_err(|p| value_error(0, p));
    }
    let mut parts = Vec::with_capacity(values.len());
    for (part, value) in values.iter().enumerate() {
        let json = json(value).map_err(|p| value_error(part, p))?;
        parts.push(crate::keys::part(&json, keys_words).map_err(|p| value_error(part, p))?);
    }
    Ok(crate::keys::composite_text(parts))
}

/// Why a positional argument is missing: `index` at or past the `count` the job got.
pub fn missing_argument(index: usize, count: usize) -> String {
    format!("argument {index} is missing (the job has {count} arguments)")
}

/// [`resolve`] for a host whose arguments are one list (`args`: a Ruby job's `args`,
/// the conformance vectors' `args_json`): part `i` starts at argument `parts[i].0` (its
/// head, a name already mapped to its position), or is missing ([`missing_argument`]).
///
/// Errors: as [`resolve`]; `args` that are not a list are part 0's problem.
pub fn resolve_args<N: Node>(
    args: &N,
    parts: &[(usize, Vec<String>)],
    composite: bool,
    words: &PathWords,
    keys_words: &crate::keys::Words,
    json: impl FnMut(&N) -> Result<serde_json::Value, String>,
) -> Result<String, KeyError> {
    let count = match args.shape() {
        Shape::List(count) => count,
        _ => 0,
    };
    let starts = parts
        .iter()
        .map(|(index, segments)| {
            let start = if *index < count {
                args.element(*index)
                    .ok_or_else(|| missing_argument(*index, count))
            } else {
                Err(missing_argument(*index, count))
            };
            (start, segments.as_slice())
        })
        .collect();
    resolve(starts, composite, words, keys_words, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: DeclarationWords = DeclarationWords {
        list: "list",
        a_list: "a list",
        name_types: "str",
        index_type: "int",
    };

    fn text(t: &str) -> Part {
        Part::Text {
            text: t.into(),
            shown: format!("{t:?}"),
        }
    }

    #[test]
    fn integer_keys_are_reached_by_the_text_they_are_written_as() {
        for yes in ["0", "1", "17", "-3", "18446744073709551616"] {
            assert!(integer_key(yes), "{yes}");
        }
        for no in ["", "-", "01", "-0", "+1", "1.0", "1e3", " 1", "a1", "00"] {
            assert!(!integer_key(no), "{no}");
        }
        assert!(!integer_key(
            &"9".repeat(crate::canonical::MAX_INTEGER_DIGITS + 1)
        ));
    }

    #[test]
    fn parts_become_paths() {
        let paths = parse(
            &[Part::Index(2), text("payload.order.id"), text("0.id")],
            &WORDS,
        )
        .unwrap();
        assert_eq!(paths[0].label, "argument 2");
        assert_eq!(paths[0].head, Head::Index(2));
        assert_eq!(paths[1].head, Head::Name("payload".into()));
        assert_eq!(paths[1].segments, ["order", "id"]);
        assert_eq!(paths[2].head, Head::Index(0));
        assert_eq!(paths[2].label, "0.id");
    }

    #[test]
    fn malformed_declarations_are_refused_in_the_hosts_words() {
        assert_eq!(parse(&[], &WORDS).unwrap_err(), "is an empty list");
        assert_eq!(
            parse(&[Part::Index(-1)], &WORDS).unwrap_err(),
            "uses a negative argument index -1"
        );
        assert_eq!(
            parse(&[text("a..b")], &WORDS).unwrap_err(),
            "contains an empty name or path segment in \"a..b\""
        );
        assert!(parse(&[Part::Other("float".into())], &WORDS)
            .unwrap_err()
            .ends_with(
                "an argument index (int), a dotted path (\"payload.id\") or a list of those"
            ));
        assert_eq!(list_index("12"), Some(12));
        assert_eq!(list_index("1a"), None);
    }

    const PATH_WORDS: PathWords = PathWords {
        map: "dict",
        list: "list",
        a_list: "a list",
        nil: "None",
        quote: |s| format!("'{s}'"),
    };

    const KEY_WORDS: crate::keys::Words = crate::keys::Words {
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

    fn key(
        args: serde_json::Value,
        parts: &[(usize, &str)],
        composite: bool,
    ) -> Result<String, KeyError> {
        let parts: Vec<(usize, Vec<String>)> = parts
            .iter()
            .map(|(i, path)| {
                let segments = path.split('.').filter(|s| !s.is_empty()).map(String::from);
                (*i, segments.collect())
            })
            .collect();
        resolve_args(&&args, &parts, composite, &PATH_WORDS, &KEY_WORDS, |v| {
            Ok((*v).clone())
        })
    }

    #[test]
    fn paths_reach_values_and_make_the_key() {
        use serde_json::json;
        let args = json!([7, {"order": {"id": "A-1", "lines": [{"sku": 3}]}}]);
        assert_eq!(key(args.clone(), &[(0, "")], false).unwrap(), "7");
        assert_eq!(key(args.clone(), &[(1, "order.id")], false).unwrap(), "A-1");
        assert_eq!(
            key(args.clone(), &[(1, "order.lines.0.sku")], false).unwrap(),
            "3"
        );
        assert_eq!(
            key(args.clone(), &[(0, ""), (1, "order.id")], true).unwrap(),
            r#"["7","A-1"]"#
        );
    }

    #[test]
    fn paths_that_reach_nothing_name_the_part_and_segment() {
        use serde_json::json;
        let args = json!([7, {"order": {"id": null, "lines": [1]}}]);
        let bad =
            |parts: &[(usize, &str)], composite| key(args.clone(), parts, composite).unwrap_err();
        let missing = bad(&[(0, ""), (2, "")], true);
        assert_eq!((missing.part, missing.reached), (1, false));
        assert_eq!(
            missing.problem,
            "argument 2 is missing (the job has 2 arguments)"
        );
        assert_eq!(
            bad(&[(1, "order.x")], false).problem,
            "the dict has no key 'x'"
        );
        assert_eq!(
            bad(&[(1, "order.lines.1")], false).problem,
            "the list has no element 1"
        );
        assert_eq!(
            bad(&[(1, "order.lines.99999999999999999999999")], false).problem,
            "the list has no element 99999999999999999999999"
        );
        assert_eq!(
            bad(&[(1, "order.lines.x")], false).problem,
            "segment 'x' indexes a list, so it must be a number"
        );
        assert_eq!(
            bad(&[(0, "id")], false).problem,
            "segment 'id' reaches into a number, not a dict or list"
        );
        assert_eq!(
            bad(&[(1, "order.id.x")], false).problem,
            "segment 'x' reaches into None, not a dict or list"
        );
        assert_eq!(bad(&[(1, "order.id")], false).problem, "the value is None");
        // Every part is walked before a value is judged: the missing part is reported
        // before the float.
        let args = json!([1.5]);
        let err = key(args.clone(), &[(0, ""), (1, "")], true).unwrap_err();
        assert_eq!((err.part, err.reached), (1, false));
        let err = key(args, &[(0, "")], false).unwrap_err();
        assert!(
            err.reached && err.problem.contains("floats are ambiguous"),
            "{err:?}"
        );
    }
}
