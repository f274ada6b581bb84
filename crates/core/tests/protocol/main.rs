//! The core protocol (`idempotent_job_core::protocol`) against a real PostgreSQL
//! (DATABASE_URL): a table of its transitions (the record's state × the job's options
//! → the step a delivery takes and the record's state after), then the completion,
//! release, crash, lookup, mismatch and transaction paths. Each case uses its own
//! operation key, so the tests run in parallel on one database.

use std::cell::RefCell;
use std::time::Duration;

use common::claim::{self, ClaimRequest, Fenced};
use idempotent_job_core::config::DEFAULT_MAX_RESULT_BYTES;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::protocol::{
    deferral_delay, unreachable_delay, Channel, Claim, ClaimInfo, ClaimKind, Completion, Decision,
    DeliveryRequest, Detail, Direct, DoorWords, JobOptions, Level, LookupAnswer, Note, NoteKind,
    Notes, OnMismatch, OnStale, Outcome, Protocol, Step, COMPLETION_RETRY_DELAYS, ERROR_TEXT_LIMIT,
    UNREACHABLE_MAX_DELAY,
};
use idempotent_job_core::results::{self, ResultInput, ResultState};
use idempotent_job_core::session::Session;
use idempotent_job_core::store::{PoolHandle, Store};

#[path = "../common/mod.rs"]
mod common;
mod paths;
mod retries;
mod stored_results;
mod waiting;
use common::StoreExt;
use common::{find_record, store_with};
use paths::*;
use stored_results::*;
use waiting::*;

macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod prepared_statements_on {
            $(#[test]
            fn $name() {
                super::$name(&super::store_with(true, 10))
            })*
        }
        mod prepared_statements_off {
            $(#[test]
            fn $name() {
                super::$name(&super::store_with(false, 10))
            })*
        }
    };
}

in_both_modes!(
    the_transition_table,
    a_completion_is_recorded_with_the_bodys_duration,
    a_raising_body_releases_its_claim_for_the_retry,
    a_body_error_holding_a_nul_is_still_released,
    a_wait_too_long_for_the_clock_is_refused_not_a_panic,
    a_delivery_text_holding_a_nul_is_refused_naming_the_job,
    a_crash_keeps_the_claim_until_its_lease_ends,
    lookup_answers_decide_a_takeover,
    a_failing_lookup_ends_the_lease_and_fails_the_delivery,
    payload_mismatches_are_noted_and_refused_under_raise,
    a_completion_after_a_takeover_is_a_lost_claim,
    the_heartbeat_runs_with_the_body_only_when_asked,
    a_transactional_delivery_claims_and_completes_in_one_transaction,
    a_stored_result_is_replayed_by_a_repeat,
    a_result_that_cannot_be_stored_is_noted_and_the_completion_stands,
    without_store_result_nothing_is_stored_or_replayed,
    a_transactional_completion_stores_its_result_with_the_commit,
    a_waiting_delivery_decides_again_when_the_claim_ends,
    the_reclaim_budget_holds_the_operation_after_max_takeovers,
    a_spent_reclaim_budget_asks_the_lookup_first,
    a_copy_is_counted_once_however_often_it_comes_back,
);

const JOB: &str = "ProtocolTestJob";

/// A delivery of a fresh operation of [`JOB`].
fn delivery(digest: &str) -> DeliveryRequest {
    let key = uuid::Uuid::new_v4().to_string();
    DeliveryRequest {
        job_type: JOB.into(),
        operation_key: key,
        delivery_id: Some("d-1".into()),
        job_class: Some("ProtocolTestJob".into()),
        queue: Some("default".into()),
        args_json: Some("[1]".into()),
        args_digest: Some(digest.into()),
        facts_json: None,
        deferrals: 0,
        ..DeliveryRequest::default()
    }
}

fn protocol(options: JobOptions) -> Protocol {
    Protocol::new(JOB, options, DoorWords::default()).unwrap()
}

fn direct(store: &Store) -> Direct {
    Direct::new(store.pool().unwrap(), false)
}

/// `protocol.begin` on the store's pool, with its notes.
fn begin(store: &Store, protocol: &Protocol, delivery: &DeliveryRequest) -> (Result<Step>, Notes) {
    let mut notes = Notes::new();
    let step = protocol.begin(&mut direct(store), &Interrupt::none(), delivery, &mut notes);
    (step, notes)
}

/// `protocol.complete` on the store's pool, uninterrupted, with the default result limit.
fn complete(
    store: &Store,
    protocol: &Protocol,
    claim: Claim,
    result: Option<&serde_json::Value>,
    notes: &mut Notes,
) -> Result<Completion> {
    protocol.complete(
        &mut direct(store),
        &Interrupt::none(),
        claim,
        result,
        DEFAULT_MAX_RESULT_BYTES,
        notes,
    )
}

/// The step's name: what the binding does next.
fn action(step: &Step) -> String {
    match step {
        Step::Run(claim) => format!("run:{}", claim.info().kind.as_str()),
        Step::AskLookup(claim) => format!("ask_lookup:{}", claim.info().kind.as_str()),
        Step::Skip(outcome) => format!("skip:{}", outcome.decision.as_str()),
        Step::InProgress(outcome) => format!("in_progress:{}", outcome.decision.as_str()),
    }
}

fn status(store: &Store, delivery: &DeliveryRequest) -> String {
    find_record(store, &claim_request(delivery))
        .map(|r| r.status)
        .unwrap_or_else(|| "none".into())
}

fn claim_request(delivery: &DeliveryRequest) -> ClaimRequest {
    delivery.claim_request(&JobOptions::default())
}

/// Ends the record's lease now, as if its holder had died a lease ago (a stale claim).
fn expire_lease(store: &Store, delivery: &DeliveryRequest) {
    let (job_type, key) = (delivery.job_type.clone(), delivery.operation_key.clone());
    store
        .with_conn(async |c| {
            c.execute(
                "UPDATE idempotent_job_records SET lease_expires_at = now() - interval '1 s' \
                 WHERE job_type = $1 AND operation_key = $2",
                &[&job_type, &key],
            )
            .await?;
            Ok(())
        })
        .unwrap();
}

fn run_claim(step: Result<Step>) -> Claim {
    match step.unwrap() {
        Step::Run(claim) => claim,
        other => panic!("expected Run, got {}", action(&other)),
    }
}

/// Brings `delivery`'s operation into `state` through the protocol itself.
fn prepare(store: &Store, delivery: &DeliveryRequest, state: &str) {
    if state == "none" {
        return;
    }
    let plain = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    let mut notes = Notes::new();
    let claim = run_claim(begin(store, &plain, delivery).0);
    let mut channel = direct(store);
    let i = Interrupt::none();
    match state {
        "completed" => {
            plain
                .complete(
                    &mut channel,
                    &i,
                    claim,
                    None,
                    DEFAULT_MAX_RESULT_BYTES,
                    &mut notes,
                )
                .unwrap();
        }
        "live" => drop(claim),
        "released" => plain.release(&mut channel, &i, claim, "RuntimeError", "boom", &mut notes),
        "stale" => {
            drop(claim);
            expire_lease(store, delivery);
        }
        "held" | "given_up" => {
            let fenced = if state == "held" {
                Fenced::Hold
            } else {
                Fenced::GiveUp
            };
            channel.fenced(&i, fenced, claim.info(), None).unwrap();
        }
        other => panic!("unknown state {other}"),
    }
    assert_eq!(status(store, delivery), expected_status(state));
}

fn expected_status(state: &str) -> &str {
    match state {
        "live" | "stale" => "claimed",
        other => other,
    }
}

/// The record's state × the job's options → the step of the next delivery, and the
/// record's status right after it (before any body runs).
fn the_transition_table(store: &Store) {
    let lookup = || Some("lookup #charged?".to_string());
    let on = |on_stale: OnStale, lookup: Option<String>| JobOptions {
        on_stale,
        lookup,
        heartbeat: false,
        ..JobOptions::default()
    };
    let table: Vec<(&str, JobOptions, &str, &str)> = vec![
        ("none", on(OnStale::Reclaim, None), "run:first", "claimed"),
        ("none", on(OnStale::Hold, lookup()), "run:first", "claimed"),
        (
            "completed",
            on(OnStale::Reclaim, None),
            "skip:completed",
            "completed",
        ),
        ("held", on(OnStale::Reclaim, None), "skip:held", "held"),
        (
            "given_up",
            on(OnStale::Reclaim, None),
            "skip:given_up",
            "given_up",
        ),
        (
            "live",
            on(OnStale::Reclaim, None),
            "in_progress:in_progress",
            "claimed",
        ),
        (
            "live",
            on(OnStale::Hold, lookup()),
            "in_progress:in_progress",
            "claimed",
        ),
        ("released", on(OnStale::Hold, None), "run:retry", "claimed"),
        (
            "released",
            on(OnStale::Skip, lookup()),
            "run:retry",
            "claimed",
        ),
        (
            "stale",
            on(OnStale::Reclaim, None),
            "run:takeover",
            "claimed",
        ),
        ("stale", on(OnStale::Hold, None), "skip:held", "held"),
        (
            "stale",
            on(OnStale::Skip, None),
            "skip:given_up",
            "given_up",
        ),
        (
            "stale",
            on(OnStale::Reclaim, lookup()),
            "ask_lookup:takeover",
            "claimed",
        ),
        (
            "stale",
            on(OnStale::Hold, lookup()),
            "ask_lookup:takeover",
            "claimed",
        ),
    ];
    let mut failures = Vec::new();
    for (state, options, want_action, want_status) in table {
        let delivery = delivery("digest-a");
        prepare(store, &delivery, state);
        let (step, notes) = begin(store, &protocol(options.clone()), &delivery);
        let step = step.unwrap();
        let got = (action(&step), status(store, &delivery));
        let want = (want_action.to_string(), want_status.to_string());
        if got != want {
            failures.push(format!(
                "{state} × on_stale {} lookup {:?}: got {got:?}, want {want:?}",
                options.on_stale.as_str(),
                options.lookup
            ));
        }
        check_notes(state, &step, &notes, &options);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What each transition tells: its events and log lines.
fn check_notes(state: &str, step: &Step, notes: &Notes, options: &JobOptions) {
    let events: Vec<&str> = notes.iter().filter_map(Note::event).collect();
    match step {
        Step::Run(claim) | Step::AskLookup(claim) => {
            assert_eq!(events[0], "claimed", "{state}");
            assert_eq!(notes[0].attempt, Some(claim.info().attempt));
            assert_eq!(
                notes[0].details()[0],
                ("kind", Detail::Name(claim.info().kind.as_str()))
            );
            if claim.info().kind == ClaimKind::Takeover {
                assert_eq!(events[1], "taken_over");
            }
        }
        Step::Skip(outcome) if state == "stale" => {
            assert_eq!(events, ["claimed", "taken_over", outcome.decision.as_str()]);
            let d = delivery("x");
            let warn = notes.last().unwrap();
            assert_eq!(warn.level(), Some(Level::Warn));
            assert!(warn
                .text(&d, &DoorWords::default())
                .unwrap()
                .contains("is stale (its holder's lease ran out)"));
            assert_eq!(
                outcome.claim.as_ref().map(|c| c.kind),
                Some(ClaimKind::Takeover)
            );
        }
        Step::Skip(outcome) => {
            assert_eq!(events, ["skipped"], "{state}");
            assert_eq!(outcome.duplicates, Some(1));
            assert_eq!(
                notes[0].details(),
                vec![
                    ("decision", Detail::Name(outcome.decision.as_str())),
                    ("duplicates", Detail::Int(1))
                ]
            );
        }
        Step::InProgress(outcome) => {
            assert_eq!(events, ["deferred"]);
            // A first deferral comes back after 1 s (the lease has ~300 s left).
            assert_eq!(outcome.retry_after, Some(1.0));
            assert!(outcome.lease_remaining.unwrap() > options.lease_seconds - 60.0);
            assert_eq!(outcome.holder.as_deref(), Some("d-1"));
            let text = notes[0]
                .text(&delivery("x"), &DoorWords::default())
                .unwrap();
            assert!(
                text.contains("is in progress under delivery d-1; retry after 1.0 s (deferral 1;"),
                "{text}"
            );
        }
    }
}
