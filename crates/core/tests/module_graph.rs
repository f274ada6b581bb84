//! The core's modules form no import cycle: no module refers to another that refers
//! back to it, directly or through others.
//!
//! Reads `src/**/*.rs`, takes every `crate::m` and (in a top-level module's file)
//! `super::m` reference outside `#[cfg(test)]` items (a module's `tests.rs` file is one)
//! and plain `//` comments (doc comments count: a doc link is a dependency too), and
//! maps each file to its top-level module (`src/protocol/channel.rs` belongs to
//! `protocol`). `lib.rs` is the root and only declares the modules. Fails naming one
//! cycle when the graph has one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text without plain `//` comments (doc comments `///` and `//!` are kept).
fn without_plain_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // A plain comment (or `//` inside a string: dropped alike).
            Some(at) if !line[at + 2..].starts_with(['/', '!']) => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text without each `#[cfg(test)]` item: from the attribute to the end of the
/// item's braces (or its `;`).
fn without_test_items(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segments after `prefix` (`crate::`, `super::`) anywhere in `text`,
/// with `prefix::{a, b::c}` groups opened.
fn referenced(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        if text[..start]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident(c) || c == '$')
        {
            continue; // `$crate::`, `my_crate::`, `a::super::`
        }
        let rest = &text[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item, mut at_start) = (0usize, String::new(), true);
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_start = true,
                    c if at_start && is_ident(c) => item.push(c),
                    _ if at_start && !item.is_empty() => {
                        found.insert(std::mem::take(&mut item));
                        at_start = false;
                    }
                    _ => {}
                }
            }
            if !item.is_empty() {
                found.insert(item);
            }
        } else {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// Each top-level module of `src` and the top-level modules it refers to.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    // A module's `tests.rs` (`src/config/tests.rs`) is its `#[cfg(test)] mod tests;`.
    files.retain(|f| !(f.ends_with("tests.rs") && f.parent() != Some(src)));
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| {
            let relative = f.strip_prefix(src).unwrap();
            let first = relative.components().next()?.as_os_str().to_str()?;
            Some(first.trim_end_matches(".rs").to_string())
        })
        .filter(|m| m != "lib")
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let relative = file.strip_prefix(src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let text = without_test_items(&without_plain_comments(&text));
        let mut refs = referenced(&text, "crate::");
        if relative.components().count() == 1 {
            // `super::` of a top-level module's file is the crate root.
            refs.extend(referenced(&text, "super::"));
        }
        let edges = graph.entry(top.clone()).or_default();
        for r in refs {
            if r != top && modules.contains(&r) {
                edges.insert(r);
            }
        }
    }
    graph
}

/// One cycle of `graph`, as the modules along it (the first repeated at the end).
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    // 0 unvisited, 1 on the current path, 2 done.
    fn visit(
        node: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = path.iter().position(|m| m == next).unwrap();
                    let mut found = path[at..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                0 => {
                    if let Some(found) = visit(next, graph, state, path) {
                        return Some(found);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node).copied().unwrap_or(0) == 0 {
            if let Some(found) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(found);
            }
        }
    }
    None
}

#[test]
fn the_core_has_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(graph.len() > 5, "modules found: {graph:?}");
    if let Some(found) = cycle(&graph) {
        let edges: Vec<String> = graph
            .iter()
            .map(|(m, to)| {
                format!(
                    "  {m} -> {}",
                    to.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        panic!(
            "the core's modules import each other in a circle: {}\nthe module graph:\n{}",
            found.join(" -> "),
            edges.join("\n")
        );
    }
}

#[test]
fn the_check_sees_a_cycle() {
    let mut graph = Graph::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycle(&graph).unwrap().join(" -> "), "a -> b -> c -> a");
    graph.get_mut("c").unwrap().clear();
    assert_eq!(cycle(&graph), None);
}

#[test]
fn references_are_read_from_uses_paths_and_doc_links() {
    let text = "use crate::{error::{Error, Result}, pool};\n/// see [`super::claim::deliver`]\n\
                // crate::comment\nlet x = $crate::macro_only;\n#[cfg(test)]\nmod tests { use crate::tested; }\n";
    let text = without_test_items(&without_plain_comments(text));
    let mut refs = referenced(&text, "crate::");
    refs.extend(referenced(&text, "super::"));
    let refs: Vec<_> = refs.into_iter().collect();
    assert_eq!(refs, ["claim", "error", "pool"]);
}
