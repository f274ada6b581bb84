//! The model's steps: what each worker, the queue and the clock may do from a state
//! ([`Model::actions`], [`Model::next_state`]), and its properties.

use super::*;

pub(crate) fn lease_of(phase: &Phase) -> Option<(u8, u8)> {
    match phase {
        Phase::Idle => None,
        Phase::Holding {
            token, lease_left, ..
        }
        | Phase::Asking { token, lease_left }
        | Phase::Settling {
            token, lease_left, ..
        } => Some((*token, *lease_left)),
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            db: Db {
                status: None,
                token: 0,
                lease_left: 0,
                result: None,
            },
            workers: vec![Phase::Idle; self.budgets.workers],
            ready: 1,
            deferred: 0,
            claims: 0,
            crashes: 0,
            duplicates: 0,
            raises: 0,
            renewals: 0,
            resolves: 0,
            effects: 0,
            takeover_runs: 0,
            started_while_held: false,
            taken_over_completion: false,
            seen: None,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.budgets;
        for (w, phase) in s.workers.iter().enumerate() {
            match phase {
                Phase::Idle => {
                    if s.ready > 0 {
                        actions.push(Action::Deliver(w));
                    }
                    continue;
                }
                Phase::Holding {
                    effect_done: false,
                    lease_left,
                    ..
                } => {
                    if *lease_left > 0 || self.variant == Variant::EffectIgnoresLease {
                        actions.push(Action::Effect(w));
                    }
                    if s.raises < b.raises {
                        actions.push(Action::Raise(w));
                    }
                }
                Phase::Holding { .. } => actions.push(Action::Complete(w)),
                Phase::Asking { .. } => {
                    actions.push(Action::Lookup(w, Answer::Unknown));
                    let truth = if s.effects > 0 {
                        Answer::Done
                    } else {
                        Answer::NotDone
                    };
                    actions.push(Action::Lookup(w, truth));
                }
                Phase::Settling { .. } => actions.push(Action::Settle(w)),
            }
            if matches!(phase, Phase::Holding { .. }) && s.renewals < b.renewals {
                actions.push(Action::Renew(w));
            }
            if s.crashes < b.crashes {
                actions.push(Action::Crash(w));
            }
        }
        let leases = std::iter::once(s.db.lease_left)
            .chain(s.workers.iter().filter_map(lease_of).map(|(_, l)| l));
        if leases.into_iter().any(|l| l > 0) {
            actions.push(Action::Tick);
        }
        if s.duplicates < b.duplicates {
            actions.push(Action::Duplicate);
        }
        if s.deferred > 0 {
            actions.push(Action::BringBack);
        }
        if matches!(s.db.status, Some(Status::Held | Status::GivenUp)) && s.resolves < b.resolves {
            actions.push(Action::Resolve);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Deliver(w) => {
                s.ready -= 1;
                let held_before = s.db.status == Some(Status::Held);
                let verdict = t::claim(self.record_state(&s.db), false, OnMismatch::Log);
                let next = t::next(verdict, false, self.rules);
                match verdict {
                    ClaimVerdict::Take(taken) => {
                        s.claims += 1;
                        s.db = Db {
                            status: Some(Status::Claimed),
                            token: s.claims,
                            lease_left: self.budgets.lease,
                            result: s.db.result,
                        };
                        if held_before && next == Next::Run {
                            s.started_while_held = true;
                        }
                        let token = s.claims;
                        s.workers[w] = self.phase_of(&mut s, next, token, taken);
                    }
                    ClaimVerdict::Met(met) => match next {
                        Next::Defer => s.deferred += 1,
                        Next::Skip => {
                            if met == Met::Completed && s.seen.is_none() {
                                s.seen = Some(s.db.result);
                            }
                        }
                        other => unreachable!("a duplicate's step is never {other:?}"),
                    },
                }
            }
            Action::Effect(w) => {
                s.effects += 1;
                if let Phase::Holding { effect_done, .. } = &mut s.workers[w] {
                    *effect_done = true;
                }
            }
            Action::Raise(w) => {
                s.raises += 1;
                let (token, _) = lease_of(&s.workers[w])?;
                self.fenced(&mut s, Change::Release, token);
                Protocol::end(&mut s, w, true);
            }
            Action::Renew(w) => {
                s.renewals += 1;
                let (token, _) = lease_of(&s.workers[w])?;
                if self.fenced(&mut s, Change::Renew, token) {
                    if let Phase::Holding { lease_left, .. } = &mut s.workers[w] {
                        *lease_left = self.budgets.lease;
                    }
                }
            }
            Action::Complete(w) => {
                let (token, _) = lease_of(&s.workers[w])?;
                let accepted = self.fenced(&mut s, Change::Complete, token);
                if accepted {
                    s.db.result = Some(token);
                }
                // A lost claim fails the delivery: the queue delivers it again.
                Protocol::end(&mut s, w, !accepted);
            }
            Action::Lookup(w, answer) => {
                let (token, _) = lease_of(&s.workers[w])?;
                let next = t::after_lookup(answer, self.rules.on_stale);
                s.workers[w] = self.phase_of(&mut s, next, token, ClaimKind::Takeover);
                if let Some(lease) = lease_of(&last.workers[w]).map(|(_, l)| l) {
                    set_lease(&mut s.workers[w], lease);
                }
            }
            Action::Settle(w) => {
                let Phase::Settling { token, change, .. } = s.workers[w].clone() else {
                    return None;
                };
                let accepted = self.fenced(&mut s, change, token);
                if accepted && change == Change::Complete {
                    s.db.result = None;
                }
                Protocol::end(&mut s, w, !accepted);
            }
            Action::Crash(w) => {
                s.crashes += 1;
                Protocol::end(&mut s, w, true);
            }
            Action::Tick => {
                s.db.lease_left = s.db.lease_left.saturating_sub(1);
                for phase in &mut s.workers {
                    if let Some((_, lease)) = lease_of(phase) {
                        set_lease(phase, lease.saturating_sub(1));
                    }
                }
                if s.db.lease_left == 0 {
                    // The deferral's delay never passes the holder's lease end (+ margin).
                    s.ready += s.deferred;
                    s.deferred = 0;
                }
            }
            Action::Duplicate => {
                s.duplicates += 1;
                s.ready += 1;
            }
            Action::BringBack => {
                s.deferred -= 1;
                s.ready += 1;
            }
            Action::Resolve => {
                s.resolves += 1;
                let resolution = if s.effects > 0 {
                    Resolution::Done
                } else {
                    Resolution::Rerun
                };
                s.db.status = Some(t::resolve(s.db.status?, resolution)?);
                if resolution == Resolution::Rerun {
                    s.ready += 1; // resolve(as: :rerun) enqueues the job again
                }
            }
        }
        Some(s)
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.claims <= self.budgets.claims
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one live claim", |_, s: &State| {
                s.workers
                    .iter()
                    .filter_map(lease_of)
                    .filter(|(_, lease)| *lease > 0)
                    .count()
                    <= 1
            }),
            Property::always(
                "no completion by a holder whose claim was taken over",
                |_, s: &State| !s.taken_over_completion,
            ),
            Property::always(
                "a crash after the effect costs at most what the stale policy says",
                |m: &Protocol, s: &State| {
                    let may_rerun = m.rules.on_stale == OnStale::Reclaim || m.rules.lookup;
                    s.effects <= 1 + s.takeover_runs && (may_rerun || s.takeover_runs == 0)
                },
            ),
            Property::always(
                "a held operation never runs until resolved",
                |_, s: &State| !s.started_while_held,
            ),
            Property::always(
                "a waiter never sees a value that was not stored",
                |_, s: &State| {
                    s.seen
                        .is_none_or(|v| s.db.status == Some(Status::Completed) && s.db.result == v)
                },
            ),
            Property::sometimes("the operation completes", |_, s: &State| {
                s.db.status == Some(Status::Completed)
            }),
        ]
    }
}

pub(crate) fn set_lease(phase: &mut Phase, lease: u8) {
    match phase {
        Phase::Idle => {}
        Phase::Holding { lease_left, .. }
        | Phase::Asking { lease_left, .. }
        | Phase::Settling { lease_left, .. } => *lease_left = lease,
    }
}

/// Settled: completed, held or given up, nothing left in the queue, every worker idle.
pub(crate) fn settled(s: &State) -> bool {
    matches!(
        s.db.status,
        Some(Status::Completed | Status::Held | Status::GivenUp)
    ) && s.ready == 0
        && s.deferred == 0
        && s.workers.iter().all(|p| *p == Phase::Idle)
}
