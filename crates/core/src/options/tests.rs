//! The option table's tests: names, kinds, limits, defaults, the check's messages.

use serde_json::{json, Value};

use super::*;

#[test]
fn every_name_is_unique_and_findable() {
    for option in JOB_OPTIONS {
        assert_eq!(find(option.name).unwrap().name, option.name);
    }
    let mut names: Vec<_> = JOB_OPTIONS.iter().map(|o| o.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), JOB_OPTIONS.len());
}

#[test]
fn a_misspelled_name_gets_the_nearest_known_one() {
    let err = unknown("ChargeJob", "idempotency_", "on_stail").to_string();
    assert!(
        err.starts_with(
            "ChargeJob: unknown option idempotency_on_stail (did you mean idempotency_on_stale?)"
        ),
        "{err}"
    );
    assert!(err.contains("idempotency_lock_timeout"), "{err}");
    assert_eq!(suggestion("keys"), Some("key"));
    assert_eq!(suggestion("hearbeat"), Some("heartbeat"));
    assert_eq!(suggestion("zzz"), None);
    assert_eq!(suggestion("idempotency_lease"), Some("lease"));
    assert_eq!(
        not_taken(
            "Charge",
            "perform_once",
            ":on_stael",
            "on_stael",
            &["lease", "on_stale"],
            ":"
        )
        .to_string(),
        "Charge: perform_once does not take :on_stael (did you mean on_stale:?) (it takes \
         lease:, on_stale:)"
    );
    let err = unknown_among("T", "idempotency_", "leese", &["key", "lease"]).to_string();
    assert_eq!(
        err,
        "T: unknown option idempotency_leese (did you mean idempotency_lease?); known \
         options: idempotency_key, idempotency_lease"
    );
}

#[test]
fn values_of_the_wrong_kind_are_refused_by_name() {
    let err = |name: &str, value: Value| {
        check("J", "idempotency_", name, &value, None)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err("heartbeat", json!("false")),
        "J: idempotency_heartbeat must be true or false, got \"false\""
    );
    assert!(err("on_stale", json!("hodl")).contains("must be one of reclaim, hold, skip"));
    assert!(err("lease", json!(0.1)).contains("must be at least 0.25 s"));
    assert!(err("lease", json!("60")).contains("positive number of seconds"));
    assert!(err("lock_timeout", json!(3_000_000)).contains("PostgreSQL's limit"));
    assert!(err("scope", json!("")).contains("must not be empty"));
    assert!(err("transaction", json!("yes")).contains("true, false or one of"));
    assert!(err("max_takeovers", json!(-1)).contains("a whole number from 0 to"));
    assert!(err("max_takeovers", json!(2.5)).contains("a whole number from 0 to"));
    assert!(err("max_takeovers", json!("2")).contains("a whole number from 0 to"));
    assert_eq!(suggestion("max_takeover"), Some("max_takeovers"));
}

#[test]
fn good_values_come_back_normalised() {
    let ok = |name: &str, value: Value| check("J", "", name, &value, None).unwrap();
    assert_eq!(ok("lease", json!(0.25)), json!(0.25));
    assert_eq!(ok("lease", json!(60)), json!(60));
    assert_eq!(ok("transaction", json!(true)), json!("native"));
    assert_eq!(ok("transaction", json!(false)), Value::Null);
    assert_eq!(ok("on_stale", json!("hold")), json!("hold"));
    assert_eq!(ok("heartbeat", Value::Null), Value::Null);
    assert_eq!(ok("key", json!(["a", 1])), json!(["a", 1]));
}

#[test]
fn the_table_carries_kinds_limits_and_defaults() {
    let table = table_json();
    assert_eq!(table["lease"]["min"], json!(0.25));
    assert_eq!(table["lease"]["default"], json!(300));
    assert_eq!(
        table["on_stale"]["allowed"],
        json!(["reclaim", "hold", "skip"])
    );
    assert_eq!(table["scope"]["default_is_job_name"], json!(true));
    assert_eq!(table["key"]["required"], json!(true));
}
