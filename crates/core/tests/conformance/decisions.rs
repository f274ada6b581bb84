//! Every decision case twice: by the pure decision table and by the claim statement
//! and the protocol on PostgreSQL.

use super::*;

/// A decision case's record state, as the pure table names it.
pub(super) fn record_state(record: &str) -> RecordState {
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

pub(super) const JOB: &str = "ConformanceJob";

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

pub(super) fn delivery(key: &str, payload: &Value) -> DeliveryRequest {
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

pub(super) fn status_of(store: &Store, key: &str) -> Value {
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
