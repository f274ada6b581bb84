//! Any URL a Rails app already has works (issue 25 item 3): the parameters Rails or
//! libpq accept are honoured where they mean something to the gem (pool,
//! prepared_statements, connect_timeout, application_name, sslmode) and otherwise
//! ignored (the binding logs [`Config::ignored_url_params`] once); a parameter nobody
//! knows is an error naming it. Against the real PostgreSQL of DATABASE_URL.

mod common;
use common::StoreExt;

use common::database_url;
use idempotent_job_core::config::{Config, UrlParam};
use idempotent_job_core::store::Store;

/// DATABASE_URL with `query` appended (it has no query of its own in the suite).
fn with_query(query: &str) -> String {
    let url = database_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

const RAILS_QUERY: &str = "pool=25&encoding=unicode&timeout=5000&reconnect=true\
     &prepared_statements=false&application_name=railsy_app&connect_timeout=3&sslmode=disable\
     &variables%5Bstatement_timeout%5D=5000&checkout_timeout=5&idle_timeout=300\
     &schema_search_path=public&statement_limit=100&adapter=postgresql";

#[test]
fn a_rails_database_url_connects_and_its_parameters_take_effect() {
    let config = Config::from_json(
        &serde_json::json!({ "database_url": with_query(RAILS_QUERY) }).to_string(),
    )
    .expect("a Rails DATABASE_URL is accepted");
    assert_eq!(
        config.pool_size, 25,
        "pool is the pool size when pool_size is not set"
    );
    assert!(
        !config.prepared_statements,
        "prepared_statements=false: unnamed statements"
    );
    assert_eq!(
        config.ignored_url_params(),
        [
            "encoding",
            "timeout",
            "reconnect",
            "variables[statement_timeout]",
            "checkout_timeout",
            "idle_timeout",
            "schema_search_path",
            "statement_limit",
            "adapter"
        ]
    );
    let pg = config.pg_config().unwrap();
    assert_eq!(
        pg.get_connect_timeout(),
        Some(&std::time::Duration::from_secs(3))
    );
    assert_eq!(pg.get_application_name(), Some("railsy_app"));
    assert_eq!(pg.get_ssl_mode(), tokio_postgres::config::SslMode::Disable);

    // A real connection: PostgreSQL sees the URL's application_name.
    let store = Store::new(config).unwrap();
    let name: String = store
        .with_conn(async |c| {
            let row = c
                .query_typed("SELECT current_setting('application_name')", &[])
                .await?;
            Ok(row[0].get(0))
        })
        .unwrap();
    assert_eq!(name, "railsy_app");
}

#[test]
fn an_explicit_pool_size_wins_over_the_urls_pool() {
    let json = serde_json::json!({ "database_url": with_query("pool=25"), "pool_size": 4 });
    assert_eq!(Config::from_json(&json.to_string()).unwrap().pool_size, 4);
    assert_eq!(Config::new(with_query("pool=7")).pool_size, 7);
}

#[test]
fn a_parameter_nobody_knows_is_an_error_naming_it() {
    for (query, named) in [
        ("pool=5&poool=3", "poool (did you mean pool?)"),
        ("sslmdoe=require", "sslmdoe (did you mean sslmode?)"),
        ("frobnicate=1", "frobnicate; remove it"),
    ] {
        let err = Config::new(with_query(query))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "database_url has a parameter neither PostgreSQL (libpq) nor Rails knows: {named}"
            )),
            "{query}: {err}"
        );
    }
    let err = Config::new(with_query("pool=many"))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pool must be a positive integer, got \"many\""),
        "{err}"
    );
    let err = Config::new(with_query("prepared_statements=maybe"))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prepared_statements must be true or false"),
        "{err}"
    );
}

#[test]
fn a_bad_key_value_string_names_its_option() {
    let err = Config::new("host=127.0.0.1 pool=5")
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown option `pool`"), "{err}");
}

#[test]
fn each_parameter_is_classified_once() {
    assert_eq!(UrlParam::of("connect_timeout"), UrlParam::Driver);
    assert_eq!(UrlParam::of("sslrootcert"), UrlParam::Tls);
    assert_eq!(UrlParam::of("pool"), UrlParam::Pool);
    assert_eq!(UrlParam::of("variables[search_path]"), UrlParam::Ignored);
    assert_eq!(UrlParam::of("client_encoding"), UrlParam::Ignored);
    assert_eq!(UrlParam::of("nonsense"), UrlParam::Unknown);
}
