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
    deferral_delay, unreachable_delay, Channel, Claim, ClaimInfo, ClaimKind, Decision,
    DeliveryRequest, Detail, Direct, DoorWords, JobOptions, Level, LookupAnswer, Note, NoteKind,
    Notes, OnMismatch, OnStale, Outcome, Protocol, Step, COMPLETION_RETRY_DELAYS, ERROR_TEXT_LIMIT,
    UNREACHABLE_MAX_DELAY,
};
use idempotent_job_core::results::{self, ResultInput, ResultState};
use idempotent_job_core::session::Session;
use idempotent_job_core::store::{PoolHandle, Store};

mod common;
use common::StoreExt;
use common::{find_record, store_with};

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

fn a_completion_is_recorded_with_the_bodys_duration(store: &Store) {
    let protocol = protocol(JobOptions::default());
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let info = claim.info().clone();
    let mut notes = Notes::new();
    let value = serde_json::json!({"charge_id": "ch_1"});
    let done = protocol
        .complete(
            &mut direct(store),
            &Interrupt::none(),
            claim,
            Some(&value),
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert!(done.recorded);
    assert_eq!(done.attempts, 1);
    assert_eq!(done.outcome.decision, Decision::Ran);
    assert!(done.outcome.ran());
    assert_eq!(done.outcome.claim, Some(info));
    assert_eq!(status(store, &delivery), "completed");
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].event(), Some("completed"));
    assert!(matches!(notes[0].details()[0], ("duration", Detail::Float(d)) if d >= 0.0));
    // The next delivery of the operation is a duplicate.
    let (again, _) = begin(store, &protocol, &delivery);
    assert_eq!(action(&again.unwrap()), "skip:completed");
}

fn a_raising_body_releases_its_claim_for_the_retry(store: &Store) {
    let protocol = protocol(JobOptions::default());
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let long = "é".repeat(ERROR_TEXT_LIMIT + 50);
    protocol.release(
        &mut direct(store),
        &Interrupt::none(),
        claim,
        "Gateway::Timeout",
        &long,
        &mut notes,
    );
    let record = find_record(store, &claim_request(&delivery)).unwrap();
    assert_eq!(record.status, "released");
    let stored = record.last_error.unwrap();
    assert!(stored.starts_with("Gateway::Timeout: éé"));
    assert_eq!(stored.chars().count(), ERROR_TEXT_LIMIT);
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].event(), Some("released"));
    assert_eq!(
        notes[0].details(),
        vec![("error", Detail::Text("Gateway::Timeout".into()))]
    );
    let retry = run_claim(begin(store, &protocol, &delivery).0);
    assert_eq!(retry.info().kind, ClaimKind::Retry);
    assert_eq!(retry.info().attempt, 2);
}

fn a_crash_keeps_the_claim_until_its_lease_ends(store: &Store) {
    let protocol = protocol(JobOptions::default());
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    protocol.keep(claim, &mut notes);
    assert_eq!(status(store, &delivery), "claimed");
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].level(), Some(Level::Warn));
    let text = notes[0].text(&delivery, protocol.words()).unwrap();
    assert!(
        text.starts_with("the worker is shutting down (interrupt or signal): the claim of"),
        "{text}"
    );
    let (again, _) = begin(store, &protocol, &delivery);
    assert_eq!(action(&again.unwrap()), "in_progress:in_progress");
}

/// A stale claim of a fresh operation, taken over by a protocol with a lookup: the
/// claim to ask about.
fn asked(store: &Store, protocol: &Protocol) -> (DeliveryRequest, Claim) {
    let delivery = delivery("digest-a");
    prepare(store, &delivery, "stale");
    match begin(store, protocol, &delivery).0.unwrap() {
        Step::AskLookup(claim) => (delivery, claim),
        other => panic!("expected AskLookup, got {}", action(&other)),
    }
}

fn lookup_answers_decide_a_takeover(store: &Store) {
    let i = Interrupt::none();
    let cases = [
        (
            LookupAnswer::Done,
            OnStale::Reclaim,
            "skip:completed",
            "completed",
        ),
        (
            LookupAnswer::NotDone,
            OnStale::Hold,
            "run:takeover",
            "claimed",
        ),
        (
            LookupAnswer::Unknown,
            OnStale::Reclaim,
            "run:takeover",
            "claimed",
        ),
        (LookupAnswer::Unknown, OnStale::Hold, "skip:held", "held"),
        (
            LookupAnswer::Unknown,
            OnStale::Skip,
            "skip:given_up",
            "given_up",
        ),
    ];
    for (answer, on_stale, want_action, want_status) in cases {
        let protocol = protocol(JobOptions {
            on_stale,
            lookup: Some("lookup #charged?".into()),
            heartbeat: false,
            ..JobOptions::default()
        });
        let (delivery, claim) = asked(store, &protocol);
        let mut notes = Notes::new();
        let step = protocol
            .after_lookup(&mut direct(store), &i, claim, answer.clone(), &mut notes)
            .unwrap();
        assert_eq!(
            (action(&step), status(store, &delivery)),
            (want_action.to_string(), want_status.to_string()),
            "{answer:?} × {on_stale:?}"
        );
        assert_eq!(notes[0].event(), Some("lookup"));
        let text = notes[0].text(&delivery, protocol.words()).unwrap();
        assert!(
            text.starts_with("lookup #charged? of ProtocolTestJob operation"),
            "{text}"
        );
        if answer == LookupAnswer::Unknown && on_stale != OnStale::Reclaim {
            let last = notes
                .last()
                .unwrap()
                .text(&delivery, protocol.words())
                .unwrap();
            assert!(last.contains("(lookup #charged? does not know)"), "{last}");
        }
    }
}

fn a_failing_lookup_ends_the_lease_and_fails_the_delivery(store: &Store) {
    let i = Interrupt::none();
    let protocol = protocol(JobOptions {
        lookup: Some("lookup #charged?".into()),
        heartbeat: false,
        ..JobOptions::default()
    });
    for answer in [
        LookupAnswer::Raised {
            error: "RuntimeError: gateway down".into(),
        },
        LookupAnswer::Invalid {
            answer: "\"maybe\"".into(),
        },
    ] {
        let (delivery, claim) = asked(store, &protocol);
        let token = claim.info().token;
        let mut notes = Notes::new();
        let failed =
            protocol.after_lookup(&mut direct(store), &i, claim, answer.clone(), &mut notes);
        let Err(Error::Lookup { message, .. }) = failed else {
            panic!("expected a lookup error, got {failed:?}");
        };
        match &answer {
            LookupAnswer::Raised { .. } => assert!(
                message.contains("raised RuntimeError: gateway down; the job was not run"),
                "{message}"
            ),
            _ => assert!(
                message.contains("answered \"maybe\"; expected done, not_done or unknown"),
                "{message}"
            ),
        }
        let record = find_record(store, &claim_request(&delivery)).unwrap();
        assert_eq!(
            (
                record.status.as_str(),
                record.lease_expired,
                record.claim_token
            ),
            ("claimed", true, token)
        );
        assert!(record.last_error.unwrap().starts_with("lookup failed: "));
        assert_eq!(notes[0].level(), Some(Level::Error));
        // The next delivery asks again.
        let (again, _) = begin(store, &protocol, &delivery);
        assert_eq!(action(&again.unwrap()), "ask_lookup:takeover");
    }
}

fn payload_mismatches_are_noted_and_refused_under_raise(store: &Store) {
    let log = protocol(JobOptions::default());
    let raise = protocol(JobOptions {
        on_mismatch: OnMismatch::Raise,
        ..JobOptions::default()
    });
    // Completed, then a different payload: noted; under raise, refused.
    let first = delivery("digest-a");
    prepare(store, &first, "completed");
    let other = DeliveryRequest {
        args_digest: Some("digest-b".into()),
        ..first.clone()
    };
    let (step, notes) = begin(store, &log, &other);
    assert_eq!(action(&step.unwrap()), "skip:completed");
    assert_eq!(notes[0].event(), Some("mismatch"));
    assert_eq!(notes[0].details(), vec![("refused", Detail::Bool(false))]);
    assert_eq!(notes[0].level(), Some(Level::Warn));
    let (step, notes) = begin(store, &raise, &other);
    assert!(
        matches!(&step, Err(Error::PayloadMismatch { operation_key, .. }) if *operation_key == first.operation_key),
        "{step:?}"
    );
    assert_eq!(notes[0].details(), vec![("refused", Detail::Bool(true))]);
    assert_eq!(notes[0].level(), Some(Level::Error));
    // Released, then a different payload under raise: never taken over.
    let released = delivery("digest-a");
    prepare(store, &released, "released");
    let other = DeliveryRequest {
        args_digest: Some("digest-b".into()),
        ..released.clone()
    };
    let (step, _) = begin(store, &raise, &other);
    assert!(
        matches!(step, Err(Error::PayloadMismatch { .. })),
        "{step:?}"
    );
    assert_eq!(status(store, &released), "released");
    // The same payload claims it again.
    let (step, notes) = begin(store, &raise, &released);
    assert_eq!(action(&step.unwrap()), "run:retry");
    assert!(notes.iter().all(|n| n.event() != Some("mismatch")));
}

fn a_completion_after_a_takeover_is_a_lost_claim(store: &Store) {
    let protocol = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    let delivery = delivery("digest-a");
    let slow = run_claim(begin(store, &protocol, &delivery).0);
    expire_lease(store, &delivery);
    let taker = run_claim(begin(store, &protocol, &delivery).0);
    assert_eq!(taker.info().kind, ClaimKind::Takeover);
    let mut notes = Notes::new();
    let lost = protocol.complete(
        &mut direct(store),
        &Interrupt::none(),
        slow,
        None,
        DEFAULT_MAX_RESULT_BYTES,
        &mut notes,
    );
    assert!(matches!(lost, Err(Error::LostClaim { .. })), "{lost:?}");
    assert_eq!(notes[0].event(), Some("lost_claim"));
    assert_eq!(
        notes[0].details(),
        vec![("during", Detail::Name("completion"))]
    );
    assert_eq!(notes[0].level(), Some(Level::Error));
    // The taker's completion stands.
    protocol
        .complete(
            &mut direct(store),
            &Interrupt::none(),
            taker,
            None,
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert_eq!(status(store, &delivery), "completed");
}

fn the_heartbeat_runs_with_the_body_only_when_asked(store: &Store) {
    let with = protocol(JobOptions::default());
    let without = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    let claim = run_claim(begin(store, &with, &delivery("digest-a")).0);
    let report = claim
        .heartbeat_report()
        .expect("a heartbeat while the body runs");
    assert!(!report.lost && !report.in_doubt);
    with.keep(claim, &mut Notes::new());
    let claim = run_claim(begin(store, &without, &delivery("digest-a")).0);
    assert!(claim.heartbeat_report().is_none());
}

fn a_transactional_delivery_claims_and_completes_in_one_transaction(store: &Store) {
    let protocol = protocol(JobOptions::default());
    let delivery = delivery("digest-a");
    let i = Interrupt::none();
    let pool = store.pool().unwrap();
    let mut session = Session::begin(&pool, &i).unwrap();
    let mut notes = Notes::new();
    let claim = run_claim(protocol.begin(&mut session, &i, &delivery, &mut notes));
    assert!(
        claim.heartbeat_report().is_none(),
        "no heartbeat in a transaction"
    );
    let done = protocol
        .complete(
            &mut session,
            &i,
            claim,
            None,
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert!(done.recorded);
    // Not visible before the commit.
    assert_eq!(status(store, &delivery), "none");
    session.commit(&i).unwrap();
    assert_eq!(status(store, &delivery), "completed");
    // A raising body in a transaction: release writes nothing; the rollback undoes the claim.
    let second = self::delivery("digest-a");
    let mut session = Session::begin(&pool, &i).unwrap();
    let claim = run_claim(protocol.begin(&mut session, &i, &second, &mut notes));
    let mut released = Notes::new();
    protocol.release(
        &mut session,
        &i,
        claim,
        "RuntimeError",
        "boom",
        &mut released,
    );
    assert!(released.is_empty());
    session.rollback(&i).unwrap();
    assert_eq!(status(store, &second), "none");
}

/// Direct, with the first `fail` completions failing as a dead database would, and
/// the pauses between attempts counted instead of waited.
struct Flaky {
    inner: Direct,
    fail: usize,
    pauses: RefCell<Vec<Duration>>,
}

impl Channel for Flaky {
    fn claim(
        &mut self,
        i: &Interrupt<'_>,
        request: &ClaimRequest,
        lock: f64,
    ) -> Result<claim::ClaimReply> {
        self.inner.claim(i, request, lock)
    }

    fn fenced_with_result(
        &mut self,
        i: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&claim::PreparedResult>,
    ) -> Result<()> {
        if change == Fenced::Complete && self.fail > 0 {
            self.fail -= 1;
            return Err(Error::connection("the connection closed"));
        }
        self.inner
            .fenced_with_result(i, change, claim, text, result)
    }

    fn transactional(&self) -> bool {
        false
    }

    fn heartbeat_pool(&self) -> Option<&PoolHandle> {
        self.inner.heartbeat_pool()
    }

    fn pause(&mut self, _: &Interrupt<'_>, pause: Duration) -> Result<()> {
        self.pauses.borrow_mut().push(pause);
        Ok(())
    }
}

#[test]
fn a_failing_completion_is_retried_seven_times_then_given_up() {
    let store = store_with(true, 4);
    let protocol = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    let i = Interrupt::none();
    let delays: Vec<Duration> = COMPLETION_RETRY_DELAYS
        .iter()
        .map(|s| Duration::from_secs_f64(*s))
        .collect();
    assert_eq!(COMPLETION_RETRY_DELAYS.iter().sum::<f64>(), 15.3);
    // Three failures, then the completion lands.
    let delivery = delivery("digest-a");
    let mut flaky = Flaky {
        inner: direct(&store),
        fail: 3,
        pauses: RefCell::default(),
    };
    let claim = run_claim(begin(&store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let done = protocol
        .complete(
            &mut flaky,
            &i,
            claim,
            None,
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert_eq!((done.recorded, done.attempts), (true, 4));
    assert_eq!(*flaky.pauses.borrow(), delays[..3]);
    assert_eq!(status(&store, &delivery), "completed");
    // Always failing: 7 attempts, then given up; the record stays claimed.
    let delivery = self::delivery("digest-a");
    let mut flaky = Flaky {
        inner: direct(&store),
        fail: usize::MAX,
        pauses: RefCell::default(),
    };
    let claim = run_claim(begin(&store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let done = protocol
        .complete(
            &mut flaky,
            &i,
            claim,
            None,
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert_eq!((done.recorded, done.attempts), (false, 7));
    assert_eq!(*flaky.pauses.borrow(), delays);
    assert_eq!(status(&store, &delivery), "claimed");
    let last = notes.last().unwrap();
    assert_eq!(last.level(), Some(Level::Error));
    assert!(last
        .text(&delivery, protocol.words())
        .unwrap()
        .contains("ran, but its completion could not be recorded after 7 attempts"));
}

#[test]
fn the_deferral_doubles_up_to_the_lease_end_plus_the_margin() {
    assert_eq!(deferral_delay(300.0, 0, 1.0), 1.0);
    assert_eq!(deferral_delay(300.0, 1, 1.0), 2.0);
    assert_eq!(deferral_delay(300.0, 3, 1.0), 8.0);
    assert_eq!(deferral_delay(10.0, 5, 1.0), 11.0);
    assert_eq!(deferral_delay(-3.0, 5, 0.0), 0.0);
    assert_eq!(deferral_delay(1e12, 1000, 1.0), 2f64.powi(30));
}

#[test]
fn a_failed_claim_comes_back_doubling_up_to_a_minute() {
    assert_eq!(unreachable_delay(0), 1.0);
    assert_eq!(unreachable_delay(2), 4.0);
    assert_eq!(unreachable_delay(5), 32.0);
    assert_eq!(unreachable_delay(6), UNREACHABLE_MAX_DELAY);
    assert_eq!(unreachable_delay(u32::MAX), UNREACHABLE_MAX_DELAY);
}

#[test]
fn options_are_checked_naming_the_job() {
    let bad = |options: JobOptions| match Protocol::new("ChargeJob", options, DoorWords::default())
    {
        Err(Error::Config(message)) => message,
        other => panic!("expected a configuration error, got {other:?}"),
    };
    assert!(bad(JobOptions {
        lease_seconds: 0.1,
        ..JobOptions::default()
    })
    .starts_with("ChargeJob: lease must be at least 0.25 s"));
    assert!(bad(JobOptions {
        max_run_seconds: f64::NAN,
        ..JobOptions::default()
    })
    .starts_with("ChargeJob: max_run"));
    assert!(bad(JobOptions {
        lookup: Some(String::new()),
        ..JobOptions::default()
    })
    .contains("lookup"));
    assert_eq!(OnStale::parse("ChargeJob", "hold").unwrap(), OnStale::Hold);
    assert!(
        matches!(OnMismatch::parse("ChargeJob", "yell"), Err(Error::Config(m)) if m.contains("ChargeJob: on_mismatch must be log or raise"))
    );
}

#[test]
fn decision_names_are_the_bindings_names() {
    let names: Vec<&str> = [
        Decision::Ran,
        Decision::Completed,
        Decision::Held,
        Decision::GivenUp,
        Decision::InProgress,
        Decision::Refused,
    ]
    .iter()
    .map(|d| d.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "ran",
            "completed",
            "held",
            "given_up",
            "in_progress",
            "refused"
        ]
    );
    let _: Option<Outcome> = None;
    let _ = NoteKind::Kept;
}

/// A binding keeps protocols per job class and hands claims between threads (Python's
/// pyclasses must be Send; a protocol is shared by every worker thread).
#[test]
fn protocol_values_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Protocol>();
    send_sync::<Claim>();
    send_sync::<Outcome>();
    send_sync::<Direct>();
    send_sync::<Notes>();
}

fn storing() -> Protocol {
    protocol(JobOptions {
        store_result: true,
        heartbeat: false,
        ..JobOptions::default()
    })
}

/// A second delivery (another delivery id) of `delivery`'s operation.
fn repeat_of(delivery: &DeliveryRequest) -> DeliveryRequest {
    DeliveryRequest {
        delivery_id: Some("d-2".into()),
        ..delivery.clone()
    }
}

fn skipped(step: Step) -> Outcome {
    match step {
        Step::Skip(outcome) => outcome,
        other => panic!("expected Skip, got {}", action(&other)),
    }
}

fn a_stored_result_is_replayed_by_a_repeat(store: &Store) {
    let protocol = storing();
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let value = serde_json::json!({"charge_id": "ch_1", "amounts": [1500, 2.5]});
    let done = protocol
        .complete(
            &mut direct(store),
            &Interrupt::none(),
            claim,
            Some(&value),
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert!(done.recorded);
    assert!(done.result_stored);
    assert_eq!(done.outcome.result_state, Some(ResultState::Stored));
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(
        notes[0].details()[1],
        ("result_state", Detail::Name("stored"))
    );
    // The repeat replays the stored value, says so in its note, and does not run.
    let (again, notes) = begin(store, &protocol, &repeat_of(&delivery));
    let outcome = skipped(again.unwrap());
    assert_eq!(outcome.decision, Decision::Completed);
    assert!(outcome.replayed());
    assert_eq!(outcome.result_state, Some(ResultState::Stored));
    let replayed: serde_json::Value =
        serde_json::from_str(outcome.result_json.as_deref().unwrap()).unwrap();
    assert_eq!(replayed, value);
    let note = notes.iter().find(|n| n.event() == Some("skipped")).unwrap();
    assert!(note.details().contains(&("replayed", Detail::Bool(true))));
    assert!(note
        .details()
        .contains(&("result_state", Detail::Name("stored"))));
    let text = note.text(&delivery, &DoorWords::default()).unwrap();
    assert!(
        text.ends_with("so far); replayed: true (its stored result)"),
        "{text}"
    );
}

fn a_result_that_cannot_be_stored_is_noted_and_the_completion_stands(store: &Store) {
    let protocol = storing();
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let too_large = results::prepare(
        8,
        &delivery.job_type,
        &delivery.operation_key,
        ResultInput::Json("\"a longer text\""),
    );
    let done = protocol
        .complete_prepared(
            &mut direct(store),
            &Interrupt::none(),
            claim,
            Some(too_large),
            &mut notes,
        )
        .unwrap();
    assert!(done.recorded);
    assert!(!done.result_stored);
    assert_eq!(done.outcome.result_state, Some(ResultState::TooLarge));
    assert_eq!(status(store, &delivery), "completed");
    let events: Vec<_> = notes.iter().map(|n| n.event()).collect();
    assert_eq!(events, [Some("completed"), Some("result_not_stored")]);
    assert_eq!(notes[1].level(), Some(Level::Warn));
    assert!(notes[1]
        .text(&delivery, &DoorWords::default())
        .unwrap()
        .contains("over max_result_bytes (8)"));
    assert_eq!(
        notes[1].details()[0],
        ("result_state", Detail::Name("too_large"))
    );
    // A repeat is a replay without a value.
    let (again, notes) = begin(store, &protocol, &repeat_of(&delivery));
    let outcome = skipped(again.unwrap());
    assert!(outcome.replayed());
    assert_eq!(outcome.result_state, Some(ResultState::TooLarge));
    assert_eq!(outcome.result_json, None);
    let text = notes[0].text(&delivery, &DoorWords::default()).unwrap();
    assert!(
        text.ends_with("; no value replayed (result too_large, not stored)"),
        "{text}"
    );
}

fn without_store_result_nothing_is_stored_or_replayed(store: &Store) {
    let protocol = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let value = serde_json::json!("ch_1");
    let done = protocol
        .complete(
            &mut direct(store),
            &Interrupt::none(),
            claim,
            Some(&value),
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert!(!done.result_stored);
    assert_eq!(done.outcome.result_state, None);
    assert_eq!(notes[0].details()[1], ("result_state", Detail::Null));
    let (again, notes) = begin(store, &protocol, &repeat_of(&delivery));
    let outcome = skipped(again.unwrap());
    assert!(!outcome.replayed());
    assert_eq!((outcome.result_json, outcome.result_state), (None, None));
    assert_eq!(notes[0].details().len(), 2, "no replay details");
}

fn a_transactional_completion_stores_its_result_with_the_commit(store: &Store) {
    let protocol = storing();
    let delivery = delivery("digest-a");
    let i = Interrupt::none();
    let pool = store.pool().unwrap();
    let mut session = Session::begin(&pool, &i).unwrap();
    let mut notes = Notes::new();
    let claim = run_claim(protocol.begin(&mut session, &i, &delivery, &mut notes));
    let value = serde_json::json!([1, "two"]);
    let done = protocol
        .complete(
            &mut session,
            &i,
            claim,
            Some(&value),
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    assert!(done.result_stored);
    session.commit(&i).unwrap();
    let (again, _) = begin(store, &protocol, &repeat_of(&delivery));
    let outcome = skipped(again.unwrap());
    let stored: serde_json::Value =
        serde_json::from_str(outcome.result_json.as_deref().unwrap()).unwrap();
    assert_eq!(stored, value);
}

/// [`Direct`], telling `started` when it begins to wait.
struct Telling {
    direct: Direct,
    started: std::sync::mpsc::Sender<()>,
}

impl Channel for Telling {
    fn claim(
        &mut self,
        interrupt: &Interrupt<'_>,
        request: &ClaimRequest,
        lock_timeout_seconds: f64,
    ) -> Result<claim::ClaimReply> {
        self.direct.claim(interrupt, request, lock_timeout_seconds)
    }

    fn fenced_with_result(
        &mut self,
        interrupt: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&claim::PreparedResult>,
    ) -> Result<()> {
        self.direct
            .fenced_with_result(interrupt, change, claim, text, result)
    }

    fn can_wait(&self) -> bool {
        true
    }

    fn wait(
        &mut self,
        interrupt: &Interrupt<'_>,
        request: &ClaimRequest,
        seconds: f64,
    ) -> Result<Option<claim::ClaimReply>> {
        let _ = self.started.send(());
        self.direct.wait(interrupt, request, seconds)
    }

    fn transactional(&self) -> bool {
        false
    }

    fn heartbeat_pool(&self) -> Option<&PoolHandle> {
        None
    }

    fn pause(&mut self, interrupt: &Interrupt<'_>, pause: Duration) -> Result<()> {
        self.direct.pause(interrupt, pause)
    }
}

fn a_waiting_delivery_decides_again_when_the_claim_ends(store: &Store) {
    let protocol = storing();
    let delivery = delivery("digest-a");
    let holder = run_claim(begin(store, &protocol, &delivery).0);
    // A wait that runs out: told before waiting, then deferred as without a wait.
    let short = DeliveryRequest {
        wait_seconds: Some(0.2),
        ..repeat_of(&delivery)
    };
    let (step, notes) = begin(store, &protocol, &short);
    let Step::InProgress(first) = step.unwrap() else {
        panic!("expected InProgress")
    };
    assert_eq!((first.wait_seconds, first.retry_after), (Some(0.2), None));
    assert_eq!(notes.len(), 1, "the wait, no deferral yet: {notes:?}");
    let text = notes[0].text(&short, &DoorWords::default()).unwrap();
    assert!(
        text.ends_with("is in progress under delivery d-1; waiting up to 0.2 s for it"),
        "{text}"
    );
    let mut notes = Notes::new();
    let step = protocol.wait(&mut direct(store), &Interrupt::none(), &short, &mut notes);
    let Step::InProgress(after) = step.unwrap() else {
        panic!("expected InProgress")
    };
    assert_eq!(after.wait_seconds, None, "no second wait");
    assert!(after.retry_after.is_some());
    assert_eq!(notes[0].event(), Some("deferred"));
    // A wait the holder's completion ends: the waiter replays its stored result.
    let (started, told) = std::sync::mpsc::channel();
    let long = DeliveryRequest {
        wait_seconds: Some(30.0),
        ..repeat_of(&delivery)
    };
    let waiter = {
        let protocol = protocol.clone();
        let mut channel = Telling {
            direct: direct(store),
            started,
        };
        std::thread::spawn(move || {
            let mut notes = Notes::new();
            let first = protocol.begin(&mut channel, &Interrupt::none(), &long, &mut notes);
            let waits = matches!(
                first,
                Ok(Step::InProgress(Outcome {
                    wait_seconds: Some(_),
                    ..
                }))
            );
            assert!(waits, "{first:?}");
            let step = protocol.wait(&mut channel, &Interrupt::none(), &long, &mut notes);
            (step.map(skipped), notes)
        })
    };
    told.recv().unwrap();
    let value = serde_json::json!({"charge_id": "ch_9"});
    let mut notes = Notes::new();
    protocol
        .complete(
            &mut direct(store),
            &Interrupt::none(),
            holder,
            Some(&value),
            DEFAULT_MAX_RESULT_BYTES,
            &mut notes,
        )
        .unwrap();
    let (outcome, notes) = waiter.join().unwrap();
    let outcome = outcome.unwrap();
    assert!(outcome.replayed());
    let stored: serde_json::Value =
        serde_json::from_str(outcome.result_json.as_deref().unwrap()).unwrap();
    assert_eq!(stored, value);
    assert!(notes
        .iter()
        .any(|n| matches!(n.kind, NoteKind::Waiting { .. })));
    // A transaction's channel cannot wait: the first decision stands (deferred).
    let pool = store.pool().unwrap();
    let second = self::delivery("digest-a");
    let live = run_claim(begin(store, &protocol, &second).0);
    let mut session = Session::begin(&pool, &Interrupt::none()).unwrap();
    let mut notes = Notes::new();
    let waited = DeliveryRequest {
        wait_seconds: Some(30.0),
        ..repeat_of(&second)
    };
    let step = protocol
        .begin(&mut session, &Interrupt::none(), &waited, &mut notes)
        .unwrap();
    let Step::InProgress(deferred) = step else {
        panic!("expected InProgress")
    };
    assert_eq!(deferred.wait_seconds, None);
    assert!(deferred.retry_after.is_some());
    assert!(!notes
        .iter()
        .any(|n| matches!(n.kind, NoteKind::Waiting { .. })));
    session.rollback(&Interrupt::none()).unwrap();
    drop(live);
}

#[test]
fn job_options_defaults_are_the_options_tables() {
    use idempotent_job_core::options::{find, Default as TableDefault};
    let defaults = JobOptions::default();
    let table = |name: &str| find(name).unwrap().default;
    assert_eq!(
        table("lease"),
        TableDefault::Seconds(defaults.lease_seconds)
    );
    assert_eq!(
        table("max_run"),
        TableDefault::Seconds(defaults.max_run_seconds)
    );
    assert_eq!(
        table("lock_timeout"),
        TableDefault::Seconds(defaults.lock_timeout_seconds)
    );
    assert_eq!(
        table("heartbeat"),
        TableDefault::Boolean(defaults.heartbeat)
    );
    assert_eq!(
        table("store_result"),
        TableDefault::Boolean(defaults.store_result)
    );
    assert_eq!(
        table("on_stale"),
        TableDefault::Choice(defaults.on_stale.as_str())
    );
    assert_eq!(
        table("on_mismatch"),
        TableDefault::Choice(defaults.on_mismatch.as_str())
    );
    assert_eq!(table("lookup"), TableDefault::None);
    assert_eq!(defaults.lookup, None);
}

/// `max_takeovers: 2` under `reclaim`: the first run and two takeovers run, each left
/// stale as a body that kills its worker leaves it; the third stale claim is held for a
/// person, with the reason in `last_error`, the `held` event and the log line. A
/// control without the budget keeps reclaiming.
fn the_reclaim_budget_holds_the_operation_after_max_takeovers(store: &Store) {
    let budgeted = protocol(JobOptions {
        max_takeovers: Some(2),
        heartbeat: false,
        ..JobOptions::default()
    });
    let control = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    for (protocol, budget) in [(&budgeted, true), (&control, false)] {
        let delivery = delivery("digest-a");
        let mut steps = Vec::new();
        let mut last = Notes::new();
        for _ in 0..4 {
            let (step, notes) = begin(store, protocol, &delivery);
            let step = step.unwrap();
            steps.push(action(&step));
            last = notes;
            if let Step::Run(claim) = step {
                drop(claim); // the worker died with the claim: its lease ends
                expire_lease(store, &delivery);
            }
        }
        let record = find_record(store, &claim_request(&delivery)).unwrap();
        if !budget {
            assert_eq!(
                steps,
                ["run:first", "run:takeover", "run:takeover", "run:takeover"]
            );
            assert_eq!((record.status.as_str(), record.takeovers), ("claimed", 3));
            continue;
        }
        assert_eq!(
            steps,
            ["run:first", "run:takeover", "run:takeover", "skip:held"]
        );
        assert_eq!((record.status.as_str(), record.takeovers), ("held", 3));
        let reason = "the reclaim budget is spent: 3 stale takeovers of this operation, \
                      max_takeovers 2";
        assert_eq!(record.last_error.as_deref(), Some(reason));
        let held = last.iter().find(|n| n.event() == Some("held")).unwrap();
        assert_eq!(
            held.details(),
            vec![("reason", Detail::Text(reason.into()))]
        );
        let line = held.text(&delivery, &DoorWords::default()).unwrap();
        assert!(
            line.contains(&format!("held for a person: {reason}")),
            "{line}"
        );
    }
}

/// With a lookup, a spent budget asks it first: `not_done` runs the body, `unknown`
/// holds the operation (where `reclaim` alone would run it).
fn a_spent_reclaim_budget_asks_the_lookup_first(store: &Store) {
    let i = Interrupt::none();
    let budgeted = protocol(JobOptions {
        max_takeovers: Some(0),
        lookup: Some("lookup #charged?".into()),
        heartbeat: false,
        ..JobOptions::default()
    });
    for (answer, want) in [
        (LookupAnswer::NotDone, "run:takeover"),
        (LookupAnswer::Unknown, "skip:held"),
    ] {
        let delivery = delivery("digest-a");
        prepare(store, &delivery, "stale");
        let step = begin(store, &budgeted, &delivery).0.unwrap();
        let Step::AskLookup(claim) = step else {
            panic!("expected the lookup to be asked, got {}", action(&step));
        };
        let mut notes = Notes::new();
        let step = budgeted
            .after_lookup(&mut direct(store), &i, claim, answer, &mut notes)
            .unwrap();
        assert_eq!(action(&step), want);
    }
}

/// `(duplicates, mismatches, repeats recorded)` of `delivery`'s record, its bookkeeping
/// written first.
fn counts(store: &Store, delivery: &DeliveryRequest) -> (i32, i32, i64) {
    let record = find_record(store, &claim_request(delivery)).expect("a record");
    let (job_type, key) = (delivery.job_type.clone(), delivery.operation_key.clone());
    let repeats = store
        .with_conn(async |c| {
            let row = c
                .query_one(
                    "SELECT cardinality(repeat_times)::int8 FROM idempotent_job_records \
                      WHERE job_type = $1 AND operation_key = $2",
                    &[&job_type, &key],
                )
                .await?;
            Ok(row.get::<_, i64>(0))
        })
        .unwrap();
    (record.duplicates, record.mismatches, repeats)
}

/// Copy `n` of `delivery`'s operation (its own delivery id, payload digest `digest`)
/// after `deferrals` deferrals.
fn copy(delivery: &DeliveryRequest, n: usize, digest: &str, deferrals: u32) -> DeliveryRequest {
    DeliveryRequest {
        delivery_id: Some(format!("copy-{n}")),
        args_digest: Some(digest.into()),
        deferrals,
        ..delivery.clone()
    }
}

/// `duplicates` (and `mismatches`) count copies, not their returns: a copy deferred
/// behind a live claim is counted when it first arrives, and neither its returns (on
/// the look, on the claim statement in a transaction, after the claim completed) nor
/// its decision after a wait count it again; every return is still a repeat
/// (`repeat_times`). Control: without `returning`, the 4 copies below that come back
/// 3 times each would count 16.
fn a_copy_is_counted_once_however_often_it_comes_back(store: &Store) {
    let protocol = storing();
    let delivery = delivery("digest-a");
    let holder = run_claim(begin(store, &protocol, &delivery).0);
    // Four copies meet the live claim (one with another payload): each counted once.
    for n in 0..4 {
        let digest = if n == 0 { "digest-b" } else { "digest-a" };
        let (step, _) = begin(store, &protocol, &copy(&delivery, n, digest, 0));
        let Step::InProgress(outcome) = step.unwrap() else {
            panic!("expected InProgress")
        };
        assert!(outcome.retry_after.is_some());
    }
    assert_eq!(counts(store, &delivery), (4, 1, 4));
    // Each comes back twice while the claim is still live: deferred again, not counted.
    for deferrals in 1..3 {
        for n in 0..4 {
            let digest = if n == 0 { "digest-b" } else { "digest-a" };
            let returned = copy(&delivery, n, digest, deferrals);
            let (step, _) = begin(store, &protocol, &returned);
            let Step::InProgress(outcome) = step.unwrap() else {
                panic!("expected InProgress")
            };
            assert_eq!(outcome.duplicates, Some(4), "a return is not counted");
        }
    }
    assert_eq!(counts(store, &delivery), (4, 1, 12));
    // In a transaction the claim statement itself decides: a return is not counted
    // there either; a fifth copy is.
    let i = Interrupt::none();
    let pool = store.pool().unwrap();
    for (n, deferrals, counted) in [(1, 3, 4), (4, 0, 5)] {
        let mut session = Session::begin(&pool, &i).unwrap();
        let step = protocol
            .begin(
                &mut session,
                &i,
                &copy(&delivery, n, "digest-a", deferrals),
                &mut Notes::new(),
            )
            .unwrap();
        let Step::InProgress(outcome) = step else {
            panic!("expected InProgress")
        };
        assert_eq!(outcome.duplicates, Some(counted));
        session.commit(&i).unwrap();
    }
    assert_eq!(counts(store, &delivery), (5, 1, 14));
    // A sixth copy waits for the claim: counted when it meets it, not again when it
    // decides after the completion (a replay).
    let (started, told) = std::sync::mpsc::channel();
    let waiting = DeliveryRequest {
        wait_seconds: Some(30.0),
        ..copy(&delivery, 5, "digest-a", 0)
    };
    let waiter = {
        let protocol = protocol.clone();
        let mut channel = Telling {
            direct: direct(store),
            started,
        };
        std::thread::spawn(move || {
            let mut notes = Notes::new();
            let first = protocol.begin(&mut channel, &Interrupt::none(), &waiting, &mut notes);
            assert!(matches!(first, Ok(Step::InProgress(_))), "{first:?}");
            let step = protocol.wait(&mut channel, &Interrupt::none(), &waiting, &mut notes);
            step.map(skipped)
        })
    };
    told.recv().unwrap();
    let value = serde_json::json!({"charge_id": "ch_1"});
    protocol
        .complete(
            &mut direct(store),
            &i,
            holder,
            Some(&value),
            DEFAULT_MAX_RESULT_BYTES,
            &mut Notes::new(),
        )
        .unwrap();
    let replayed = waiter.join().unwrap().unwrap();
    assert!(replayed.replayed());
    assert_eq!(replayed.duplicates, Some(6));
    // The deferred copies come back after the completion: replays, not counted.
    for n in 0..4 {
        let outcome = skipped(
            begin(store, &protocol, &copy(&delivery, n, "digest-a", 3))
                .0
                .unwrap(),
        );
        assert!(outcome.replayed());
        assert_eq!(outcome.duplicates, Some(6));
    }
    assert_eq!(counts(store, &delivery), (6, 1, 20));
    // A copy arriving now for the first time is a duplicate.
    let late = skipped(
        begin(store, &protocol, &copy(&delivery, 6, "digest-a", 0))
            .0
            .unwrap(),
    );
    assert_eq!(late.duplicates, Some(7));
    assert_eq!(counts(store, &delivery).0, 7);
}
