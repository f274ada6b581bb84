//! The value sections of the vectors: canonical JSON and digests, key texts and
//! refusals, key paths, the deferral and unreachable delays.

use super::*;

/// How the Rust reading names host types in key messages (any door's words do: the
/// vectors check only the language-independent part of each message).
const WORDS: Words = Words {
    nil: "null",
    true_type: "bool",
    false_type: "bool",
    float: "f64",
    string: "string",
    list: "array",
    map: "object",
    accepted: "a string, an integer, or a non-empty array/object of JSON values",
    instead_of_float: "pass an integer or a string",
};
#[test]
fn canonical_json_and_digests() {
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in cases(&vectors, "canonical") {
        let value: Value = serde_json::from_str(text(case, "json")).unwrap();
        let got = (canonical::to_string(&value), canonical::digest(&value));
        let want = (
            text(case, "canonical").to_string(),
            text(case, "digest").to_string(),
        );
        if got != want {
            failures.push(format!("{}: got {got:?}, want {want:?}", case["name"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A key's text (value, then the finished key's check), or the refusal's message.
fn key_text(job_type: &str, value: std::result::Result<String, String>) -> Result<String, String> {
    let key = value?;
    match keys::problem(job_type.as_bytes(), key.as_bytes()) {
        Some(problem) => Err(problem),
        None => Ok(key),
    }
}

fn check_key(case: &Value, got: Result<String, String>, failures: &mut Vec<String>) {
    let ok = match (&got, case.get("text"), case.get("refused")) {
        (Ok(t), Some(want), _) => want == t,
        (Err(message), None, Some(Value::String(fragment))) => message.contains(fragment.as_str()),
        _ => false,
    };
    if !ok {
        failures.push(format!(
            "{}: got {got:?}, want text {} / refused {}",
            case["name"], case["text"], case["refused"]
        ));
    }
}

#[test]
fn key_texts_and_refusals() {
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in cases(&vectors, "keys") {
        let job_type = case["job_type"].as_str().unwrap_or("Job");
        let value: Value = serde_json::from_str(text(case, "json")).unwrap();
        let got = key_text(job_type, keys::value_text(&value, &WORDS));
        check_key(case, got, &mut failures);
    }
    for case in cases(&vectors, "composite_keys") {
        let parts: Vec<Value> = serde_json::from_str(text(case, "parts_json")).unwrap();
        let parts: Result<Vec<Value>, String> =
            parts.iter().map(|p| keys::part(p, &WORDS)).collect();
        let got = key_text("Job", parts.map(keys::composite_text));
        check_key(case, got, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How the Rust reading names what a key path walks through.
const PATH_WORDS: declaration::PathWords = declaration::PathWords {
    map: "object",
    list: "array",
    a_list: "an array",
    nil: "null",
    quote: |s| format!("{s:?}"),
};

/// The declaration's parts by the core's parse ([`declaration::parse`]), each an
/// argument index (the vectors name no parameters) and its segments.
fn index_parts(declaration: &Value) -> Vec<(usize, Vec<String>)> {
    let words = declaration::DeclarationWords {
        list: "array",
        a_list: "an array",
        name_types: "string",
        index_type: "integer",
    };
    let part = |v: &Value| match v {
        Value::Number(n) => declaration::Part::Index(n.as_i64().unwrap()),
        Value::String(s) => declaration::Part::Text {
            text: s.clone(),
            shown: format!("{s:?}"),
        },
        other => panic!("a declaration part {other}"),
    };
    let parts: Vec<declaration::Part> = match declaration {
        Value::Array(items) => items.iter().map(part).collect(),
        other => vec![part(other)],
    };
    declaration::parse(&parts, &words)
        .unwrap()
        .into_iter()
        .map(|path| match path.head {
            declaration::Head::Index(i) => (i, path.segments),
            declaration::Head::Name(name) => panic!("the vectors name no parameter ({name})"),
        })
        .collect()
}

#[test]
fn key_paths_resolve_and_refuse() {
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in cases(&vectors, "key_paths") {
        let args: Value = serde_json::from_str(text(case, "args_json")).unwrap();
        let parts = index_parts(&case["declaration"]);
        let got = declaration::resolve_args(
            &&args,
            &parts,
            case["declaration"].is_array(),
            &PATH_WORDS,
            &WORDS,
            |v| Ok((*v).clone()),
        )
        .map_err(|e| e.problem);
        check_key(case, key_text("Job", got), &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn deferral_and_unreachable_delays() {
    let vectors = vectors();
    for case in vectors["delays"]["deferral"].as_array().unwrap() {
        let got = deferral_delay(
            case["lease_remaining"].as_f64().unwrap(),
            case["deferrals"].as_u64().unwrap() as u32,
            case["margin"].as_f64().unwrap(),
        );
        assert_eq!(got, case["delay"].as_f64().unwrap(), "{case}");
    }
    for case in vectors["delays"]["unreachable"].as_array().unwrap() {
        let got = unreachable_delay(case["failures"].as_u64().unwrap() as u32);
        assert_eq!(got, case["delay"].as_f64().unwrap(), "{case}");
    }
}
