//! The fenced changes and the resolve, each by the pure table and by the statements on
//! PostgreSQL.

use super::*;

use super::decisions::{delivery, record_state, status_of, JOB};

fn change_of(name: &str) -> (t::Change, idempotent_job_core::fenced::Fenced) {
    use idempotent_job_core::fenced::Fenced;
    match name {
        "complete" => (t::Change::Complete, Fenced::Complete),
        "release" => (t::Change::Release, Fenced::Release),
        "hold" => (t::Change::Hold, Fenced::Hold),
        "give_up" => (t::Change::GiveUp, Fenced::GiveUp),
        "expire" => (t::Change::Expire, Fenced::Expire),
        "renew" => (t::Change::Renew, Fenced::Renew),
        other => panic!("change {other}"),
    }
}

#[test]
fn fenced_changes_by_the_pure_table() {
    let vectors = vectors();
    let mut failures = Vec::new();
    for case in cases(&vectors, "fenced") {
        let RecordState::Present { status, .. } = record_state(text(case, "record")) else {
            panic!("a fenced case has a record")
        };
        let (change, _) = change_of(text(case, "change"));
        let after = t::fenced(change, status, text(case, "token") == "own");
        let got = json!({
            "accepted": after.is_some(),
            "status_after": after.unwrap_or(status).as_str(),
        });
        let want = json!({"accepted": case["accepted"], "status_after": case["status_after"]});
        if got != want {
            failures.push(format!("{}: table {got}, vectors {want}", case["name"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn fenced_changes_by_the_statements_on_postgresql() {
    use common::claim;
    let vectors = vectors();
    let section = &vectors["decisions"];
    let setup_sql = text(section, "setup_sql").to_string();
    let store = common::store();
    let mut failures = Vec::new();
    for case in cases(&vectors, "fenced") {
        let key = uuid::Uuid::new_v4().to_string();
        let first = delivery(&key, &section["payload_a"]);
        let req = first.claim_request(&JobOptions::default());
        let setup = &section["setup"][text(case, "record")];
        let (status, seconds) = (
            text(setup, "status").to_string(),
            setup["lease_expires_in"].as_f64().unwrap(),
        );
        let (_, change) = change_of(text(case, "change"));
        let own = text(case, "token") == "own";
        let sql = setup_sql.clone();
        let accepted = store
            .with_conn(async |c| {
                let claim::ClaimAnswer::Claimed { token, .. } =
                    claim::claim(c, &req).await?.outcome
                else {
                    panic!("a fresh operation is claimed")
                };
                claim::complete(c, JOB, &key, token).await?;
                let changed = c
                    .execute(sql.as_str(), &[&JOB.to_string(), &key, &status, &seconds])
                    .await?;
                assert_eq!(changed, 1);
                let presented = if own { token } else { uuid::Uuid::new_v4() };
                match claim::fenced(c, change, JOB, &key, presented, Some("conformance")).await {
                    Ok(()) => Ok(true),
                    Err(Error::LostClaim { .. }) => Ok(false),
                    Err(other) => Err(other),
                }
            })
            .unwrap();
        let got = json!({"accepted": accepted, "status_after": status_of(&store, &key)});
        let want = json!({"accepted": case["accepted"], "status_after": case["status_after"]});
        if got != want {
            failures.push(format!(
                "{}: postgresql {got}, vectors {want}",
                case["name"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn resolution_of(name: &str) -> (t::Resolution, common::claim::Resolution) {
    match name {
        "done" => (t::Resolution::Done, common::claim::Resolution::Done),
        "rerun" => (t::Resolution::Rerun, common::claim::Resolution::Rerun),
        other => panic!("resolution {other}"),
    }
}

#[test]
fn resolve_by_the_pure_table_and_by_the_statement_on_postgresql() {
    use common::claim;
    let vectors = vectors();
    let section = &vectors["decisions"];
    let setup_sql = text(section, "setup_sql").to_string();
    let store = common::store();
    let mut failures = Vec::new();
    for case in cases(&vectors, "resolve") {
        let RecordState::Present { status, .. } = record_state(text(case, "record")) else {
            panic!("a resolve case has a record")
        };
        let (pure, how) = resolution_of(text(case, "as"));
        let after = t::resolve(status, pure);
        let table = json!({"resolved": after.is_some(),
                           "status_after": after.unwrap_or(status).as_str()});
        let key = uuid::Uuid::new_v4().to_string();
        let req = delivery(&key, &section["payload_a"]).claim_request(&JobOptions::default());
        let setup = &section["setup"][text(case, "record")];
        let (setup_status, seconds) = (
            text(setup, "status").to_string(),
            setup["lease_expires_in"].as_f64().unwrap(),
        );
        let sql = setup_sql.clone();
        let resolved = store
            .with_conn(async |c| {
                // Made by a takeover, as every held or given-up record is: the claim
                // that stores the delivery's job, which a rerun needs (issue 31).
                let token = uuid::Uuid::new_v4();
                claim::claim_as(c, &req, token).await?;
                claim::fenced(c, claim::Fenced::Expire, JOB, &key, token, Some("stale")).await?;
                claim::claim(c, &req).await?;
                let changed = c
                    .execute(
                        sql.as_str(),
                        &[&JOB.to_string(), &key, &setup_status, &seconds],
                    )
                    .await?;
                assert_eq!(changed, 1);
                claim::resolve(c, JOB, &key, how).await
            })
            .unwrap();
        let postgresql = json!({"resolved": resolved, "status_after": status_of(&store, &key)});
        let want = json!({"resolved": case["resolved"], "status_after": case["status_after"]});
        if table != want || postgresql != want {
            failures.push(format!(
                "{}: table {table}, postgresql {postgresql}, vectors {want}",
                case["name"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
