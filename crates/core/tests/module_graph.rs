//! No import cycle in the core (`crates/core/src`), the Ruby extension
//! (`ext/idempotent_job/src/ruby`) or the Python one (`python/src`): no module refers
//! to another that refers back to it, directly or through others.
//!
//! Reads the directory's `**/*.rs`, takes every `crate::m`, `$crate::m` (a macro's
//! body) and (in a child module's own file) `super::m` reference outside `#[cfg(test)]`
//! items (a module's `tests.rs` file is one) and plain `//` comments (doc comments
//! count: a doc link is a dependency too), and every invocation of a macro another
//! module defines (a macro import: `#[macro_use]` brings no path), and maps each file
//! to its child module (`src/protocol/channel.rs` belongs to `protocol`). The root
//! (`lib.rs`, `mod.rs`) only declares the modules. Fails naming one cycle when the
//! graph has one.
//!
//! Within each module directory (`src/sql/`, `src/record/`…) the same check runs on its
//! files: `claim.rs` and `flush.rs` of `sql/` are two modules there, and neither may
//! refer back to the other (through `super::m`, `crate::sql::m` or a sibling's macro).

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

/// The macros `macro_rules!` defines in `text`.
fn macros_defined(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("macro_rules!") {
        rest = &rest[at + "macro_rules!".len()..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|&c| is_ident(c))
            .collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

/// Whether `text` invokes the macro `name` (`name!(`, `name! {`, `name![`), outside its
/// own `macro_rules! name` line.
fn invokes(text: &str, name: &str) -> bool {
    let call = format!("{name}!");
    text.match_indices(&call).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + call.len()..].trim_start().chars().next();
        !before.is_some_and(|c| is_ident(c) || c == '$')
            && !text[..at].trim_end().ends_with("macro_rules!")
            && matches!(after, Some('(' | '{' | '['))
    })
}

/// The module graph of the files of one module directory, given as (path relative to
/// the directory, text). Each file belongs to the child module its path starts with
/// (`protocol/channel.rs` to `protocol`); `root` (`lib.rs`, `mod.rs`) only declares
/// the children and is left out. A child refers to another through
/// `crate::{prefix}m` or `$crate::{prefix}m` (in a macro's body: an edge from the
/// module that defines it), `super::m` (in a child's own file), or by invoking a macro
/// the other defines with `macro_rules!` (a macro import, seen only as `name!(…)`).
fn graph_of(files: &[(PathBuf, String)], root: &str, prefix: &str) -> Graph {
    let top_of = |relative: &Path| -> String {
        let first = relative.components().next().unwrap().as_os_str();
        first.to_str().unwrap().trim_end_matches(".rs").to_string()
    };
    let root_module = root.trim_end_matches(".rs");
    let texts: Vec<(String, usize, String)> = files
        .iter()
        .filter(|(relative, _)| top_of(relative) != root_module)
        .map(|(relative, text)| {
            let text = without_test_items(&without_plain_comments(text));
            (top_of(relative), relative.components().count(), text)
        })
        .collect();
    let modules: BTreeSet<String> = texts.iter().map(|(top, _, _)| top.clone()).collect();
    let mut defined_in: BTreeMap<String, String> = BTreeMap::new();
    for (top, _, text) in &texts {
        for name in macros_defined(text) {
            defined_in.insert(name, top.clone());
        }
    }
    let mut graph = Graph::new();
    for (top, depth, text) in &texts {
        // A macro's `$crate::m` is the defining module's reference to `m`.
        let paths = text.replace("$crate::", " crate::");
        let mut refs = referenced(&paths, &format!("crate::{prefix}"));
        if *depth == 1 {
            // `super::` of a child's own file is the directory's module.
            refs.extend(referenced(text, "super::"));
        }
        for (name, definer) in &defined_in {
            if definer != top && invokes(text, name) {
                refs.insert(definer.clone());
            }
        }
        let edges = graph.entry(top.clone()).or_default();
        for r in refs {
            if &r != top && modules.contains(&r) {
                edges.insert(r);
            }
        }
    }
    graph
}

/// The graph of the module directory `dir` (see [`graph_of`]).
fn graph(dir: &Path, root: &str, prefix: &str) -> Graph {
    let mut paths = Vec::new();
    rust_files(dir, &mut paths);
    // A module's `tests.rs` (`src/config/tests.rs`) is its `#[cfg(test)] mod tests;`.
    paths.retain(|f| !(f.ends_with("tests.rs") && f.parent() != Some(dir)));
    let files: Vec<(PathBuf, String)> = paths
        .iter()
        .map(|f| {
            let relative = f.strip_prefix(dir).unwrap().to_path_buf();
            (relative, std::fs::read_to_string(f).unwrap())
        })
        .collect();
    graph_of(&files, root, prefix)
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

/// Fails naming a cycle of `graph` and the whole graph.
fn assert_no_cycle(what: &str, graph: &Graph) {
    if let Some(found) = cycle(graph) {
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
            "{what}'s modules import each other in a circle: {}\nthe module graph:\n{}",
            found.join(" -> "),
            edges.join("\n")
        );
    }
}

/// Every module directory under `dir` (one with a `mod.rs`), with the path prefix its
/// files use for a sibling (`sql::` for `src/sql`, under `prefix`).
fn module_dirs(dir: &Path, prefix: &str, out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && path.join("mod.rs").is_file() {
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            let inner = format!("{prefix}{name}::");
            module_dirs(&path, &inner, out);
            out.push((path, inner));
        }
    }
}

/// The graphs of the files of every module directory under `root` (see [`module_dirs`]),
/// by directory.
fn directory_graphs(root: &Path, prefix: &str) -> BTreeMap<PathBuf, Graph> {
    let mut dirs = Vec::new();
    module_dirs(root, prefix, &mut dirs);
    dirs.into_iter()
        .map(|(dir, inner)| {
            let graph = graph(&dir, "mod.rs", &inner);
            (dir, graph)
        })
        .collect()
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_core_has_no_import_cycle() {
    let graph = graph(&repository().join("crates/core/src"), "lib.rs", "");
    assert!(graph.len() > 5, "modules found: {graph:?}");
    assert!(
        graph["config"].contains("sql"),
        "a macro import is an edge: {graph:?}"
    );
    assert_no_cycle("the core", &graph);
}

#[test]
fn the_ruby_extension_has_no_import_cycle() {
    // `src/lib.rs` declares only `ruby`; its children are the modules that matter.
    let dir = repository().join("ext/idempotent_job/src/ruby");
    let graph = graph(&dir, "mod.rs", "ruby::");
    assert!(graph.len() > 5, "modules found: {graph:?}");
    assert_no_cycle("the Ruby extension (ext/idempotent_job/src/ruby)", &graph);
}

#[test]
fn the_python_extension_has_no_import_cycle() {
    let graph = graph(&repository().join("python/src"), "lib.rs", "");
    assert!(graph.len() > 3, "modules found: {graph:?}");
    assert_no_cycle("the Python extension (python/src)", &graph);
}

#[test]
fn no_module_directory_has_an_import_cycle_among_its_files() {
    let repository = repository();
    let core = directory_graphs(&repository.join("crates/core/src"), "");
    let sql = &core[&repository.join("crates/core/src/sql")];
    assert!(sql.len() > 5, "sql's files found: {sql:?}");
    assert!(
        sql["claim"].contains("fragments"),
        "a sibling's macro is an edge: {sql:?}"
    );
    assert!(
        sql["reads"].contains("purge"),
        "a doc link to a sibling is an edge: {sql:?}"
    );
    for (root, prefix) in [
        ("crates/core/src", ""),
        ("ext/idempotent_job/src/ruby", "ruby::"),
        ("python/src", ""),
    ] {
        for (dir, graph) in directory_graphs(&repository.join(root), prefix) {
            assert_no_cycle(&dir.display().to_string(), &graph);
        }
    }
}

#[test]
fn a_macro_made_cycle_is_seen() {
    let files = |b: &str| {
        vec![
            (
                PathBuf::from("a.rs"),
                "macro_rules! ping {\n    () => { $crate::b::pong() };\n}\n".to_string(),
            ),
            (PathBuf::from("b.rs"), b.to_string()),
            (
                PathBuf::from("lib.rs"),
                "#[macro_use]\nmod a;\nmod b;\n".to_string(),
            ),
        ]
    };
    let with_use = graph_of(
        &files("pub fn pong() {}\nfn f() { ping!() }\n"),
        "lib.rs",
        "",
    );
    assert_eq!(cycle(&with_use).unwrap().join(" -> "), "a -> b -> a");
    let without = graph_of(&files("pub fn pong() {}\nfn ping() {}\n"), "lib.rs", "");
    assert_eq!(cycle(&without), None, "{without:?}");
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
