use super::*;

#[test]
fn every_class_in_the_table_has_an_example_of_its_own_class() {
    for class in ERROR_CLASSES {
        let err = example(class.name).unwrap();
        assert_eq!(err.class_name(), class.name);
        // The core sets every attribute of the table but the host's own.
        let names: Vec<&str> = err.attributes().iter().map(|(n, _)| *n).collect();
        let core_set: Vec<&str> = (class.attributes.iter())
            .filter(|a| !class.host_attributes.contains(a))
            .copied()
            .collect();
        assert_eq!(names, core_set, "{}", class.name);
        assert!(
            (class.host_attributes.iter()).all(|a| class.attributes.contains(a)),
            "{}",
            class.name
        );
        if class.always_retryable {
            assert!(err.retryable(), "{}", class.name);
        }
        assert_eq!(err.sends_back(), class.sends_back, "{}", class.name);
    }
    assert!(example("Nope").is_none());
}

#[test]
fn server_answers_take_the_class_of_their_sqlstate() {
    let class = |code: &str| Error::from_server(code, "m".into()).class_name();
    assert_eq!(class("08006"), "ConnectionError");
    assert_eq!(class("53300"), "ConnectionError");
    assert_eq!(class("55P03"), "LockTimeoutError");
    assert_eq!(class("57014"), "TimeoutError");
    assert_eq!(class("23505"), "DatabaseError");
    assert!(Error::from_server("53100", "m".into()).retryable());
    assert!(Error::from_server("25006", "m".into()).retryable());
    assert!(!Error::from_server("23505", "m".into()).retryable());
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_code_line_of_the_core_words_a_hosts_remedy() {
    // Each binding words its own remedy (Remedy); the core's texts name none. The
    // words are spliced so this test's own lines do not hold them.
    let host_words: Vec<String> = [
        ["ra", "ke "],
        ["migrate", "!"],
        ["idempotent_job", ".migrate"],
        ["IdempotentJob", "."],
        ["the ", "gem"],
        ["latest ", "gem"],
    ]
    .iter()
    .map(|p| p.concat())
    .collect();
    let mut files = Vec::new();
    sources(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 10, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for word in &host_words {
                assert!(
                    !line.contains(word.as_str()),
                    "{}:{}: {word:?} in {line:?}",
                    file.display(),
                    n + 1
                );
            }
        }
    }
}

#[test]
fn remedies_are_named_not_worded() {
    let err = Error::from_server("42P01", "relation missing".into());
    assert_eq!(err.remedies(), &[Remedy::Migrate]);
    assert!(!err.to_string().contains("rake"), "{err}");
    assert!(err.worded(|_| "do it").ends_with("(do it)"));
}
