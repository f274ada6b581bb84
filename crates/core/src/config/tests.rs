//! Unit tests of the settings: defaults, validation, URL parameters, redaction.
#[test]
fn connection_defaults_are_the_configs_own() {
    let rows = super::connection_defaults_json();
    assert_eq!(rows["connect_timeout"], serde_json::json!(5));
    assert_eq!(rows["deadline"], serde_json::json!(10));
    assert_eq!(
        rows["application_name"],
        serde_json::json!("idempotent_job")
    );
    assert_eq!(rows["sslmode"], serde_json::Value::Null);
    assert_eq!(
        rows.as_object().unwrap().len(),
        super::CONNECTION_SETTINGS.len()
    );
}

use super::*;
use crate::tls::SslMode;
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn unknown_keys_are_rejected_by_name() {
    let err = Config::from_json(r#"{"database_url":"postgres://h/db","pool_sise":3}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("pool_sise"), "{err}");
}

#[test]
fn connection_settings_are_configs_fields() {
    // serde lists the fields it expects when it meets an unknown one.
    let err = Config::from_json(r#"{"zz":1}"#).unwrap_err().to_string();
    let (_, expected) = err.split_once("expected one of ").unwrap();
    let mut fields: Vec<&str> = expected
        .split(", ")
        .map(|f| f.trim_matches(|c: char| c == '`' || !c.is_ascii() || c.is_whitespace()))
        .map(|f| f.split('`').next().unwrap())
        .collect();
    fields.sort_unstable();
    let mut listed = CONNECTION_SETTINGS.to_vec();
    listed.sort_unstable();
    assert_eq!(fields, listed, "{err}");
    let err =
        crate::options::unknown_setting("leese", "leese", &["lease", "retention"]).to_string();
    assert_eq!(
        err,
        "unknown idempotent_job setting leese (did you mean lease?) (known: lease, retention)"
    );
}

#[test]
fn bad_values_name_the_key() {
    let err = Config::from_json(r#"{"database_url":"postgres://h/db","checkout_timeout":0}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("checkout_timeout"), "{err}");
    let err = Config::from_json(r#"{"database_url":""}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("database_url is not set"), "{err}");
}

#[test]
fn discrete_fields_without_a_host_name_the_missing_host() {
    // A Rails database.yml without `host:` (its Unix-socket default) gives dbname and
    // user but no host: the message must say host is the one missing, and how to set it.
    let err = Config::from_json(r#"{"database_url":"","dbname":"app","user":"app"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("host is not set"), "{err}");
    assert!(err.contains("dbname, user"), "{err}");
    assert!(err.contains("/var/run/postgresql"), "{err}");
    // With nothing at all, the message still names the URL settings.
    let err = Config::from_json(r#"{"database_url":""}"#)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("database_url is not set"), "{err}");
}

#[test]
fn passwords_never_appear_in_messages_or_debug() {
    for url in [
        "postgres://app:s3cret-pw@db.example/app?sslmode=bogus",
        "postgres://app:pa/s3cret-pw@db.example/app?port=x",
        "host=h password=s3cret-pw port=notaport",
        "host=h password = s3cret-pw port=notaport",
        "host=h password='s3cret-pw x' port=notaport",
        "postgres://app:s3cret-pw@db.example:99999/app",
    ] {
        let c = Config::new(url);
        let err = c.validate().unwrap_err().to_string();
        assert!(!err.contains("s3cret-pw"), "{url}: {err}");
        assert!(!format!("{c:?}").contains("s3cret-pw"), "{url}");
        assert!(!describe_url(url).contains("s3cret-pw"), "{url}");
    }
}

#[test]
fn tls_parameters_come_from_the_url_or_the_settings() {
    let mut c = Config::new(
        "postgres://u@h/db?sslmode=verify-full&options=-c%20statement_timeout%3D5&sslrootcert=/ca.pem",
    );
    let tls = c.tls().unwrap();
    assert_eq!(tls.mode, SslMode::VerifyFull);
    assert_eq!(tls.rootcert, Some(PathBuf::from("/ca.pem")));
    let pg = c.pg_config().unwrap();
    assert_eq!(pg.get_options(), Some("-c statement_timeout=5"));
    assert_eq!(pg.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
    c.sslmode = Some("disable".into());
    assert_eq!(c.tls().unwrap().mode, SslMode::Disable);
    c.sslmode = Some("verify-everything".into());
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("sslmode must be"));
}

#[test]
fn a_key_value_sslmode_is_kept() {
    let c = Config::new("host=h user=u sslmode=require");
    assert_eq!(c.tls().unwrap().mode, SslMode::Require);
    assert_eq!(
        c.pg_config().unwrap().get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );
    let c = Config::new("host=h user=u sslmode=disable");
    assert_eq!(c.tls().unwrap().mode, SslMode::Disable);
}

#[test]
fn prepared_statements_default_to_on_and_must_be_a_boolean() {
    let c = Config::from_json(r#"{"database_url":"postgres://h/db"}"#).unwrap();
    assert!(c.prepared_statements);
    assert!(Config::new("postgres://h/db").prepared_statements);
    let c = Config::from_json(r#"{"database_url":"postgres://h/db","prepared_statements":false}"#)
        .unwrap();
    assert!(!c.prepared_statements);
    assert!(format!("{c:?}").contains("prepared_statements: false"));
    let err = Config::from_json(r#"{"database_url":"postgres://h/db","prepared_statements":"no"}"#)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        r#"prepared_statements must be true or false, got "no""#
    );
}

#[test]
fn a_url_with_a_wrong_scheme_says_so() {
    let err = Config::from_json(r#"{"database_url":"postgress://u@h/db"}"#)
        .and_then(|c| c.pg_config())
        .unwrap_err()
        .to_string();
    assert!(err.contains(r#"scheme "postgress""#), "{err}");
    assert!(err.contains("postgres://"), "{err}");
}

#[test]
fn the_deadline_defaults_to_ten_seconds_and_must_be_positive() {
    let c = Config::from_json(r#"{"database_url":"postgres://h/db"}"#).unwrap();
    assert_eq!(c.deadline, 10.0);
    assert_eq!(
        c.pg_config().unwrap().get_tcp_user_timeout(),
        Some(&Duration::from_secs(10))
    );
    for bad in ["0", "-1", "3000000"] {
        let err = Config::from_json(&format!(
            r#"{{"database_url":"postgres://h/db","deadline":{bad}}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("deadline"), "{err}");
    }
}

#[test]
fn describes_urls_by_their_parts() {
    assert_eq!(
        describe_url("postgres://u:p@h:5/db?sslmode=disable"),
        "postgres://u@h:5/db"
    );
    assert_eq!(
        describe_url("host=h port=7 user=u password=p dbname=d"),
        "postgres://u@h:7/d"
    );
    assert_eq!(describe_url("postgres://u:p@h:notaport/db"), "(unparsable)");
}

/// Issue 30: every duration setting has the same ten-year cap as the job options
/// (a larger one never times out under tokio, whose `timeout` past `Instant`'s range
/// has no deadline, and above u64::MAX seconds `Duration::from_secs_f64` panics), and
/// pool_size has PostgreSQL's limit of connections (deadpool sizes its slots by it).
#[test]
fn durations_and_sizes_beyond_any_use_are_refused_by_the_cores_rule() {
    for (name, bad) in [
        ("connect_timeout", "315360001"),
        ("connect_timeout", "1e20"),
        ("checkout_timeout", "1e20"),
        ("enqueue_check_timeout", "315360001"),
        ("pool_size", "1000000000000"),
    ] {
        let result = Config::from_json(&format!(
            r#"{{"database_url":"postgres://h/db","{name}":{bad}}}"#
        ));
        let err = result.map(|_| ()).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{name} must be ")), "{err}");
    }
    let err =
        Config::from_json(r#"{"database_url":"postgres://h/db","connect_timeout":315360001}"#)
            .map(|_| ())
            .unwrap_err()
            .to_string();
    assert_eq!(
        err,
        "connect_timeout must be a positive number of seconds up to 315360000 (ten years), got 315360001"
    );
    let c = Config::from_json(r#"{"database_url":"postgres://h/db","connect_timeout":315360000}"#)
        .unwrap();
    assert_eq!(c.connect_timeout(), Duration::from_secs(315_360_000));
}

/// Issue 30: one rule and one wording per setting, for a binding's check at assignment
/// (`shown`: the host's notation) as for `from_json`; the job options' wording.
#[test]
fn each_setting_is_checked_alone_in_the_options_words() {
    use serde_json::json;
    let err = |name: &str, value: serde_json::Value, shown: Option<&str>| {
        check_setting(name, &value, shown).unwrap_err().to_string()
    };
    assert_eq!(
        err("pool_size", json!(0), None),
        "pool_size must be a whole number from 1 to 262143 (PostgreSQL's most connections), got 0"
    );
    assert_eq!(
        err("port", json!(70_000), None),
        "port must be a whole number from 1 to 65535 (a TCP port), got 70000"
    );
    assert_eq!(
        err("max_result_bytes", json!(268_435_456), None),
        "max_result_bytes must be a whole number from 1 to 268435455 (jsonb's limit), got 268435456"
    );
    assert_eq!(
        err("compatibility", json!("cockroach"), Some(":cockroach")),
        "compatibility must be one of postgresql, distributed, got :cockroach"
    );
    assert_eq!(
        err("statement_timeout", json!(3_000_000), None),
        "statement_timeout must be a positive number of seconds up to 2147483 (PostgreSQL's limit), got 3000000"
    );
    // The same words as the job option of the same limit.
    let lock = crate::options::check("", "", "lock_timeout", &json!(3_000_000), None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        lock.replacen("lock_timeout", "deadline", 1),
        err("deadline", json!(3_000_000), None)
    );
    assert_eq!(
        err("checkout_timeout", json!(null), Some("nil")),
        "checkout_timeout must be a positive number of seconds up to 315360000 (ten years), got nil"
    );
    assert_eq!(
        err("application_name", json!(""), None),
        "application_name must not be empty"
    );
    assert!(err("schema", json!("a-b"), None)
        .starts_with("schema must be a plain PostgreSQL identifier"));
    assert_eq!(err("host", json!(5), None), "host must be a string, got 5");
    // A secret setting's value is never shown, whatever the caller's notation.
    assert_eq!(
        err("password", json!(12345), Some("12345")),
        "password must be a string, got [REDACTED]"
    );
    assert!(!err("database_url", json!({"u": "pa55"}), None).contains("pa55"));
    // Unset: the default (or the URL's) for those that may be unset.
    for name in [
        "pool_size",
        "statement_timeout",
        "max_result_bytes",
        "port",
        "password",
    ] {
        assert_eq!(
            check_setting(name, &json!(null), None).unwrap(),
            json!(null),
            "{name}"
        );
    }
    assert_eq!(
        check_setting("compatibility", &json!("distributed"), None).unwrap(),
        json!("distributed")
    );
    assert!(check_setting("lease", &json!(5), None).is_err());
    // from_json takes an unset one as its default, and says the same words.
    let c = Config::from_json(
        r#"{"database_url":"postgres://h/db","pool_size":null,"max_result_bytes":null}"#,
    )
    .unwrap();
    assert_eq!(
        (c.pool_size, c.max_result_bytes),
        (10, DEFAULT_MAX_RESULT_BYTES)
    );
    let e = Config::from_json(r#"{"database_url":"postgres://h/db","pool_size":"5"}"#)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert_eq!(e, err("pool_size", json!("5"), None));
    // Every setting has a rule, in the settings' order.
    let names: Vec<&str> = SETTING_RULES.iter().map(|r| r.name).collect();
    assert_eq!(names, CONNECTION_SETTINGS);
}

/// Issue 30 item E: the pool size of an unset pool_size, the core's for every binding.
#[test]
fn an_unset_pool_size_is_the_queues_concurrency_plus_headroom_else_ten() {
    assert_eq!(pool_size_for(None), 10);
    assert_eq!(pool_size_for(None), Config::new("").pool_size);
    assert_eq!(pool_size_for(Some(25)), 25 + POOL_HEADROOM);
    assert_eq!(pool_size_for(Some(usize::MAX)), MAX_POOL_SIZE);
}

/// Issue 30: the URL's own connect_timeout has the `connect_timeout` setting's rule and
/// words (ten years at most): a huge one passed the driver's parse and never fired
/// (past tokio's `Instant` range), and 1e30 was refused only as unparsable.
#[test]
fn the_urls_connect_timeout_is_capped_by_the_settings_rule() {
    let refused = |url: &str| {
        Config::from_json(&serde_json::json!({ "database_url": url }).to_string())
            .and_then(|c| c.pg_config())
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let rule = "a positive number of seconds up to 315360000 (ten years)";
    for bad in ["1e30", "315360001", "99999999999999", "inf", "nan"] {
        assert_eq!(
            refused(&format!("postgres://h/db?connect_timeout={bad}")),
            format!("database_url parameter connect_timeout must be {rule}, got \"{bad}\"")
        );
    }
    // A key/value string's, judged once the driver parsed it.
    assert_eq!(
        refused("host=h dbname=db connect_timeout=315360001"),
        format!("database_url parameter connect_timeout must be {rule}, got \"315360001\"")
    );
    // The setting's words are the same.
    assert_eq!(
        Config::from_json(r#"{"database_url":"postgres://h/db","connect_timeout":315360001}"#)
            .map(|_| ())
            .unwrap_err()
            .to_string(),
        format!("connect_timeout must be {rule}, got 315360001")
    );
    for good in [
        "postgres://h/db?connect_timeout=315360000",
        "postgres://h/db?connect_timeout=3",
        "postgres://h/db?connect_timeout=0",
        "host=h dbname=db connect_timeout=315360000",
    ] {
        let c =
            Config::from_json(&serde_json::json!({ "database_url": good }).to_string()).unwrap();
        c.pg_config().unwrap();
    }
    let c = Config::from_json(r#"{"database_url":"postgres://h/db?connect_timeout=7"}"#).unwrap();
    assert_eq!(
        c.pg_config().unwrap().get_connect_timeout(),
        Some(&Duration::from_secs(7))
    );
}

#[test]
fn a_nul_in_a_text_the_connection_sends_is_refused_naming_it_never_its_value() {
    // The startup and password messages are C strings: a NUL was accepted here and every
    // connect then failed as a retryable ConnectionError ("string contains embedded
    // null") after retrying until the deadline, naming neither setting nor job.
    for (name, value) in [
        ("application_name", "a\0b"),
        ("user", "post\0gres"),
        ("dbname", "x\0"),
        ("password", "s3cr\0t"),
        ("host", "127.0.0.1\0"),
    ] {
        let err = check_setting(name, &serde_json::json!(value), None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&format!("{name} must be")), "{err}");
        assert!(err.contains("NUL"), "{err}");
        assert!(!err.contains("s3cr"), "{err}");
        let json = serde_json::json!({ "database_url": "postgres://h/db", name: value });
        let err = Config::from_json(&json.to_string())
            .unwrap_err()
            .to_string();
        assert!(err.contains(name) && err.contains("NUL"), "{err}");
    }
    for (url, names) in [
        ("postgres://h/db?application_name=a%00b", "application_name"),
        ("postgres://u%00x@h/db", "user"),
        ("postgres://h/d%00b", "dbname"),
        ("postgres://u:s3cr%00t@h/db", "password"),
        ("postgres://h/db?options=-c%20x%3Dy%00", "options"),
    ] {
        let err = Config::new(url).validate().unwrap_err().to_string();
        assert!(
            err.contains(&format!("database_url's {names}")) && err.contains("NUL"),
            "{url}: {err}"
        );
        assert!(!err.contains("s3cr"), "{err}");
    }
}

#[test]
fn a_nul_in_a_urls_tls_path_is_refused_escaped_as_the_setting_form_shows_it() {
    // A NUL in the URL's sslrootcert/sslcert/sslkey was refused only when the pool opened
    // the file ("sslrootcert /a<NUL>b: file name contained an unexpected NUL byte"), the
    // raw NUL in the message, where the setting form shows it escaped (JSON's \u0000).
    for name in ["sslrootcert", "sslcert", "sslkey"] {
        let setting = check_setting(name, &serde_json::json!("/a\0b.pem"), None)
            .unwrap_err()
            .to_string();
        assert!(setting.contains(r#""/a\u0000b.pem""#), "{setting}");
        let url = format!("postgres://h/db?sslmode=verify-full&{name}=/a%00b.pem");
        let err = Config::new(&url).validate().unwrap_err().to_string();
        assert_eq!(err, format!("database_url's {setting}"), "{url}");
        assert!(!err.contains('\0'), "{err:?}");
    }
}
