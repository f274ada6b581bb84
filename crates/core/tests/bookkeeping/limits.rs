//! The bookkeeping at its limits: counters at int4's maximum saturate, facts as deep as
//! a claim accepts are read back, a `since` before PostgreSQL's first timestamp.

use super::*;

/// Counters at int4's maximum (a record edited by hand, or counted for years) saturate:
/// a bookkeeping batch counting more duplicates and mismatches, a claim meeting a live
/// claim, and a takeover all succeed and leave each counter at 2147483647. Before
/// (`r.duplicates + b.dups` …) the batch failed with SQLSTATE 22003 ("integer out of
/// range") and was dropped, and every claim of the record failed.
#[test]
fn counters_at_int4_maximum_saturate_instead_of_failing_batches_and_claims() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let store = store_named(&unique("saturate"));
    let job_type = unique("Saturate");
    claim_all(&store, &job_type, &["a"]);
    let admin = Admin::new();
    let counters = || {
        admin.text(&format!(
            "SELECT concat_ws(',', attempts, takeovers, duplicates, mismatches) \
               FROM idempotent_job_records WHERE job_type = '{job_type}' AND operation_key = 'a'"
        ))
    };
    let max = "2147483647,2147483647,2147483647,2147483647";
    admin.exec(&format!(
        "UPDATE idempotent_job_records SET attempts = 2147483647, takeovers = 2147483647, \
                duplicates = 2147483647, mismatches = 2147483647 \
          WHERE job_type = '{job_type}' AND operation_key = 'a'"
    ));
    // A batch counting two duplicates, one with another payload.
    store
        .run(|pool, i| {
            pool.bookkeeper().record(duplicate(&job_type, "a"));
            pool.bookkeeper().record(Repeat {
                mismatch: true,
                ..duplicate(&job_type, "a")
            });
            pool.bookkeeper().settle(pool, i)
        })
        .unwrap();
    assert_eq!(counters(), max);
    let req = ClaimRequest {
        job_type: job_type.clone(),
        operation_key: "a".into(),
        lease_seconds: 30.0,
        args_digest: Some("other".into()),
        ..ClaimRequest::default()
    };
    // A copy meeting the live claim, then one taking the expired claim over.
    let live = store.run(|pool, i| claim::deliver(pool, i, &req)).unwrap();
    assert!(
        matches!(live.outcome, ClaimAnswer::InProgress { .. }),
        "{live:?}"
    );
    admin.exec(&format!(
        "UPDATE idempotent_job_records SET lease_expires_at = now() - interval '1 second' \
          WHERE job_type = '{job_type}' AND operation_key = 'a'"
    ));
    let taken = store.run(|pool, i| claim::deliver(pool, i, &req)).unwrap();
    assert!(
        !matches!(taken.outcome, ClaimAnswer::InProgress { .. }),
        "{taken:?}"
    );
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    assert_eq!(counters(), max);
}

/// A duplicate answered by a read-only server (SQLSTATE 25006: the read-only look) of a
/// record whose `duplicates` is at int4's maximum: the answer's count saturates as the
/// writable path's does. Before, `duplicates + pending + 1` overflowed there (a panic,
/// "attempt to add with overflow", in a debug build; a negative count in a release one).
#[test]
fn a_read_only_answer_of_a_record_counted_to_int4_maximum_saturates() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let writable = store_named(&unique("ro-saturate"));
    let job_type = unique("ReadOnlySaturate");
    let done = ClaimRequest {
        job_type: job_type.clone(),
        operation_key: "done".into(),
        lease_seconds: 30.0,
        ..ClaimRequest::default()
    };
    completed(&writable, &done);
    Admin::new().exec(&format!(
        "UPDATE idempotent_job_records SET duplicates = 2147483647 \
          WHERE job_type = '{job_type}' AND operation_key = 'done'"
    ));
    let read_only = read_only_store();
    // Twice: the second also counts the first's duplicate, still queued (pending).
    for _ in 0..2 {
        let answer = read_only.run(|pool, i| claim::deliver(pool, i, &done));
        assert!(
            matches!(
                answer,
                Ok(ClaimReply {
                    outcome: ClaimAnswer::Completed {
                        duplicates: 2147483647,
                        ..
                    },
                    ..
                })
            ),
            "{answer:?}"
        );
    }
}

/// Delivery facts nested as deep as a claim accepts them (the core's `MAX_NESTING`,
/// 127 levels) are read by the repeats report, although its `repeat_facts` array wraps
/// each in an element object (two levels more: past serde_json's own limit of 128).
/// Before, one such record made the whole report fail ("the repeats of … are not JSON:
/// recursion limit exceeded"); one level deeper is refused at the claim.
#[test]
fn the_repeats_report_reads_facts_nested_as_deep_as_a_claim_accepts() {
    use idempotent_job_core::canonical::MAX_NESTING;
    let store = store_named(&unique("deep-facts"));
    let job_type = unique("DeepFacts");
    let facts = |levels: usize| {
        format!(
            "{}{{}}{}",
            "{\"d\":".repeat(levels - 1),
            "}".repeat(levels - 1)
        )
    };
    let req = |levels: usize| ClaimRequest {
        job_type: job_type.clone(),
        operation_key: "a".into(),
        lease_seconds: 30.0,
        facts_json: Some(facts(levels)),
        ..ClaimRequest::default()
    };
    let too_deep = store.run(|pool, i| claim::deliver(pool, i, &req(MAX_NESTING + 1)));
    assert!(matches!(too_deep, Err(Error::Config(_))), "{too_deep:?}");
    for _ in 0..2 {
        store
            .run(|pool, i| claim::deliver(pool, i, &req(MAX_NESTING)))
            .unwrap();
    }
    let since = Utc::now() - chrono::Duration::hours(1);
    let rows = store
        .run(|pool, i| idempotent_job_core::operations::repeats(pool, i, since, Some(&job_type)))
        .unwrap();
    assert_eq!(rows.len(), 1);
    let ops = idempotent_job_core::repeats::operations(rows, &[], 120.0).unwrap();
    assert_eq!(ops[0].repeats.len(), 1);
    assert_eq!(ops[0].deliveries.len(), 2);
}

/// A `since` earlier than PostgreSQL's first timestamp (4714 BC; chrono, and so a
/// binding, takes years back to -262143) asks for every repeat: it is read as that
/// first timestamp. Before, `Repeats.report(since: Time.at(-2**40))` (or Python's
/// `repeats(since=-2**40)`) failed with PostgreSQL's DatabaseError 22008 "timestamp out
/// of range".
#[test]
fn a_since_before_postgresqls_first_timestamp_reads_every_repeat() {
    let store = store_named(&unique("early-since"));
    let job_type = unique("EarlySince");
    let req = ClaimRequest {
        job_type: job_type.clone(),
        operation_key: "a".into(),
        lease_seconds: 30.0,
        ..ClaimRequest::default()
    };
    for _ in 0..2 {
        store.run(|pool, i| claim::deliver(pool, i, &req)).unwrap();
    }
    for seconds in [-(1_i64 << 40), -210_866_803_201, -210_866_803_200] {
        let since = chrono::DateTime::from_timestamp(seconds, 0).unwrap();
        let rows = store.run(|pool, i| {
            idempotent_job_core::operations::repeats(pool, i, since, Some(&job_type))
        });
        assert_eq!(
            rows.map(|r| r.len()).map_err(|e| e.to_string()),
            Ok(1),
            "{seconds}"
        );
    }
}

/// A record whose `first_claimed_at` was edited by hand to `'infinity'` (no time of the
/// core's holds it) makes the repeats report fail with the core's UnreadableRecordError
/// naming the record (job type and operation key) and the column, as a record's own read
/// does, so the operator knows which row to fix.
#[test]
fn an_unreadable_first_claimed_at_in_the_repeats_report_names_the_record() {
    let store = store_named(&unique("infinite-first"));
    let job_type = unique("InfiniteFirst");
    let req = ClaimRequest {
        job_type: job_type.clone(),
        operation_key: "k-9".into(),
        lease_seconds: 30.0,
        ..ClaimRequest::default()
    };
    for _ in 0..2 {
        store.run(|pool, i| claim::deliver(pool, i, &req)).unwrap();
    }
    Admin::new().exec(&format!(
        "UPDATE idempotent_job_records SET first_claimed_at = 'infinity' WHERE job_type = '{job_type}'"
    ));
    let since = Utc::now() - chrono::Duration::hours(1);
    let read = store
        .run(|pool, i| idempotent_job_core::operations::repeats(pool, i, since, Some(&job_type)));
    // Gone before asserting: a report of every job type (another test's) reads it too.
    Admin::new().exec(&format!(
        "DELETE FROM idempotent_job_records WHERE job_type = '{job_type}'"
    ));
    let err = read.unwrap_err();
    assert!(matches!(err, Error::Unreadable(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "the record of {job_type} operation \"k-9\" cannot be read: its column first_claimed_at"
        )),
        "{text}"
    );
}

/// Every time column the repeats report reads (`first_claimed_at`, `completed_at`,
/// `repeat_times`), edited by hand to `'infinity'` or `'-infinity'`, makes the report fail
/// with the core's UnreadableRecordError naming the record and that column, as
/// `first_claimed_at`'s does: none is read into a time silently or reported without the
/// record it belongs to.
#[test]
fn every_unreadable_time_in_the_repeats_report_names_the_record_and_column() {
    let store = store_named(&unique("infinite-times"));
    let cases = [
        ("completed_at", "completed_at = 'infinity'"),
        ("completed_at", "completed_at = '-infinity'"),
        ("first_claimed_at", "first_claimed_at = '-infinity'"),
        (
            "repeat_times",
            "repeat_times = repeat_times || 'infinity'::timestamptz",
        ),
    ];
    for (column, set) in cases {
        let job_type = unique("InfiniteTime");
        let req = ClaimRequest {
            job_type: job_type.clone(),
            operation_key: "k-1".into(),
            lease_seconds: 30.0,
            ..ClaimRequest::default()
        };
        for _ in 0..2 {
            store.run(|pool, i| claim::deliver(pool, i, &req)).unwrap();
        }
        Admin::new().exec(&format!(
            "UPDATE idempotent_job_records SET {set} WHERE job_type = '{job_type}'"
        ));
        let since = Utc::now() - chrono::Duration::hours(1);
        let err = store
            .run(|pool, i| {
                idempotent_job_core::operations::repeats(pool, i, since, Some(&job_type))
            })
            .unwrap_err();
        assert!(matches!(err, Error::Unreadable(_)), "{set}: {err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "the record of {job_type} operation \"k-1\" cannot be read: its column {column}"
            )),
            "{set}: {text}"
        );
    }
}
