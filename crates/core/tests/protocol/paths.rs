//! A delivery's paths after the claim: completion, release, crash, lookup, mismatch,
//! lost claim, heartbeat, and the transactional delivery.

use super::*;

pub(crate) fn a_completion_is_recorded_with_the_bodys_duration(store: &Store) {
    let protocol = protocol(JobOptions::default());
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let info = claim.info().clone();
    let mut notes = Notes::new();
    let value = serde_json::json!({"charge_id": "ch_1"});
    let done = complete(store, &protocol, claim, Some(&value), &mut notes).unwrap();
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

pub(crate) fn a_raising_body_releases_its_claim_for_the_retry(store: &Store) {
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

/// An error text PostgreSQL's `text` cannot hold (a NUL character, in the message or
/// the class name) is still released, the NUL written as U+FFFD: the claim must not stay
/// for its lease (and be held for a person under `on_stale: hold`) because of its words.
pub(crate) fn a_body_error_holding_a_nul_is_still_released(store: &Store) {
    let protocol = protocol(JobOptions::default());
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    protocol.release(
        &mut direct(store),
        &Interrupt::none(),
        claim,
        "Bad\0Class",
        "a\0b",
        &mut notes,
    );
    let record = find_record(store, &claim_request(&delivery)).unwrap();
    assert_eq!(record.status, "released");
    assert_eq!(
        record.last_error.as_deref(),
        Some("Bad\u{fffd}Class: a\u{fffd}b")
    );
    assert_eq!(notes[0].event(), Some("released"));
    let retry = run_claim(begin(store, &protocol, &delivery).0);
    assert_eq!(retry.info().kind, ClaimKind::Retry);
}

/// A delivery whose id, job class, queue or job type holds a NUL character (which PostgreSQL's
/// `text` cannot store) is refused before any statement with the configuration error
/// naming the job and the field, not the database's 22021 (a DatabaseError, which a door
/// sends back to its queue again and again); nothing is recorded.
pub(crate) fn a_delivery_text_holding_a_nul_is_refused_naming_the_job(store: &Store) {
    let protocol = protocol(JobOptions::default());
    for field in ["id", "job class", "queue", "job type"] {
        let mut delivery = delivery("digest-a");
        let text = Some("a\0b".to_string());
        match field {
            "id" => delivery.delivery_id = text,
            "job class" => delivery.job_class = text,
            "queue" => delivery.queue = text,
            _ => delivery.job_type = format!("{JOB}\0"),
        }
        let err = match begin(store, &protocol, &delivery).0 {
            Err(err) => err,
            Ok(step) => panic!("{field}: {}", action(&step)),
        };
        assert_eq!(err.class_name(), "ConfigurationError", "{field}: {err}");
        assert!(
            err.to_string().starts_with(&format!(
                "{}: the delivery's {field} holds a NUL",
                delivery.job_type
            )),
            "{err}"
        );
        if field != "job type" {
            assert_eq!(status(store, &delivery), "none");
        }
    }
}

pub(crate) fn a_crash_keeps_the_claim_until_its_lease_ends(store: &Store) {
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
pub(crate) fn asked(store: &Store, protocol: &Protocol) -> (DeliveryRequest, Claim) {
    let delivery = delivery("digest-a");
    prepare(store, &delivery, "stale");
    match begin(store, protocol, &delivery).0.unwrap() {
        Step::AskLookup(claim) => (delivery, claim),
        other => panic!("expected AskLookup, got {}", action(&other)),
    }
}

pub(crate) fn lookup_answers_decide_a_takeover(store: &Store) {
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

pub(crate) fn a_failing_lookup_ends_the_lease_and_fails_the_delivery(store: &Store) {
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

pub(crate) fn payload_mismatches_are_noted_and_refused_under_raise(store: &Store) {
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

pub(crate) fn a_completion_after_a_takeover_is_a_lost_claim(store: &Store) {
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
    let lost = complete(store, &protocol, slow, None, &mut notes);
    assert!(matches!(lost, Err(Error::LostClaim { .. })), "{lost:?}");
    assert_eq!(notes[0].event(), Some("lost_claim"));
    assert_eq!(
        notes[0].details(),
        vec![("during", Detail::Name("completion"))]
    );
    assert_eq!(notes[0].level(), Some(Level::Error));
    // The taker's completion stands.
    complete(store, &protocol, taker, None, &mut notes).unwrap();
    assert_eq!(status(store, &delivery), "completed");
}

pub(crate) fn the_heartbeat_runs_with_the_body_only_when_asked(store: &Store) {
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

pub(crate) fn a_transactional_delivery_claims_and_completes_in_one_transaction(store: &Store) {
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
