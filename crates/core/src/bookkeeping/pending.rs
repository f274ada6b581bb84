//! The repeats of one operation still to write, merged ([`Pending`]), and the queue of
//! them per operation, in the lock order of the batch statement.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use serde_json::{json, Value};

use super::repeat::Repeat;
use crate::config::REPEATS_KEPT;

/// An operation: (job type, operation key).
pub(super) type Key = (String, String);

/// The repeats of one operation still to write, merged.
#[derive(Default)]
pub(super) struct Pending {
    /// Repeats merged in (counted or not).
    pub(super) repeats: usize,
    pub(super) dups: i64,
    pub(super) mismatches: i64,
    pub(super) last_mismatch: bool,
    pub(super) last_at: Option<String>,
    pub(super) times: Vec<String>,
    pub(super) classes: Vec<String>,
    pub(super) facts: VecDeque<Value>,
    /// `repeat_facts` entries waiting for their transaction's commit ([`Repeat::xid`]):
    /// `{"xid": "<id>", "entry": {…}}`, in order ([`FLUSH_AWAITING_SQL`](crate::sql::FLUSH_AWAITING_SQL)'s `awaiting`).
    pub(super) awaiting: VecDeque<Value>,
    /// When a batch first found the operation's row locked ([`FLUSH_SQL`](crate::sql::FLUSH_SQL) skipped it),
    /// or an awaited transaction still in progress, if one did.
    pub(super) locked_since: Option<Instant>,
}

impl Pending {
    pub(super) fn add(&mut self, r: Repeat) {
        let at = r.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        self.repeats += 1;
        if r.adds_duplicate() {
            self.dups += 1;
            self.mismatches += i64::from(r.mismatch);
            self.last_mismatch = r.mismatch;
            // The latest duplicate's time: RFC 3339 texts in UTC sort as text.
            self.last_at = self.last_at.take().max(Some(at.clone()));
        }
        if r.count {
            self.times.push(at.clone());
            keep_latest(&mut self.times);
            if let Some(class) = &r.job_class {
                if !self.classes.contains(class) {
                    self.classes.push(class.clone());
                }
            }
        }
        let facts = r
            .facts
            .as_deref()
            .and_then(|f| serde_json::from_str::<Value>(f).ok())
            .unwrap_or(Value::Null);
        let mut entry =
            json!({"at": at, "job_class": r.job_class, "decision": r.decision, "facts": facts});
        if r.replayed {
            // A replay (V7): counted by the repeats report.
            entry["replayed"] = json!(true);
        }
        match r.xid {
            Some(xid) => {
                self.awaiting
                    .push_back(json!({"xid": xid.to_string(), "entry": entry}));
                if self.awaiting.len() > REPEATS_KEPT {
                    self.awaiting.pop_front();
                }
            }
            None => {
                self.facts.push_back(entry);
                if self.facts.len() > REPEATS_KEPT {
                    self.facts.pop_front();
                }
            }
        }
    }

    /// Adds `newer` (queued after `self`) to `self`.
    pub(super) fn absorb(&mut self, newer: Pending) {
        self.locked_since = self.locked_since.or(newer.locked_since);
        self.repeats += newer.repeats;
        self.dups += newer.dups;
        self.mismatches += newer.mismatches;
        if newer.dups > 0 {
            self.last_mismatch = newer.last_mismatch;
        }
        self.times.extend(newer.times);
        keep_latest(&mut self.times);
        self.last_at = self.last_at.take().max(newer.last_at);
        for class in newer.classes {
            if !self.classes.contains(&class) {
                self.classes.push(class);
            }
        }
        self.facts.extend(newer.facts);
        while self.facts.len() > REPEATS_KEPT {
            self.facts.pop_front();
        }
        self.awaiting.extend(newer.awaiting);
        while self.awaiting.len() > REPEATS_KEPT {
            self.awaiting.pop_front();
        }
    }

    /// Takes out the `awaiting` entries at `positions` (from 1, as [`FLUSH_AWAITING_SQL`](crate::sql::FLUSH_AWAITING_SQL) returns
    /// them), as a pending of their own (their repeats moved to it).
    pub(super) fn take_awaiting(&mut self, positions: &[usize]) -> Pending {
        let mut taken = Pending::default();
        for &n in positions {
            if let Some(entry) = n.checked_sub(1).and_then(|i| self.awaiting.get_mut(i)) {
                taken.awaiting.push_back(entry.take());
            }
        }
        let moved = taken.awaiting.len().min(self.repeats);
        self.repeats -= moved;
        taken.repeats = moved;
        taken
    }

    /// The operation's JSON object of [`FLUSH_SQL`](crate::sql::FLUSH_SQL)'s $3.
    pub(super) fn doc(&self) -> Value {
        let mut doc = json!({
            "dups": self.dups, "mismatches": self.mismatches,
            "last_mismatch": self.last_mismatch, "last_at": self.last_at,
            "times": self.times, "classes": self.classes, "facts": self.facts,
        });
        if !self.awaiting.is_empty() {
            doc["awaiting"] = json!(self.awaiting);
        }
        doc
    }
}

/// Keeps the [`REPEATS_KEPT`] latest of `times` (RFC 3339 texts in UTC with microseconds, so
/// they sort as text), in order.
fn keep_latest(times: &mut Vec<String>) {
    times.sort();
    let excess = times.len().saturating_sub(REPEATS_KEPT);
    times.drain(..excess);
}

/// Queued repeats per operation, in the one lock order of [`FLUSH_SQL`](crate::sql::FLUSH_SQL).
pub(super) type Queue = BTreeMap<Key, Pending>;
