//! The distributed profile (`compatibility: "distributed"`, docs/scaling.md) forced on
//! plain PostgreSQL (DATABASE_URL), and conflicts (40001) injected into every writing
//! statement: each operation still runs exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::{Admin, StoreExt};
use idempotent_job_core::config::{Config, DEFAULT_MAX_RESULT_BYTES};
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::migrate;
use idempotent_job_core::protocol::{
    DeliveryRequest, Direct, DoorWords, JobOptions, Notes, Protocol, Step,
};
use idempotent_job_core::store::Store;

mod common;

fn distributed_store(pool_size: usize) -> Store {
    let mut config = Config::new(common::database_url());
    config.compatibility = "distributed".into();
    config.pool_size = pool_size;
    let store = Store::new(config).unwrap();
    store.run(|pool, i| migrate::migrate(pool, i)).unwrap();
    store
}

#[test]
fn an_unknown_compatibility_is_refused_naming_the_values() {
    let mut config = Config::new(common::database_url());
    config.compatibility = "cockroach".into();
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains(r#"compatibility must be one of postgresql, distributed, got "cockroach""#),
        "{err}"
    );
    let from_json = Config::from_json(&format!(
        r#"{{"database_url":{:?},"compatibility":"distributed"}}"#,
        common::database_url()
    ))
    .unwrap();
    assert!(from_json.distributed() && !from_json.named_statements());
}

/// Runs one delivery to its end, coming back after a deferral, as a door does; `effect`
/// is the body.
fn deliver(store: &Store, protocol: &Protocol, job: &str, key: &str, effect: &dyn Fn()) {
    let delivery = DeliveryRequest {
        job_type: job.into(),
        operation_key: key.into(),
        delivery_id: Some(uuid::Uuid::new_v4().to_string()),
        ..DeliveryRequest::default()
    };
    let i = Interrupt::none();
    loop {
        let mut notes = Notes::new();
        let mut channel = Direct::new(store.pool().unwrap(), false);
        match protocol
            .begin(&mut channel, &i, &delivery, &mut notes)
            .unwrap()
        {
            Step::Run(claim) => {
                effect();
                let done = protocol
                    .complete(
                        &mut channel,
                        &i,
                        claim,
                        None,
                        DEFAULT_MAX_RESULT_BYTES,
                        &mut notes,
                    )
                    .unwrap();
                assert!(done.recorded, "{key}: the completion was recorded");
                return;
            }
            Step::InProgress(_) => thread::sleep(Duration::from_millis(20)),
            Step::Skip(_) => return,
            Step::AskLookup(_) => panic!("no lookup is declared"),
        }
    }
}

/// A trigger that fails the first attempt of every writing statement of
/// `InjectedConflictJob` with 40001: "first" is remembered by a session advisory lock
/// per (key, operation, new status, token), which a rolled-back transaction keeps.
const INJECT: &str = r#"
CREATE OR REPLACE FUNCTION idempotent_job_test_inject_40001() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE h int4 := hashtext(NEW.operation_key || TG_OP || NEW.status || coalesce(NEW.claim_token::text, ''));
BEGIN
  IF NEW.job_type = 'InjectedConflictJob'
     AND NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 4035
                     AND objid = (h::int8 & 4294967295)::oid AND objsubid = 2)
     AND pg_try_advisory_lock(4035, h) THEN
    RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS idempotent_job_test_inject_40001 ON idempotent_job_records;
CREATE TRIGGER idempotent_job_test_inject_40001 BEFORE INSERT OR UPDATE ON idempotent_job_records
  FOR EACH ROW EXECUTE FUNCTION idempotent_job_test_inject_40001();
"#;

#[test]
fn an_injected_40001_on_every_writing_statement_still_completes_every_operation_once() {
    let store = distributed_store(6);
    let admin = Admin::new();
    admin.exec(INJECT);
    let protocol = Protocol::new(
        "InjectedConflictJob",
        JobOptions {
            heartbeat: false,
            ..JobOptions::default()
        },
        DoorWords::default(),
    )
    .unwrap();
    let run = uuid::Uuid::new_v4().to_string();
    let keys: Vec<String> = (0..20).map(|n| format!("{run}-{n}")).collect();
    let effects: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    // Three copies of every operation, delivered at once from three threads.
    let result = thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    for key in &keys {
                        let effects = Arc::clone(&effects);
                        let k = key.clone();
                        deliver(&store, &protocol, "InjectedConflictJob", key, &move || {
                            *effects.lock().unwrap().entry(k.clone()).or_default() += 1;
                        });
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    let injected =
        admin.int("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 4035");
    admin.exec(
        "DROP TRIGGER idempotent_job_test_inject_40001 ON idempotent_job_records; \
         DROP FUNCTION idempotent_job_test_inject_40001()",
    );
    for r in result {
        r.expect("a delivery thread panicked");
    }
    let effects = effects.lock().unwrap();
    for key in &keys {
        assert_eq!(effects.get(key), Some(&1), "{key} ran once");
        let req = DeliveryRequest {
            job_type: "InjectedConflictJob".into(),
            operation_key: key.clone(),
            ..DeliveryRequest::default()
        }
        .claim_request(&JobOptions::default());
        let record = common::find_record(&store, &req).unwrap();
        assert_eq!(record.status, "completed", "{key}");
    }
    // Each operation's first claim and its completion at least were rolled back once.
    assert!(
        injected >= 2 * keys.len() as i64,
        "{injected} statements failed with the injected 40001"
    );
    println!("{injected} writing statements failed once with 40001; every operation ran once");
}

#[test]
fn the_distributed_profile_prepares_nothing_and_migrates_by_a_lock_row() {
    let store = distributed_store(1);
    // Two more migrators at once: each waits for the lock row, then finds nothing to do.
    let both: Vec<Vec<String>> = thread::scope(|scope| {
        let a = scope.spawn(|| distributed_store(1).run(|p, i| migrate::migrate(p, i)));
        let b = scope.spawn(|| distributed_store(1).run(|p, i| migrate::migrate(p, i)));
        vec![a.join().unwrap().unwrap(), b.join().unwrap().unwrap()]
    });
    assert_eq!(both, vec![Vec::<String>::new(), Vec::new()]);
    let admin = Admin::new();
    assert_eq!(
        admin.int("SELECT count(*) FROM idempotent_job_migration_lock"),
        0,
        "the lock row is given back"
    );
    let protocol = Protocol::new(
        "DistributedJob",
        JobOptions::default(),
        DoorWords::default(),
    )
    .unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let ran = Mutex::new(0);
    deliver(&store, &protocol, "DistributedJob", &key, &|| {
        *ran.lock().unwrap() += 1
    });
    assert_eq!(*ran.lock().unwrap(), 1);
    assert_eq!(
        common::prepared_on_connection(&store),
        Vec::<(String, Option<i64>)>::new(),
        "no named statement on the profile's connection"
    );
}

/// The profile's promises that are properties of the text: no statement the gem sends
/// makes a SAVEPOINT (the transactional modes, native and ActiveRecord, use one
/// transaction and none), and `pg_advisory_lock` appears only in the plain profile's
/// migration.
#[test]
fn no_statement_makes_a_savepoint_and_only_plain_migrations_take_an_advisory_lock() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    // Every file under each directory, subdirectories included (the statements live in
    // `src/sql/`, one file per concern).
    fn sources(dir: &std::path::Path, files: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "rb") {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["crates/core/src", "lib/idempotent_job/transactional"] {
        sources(std::path::Path::new(&format!("{root}/{dir}")), &mut files);
    }
    assert!(
        files.len() > 20,
        "read the core's and the transactional modes' sources"
    );
    for statements in [
        "sql/claim.rs",
        "sql/fenced.rs",
        "sql/flush.rs",
        "record/stored.rs",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(statements)),
            "read the statement texts in {statements}"
        );
    }
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap().to_uppercase();
        assert!(!text.contains("SAVEPOINT"), "{}", path.display());
        if !path.ends_with("migrate.rs") {
            assert!(!text.contains("PG_ADVISORY"), "{}", path.display());
        }
    }
}
