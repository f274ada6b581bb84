//! The conformance vectors (`conformance/vectors.json`, docs/conformance.md) run by the
//! core: canonical JSON and digests, key texts and refusals, delays, and every decision
//! case twice — through the pure decision table (`idempotent_job_core::transitions`, what
//! the model check explores) and through the claim statement and the protocol on a real
//! PostgreSQL (DATABASE_URL). The vectors are the contract; these two readings of the
//! protocol, the Ruby specs and the Python tests must all agree with them.
//!
//! By section: `values` (canonical JSON, keys, key paths, delays), `decisions` (every
//! decision case by the pure table and on PostgreSQL), `fenced` (the fenced changes and
//! the resolve, both ways); this file reads the vectors and checks their names.

use std::collections::HashSet;

use common::StoreExt;
use idempotent_job_core::config::DEFAULT_MAX_RESULT_BYTES;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::Error;
use idempotent_job_core::keys::{self, Words};
use idempotent_job_core::protocol::{
    deferral_delay, unreachable_delay, DeliveryRequest, Direct, DoorWords, JobOptions,
    LookupAnswer, Notes, OnMismatch, OnStale, Protocol, Step,
};
use idempotent_job_core::store::Store;
use idempotent_job_core::transitions::{self as t, RecordState, Rules, Status};
use idempotent_job_core::{canonical, declaration};
use serde_json::{json, Value};
#[path = "../common/mod.rs"]
mod common;
mod decisions;
mod fenced;
mod values;

/// The vectors file, parsed.
fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conformance/vectors.json"
    );
    let text = std::fs::read_to_string(path).expect("conformance/vectors.json is readable");
    let vectors: Value = serde_json::from_str(&text).expect("conformance/vectors.json is JSON");
    assert_eq!(vectors["format"], 1, "a vectors format this test reads");
    vectors
}

fn cases<'a>(vectors: &'a Value, section: &str) -> &'a Vec<Value> {
    vectors[section]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("section {section} has cases"))
}

fn text<'a>(case: &'a Value, field: &str) -> &'a str {
    case[field]
        .as_str()
        .unwrap_or_else(|| panic!("{}: {field} is a string", case["name"]))
}

#[test]
fn every_case_has_a_unique_name() {
    let vectors = vectors();
    let mut seen = HashSet::new();
    for section in [
        "canonical",
        "keys",
        "composite_keys",
        "key_paths",
        "decisions",
        "fenced",
        "resolve",
    ] {
        for case in cases(&vectors, section) {
            assert!(
                seen.insert(format!("{section}/{}", text(case, "name"))),
                "duplicate name in {section}: {}",
                case["name"]
            );
        }
    }
}
