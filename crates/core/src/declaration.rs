//! Key declarations: how a job says where its operation key is, stated once for every
//! binding and door. A declaration is a part or a list of parts (a composite key); a
//! part is an argument index (`0`), a parameter name (`"order_id"`), or a dotted path
//! into a map or list argument (`"payload.order.id"`, `"0.id"`) whose first segment is a
//! parameter name or an index. [`parse`] checks the shape and splits each part into a
//! [`Path`]; the binding maps a [`Head::Name`] to a position by its host's parameters
//! (the only thing it knows that the core does not) and walks the segments over the
//! delivery's arguments. The texts are the problems after "`<job>`: idempotency key
//! `<declaration>` ", naming the host's types through [`DeclarationWords`].

/// How a host language names the types a declaration message mentions.
#[derive(Debug, Clone, Copy)]
pub struct DeclarationWords {
    /// The list type (`Array`, `list`), and with its article (`an Array`, `a list`).
    pub list: &'static str,
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
    Text { text: String, shown: String },
    /// Anything else, by its host type name.
    Other(String),
}

/// Where a path starts: an argument position, or a parameter the binding maps.
#[derive(Debug, Clone, PartialEq)]
pub enum Head {
    Index(usize),
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
}
