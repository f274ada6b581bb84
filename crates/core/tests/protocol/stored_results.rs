//! Stored results: replayed by a repeat, noted when they cannot be stored, written with
//! a transactional completion.

use super::*;

pub(crate) fn storing() -> Protocol {
    protocol(JobOptions {
        store_result: true,
        heartbeat: false,
        ..JobOptions::default()
    })
}

/// A second delivery (another delivery id) of `delivery`'s operation.
pub(crate) fn repeat_of(delivery: &DeliveryRequest) -> DeliveryRequest {
    DeliveryRequest {
        delivery_id: Some("d-2".into()),
        ..delivery.clone()
    }
}

pub(crate) fn skipped(step: Step) -> Outcome {
    match step {
        Step::Skip(outcome) => outcome,
        other => panic!("expected Skip, got {}", action(&other)),
    }
}

pub(crate) fn a_stored_result_is_replayed_by_a_repeat(store: &Store) {
    let protocol = storing();
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let value = serde_json::json!({"charge_id": "ch_1", "amounts": [1500, 2.5]});
    let done = complete(store, &protocol, claim, Some(&value), &mut notes).unwrap();
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

pub(crate) fn a_result_that_cannot_be_stored_is_noted_and_the_completion_stands(store: &Store) {
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
    // A repeat learns why it has no value; it is not a replay (nothing stored to replay).
    let (again, notes) = begin(store, &protocol, &repeat_of(&delivery));
    let outcome = skipped(again.unwrap());
    assert!(!outcome.replayed());
    assert_eq!(outcome.label(), "skipped");
    assert!(!notes[0]
        .details()
        .iter()
        .any(|(name, _)| *name == "replayed"));
    assert_eq!(outcome.result_state, Some(ResultState::TooLarge));
    assert_eq!(outcome.result_json, None);
    let text = notes[0].text(&delivery, &DoorWords::default()).unwrap();
    assert!(
        text.ends_with("; no value replayed (result too_large, not stored)"),
        "{text}"
    );
}

pub(crate) fn without_store_result_nothing_is_stored_or_replayed(store: &Store) {
    let protocol = protocol(JobOptions {
        heartbeat: false,
        ..JobOptions::default()
    });
    let delivery = delivery("digest-a");
    let claim = run_claim(begin(store, &protocol, &delivery).0);
    let mut notes = Notes::new();
    let value = serde_json::json!("ch_1");
    let done = complete(store, &protocol, claim, Some(&value), &mut notes).unwrap();
    assert!(!done.result_stored);
    assert_eq!(done.outcome.result_state, None);
    assert_eq!(notes[0].details()[1], ("result_state", Detail::Null));
    let (again, notes) = begin(store, &protocol, &repeat_of(&delivery));
    let outcome = skipped(again.unwrap());
    assert!(!outcome.replayed());
    assert_eq!((outcome.result_json, outcome.result_state), (None, None));
    assert_eq!(notes[0].details().len(), 2, "no replay details");
}

pub(crate) fn a_transactional_completion_stores_its_result_with_the_commit(store: &Store) {
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
