use super::*;
use serde_json::json;

const T0: f64 = 1_764_547_200.0;

fn delivery(at: f64, jid: &str, more: Value) -> Facts {
    let mut f = json!({"at": T0 + at, "jid": jid, "decision": "completed",
                       "enqueued_at": T0 + at - 0.01, "producer": "orders"});
    for (k, v) in more.as_object().unwrap() {
        f[k] = v.clone();
    }
    f.as_object().unwrap().clone()
}

fn causes(d: &[Facts]) -> Vec<Cause> {
    classify(d, None, &[], DEFAULT_RESTART_WINDOW)
        .iter()
        .map(|r| r.cause)
        .collect()
}

#[test]
fn copies_meeting_a_live_claim_and_their_deferred_returns() {
    let d = [
        delivery(0.0, "a", json!({"decision": "claimed"})),
        delivery(0.002, "b", json!({"decision": "in_progress"})),
        delivery(1.0, "b", json!({"deferrals": 1})),
    ];
    let r = classify(&d, None, &[], 120.0);
    assert_eq!(
        r.iter().map(|r| r.cause).collect::<Vec<_>>(),
        [Cause::ConcurrentCopy; 2]
    );
    assert_eq!(
        r.iter().map(|r| r.deferred_return).collect::<Vec<_>>(),
        [false, true]
    );
    assert!(r[0].live_claim);
    assert!((r[0].after_claim.unwrap() - 0.002).abs() < 1e-6);
}

#[test]
fn queue_retry_redelivery_and_restart() {
    let d = [
        delivery(0.0, "a", json!({"decision": "claimed"})),
        delivery(30.0, "a", json!({"retry_count": 0, "decision": "claimed"})),
        delivery(400.0, "a", json!({"retry_count": 0})),
    ];
    let r = classify(&d, None, &[T0 - 5000.0, T0 + 350.0], 120.0);
    assert_eq!(r[0].cause, Cause::QueueRetry);
    assert_eq!(r[1].cause, Cause::Redelivery);
    assert_eq!(r[1].restart, Some(T0 + 350.0));
    assert_eq!(r[0].retry_count, Some(0));
}

#[test]
fn re_enqueues_by_producer_and_without_facts() {
    let d = [
        delivery(0.0, "a", json!({"decision": "claimed"})),
        delivery(3600.0, "b", json!({})),
        delivery(7200.0, "c", json!({"producer": "stripe"})),
        delivery(7400.0, "e", json!({"producer": null})),
        Map::from_iter([("at".to_owned(), json!(T0 + 9000.0))]),
    ];
    assert_eq!(
        causes(&d),
        [
            Cause::ReEnqueueSameProducer,
            Cause::ReEnqueueOtherProducer,
            Cause::ReEnqueue,
            Cause::Unknown
        ]
    );
}

#[test]
fn a_takeover_and_its_deferred_arrival_are_redeliveries() {
    let d = [
        delivery(0.0, "a", json!({"decision": "claimed"})),
        delivery(2.0, "b", json!({"decision": "in_progress"})),
        delivery(6.0, "b", json!({"decision": "takeover", "deferrals": 1})),
    ];
    let r = classify(&d, None, &[], 120.0);
    assert_eq!(
        r.iter().map(|r| r.cause).collect::<Vec<_>>(),
        [Cause::Redelivery; 2]
    );
    assert_eq!(
        r.iter().map(|r| r.deferred_return).collect::<Vec<_>>(),
        [false, true]
    );
}

fn sqs(at: f64, receives: i64, decision: &str) -> Facts {
    json!({"at": T0 + at, "message_id": "m", "receive_count": receives, "decision": decision})
        .as_object()
        .unwrap()
        .clone()
}

#[test]
fn reads_sqs_receives_by_what_the_previous_receive_was_answered() {
    // A consumer killed in the body: the message back after its visibility timeout
    // meets the dead claim (deferred), comes back, and takes the stale claim over.
    let killed = [
        sqs(0.0, 1, "claimed"),
        sqs(3.0, 2, "in_progress"),
        sqs(5.0, 3, "in_progress"),
        sqs(7.0, 4, "takeover"),
    ];
    let r = classify(&killed, None, &[], 120.0);
    assert_eq!(
        r.iter().map(|r| r.cause).collect::<Vec<_>>(),
        [Cause::Redelivery; 3]
    );
    assert_eq!(
        r.iter().map(|r| r.deferred_return).collect::<Vec<_>>(),
        [false, true, true]
    );
    // A raising body: the message left, received again, claims the released claim.
    let raised = [sqs(0.0, 1, "claimed"), sqs(2.0, 2, "claimed")];
    assert_eq!(causes(&raised), [Cause::QueueRetry]);
    // Its consumer died past the lease: the next receive takes over at once.
    let taken = [sqs(0.0, 1, "claimed"), sqs(9.0, 2, "takeover")];
    assert_eq!(causes(&taken), [Cause::Redelivery]);
    // Two sends of one body: another message id, deferred behind the live claim, back
    // to find the completion.
    let mut copy = [sqs(0.01, 1, "in_progress"), sqs(2.0, 2, "completed")];
    for c in &mut copy {
        c.insert("message_id".into(), "m2".into());
    }
    let r = classify(
        &[&[sqs(0.0, 1, "claimed")][..], &copy].concat(),
        None,
        &[],
        120.0,
    );
    assert_eq!(
        r.iter()
            .map(|r| (r.cause, r.deferred_return))
            .collect::<Vec<_>>(),
        [
            (Cause::ConcurrentCopy, false),
            (Cause::ConcurrentCopy, true)
        ]
    );
}

#[test]
fn reads_seconds_milliseconds_and_iso_text() {
    assert_eq!(
        seconds(&json!(1_764_547_200_123_i64)),
        Some(1_764_547_200.123)
    );
    assert_eq!(seconds(&json!("2025-12-01T00:00:01Z")), Some(T0 + 1.0));
    assert_eq!(seconds(&json!("yesterday")), None);
    assert_eq!(seconds(&Value::Null), None);
}

#[test]
fn reads_a_records_elements_in_time_order() {
    let d = deliveries(
        T0,
        Some(json!({"jid": "a"}).as_object().unwrap().clone()),
        &[
            json!({"at": T0 + 30.0, "decision": "retry", "facts": {"jid": "a", "retry_count": 0}}),
            json!({"at": "2025-12-01T00:00:00.5+00:00", "decision": "in_progress", "facts": {"jid": "b"}}),
            json!({"at": (T0 + 60.0) * 1000.0}),
        ],
    );
    assert_eq!(d[1]["jid"], "b");
    assert_eq!(d[1]["at"], json!(T0 + 0.5));
    assert_eq!(d[2]["decision"], "claimed");
    assert_eq!(d[3], json!({"at": T0 + 60.0}).as_object().unwrap().clone());
    assert_eq!(
        causes(&d),
        [Cause::ConcurrentCopy, Cause::QueueRetry, Cause::Unknown]
    );
}

fn reported(key: &str, producers: &[&str], d: &[Facts]) -> ReportOperation {
    ReportOperation {
        job_type: "ChargeOrderJob".into(),
        operation_key: key.into(),
        status: "completed".into(),
        takeovers: 0,
        mismatches: 0,
        replays: 0,
        producers: producers.iter().map(|p| p.to_string()).collect(),
        job_classes: vec!["ChargeOrderJob".into()],
        repeats: classify(d, None, &[], 120.0),
    }
}

#[test]
fn prints_the_report_per_operation_job_type_and_pair_of_producers() {
    let copies = [
        delivery(0.0, "a", json!({"decision": "claimed"})),
        delivery(0.01, "b", json!({"decision": "in_progress"})),
        delivery(1.2, "b", json!({"deferrals": 1})),
    ];
    let enqueued = [
        delivery(0.0, "f", json!({"decision": "claimed"})),
        delivery(3600.0, "g", json!({"producer": "stripe"})),
    ];
    let ops = [
        reported("1", &["orders"], &copies),
        reported("=2", &["orders", "stripe"], &enqueued),
    ];
    let s = summary(&ops);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].1.operations, s[0].1.repeats, s[0].1.deferred_returns),
        (2, 2, 1)
    );
    assert_eq!(
        producer_pairs(&ops),
        [(
            ("ChargeOrderJob".into(), "orders".into(), "stripe".into()),
            1
        )]
    );
    assert_eq!(
        lines(&ops),
        [
            "ChargeOrderJob \"1\": completed, 1 repeat (concurrent copy after 0.0 s, concurrent copy \
             after 1.2 s (deferred copy back))",
            "ChargeOrderJob \"=2\": completed, 1 repeat (re-enqueue, other producer after 3600.0 s \
             by stripe); enqueued by 2 producers: orders, stripe",
            "ChargeOrderJob: 2 operations repeated 2 times — 1 concurrent copy, 1 re-enqueue, other \
             producer; 1 deferred copy back, 1 enqueued by several producers",
            "orders and stripe both enqueue ChargeOrderJob for the same operation: 1 operation",
        ]
    );
    let csv = csv(&ops);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], CSV_HEADERS.join(","));
    assert_eq!(
        rows[3],
        "ChargeOrderJob,'=2,completed,2025-12-01T01:00:00.000000Z,re_enqueue_other_producer,g,,\
         3600.0,0.01,false,false,stripe,orders,"
    );
}

#[test]
fn refuses_operations_it_cannot_read() {
    let err = report_of_json(
        r#"[{"job_type": "J", "operation_key": "k", "status": "completed",
                                  "repeats": [{"cause": "gremlins"}]}]"#,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("J \"k\": a repeat's cause must be one of concurrent_copy"),
        "{err}"
    );
    assert!(report_of_json("{}").is_err());
    assert!(report_of_json(r#"[{"operation_key": "k"}]"#).is_err());
}

/// A producer, job type or job class holding a newline (or the report's separators)
/// is quoted in the text lines, so it cannot forge a line; plain names stay as they
/// are. Before, `lines` wrote them as they are: one line held a forged second line.
#[test]
fn quotes_names_that_could_forge_report_lines() {
    let forged = "x\nChargeOrderJob: 0 operations repeated 0 times";
    let enqueued = [
        delivery(0.0, "f", json!({"decision": "claimed"})),
        delivery(3600.0, "g", json!({"producer": forged})),
    ];
    let mut op = reported("1", &["orders", forged], &enqueued);
    op.job_type = "Charge\nJob".into();
    op.job_classes = vec!["A".into(), "B, C".into()];
    let lines = lines(&[op]);
    assert!(lines.iter().all(|l| !l.contains('\n')), "{lines:#?}");
    assert_eq!(
        lines[0],
        "\"Charge\\nJob\" \"1\": completed, 1 repeat (re-enqueue, other producer after 3600.0 \
         s by \"x\\nChargeOrderJob: 0 operations repeated 0 times\"); enqueued by 2 producers: \
         orders, \"x\\nChargeOrderJob: 0 operations repeated 0 times\"; delivered by 2 job \
         classes: A, \"B, C\""
    );
    assert!(lines[1].starts_with("\"Charge\\nJob\": 1 operation repeated 1 time"));
    assert!(
        lines[2].starts_with("orders and \"x\\nChargeOrderJob"),
        "{}",
        lines[2]
    );
}

/// Retry counts at the ends of an integer (i64::MAX, a u64 beyond it, i64::MIN) are
/// read without overflowing: no panic, saturated. Before, `retry_count + 1` and
/// `executions - 1` overflowed (a panic in a debug build, a wrap in release).
#[test]
fn reads_extreme_retry_counts_without_overflowing() {
    let d = [
        delivery(
            0.0,
            "a",
            json!({"decision": "claimed", "retry_count": i64::MAX}),
        ),
        delivery(
            1.0,
            "a",
            json!({"decision": "claimed", "retry_count": i64::MAX}),
        ),
        delivery(
            2.0,
            "a",
            json!({"decision": "claimed", "retry_count": u64::MAX}),
        ),
        delivery(
            3.0,
            "b",
            json!({"decision": "claimed", "executions": i64::MIN}),
        ),
        delivery(
            4.0,
            "b",
            json!({"decision": "claimed", "retries": i64::MAX}),
        ),
        delivery(
            5.0,
            "c",
            json!({"decision": "claimed", "retry_count": "99999999999999999999"}),
        ),
    ];
    let r = classify(&d, None, &[], 120.0);
    assert_eq!(r.len(), 5);
    assert_eq!(r[0].cause, Cause::Redelivery);
    assert_eq!(r[0].retry_count, Some(i64::MAX));
    assert_eq!(r[2].retry_count, Some(i64::MIN.saturating_sub(1)));
    assert_eq!(r[3].cause, Cause::QueueRetry);
}

/// A record's `repeat_facts` array wraps each delivery's facts two levels deeper (the
/// array, the element object): facts nested as deep as a claim accepts them
/// ([`crate::canonical::MAX_NESTING`]) are read; a hand-edited text deeper still is
/// refused with a clear error, never parsed recursively.
#[test]
fn reads_repeat_facts_at_the_depth_a_claim_accepted() {
    use crate::canonical::MAX_NESTING;
    let facts = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
    let object = |levels: usize| format!("{{\"deep\":{}}}", facts(levels - 1));
    let array = |levels: usize| {
        format!(
            r#"[{{"at": {T0}, "decision": "in_progress", "facts": {}}}]"#,
            object(levels)
        )
    };
    let d = row_deliveries_of(
        "J \"k\"",
        T0,
        Some(&object(MAX_NESTING)),
        &array(MAX_NESTING),
        &[],
        None,
    )
    .unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(d[1]["decision"], "in_progress");
    let err = row_deliveries_of("J \"k\"", T0, None, &array(MAX_NESTING + 1), &[], None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "the repeats of J \"k\" are not JSON: it holds a value nested deeper than 127"
        ),
        "{err}"
    );
    let err = row_deliveries_of(
        "J \"k\"",
        T0,
        Some(&object(MAX_NESTING + 1)),
        "[]",
        &[],
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("nested deeper than 127"), "{err}");
    // Brackets inside strings are not levels.
    let text = format!(
        r#"[{{"at": {T0}, "decision": "claimed", "facts": {{"s": "{}"}}}}]"#,
        "[".repeat(500)
    );
    assert_eq!(
        row_deliveries_of("J", T0, None, &text, &[], None)
            .unwrap()
            .len(),
        2
    );
    assert_eq!(crate::canonical::text_nesting(r#"["\"[", {"a": "\\"}]"#), 2);
}
