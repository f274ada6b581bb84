//! The model check of the claim protocol (docs/design.md, "The model check"): every
//! interleaving of a few workers, the database, a person and the queue, explored by
//! the `stateright` model checker. The record's transitions are the core's own decision
//! table (`idempotent_job_core::transitions`: the claim statement's rule, the step after
//! it, the lookup, the stale policy, the fenced changes, resolve), the table that
//! `tests/conformance/` binds to the claim statement on PostgreSQL.
//!
//! Actors (one state, every action one atomic step of one of them):
//! * **workers**: take a delivery from the queue and run the claim statement; run the
//!   body's effect (only while their own lease lasts: the `in_doubt` rule of a body that
//!   checks its claim before the effect); raise (release); renew the lease (heartbeat);
//!   complete; answer a lookup; hold or give up after a takeover; crash at any step (the
//!   delivery goes back to the queue) and restart idle;
//! * **the database**: the record (status, fencing token, lease in clock ticks, stored
//!   value) and its clock: a tick shortens every lease by one (leases are counted by the
//!   database's clock only);
//! * **a person**: resolves a held or given-up operation (done when the effect happened,
//!   rerun — re-enqueued — when it did not);
//! * **the queue**: delivers in any order, duplicates a delivery, redelivers after a
//!   crash, a release or a lost claim, and brings a deferred delivery back early or at the
//!   holder's lease end.
//!
//! Bounded: 3 workers, a lease of 2 ticks, 2 crashes, 2 duplicates, 1 raise, 1 renewal,
//! 1 resolve, 4 claims (under a minute on 2 cores). `IDEMPOTENT_JOB_MODEL_LONG=1` checks
//! larger budgets (3 crashes and duplicates, 2 raises and renewals, 6 claims: longer).

use std::collections::{HashMap, VecDeque};

use idempotent_job_core::transitions::{
    self as t, Answer, Change, ClaimKind, ClaimVerdict, Met, Next, OnMismatch, OnStale,
    RecordState, Resolution, Rules, Status,
};

mod steps;
use stateright::{Checker, Model, Property};
use steps::*;

/// A deliberately broken protocol, to show each property can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The core's table as it is.
    Correct,
    /// A completion that does not present the fencing token.
    UnfencedCompletion,
    /// A claim statement that takes a claim over before its lease ran out.
    TakeoverIgnoresLease,
    /// A claim statement that takes a held record (as if resolved).
    HeldIsTakeable,
    /// A body that does its effect without checking its claim is still its own (a process
    /// paused past its lease, e.g. SIGSTOP or a long GC, then resumed).
    EffectIgnoresLease,
}

#[derive(Debug, Clone, Copy)]
struct Budgets {
    workers: usize,
    lease: u8,
    crashes: u8,
    duplicates: u8,
    raises: u8,
    renewals: u8,
    resolves: u8,
    claims: u8,
}

const BOUNDED: Budgets = Budgets {
    workers: 3,
    lease: 2,
    crashes: 2,
    duplicates: 2,
    raises: 1,
    renewals: 1,
    resolves: 1,
    claims: 4,
};

const LONG: Budgets = Budgets {
    workers: 3,
    lease: 2,
    crashes: 3,
    duplicates: 3,
    raises: 2,
    renewals: 2,
    resolves: 1,
    claims: 6,
};

struct Protocol {
    rules: Rules,
    variant: Variant,
    budgets: Budgets,
}

/// The record as the database holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Db {
    status: Option<Status>,
    /// The fencing token: the number of the claim that holds the record.
    token: u8,
    /// Ticks of the database clock until the lease ends.
    lease_left: u8,
    /// The value the completion stored (the completing claim's token), if any.
    result: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// Running the body under claim `token` (the worker's view of its lease).
    Holding {
        token: u8,
        lease_left: u8,
        effect_done: bool,
    },
    /// A takeover asking the lookup.
    Asking {
        token: u8,
        lease_left: u8,
    },
    /// A takeover's fenced change still to send: complete (the lookup said done), hold
    /// or give up.
    Settling {
        token: u8,
        lease_left: u8,
        change: Change,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    db: Db,
    workers: Vec<Phase>,
    /// Deliveries the queue can hand out now, and deferred ones waiting for the lease end.
    ready: u8,
    deferred: u8,
    /// Budgets used.
    claims: u8,
    crashes: u8,
    duplicates: u8,
    raises: u8,
    renewals: u8,
    resolves: u8,
    /// Ghosts: what happened, for the properties.
    effects: u8,
    takeover_runs: u8,
    started_while_held: bool,
    taken_over_completion: bool,
    seen: Option<Option<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    Deliver(usize),
    Effect(usize),
    Raise(usize),
    Renew(usize),
    Complete(usize),
    Lookup(usize, Answer),
    Settle(usize),
    Crash(usize),
    Tick,
    Duplicate,
    BringBack,
    Resolve,
}

impl Protocol {
    fn new(on_stale: OnStale, lookup: bool, variant: Variant, budgets: Budgets) -> Protocol {
        Protocol {
            rules: Rules {
                on_stale,
                on_mismatch: OnMismatch::Log,
                lookup,
            },
            variant,
            budgets,
        }
    }

    fn record_state(&self, db: &Db) -> RecordState {
        match db.status {
            None => RecordState::Absent,
            Some(Status::Held) if self.variant == Variant::HeldIsTakeable => RecordState::Present {
                status: Status::Released,
                lease_expired: true,
            },
            Some(status) => RecordState::Present {
                status,
                lease_expired: db.lease_left == 0 || self.variant == Variant::TakeoverIgnoresLease,
            },
        }
    }

    /// A fenced change from the holder of `token`; applies it and answers whether the
    /// record accepted it.
    fn fenced(&self, s: &mut State, change: Change, token: u8) -> bool {
        let Some(status) = s.db.status else {
            return false;
        };
        let matches = token == s.db.token
            || (change == Change::Complete && self.variant == Variant::UnfencedCompletion);
        let Some(after) = t::fenced(change, status, matches) else {
            return false;
        };
        if change == Change::Complete && token != s.db.token {
            s.taken_over_completion = true;
        }
        s.db.status = Some(after);
        match change {
            Change::Renew => s.db.lease_left = self.budgets.lease,
            Change::Expire => s.db.lease_left = 0,
            _ => {}
        }
        true
    }

    /// The worker's next phase after the protocol's step `next` under claim `token`.
    fn phase_of(&self, s: &mut State, next: Next, token: u8, taken: ClaimKind) -> Phase {
        let lease_left = self.budgets.lease;
        let settling = |change| Phase::Settling {
            token,
            lease_left,
            change,
        };
        match next {
            Next::Run => {
                if taken == ClaimKind::Takeover {
                    s.takeover_runs += 1;
                }
                Phase::Holding {
                    token,
                    lease_left,
                    effect_done: false,
                }
            }
            Next::AskLookup => Phase::Asking { token, lease_left },
            Next::Complete => settling(Change::Complete),
            Next::Hold => settling(Change::Hold),
            Next::GiveUp => settling(Change::GiveUp),
            other => unreachable!("a won claim's step is never {other:?}"),
        }
    }

    /// The worker's delivery ends: acknowledged (`requeue` false) or sent back.
    fn end(s: &mut State, w: usize, requeue: bool) {
        s.workers[w] = Phase::Idle;
        if requeue {
            s.ready += 1;
        }
    }
}

/// Liveness (stateright's `eventually` only sees acyclic paths; deferrals and
/// redeliveries make cycles): from every reachable state inside the bounds a settled
/// state can be reached, so under fair scheduling (every worker, the clock and the queue
/// keep taking steps) a redelivered operation is eventually completed, held or given up.
/// States past the bounds count as able to settle. Returns the reachable state count and
/// a state that cannot settle, if any.
fn stuck_state(model: &Protocol) -> (usize, Option<State>) {
    let mut index: HashMap<State, usize> = HashMap::new();
    let mut states: Vec<State> = Vec::new();
    let mut preds: Vec<Vec<usize>> = Vec::new();
    let mut queue = VecDeque::new();
    for s in model.init_states() {
        index.insert(s.clone(), 0);
        states.push(s);
        preds.push(Vec::new());
        queue.push_back(0);
    }
    let mut good = Vec::new();
    while let Some(i) = queue.pop_front() {
        let s = states[i].clone();
        if settled(&s) || !model.within_boundary(&s) {
            good.push(i);
            if !model.within_boundary(&s) {
                continue;
            }
        }
        let mut actions = Vec::new();
        model.actions(&s, &mut actions);
        for a in actions {
            let Some(n) = model.next_state(&s, a) else {
                continue;
            };
            let j = *index.entry(n.clone()).or_insert_with(|| {
                states.push(n);
                preds.push(Vec::new());
                queue.push_back(states.len() - 1);
                states.len() - 1
            });
            preds[j].push(i);
        }
    }
    let mut can_settle = vec![false; states.len()];
    let mut back: VecDeque<usize> = good.into_iter().collect();
    for &g in &back {
        can_settle[g] = true;
    }
    while let Some(j) = back.pop_front() {
        for &i in &preds[j] {
            if !can_settle[i] {
                can_settle[i] = true;
                back.push_back(i);
            }
        }
    }
    let stuck = can_settle
        .iter()
        .position(|ok| !ok)
        .map(|i| states[i].clone());
    (states.len(), stuck)
}

fn long() -> bool {
    std::env::var("IDEMPOTENT_JOB_MODEL_LONG").is_ok_and(|v| v == "1")
}

fn budgets() -> Budgets {
    if long() {
        LONG
    } else {
        BOUNDED
    }
}

/// Every option combination the decision depends on.
fn configurations() -> Vec<(OnStale, bool)> {
    let mut out = Vec::new();
    for on_stale in [OnStale::Reclaim, OnStale::Hold, OnStale::Skip] {
        for lookup in [false, true] {
            out.push((on_stale, lookup));
        }
    }
    out
}

#[test]
fn the_protocol_keeps_every_property_in_every_interleaving() {
    for (on_stale, lookup) in configurations() {
        let model = Protocol::new(on_stale, lookup, Variant::Correct, budgets());
        let checker = model.checker().threads(2).spawn_bfs().join();
        println!(
            "on_stale {} lookup {lookup}: {} states, depth {}",
            on_stale.as_str(),
            checker.unique_state_count(),
            checker.max_depth()
        );
        checker.assert_properties();
    }
}

#[test]
fn a_redelivered_operation_is_eventually_completed_held_or_given_up() {
    for (on_stale, lookup) in configurations() {
        let model = Protocol::new(on_stale, lookup, Variant::Correct, budgets());
        let (count, stuck) = stuck_state(&model);
        println!(
            "on_stale {} lookup {lookup}: {count} states",
            on_stale.as_str()
        );
        assert!(
            stuck.is_none(),
            "on_stale {} lookup {lookup}: cannot settle from {stuck:?}",
            on_stale.as_str()
        );
    }
}

/// The checker finds a counterexample to `property` in `variant` (under `on_stale`).
fn finds(variant: Variant, on_stale: OnStale, lookup: bool, property: &'static str) {
    let model = Protocol::new(on_stale, lookup, variant, BOUNDED);
    // One thread: breadth first in order, so the counterexample is a shortest one.
    let checker = model.checker().threads(1).spawn_bfs().join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{variant:?}: no counterexample to {property:?}"));
    println!("{variant:?} breaks {property:?}: {:?}", path.into_actions());
}

#[test]
fn a_completion_without_the_fencing_token_is_caught() {
    finds(
        Variant::UnfencedCompletion,
        OnStale::Reclaim,
        false,
        "no completion by a holder whose claim was taken over",
    );
    finds(
        Variant::UnfencedCompletion,
        OnStale::Reclaim,
        false,
        "a waiter never sees a value that was not stored",
    );
}

#[test]
fn a_takeover_of_a_live_lease_is_caught() {
    finds(
        Variant::TakeoverIgnoresLease,
        OnStale::Reclaim,
        false,
        "at most one live claim",
    );
}

#[test]
fn a_held_record_taken_without_resolve_is_caught() {
    finds(
        Variant::HeldIsTakeable,
        OnStale::Hold,
        false,
        "a held operation never runs until resolved",
    );
}

/// What the model shows the protocol cannot promise: a body that does its effect after
/// its lease ran out (paused, not dead: the claim was taken over meanwhile) duplicates
/// it beyond the stale policy, which is why a body checks `in_doubt?` before an effect
/// and why the lease must outlast the longest pause.
#[test]
fn an_effect_after_the_lease_ran_out_can_cost_more_than_the_policy_says() {
    finds(
        Variant::EffectIgnoresLease,
        OnStale::Hold,
        false,
        "a crash after the effect costs at most what the stale policy says",
    );
}
