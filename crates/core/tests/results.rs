//! Stored results and replays (V7) and waiting for a running claim, against PostgreSQL
//! (DATABASE_URL).

mod common;
use common::StoreExt;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::claim::{self, ClaimAnswer, ClaimRequest};
use common::{find_record, store, store_with};
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::Error;
use idempotent_job_core::results::{
    self, PreparedResult, Replay, ResultInput, ResultState, WaitPath,
};
use idempotent_job_core::session::Session;
use idempotent_job_core::store::Store;

fn request(job_type: &str, lease: f64) -> ClaimRequest {
    ClaimRequest {
        job_type: job_type.into(),
        operation_key: uuid::Uuid::new_v4().to_string(),
        delivery_id: Some(uuid::Uuid::new_v4().to_string()),
        lease_seconds: lease,
        ..Default::default()
    }
}

fn deliver(store: &Store, req: &ClaimRequest) -> ClaimAnswer {
    let req = req.clone();
    store
        .run(|pool, i| claim::deliver(pool, i, &req))
        .unwrap()
        .outcome
}

fn token_of(outcome: ClaimAnswer) -> uuid::Uuid {
    match outcome {
        ClaimAnswer::Claimed { token, .. } => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn prepare(store: &Store, req: &ClaimRequest, input: ResultInput<'_>) -> PreparedResult {
    results::prepare(
        store.config().max_result_bytes,
        &req.job_type,
        &req.operation_key,
        input,
    )
}

fn complete(store: &Store, req: &ClaimRequest, token: uuid::Uuid, result: &PreparedResult) {
    let req = req.clone();
    store
        .with_conn(async |c| {
            claim::complete_with_result(c, false, &req.job_type, &req.operation_key, token, result)
                .await
        })
        .unwrap();
}

fn replay_of(outcome: ClaimAnswer) -> Option<Replay> {
    match outcome {
        ClaimAnswer::Completed { replay, .. } => replay,
        other => panic!("expected completed, got {other:?}"),
    }
}

#[test]
fn a_completion_stores_the_result_and_a_repeat_replays_it_from_either_statement() {
    let store = store();
    let req = request("ResultsStored", 30.0);
    let token = token_of(deliver(&store, &req));
    let result = prepare(&store, &req, ResultInput::Json(r#"{"charge_id":"ch_1"}"#));
    assert_eq!(result.state, ResultState::Stored);
    assert_eq!(result.warning, None);
    complete(&store, &req, token, &result);
    // The look (DELIVER_SQL) of a repeat.
    let replay = replay_of(deliver(&store, &req)).expect("a replay");
    assert_eq!(replay.json.as_deref(), Some(r#"{"charge_id": "ch_1"}"#));
    assert!(replay.stored());
    // The claim statement (CLAIM_SQL, as transactions and ActiveRecord send it).
    let via_claim = store
        .with_conn(async |c| claim::claim(c, &req).await)
        .unwrap();
    assert_eq!(replay_of(via_claim.outcome), Some(replay));
    let record = find_record(&store, &req).unwrap();
    assert_eq!(record.result_state.as_deref(), Some("stored"));
    assert_eq!(record.status, "completed");
}

#[test]
fn a_plain_completion_stores_nothing_and_a_repeat_has_no_replay() {
    let store = store();
    let req = request("ResultsNone", 30.0);
    let token = token_of(deliver(&store, &req));
    let req2 = req.clone();
    store
        .with_conn(async |c| claim::complete(c, &req2.job_type, &req2.operation_key, token).await)
        .unwrap();
    assert_eq!(replay_of(deliver(&store, &req)), None);
    let record = find_record(&store, &req).unwrap();
    assert_eq!((record.result_json, record.result_state), (None, None));
}

#[test]
fn a_result_that_cannot_be_stored_never_undoes_the_completion() {
    let mut config = idempotent_job_core::config::Config::new(common::database_url());
    config.max_result_bytes = 16;
    let store = Store::new(config).unwrap();
    for (input, state, why) in [
        (
            ResultInput::Json(r#""a string longer than sixteen bytes""#),
            ResultState::TooLarge,
            "over max_result_bytes (16)",
        ),
        (
            ResultInput::Unencodable("a Time at $"),
            ResultState::Unencodable,
            "a Time at $",
        ),
        (
            ResultInput::Json(r#""a\u0000""#),
            ResultState::Unencodable,
            "U+0000",
        ),
        (
            ResultInput::Json("{nope"),
            ResultState::Unencodable,
            "not valid JSON",
        ),
    ] {
        let req = request("ResultsUnstored", 30.0);
        let token = token_of(deliver(&store, &req));
        let result = prepare(&store, &req, input);
        assert_eq!((result.json.as_deref(), result.state), (None, state));
        let warning = result.warning.clone().expect("a warning");
        assert!(
            warning.contains(why) && warning.contains(&req.operation_key),
            "{warning}"
        );
        complete(&store, &req, token, &result);
        let replay = replay_of(deliver(&store, &req)).expect("the repeat learns it");
        assert_eq!((replay.json, replay.state), (None, state));
        assert!(!ResultState::Stored.eq(&replay.state));
    }
}

#[test]
fn a_transactional_completion_stores_the_result_with_its_commit() {
    let store = store();
    let req = request("ResultsTx", 30.0);
    let result = prepare(&store, &req, ResultInput::Json("[1,2]"));
    store
        .run(|pool, i| {
            let mut session = Session::begin(pool, i)?;
            let token = token_of(session.claim(i, &req, 5.0)?.outcome);
            session.fenced_with_result(
                i,
                claim::Fenced::Complete,
                &req.job_type,
                &req.operation_key,
                token,
                None,
                Some(&result),
            )?;
            session.commit(i)
        })
        .unwrap();
    let replay = replay_of(deliver(&store, &req)).unwrap();
    assert_eq!(replay.json.as_deref(), Some("[1, 2]"));
}

/// A holder on its own thread: claims `req`, signals, waits for `go`, then completes
/// with `json` (or releases when `json` is None).
fn holder(
    store: Store,
    req: ClaimRequest,
    json: Option<&'static str>,
) -> (mpsc::Receiver<()>, mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (claimed_tx, claimed_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let handle = thread::spawn(move || {
        let token = token_of(deliver(&store, &req));
        claimed_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        match json {
            Some(json) => {
                let result = prepare(&store, &req, ResultInput::Json(json));
                complete(&store, &req, token, &result);
            }
            None => {
                let r = req.clone();
                store
                    .with_conn(async |c| {
                        claim::release(c, &r.job_type, &r.operation_key, token, "boom").await
                    })
                    .unwrap();
            }
        }
    });
    (claimed_rx, go_tx, handle)
}

fn wait(store: &Store, req: &ClaimRequest, seconds: f64, path: WaitPath) -> results::Waited {
    let req = req.clone();
    store
        .run(|pool, i| results::wait_by(pool, i, &req, seconds, path))
        .unwrap()
}

#[test]
fn a_waiter_gets_the_running_claims_result_by_listen_and_by_polling() {
    for (prepared, path) in [(true, WaitPath::Listen), (false, WaitPath::Poll)] {
        let store = store_with(prepared, 4);
        let req = request("ResultsWait", 60.0);
        let (claimed, go, handle) = holder(
            Store::new(store.config().clone()).unwrap(),
            req.clone(),
            Some(r#"{"v":1}"#),
        );
        claimed.recv().unwrap();
        let waiter = {
            let (store, req) = (Store::new(store.config().clone()).unwrap(), req.clone());
            thread::spawn(move || wait(&store, &req, 30.0, path))
        };
        // The waiter is waiting (it cannot have an answer: the holder has not finished).
        thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished());
        go.send(()).unwrap();
        handle.join().unwrap();
        let waited = waiter.join().unwrap();
        assert_eq!(waited.path, path);
        let replay = replay_of(waited.decision.outcome).expect("a replay");
        assert_eq!(replay.json.as_deref(), Some(r#"{"v": 1}"#));
    }
}

#[test]
fn a_wait_shorter_than_the_run_ends_in_progress_and_a_release_lets_the_waiter_claim() {
    let store = store_with(true, 4);
    let req = request("ResultsWaitEnds", 60.0);
    let (claimed, go, handle) = holder(
        Store::new(store.config().clone()).unwrap(),
        req.clone(),
        None,
    );
    claimed.recv().unwrap();
    for path in [WaitPath::Listen, WaitPath::Poll] {
        let waited = wait(&store, &req, 0.2, path);
        assert!(
            matches!(waited.decision.outcome, ClaimAnswer::InProgress { lease_remaining, .. } if lease_remaining > 0.0),
            "{waited:?}"
        );
    }
    let waiter = {
        let (store, req) = (Store::new(store.config().clone()).unwrap(), req.clone());
        thread::spawn(move || wait(&store, &req, 30.0, WaitPath::Listen))
    };
    thread::sleep(Duration::from_millis(200));
    go.send(()).unwrap(); // the holder releases (its body raised)
    handle.join().unwrap();
    let waited = waiter.join().unwrap();
    assert!(
        matches!(
            waited.decision.outcome,
            ClaimAnswer::Claimed {
                kind: claim::ClaimKind::Retry,
                ..
            }
        ),
        "{waited:?}"
    );
}

#[test]
fn a_bad_wait_is_refused_by_name() {
    let store = store();
    let req = request("ResultsBadWait", 30.0);
    let err = store
        .run(|pool, i| results::wait(pool, i, &req, -1.0))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("ResultsBadWait") && m.contains("wait")),
        "{err:?}"
    );
    let _ = Interrupt::none();
}

/// The channel `req`'s record notifies on ([`claim::CHANNEL_SQL`]).
fn channel_of(store: &Store, req: &ClaimRequest) -> String {
    let req = req.clone();
    store
        .with_conn(async |c| {
            let row = c
                .query_one(claim::CHANNEL_SQL, &[&req.job_type, &req.operation_key])
                .await?;
            Ok(row.get(0))
        })
        .unwrap()
}

#[test]
fn a_completion_with_a_result_notifies_its_records_channel_and_a_plain_one_does_not() {
    let store = store();
    let (plain, stored) = (
        request("ResultsNotify", 30.0),
        request("ResultsNotify", 30.0),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let channels = [channel_of(&store, &plain), channel_of(&store, &stored)];
    assert_ne!(channels[0], channels[1]);
    let _client = runtime.block_on(async {
        let (client, mut connection) =
            tokio_postgres::connect(&common::database_url(), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    let _ = tx.send(n.channel().to_string());
                }
            }
        });
        for channel in &channels {
            client
                .batch_execute(&format!("LISTEN \"{channel}\""))
                .await
                .unwrap();
        }
        client
    });
    let token = token_of(deliver(&store, &plain));
    let r = plain.clone();
    store
        .with_conn(async |c| claim::complete(c, &r.job_type, &r.operation_key, token).await)
        .unwrap();
    let token = token_of(deliver(&store, &stored));
    complete(
        &store,
        &stored,
        token,
        &prepare(&store, &stored, ResultInput::Json("1")),
    );
    // Notifications arrive in commit order: the first one heard is the stored result's.
    let heard = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
    });
    assert_eq!(heard.as_deref(), Some(channels[1].as_str()));
}

#[test]
fn a_waiter_holds_no_pooled_connection_while_it_waits() {
    for path in [WaitPath::Listen, WaitPath::Poll] {
        // One pooled connection, shared by the waiter and another caller.
        let store = store_with(path == WaitPath::Listen, 1);
        let req = request("ResultsPoolFree", 60.0);
        let (claimed, go, handle) = holder(
            Store::new(store.config().clone()).unwrap(),
            req.clone(),
            Some("true"),
        );
        claimed.recv().unwrap();
        let shared = std::sync::Arc::new(store);
        let waiter = {
            let (store, req) = (shared.clone(), req.clone());
            thread::spawn(move || wait(&store, &req, 30.0, path))
        };
        // While it waits, the pool's one connection serves other operations.
        for _ in 0..20 {
            let other = request("ResultsPoolFree", 30.0);
            assert!(matches!(
                deliver(&shared, &other),
                ClaimAnswer::Claimed { .. }
            ));
        }
        assert!(!waiter.is_finished());
        go.send(()).unwrap();
        handle.join().unwrap();
        let waited = waiter.join().unwrap();
        assert_eq!(waited.path, path);
        assert!(replay_of(waited.decision.outcome).unwrap().stored());
    }
}
