//! The claim and its decision: [`Protocol::begin`], [`Protocol::wait`] and
//! [`Protocol::after_lookup`].

use std::time::Instant;

use crate::conn::Interrupt;
use crate::error::{Error, Result};
use crate::fenced::Fenced;
use crate::record::{self};
use crate::transitions::{self, Answer, Next};

use super::*;

impl Protocol {
    /// Claims (one statement) and decides what the delivery does.
    ///
    /// Notes: `claimed` (with the claim's duration) and `taken_over` for a won claim; a
    /// retry's info line; `mismatch` for a payload mismatch; `deferred` for a live
    /// claim; `skipped` for a duplicate; the stale policy's notes after a takeover
    /// without lookup.
    ///
    /// Errors: [`Error::Config`] for a bad request (empty or oversized key…);
    /// [`Error::PayloadMismatch`] under [`OnMismatch::Raise`] when the payload differs
    /// and this delivery did not win the claim; [`Error::LostClaim`] and connection or
    /// database errors from a hold or give-up after a takeover; connection, database,
    /// timeout and lock-timeout errors from the claim (nothing ran); [`Error::Interrupted`].
    pub fn begin(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        delivery: &DeliveryRequest,
        notes: &mut Notes,
    ) -> Result<Step> {
        interrupt.end_by(delivery.wait_until);
        let request = delivery.claim_request(&self.options);
        let started = Instant::now();
        let decided = channel.claim(interrupt, &request, self.options.lock_timeout_seconds)?;
        let duration = started.elapsed().as_secs_f64();
        self.decide(channel, interrupt, delivery, decided, duration, true, notes)
    }

    /// After [`Protocol::begin`] answered [`Step::InProgress`] with
    /// [`Outcome::wait_seconds`] (the binding told its notes meanwhile): waits for the
    /// live claim to end ([`Channel::wait`], at most that long, no pooled connection
    /// held), then decides again as `begin` does: a completion replays, a release may
    /// run, a claim still live is deferred (no second wait).
    ///
    /// Notes and errors: as [`Protocol::begin`].
    pub fn wait(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        delivery: &DeliveryRequest,
        notes: &mut Notes,
    ) -> Result<Step> {
        interrupt.end_by(delivery.wait_until);
        let seconds = delivery.wait_seconds.unwrap_or(0.0);
        let request = delivery.claim_request(&self.options);
        let started = Instant::now();
        let Some(decided) = channel.wait(interrupt, &request, seconds)? else {
            return Err(Error::Config(format!(
                "{}: this channel cannot wait for a live claim (wait: is not for transactions)",
                delivery.job_type
            )));
        };
        let duration = started.elapsed().as_secs_f64();
        self.decide(
            channel, interrupt, delivery, decided, duration, false, notes,
        )
    }

    /// What the delivery does after the claim statement's `decided` (`duration`: the
    /// claim's seconds); `may_wait`: a live claim answers a wait when the delivery asks
    /// for one and the channel can.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        delivery: &DeliveryRequest,
        decided: record::ClaimReply,
        duration: f64,
        may_wait: bool,
        notes: &mut Notes,
    ) -> Result<Step> {
        let takeovers = match decided.outcome {
            record::ClaimAnswer::Claimed { takeovers, .. } => takeovers,
            _ => 0,
        };
        let next = transitions::next(
            decided.outcome.verdict(),
            decided.mismatch,
            self.rules(takeovers),
        );
        if decided.mismatch || next == Next::RefuseMismatch {
            let refused = next == Next::RefuseMismatch;
            notes.push(Note::delivery(NoteKind::Mismatch { refused }));
            if refused {
                return Err(self.mismatch_refused(delivery));
            }
        }
        let duplicate = |decision: Decision, duplicates: i32, notes: &mut Notes| {
            notes.push(Note::delivery(NoteKind::Skipped {
                decision,
                duplicates,
                replay: None,
            }));
            let mut outcome = Outcome::of(decision);
            outcome.duplicates = Some(duplicates);
            Step::Skip(outcome)
        };
        let answered = decided.outcome.name();
        Ok(match (next, decided.outcome) {
            (
                Next::Run | Next::AskLookup | Next::Hold | Next::GiveUp,
                record::ClaimAnswer::Claimed {
                    token,
                    attempt,
                    kind,
                    takeovers,
                },
            ) => {
                let info = ClaimInfo {
                    job_type: delivery.job_type.clone(),
                    operation_key: delivery.operation_key.clone(),
                    delivery_id: delivery.delivery_id.clone(),
                    token,
                    attempt,
                    kind,
                };
                notes.push(Note::claim(&info, NoteKind::Claimed { kind, duration }));
                let claim = Claim::new(info, takeovers);
                match kind {
                    ClaimKind::First => {}
                    ClaimKind::Retry => {
                        notes.push(Note::claim(&claim.info, NoteKind::RetryClaimed))
                    }
                    ClaimKind::Takeover => {
                        notes.push(Note::claim(&claim.info, NoteKind::TakenOver))
                    }
                }
                match next {
                    Next::AskLookup => Step::AskLookup(claim),
                    Next::Run if kind != ClaimKind::Takeover => self.run(channel, claim),
                    // A takeover without a lookup: the stale policy's step.
                    next => self.stale_step(channel, interrupt, claim, next, notes)?,
                }
            }
            (
                Next::Defer,
                record::ClaimAnswer::InProgress {
                    holder_delivery_id,
                    lease_remaining,
                    duplicates,
                    ..
                },
            ) if may_wait && delivery.wait_seconds.is_some() && channel.can_wait() => {
                let seconds = delivery.wait_seconds.unwrap_or(0.0);
                notes.push(Note::delivery(NoteKind::Waiting {
                    holder: holder_delivery_id.clone(),
                    seconds,
                }));
                let mut outcome = Outcome::of(Decision::InProgress);
                outcome.duplicates = Some(duplicates);
                outcome.lease_remaining = Some(lease_remaining);
                outcome.holder = holder_delivery_id;
                outcome.wait_seconds = Some(seconds);
                Step::InProgress(outcome)
            }
            (
                Next::Defer,
                record::ClaimAnswer::InProgress {
                    holder_delivery_id,
                    lease_remaining,
                    duplicates,
                    ..
                },
            ) => {
                let delay = deferral_delay(
                    lease_remaining,
                    delivery.deferrals,
                    self.options.defer_margin_seconds,
                );
                notes.push(Note::delivery(NoteKind::Deferred {
                    delay,
                    holder: holder_delivery_id.clone(),
                    lease_remaining,
                    deferral: delivery.deferrals + 1,
                }));
                Step::InProgress(Outcome {
                    decision: Decision::InProgress,
                    duplicates: Some(duplicates),
                    retry_after: Some(delay),
                    lease_remaining: Some(lease_remaining),
                    holder: holder_delivery_id,
                    claim: None,
                    result_json: None,
                    result_state: None,
                    wait_seconds: None,
                    waited: false,
                })
            }
            (Next::Skip, record::ClaimAnswer::Completed { duplicates, replay }) => {
                // A replay: the first run's stored result (V7), when its completion was
                // asked to keep one (its state says whether it could).
                let state = replay.as_ref().map(|r| r.state);
                notes.push(Note::delivery(NoteKind::Skipped {
                    decision: Decision::Completed,
                    duplicates,
                    replay: state,
                }));
                let mut outcome = Outcome::of(Decision::Completed);
                outcome.duplicates = Some(duplicates);
                outcome.result_state = state;
                outcome.result_json = replay.and_then(|r| r.json);
                Step::Skip(outcome)
            }
            (Next::Skip, record::ClaimAnswer::Held { duplicates }) => {
                duplicate(Decision::Held, duplicates, notes)
            }
            (Next::Skip, record::ClaimAnswer::GivenUp { duplicates }) => {
                duplicate(Decision::GivenUp, duplicates, notes)
            }
            (next, _) => {
                return Err(Error::Database {
                    message: format!(
                        "{}: the claim statement answered {answered} and the decision table \
                         gives {next:?} for it, which this version of idempotent_job cannot \
                         do (nothing ran)",
                        note::describe(delivery, &self.words.id_label)
                    ),
                    sqlstate: "XX000".into(),
                })
            }
        })
    }

    /// The error of a delivery refused for its payload ([`Next::RefuseMismatch`]: it
    /// differs from the claim's and [`OnMismatch::Raise`]; this delivery did not win).
    pub(super) fn mismatch_refused(&self, delivery: &DeliveryRequest) -> Error {
        Error::PayloadMismatch {
            job_type: delivery.job_type.clone(),
            operation_key: delivery.operation_key.clone(),
            message: format!(
                "{} was delivered with arguments that differ from those of its claim \
                 (same operation key, different payload); refused (on_mismatch: \
                 raise), the job was not run",
                note::describe(delivery, &self.words.id_label)
            ),
        }
    }

    /// Applies a stale claim's lookup answer: [`LookupAnswer::Done`] marks it
    /// completed (not run), [`LookupAnswer::NotDone`] runs the body,
    /// [`LookupAnswer::Unknown`] applies the stale policy. An invalid answer or a
    /// lookup that raised ends the claim's lease now (so the next delivery asks again)
    /// and fails with [`Error::Lookup`]: the body is not run.
    ///
    /// Notes: `lookup` (the answer) and an info line, or an error line for a failed
    /// lookup; the completion's warning, or the stale policy's notes.
    ///
    /// Errors: [`Error::Lookup`] as said; [`Error::LostClaim`], connection and
    /// database errors from the completion, hold or give-up; [`Error::Interrupted`].
    pub fn after_lookup(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        claim: Claim,
        answer: LookupAnswer,
        notes: &mut Notes,
    ) -> Result<Step> {
        let label = self.options.lookup.as_deref().unwrap_or("lookup");
        let p = self.words.name_prefix.as_str();
        let failure = match &answer {
            LookupAnswer::Invalid { answer } => Some(format!(
                "{label} of {{claim}} answered {answer}; expected {}",
                LookupAnswer::listed(p, "")
            )),
            LookupAnswer::Raised { error } => Some(format!(
                "{label} of {{claim}} raised {error}; the job was not run, the next delivery \
                 asks again"
            )),
            _ => None,
        };
        if let Some(failure) = failure {
            let described = note::describe_claim(&claim.info, &self.words.id_label);
            let message = failure.replace("{claim}", &described);
            let cause = match &answer {
                LookupAnswer::Raised { error } => error.clone(),
                _ => message.clone(),
            };
            notes.push(Note::claim(
                &claim.info,
                NoteKind::LookupFailed {
                    error: cause.clone(),
                },
            ));
            let expired = channel.fenced(
                interrupt,
                Fenced::Expire,
                &claim.info,
                Some(&limited(&format!("lookup failed: {cause}"))),
            );
            if let Err(e) = expired {
                if matches!(e, Error::Interrupted) {
                    return Err(e);
                }
                notes.push(Note::claim(
                    &claim.info,
                    NoteKind::ExpireFailed {
                        error: e.to_string(),
                    },
                ));
            }
            return Err(Error::Lookup {
                job_type: claim.info.job_type.clone(),
                operation_key: claim.info.operation_key.clone(),
                message,
            });
        }
        let answered = answer.name().unwrap_or("unknown");
        notes.push(Note::claim(
            &claim.info,
            NoteKind::LookupAnswered {
                label: label.to_string(),
                answer: answered,
            },
        ));
        let answered = match answer {
            LookupAnswer::Done => Answer::Done,
            LookupAnswer::NotDone => Answer::NotDone,
            _ => Answer::Unknown,
        };
        match transitions::after_lookup(answered, self.stale_policy(claim.takeovers)) {
            Next::Complete => {
                channel.fenced(interrupt, Fenced::Complete, &claim.info, None)?;
                notes.push(Note::claim(
                    &claim.info,
                    NoteKind::LookupDone {
                        label: label.to_string(),
                    },
                ));
                let mut outcome = Outcome::of(Decision::Completed);
                outcome.claim = Some(claim.info.clone());
                Ok(Step::Skip(outcome))
            }
            Next::Run if answered == Answer::NotDone => {
                notes.push(Note::claim(
                    &claim.info,
                    NoteKind::LookupNotDone {
                        label: label.to_string(),
                    },
                ));
                Ok(self.run(channel, claim))
            }
            next => self.stale_step(channel, interrupt, claim, next, notes),
        }
    }
}
