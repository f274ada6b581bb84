//! The conformance vectors (`conformance/vectors.json`, docs/conformance.md) run by the
//! core: canonical JSON and digests, key texts and refusals, delays, and every decision
//! case twice — through the pure decision table (`idempotent_job_core::transitions`, what
//! the model check explores) and through the claim statement and the protocol on a real
//! PostgreSQL (DATABASE_URL). The vectors are the contract; these two readings of the
//! protocol, the Ruby specs and the Python tests must all agree with them.

use std::collections::HashSet;

use common::StoreExt;
use idempotent_job_core::config::DEFAULT_MAX_RESULT_BYTES;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::Error;
use idempotent_job_core::keys::{self, Words};
use idempotent_job_core::protocol::{
    deferral_delay, unreachable_delay, DeliveryRequest, Direct, DoorWords, JobOptions,
    LookupAnswer, Notes, OnMismatch, OnStale, Protocol, Step,
};
use idempotent_job_core::store::Store;
use idempotent_job_core::transitions::{self as t, RecordState, Rules, Status};
use idempotent_job_core::{canonical, declaration};
use serde_json::{json, Value};

mod common;

/// The vectors file, parsed.
fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conformance/vectors.json"
    );
    let text = std::fs::read_to_string(path).expect("conformance/vectors.json is readable");
    let vectors: Value = serde_json::from_str(&text).expect("conformance/vectors.json is JSON");
    assert_eq!(vectors["format"], 1, "a vectors format this test reads");
    vectors
}

fn cases<'a>(vectors: &'a Value, section: &str) -> &'a Vec<Value> {
    vectors[section]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("section {section} has cases"))
}

fn text<'a>(case: &'a Value, field: &str) -> &'a str {
    case[field]
        .as_str()
        .unwrap_or_else(|| panic!("{}: {field} is a string", case["name"]))
}

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
fn every_case_has_a_unique_name() {
    let vectors = vectors();
    let mut seen = HashSet::new();
    for section in [
        "canonical",
        "keys",
        "composite_keys",
        "key_paths",
        "decisions",
        "fenced",
        "resolve",
    ] {
        for case in cases(&vectors, section) {
            assert!(
                seen.insert(format!("{section}/{}", text(case, "name"))),
                "duplicate name in {section}: {}",
                case["name"]
            );
        }
    }
}

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

/// A decision case's record state, as the pure table names it.
fn record_state(record: &str) -> RecordState {
    let present = |status, lease_expired| RecordState::Present {
        status,
        lease_expired,
    };
    match record {
        "absent" => RecordState::Absent,
        "live" => present(Status::Claimed, false),
        "stale" => present(Status::Claimed, true),
        other => present(
            Status::parse(other).unwrap_or_else(|| panic!("record state {other}")),
            true,
        ),
    }
}

fn lookup_answer(name: &str) -> t::Answer {
    match name {
        "done" => t::Answer::Done,
        "not_done" => t::Answer::NotDone,
        "unknown" => t::Answer::Unknown,
        other => panic!("lookup answer {other}"),
    }
}

/// What the pure decision table says a decision case ends with, in the vectors' terms
/// (the body returns; the lease is 300 s; the record counted no earlier duplicate).
/// The case's `deferrals` (absent: 0).
fn case_deferrals(case: &Value) -> u32 {
    case["deferrals"].as_u64().map_or(0, |n| n as u32)
}

fn pure_expectation(case: &Value) -> Value {
    let record = text(case, "record");
    let options = &case["options"];
    let mismatch = text(case, "payload") == "different";
    let rules = Rules {
        on_stale: OnStale::parse("", text(options, "on_stale")).unwrap(),
        on_mismatch: OnMismatch::parse("", text(options, "on_mismatch")).unwrap(),
        lookup: !options["lookup"].is_null(),
    };
    let state = record_state(record);
    let before = match state {
        RecordState::Absent => Value::Null,
        RecordState::Present { status, .. } => json!(status.as_str()),
    };
    let verdict = t::claim(state, mismatch, rules.on_mismatch);
    let claim = match verdict {
        t::ClaimVerdict::Take(taken) => json!(taken.as_str()),
        t::ClaimVerdict::Met(_) => Value::Null,
    };
    let mut step = t::next(verdict, mismatch, rules);
    let lookup_asked = step == t::Next::AskLookup;
    if lookup_asked {
        step = t::after_lookup(lookup_answer(text(options, "lookup")), rules.on_stale);
    }
    // A copy coming back (deferrals > 0) was counted when it first arrived.
    let deferrals = case_deferrals(case);
    let duplicates = json!(i32::from(deferrals == 0));
    let mut e = json!({
        "decision": null, "error": null, "ran": false, "claim": claim,
        "lookup_asked": lookup_asked, "status_after": before, "duplicates": null,
        "retry_after": null,
    });
    let ended = |decision: &str, status: Status| (json!(decision), json!(status.as_str()));
    match step {
        t::Next::Run => {
            (e["decision"], e["status_after"]) = ended("ran", Status::Completed);
            e["ran"] = json!(true);
        }
        t::Next::Complete => {
            (e["decision"], e["status_after"]) = ended("completed", Status::Completed)
        }
        t::Next::Hold => (e["decision"], e["status_after"]) = ended("held", Status::Held),
        t::Next::GiveUp => (e["decision"], e["status_after"]) = ended("given_up", Status::GivenUp),
        t::Next::RefuseMismatch => e["error"] = json!("payload_mismatch"),
        t::Next::Defer => {
            e["decision"] = json!("in_progress");
            e["duplicates"] = duplicates;
            e["retry_after"] = json!(deferral_delay(300.0, deferrals, 1.0));
        }
        t::Next::Skip => {
            let t::ClaimVerdict::Met(met) = verdict else {
                unreachable!("a skip met the record")
            };
            e["decision"] = json!(match met {
                t::Met::Completed => "completed",
                t::Met::Held => "held",
                t::Met::GivenUp => "given_up",
                t::Met::Live => "in_progress",
                t::Met::Refused => "refused",
            });
            e["duplicates"] = duplicates;
        }
        t::Next::AskLookup => unreachable!("the lookup was answered"),
    }
    e
}

#[test]
fn decisions_by_the_pure_table() {
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in cases(&vectors, "decisions") {
        let got = pure_expectation(case);
        if got != case["expect"] {
            failures.push(format!(
                "{}:\n  table   {got}\n  vectors {}",
                case["name"], case["expect"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const JOB: &str = "ConformanceJob";

fn job_options(case: &Value) -> JobOptions {
    let options = &case["options"];
    JobOptions {
        on_stale: OnStale::parse(JOB, text(options, "on_stale")).unwrap(),
        on_mismatch: OnMismatch::parse(JOB, text(options, "on_mismatch")).unwrap(),
        lookup: options["lookup"].as_str().map(|_| "lookup".to_string()),
        heartbeat: false,
        ..JobOptions::default()
    }
}

fn delivery(key: &str, payload: &Value) -> DeliveryRequest {
    let (args_json, args_digest) = canonical::text_and_digest(payload);
    DeliveryRequest {
        job_type: JOB.into(),
        operation_key: key.into(),
        delivery_id: Some(uuid::Uuid::new_v4().to_string()),
        args_json: Some(args_json),
        args_digest: Some(args_digest),
        ..DeliveryRequest::default()
    }
}

/// Runs one delivery to its end the way a door does (the body returns at once; the
/// lookup answers `lookup`), in the vectors' terms.
fn deliver(store: &Store, protocol: &Protocol, d: &DeliveryRequest, lookup: Option<&str>) -> Value {
    let mut notes = Notes::new();
    let i = Interrupt::none();
    let mut channel = Direct::new(store.pool().unwrap(), false);
    let mut e = json!({"decision": null, "error": null, "ran": false, "claim": null,
                       "lookup_asked": false, "duplicates": null, "retry_after": null});
    let mut step = match protocol.begin(&mut channel, &i, d, &mut notes) {
        Ok(step) => step,
        Err(Error::PayloadMismatch { .. }) => {
            e["error"] = json!("payload_mismatch");
            return e;
        }
        Err(other) => panic!("{other}"),
    };
    if let Step::AskLookup(claim) = step {
        e["lookup_asked"] = json!(true);
        e["claim"] = json!(claim.info().kind.as_str());
        let answer = match lookup.expect("a lookup is declared") {
            "done" => LookupAnswer::Done,
            "not_done" => LookupAnswer::NotDone,
            _ => LookupAnswer::Unknown,
        };
        step = protocol
            .after_lookup(&mut channel, &i, claim, answer, &mut notes)
            .unwrap();
    }
    match step {
        Step::Run(claim) => {
            e["claim"] = json!(claim.info().kind.as_str());
            e["ran"] = json!(true);
            let done = protocol
                .complete(
                    &mut channel,
                    &i,
                    claim,
                    None,
                    DEFAULT_MAX_RESULT_BYTES,
                    &mut notes,
                )
                .unwrap();
            e["decision"] = json!(done.outcome.decision.as_str());
        }
        Step::Skip(outcome) | Step::InProgress(outcome) => {
            e["decision"] = json!(outcome.decision.as_str());
            if let Some(claim) = &outcome.claim {
                e["claim"] = json!(claim.kind.as_str());
            }
            e["duplicates"] = json!(outcome.duplicates);
            e["retry_after"] = json!(outcome.retry_after);
        }
        Step::AskLookup(_) => panic!("a lookup asked twice"),
    }
    e
}

fn status_of(store: &Store, key: &str) -> Value {
    let req = delivery(key, &json!(null)).claim_request(&JobOptions::default());
    common::find_record(store, &req).map_or(Value::Null, |r| json!(r.status))
}

#[test]
fn decisions_by_the_claim_statement_and_the_protocol_on_postgresql() {
    let vectors = vectors();
    let section = &vectors["decisions"];
    let store = common::store();
    let setup_sql = text(section, "setup_sql").to_string();
    let mut failures = Vec::new();
    for case in cases(&vectors, "decisions") {
        let key = uuid::Uuid::new_v4().to_string();
        let record = text(case, "record");
        let first = delivery(&key, &section["payload_a"]);
        if record != "absent" {
            let plain = Protocol::new(JOB, job_options(&json!({"options": {"on_stale": "reclaim", "on_mismatch": "log", "lookup": null}})), DoorWords::default()).unwrap();
            let set = deliver(&store, &plain, &first, None);
            assert_eq!(set["decision"], "ran", "setup of {}", case["name"]);
            let setup = &section["setup"][record];
            let (status, seconds) = (
                text(setup, "status").to_string(),
                setup["lease_expires_in"].as_f64().unwrap(),
            );
            let (job, k) = (JOB.to_string(), key.clone());
            let sql = setup_sql.clone();
            store
                .with_conn(async |c| {
                    let changed = c
                        .execute(sql.as_str(), &[&job, &k, &status, &seconds])
                        .await?;
                    assert_eq!(changed, 1);
                    Ok(())
                })
                .unwrap();
        }
        let payload = match text(case, "payload") {
            "same" => &section["payload_a"],
            _ => &section["payload_b"],
        };
        let protocol = Protocol::new(JOB, job_options(case), DoorWords::default()).unwrap();
        let d = DeliveryRequest {
            deferrals: case_deferrals(case),
            ..delivery(&key, payload)
        };
        let mut got = deliver(&store, &protocol, &d, case["options"]["lookup"].as_str());
        got["status_after"] = status_of(&store, &key);
        if got != case["expect"] {
            failures.push(format!(
                "{}:\n  postgresql {got}\n  vectors    {}",
                case["name"], case["expect"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn change_of(name: &str) -> (t::Change, idempotent_job_core::fenced::Fenced) {
    use idempotent_job_core::fenced::Fenced;
    match name {
        "complete" => (t::Change::Complete, Fenced::Complete),
        "release" => (t::Change::Release, Fenced::Release),
        "hold" => (t::Change::Hold, Fenced::Hold),
        "give_up" => (t::Change::GiveUp, Fenced::GiveUp),
        "expire" => (t::Change::Expire, Fenced::Expire),
        "renew" => (t::Change::Renew, Fenced::Renew),
        other => panic!("change {other}"),
    }
}

#[test]
fn fenced_changes_by_the_pure_table() {
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in cases(&vectors, "fenced") {
        let RecordState::Present { status, .. } = record_state(text(case, "record")) else {
            panic!("a fenced case has a record")
        };
        let (change, _) = change_of(text(case, "change"));
        let after = t::fenced(change, status, text(case, "token") == "own");
        let got = json!({
            "accepted": after.is_some(),
            "status_after": after.unwrap_or(status).as_str(),
        });
        let want = json!({"accepted": case["accepted"], "status_after": case["status_after"]});
        if got != want {
            failures.push(format!("{}: table {got}, vectors {want}", case["name"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn fenced_changes_by_the_statements_on_postgresql() {
    use common::claim;
    let vectors = vectors();
    let section = &vectors["decisions"];
    let setup_sql = text(section, "setup_sql").to_string();
    let store = common::store();
    let mut failures = Vec::new();
    for case in cases(&vectors, "fenced") {
        let key = uuid::Uuid::new_v4().to_string();
        let first = delivery(&key, &section["payload_a"]);
        let req = first.claim_request(&JobOptions::default());
        let setup = &section["setup"][text(case, "record")];
        let (status, seconds) = (
            text(setup, "status").to_string(),
            setup["lease_expires_in"].as_f64().unwrap(),
        );
        let (_, change) = change_of(text(case, "change"));
        let own = text(case, "token") == "own";
        let sql = setup_sql.clone();
        let accepted = store
            .with_conn(async |c| {
                let claim::ClaimAnswer::Claimed { token, .. } =
                    claim::claim(c, &req).await?.outcome
                else {
                    panic!("a fresh operation is claimed")
                };
                claim::complete(c, JOB, &key, token).await?;
                let changed = c
                    .execute(sql.as_str(), &[&JOB.to_string(), &key, &status, &seconds])
                    .await?;
                assert_eq!(changed, 1);
                let presented = if own { token } else { uuid::Uuid::new_v4() };
                match claim::fenced(c, change, JOB, &key, presented, Some("conformance")).await {
                    Ok(()) => Ok(true),
                    Err(Error::LostClaim { .. }) => Ok(false),
                    Err(other) => Err(other),
                }
            })
            .unwrap();
        let got = json!({"accepted": accepted, "status_after": status_of(&store, &key)});
        let want = json!({"accepted": case["accepted"], "status_after": case["status_after"]});
        if got != want {
            failures.push(format!(
                "{}: postgresql {got}, vectors {want}",
                case["name"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn resolution_of(name: &str) -> (t::Resolution, common::claim::Resolution) {
    match name {
        "done" => (t::Resolution::Done, common::claim::Resolution::Done),
        "rerun" => (t::Resolution::Rerun, common::claim::Resolution::Rerun),
        other => panic!("resolution {other}"),
    }
}

#[test]
fn resolve_by_the_pure_table_and_by_the_statement_on_postgresql() {
    use common::claim;
    let vectors = vectors();
    let section = &vectors["decisions"];
    let setup_sql = text(section, "setup_sql").to_string();
    let store = common::store();
    let mut failures = Vec::new();
    for case in cases(&vectors, "resolve") {
        let RecordState::Present { status, .. } = record_state(text(case, "record")) else {
            panic!("a resolve case has a record")
        };
        let (pure, how) = resolution_of(text(case, "as"));
        let after = t::resolve(status, pure);
        let table = json!({"resolved": after.is_some(),
                           "status_after": after.unwrap_or(status).as_str()});
        let key = uuid::Uuid::new_v4().to_string();
        let req = delivery(&key, &section["payload_a"]).claim_request(&JobOptions::default());
        let setup = &section["setup"][text(case, "record")];
        let (setup_status, seconds) = (
            text(setup, "status").to_string(),
            setup["lease_expires_in"].as_f64().unwrap(),
        );
        let sql = setup_sql.clone();
        let resolved = store
            .with_conn(async |c| {
                // Made by a takeover, as every held or given-up record is: the claim
                // that stores the delivery's job, which a rerun needs (issue 31).
                let token = uuid::Uuid::new_v4();
                claim::claim_as(c, &req, token).await?;
                claim::fenced(c, claim::Fenced::Expire, JOB, &key, token, Some("stale")).await?;
                claim::claim(c, &req).await?;
                let changed = c
                    .execute(
                        sql.as_str(),
                        &[&JOB.to_string(), &key, &setup_status, &seconds],
                    )
                    .await?;
                assert_eq!(changed, 1);
                claim::resolve(c, JOB, &key, how).await
            })
            .unwrap();
        let postgresql = json!({"resolved": resolved, "status_after": status_of(&store, &key)});
        let want = json!({"resolved": case["resolved"], "status_after": case["status_after"]});
        if table != want || postgresql != want {
            failures.push(format!(
                "{}: table {table}, postgresql {postgresql}, vectors {want}",
                case["name"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
