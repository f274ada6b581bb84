//! Waiting on a live claim, the options' defaults, the reclaim budget and the counting
//! of copies that come back.

use super::*;

/// [`Direct`], telling `started` when it begins to wait.
pub(crate) struct Telling {
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

pub(crate) fn a_waiting_delivery_decides_again_when_the_claim_ends(store: &Store) {
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
    complete(store, &protocol, holder, Some(&value), &mut notes).unwrap();
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

/// A wait no clock can bound (1e300 s, past `Duration` and `Instant`) does not panic
/// in [`DeliveryRequest::bound_wait`] (a `fatal`/`PanicException` in a binding): the
/// wait itself refuses it, naming the job.
pub(crate) fn a_wait_too_long_for_the_clock_is_refused_not_a_panic(store: &Store) {
    let protocol = storing();
    let delivery = delivery("digest-a");
    let _holder = run_claim(begin(store, &protocol, &delivery).0);
    for seconds in [1e300, f64::MAX, 1e19] {
        let mut huge = DeliveryRequest {
            wait_seconds: Some(seconds),
            ..repeat_of(&delivery)
        };
        let bound = std::panic::catch_unwind(move || {
            huge.bound_wait();
            huge
        });
        let huge = bound.unwrap_or_else(|_| panic!("bound_wait panicked for {seconds}"));
        let (step, _) = begin(store, &protocol, &huge);
        assert!(matches!(step, Ok(Step::InProgress(_))));
        let mut notes = Notes::new();
        let err = protocol
            .wait(&mut direct(store), &Interrupt::none(), &huge, &mut notes)
            .unwrap_err();
        assert_eq!(err.class_name(), "ConfigurationError", "{err}");
        assert!(err.to_string().contains(": wait must be"), "{err}");
    }
}

#[test]
pub(crate) fn job_options_defaults_are_the_options_tables() {
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
pub(crate) fn the_reclaim_budget_holds_the_operation_after_max_takeovers(store: &Store) {
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
pub(crate) fn a_spent_reclaim_budget_asks_the_lookup_first(store: &Store) {
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
pub(crate) fn counts(store: &Store, delivery: &DeliveryRequest) -> (i32, i32, i64) {
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
pub(crate) fn copy(
    delivery: &DeliveryRequest,
    n: usize,
    digest: &str,
    deferrals: u32,
) -> DeliveryRequest {
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
pub(crate) fn a_copy_is_counted_once_however_often_it_comes_back(store: &Store) {
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
    // The waiter's count is queued for the bookkeeping; a look's count is informative
    // while a batch is being written (`claim::deliver`: missed or counted twice), so it
    // is written now and every count below is exact.
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
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
