//! The end of a delivery that ran: [`Protocol::complete`],
//! [`Protocol::complete_prepared`], [`Protocol::release`] and [`Protocol::keep`].

use std::time::{Duration, Instant};

use crate::conn::Interrupt;
use crate::error::{Error, Result};
use crate::fenced::Fenced;
use crate::record::{self, PreparedResult, ResultInput, ResultState};

use super::*;

impl Protocol {
    /// Records the completion of a body that returned, after stopping its heartbeat.
    /// Outside a transaction every failure but a lost claim is retried after
    /// [`COMPLETION_RETRY_DELAYS`] (the body has run: its delivery must not fail and be
    /// retried); if every attempt fails, an error line says so and the record stays
    /// claimed until its lease ends ([`Completion::recorded`] false). Inside a
    /// transaction it is written once and any failure is returned.
    ///
    /// `result`: the body's value (JSON), stored with the completion, in the same
    /// statement, when [`JobOptions::store_result`] is on, if its JSON text is at most
    /// `max_result_bytes` long (the store's [`crate::config::Config::max_result_bytes`];
    /// a larger one is not stored: [`crate::record::prepare`]). Ignored without
    /// `store_result`. A binding that encodes the value itself prepares the result and
    /// calls [`Protocol::complete_prepared`].
    ///
    /// Notes: the heartbeat's (a claim lost while running, max_run reached);
    /// `completed` (with the body's duration); `lost_claim` and an error line; the
    /// error line of a completion given up.
    ///
    /// Errors: [`Error::LostClaim`] when another delivery took the operation over; in a
    /// transaction, any error of the statement; [`Error::Interrupted`] (a pause between
    /// attempts or an attempt was interrupted: the record stays claimed).
    pub fn complete(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        claim: Claim,
        result: Option<&serde_json::Value>,
        max_result_bytes: usize,
        notes: &mut Notes,
    ) -> Result<Completion> {
        let prepared = match result {
            Some(value) if self.options.store_result => Some(record::prepare(
                max_result_bytes,
                &claim.info.job_type,
                &claim.info.operation_key,
                ResultInput::Json(&value.to_string()),
            )),
            _ => None,
        };
        self.complete_prepared(channel, interrupt, claim, prepared, notes)
    }

    /// [`Protocol::complete`] with the result already prepared by the binding
    /// ([`crate::record::prepare`] with its configured `max_result_bytes`; `None`:
    /// nothing to store, as without `store_result`). The completion statement writes it
    /// ($4, $5): no extra round trip. A result that could not be stored (too large, not
    /// JSON) never fails the completion: a `result_not_stored` note (event and
    /// warning) says why.
    ///
    /// Notes and errors: as [`Protocol::complete`], `completed` carrying the result's
    /// state, then `result_not_stored` when it was not stored.
    pub fn complete_prepared(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        mut claim: Claim,
        result: Option<PreparedResult>,
        notes: &mut Notes,
    ) -> Result<Completion> {
        claim.stop_heartbeat(notes);
        let duration = claim.started.elapsed().as_secs_f64();
        let transactional = channel.transactional();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let written = channel.complete(interrupt, &claim.info, result.as_ref());
            match written {
                Ok(()) => {
                    notes.push(Note::claim(
                        &claim.info,
                        NoteKind::Completed {
                            duration,
                            result_state: result.as_ref().map(|r| r.state),
                        },
                    ));
                    if let Some(PreparedResult {
                        state,
                        warning: Some(reason),
                        ..
                    }) = &result
                    {
                        notes.push(Note::claim(
                            &claim.info,
                            NoteKind::ResultNotStored {
                                state: *state,
                                reason: reason.clone(),
                            },
                        ));
                    }
                    break;
                }
                Err(e @ Error::LostClaim { .. }) => {
                    notes.push(Note::claim(
                        &claim.info,
                        NoteKind::LostClaim {
                            during: "completion",
                            error: Some(e.to_string()),
                        },
                    ));
                    return Err(e);
                }
                Err(e @ Error::Interrupted) => return Err(e),
                Err(e) if transactional => return Err(e),
                Err(e) => {
                    let Some(delay) = COMPLETION_RETRY_DELAYS.get(attempts as usize - 1) else {
                        notes.push(Note::claim(
                            &claim.info,
                            NoteKind::CompletionGivenUp {
                                attempts,
                                error: e.to_string(),
                                error_class: e.class_name(),
                            },
                        ));
                        return Ok(Completion {
                            outcome: self.ran(&claim, None),
                            recorded: false,
                            attempts,
                            result_stored: false,
                        });
                    };
                    channel.pause(interrupt, Duration::from_secs_f64(*delay))?;
                }
            }
        }
        let state = result.as_ref().map(|r| r.state);
        Ok(Completion {
            outcome: self.ran(&claim, state),
            recorded: true,
            attempts,
            result_stored: state == Some(ResultState::Stored),
        })
    }

    /// Gives the claim back after the body raised (`error_class`, `message`: what it
    /// raised; stored in `last_error`, cut to [`ERROR_TEXT_LIMIT`] characters), after
    /// stopping its heartbeat, so the queue's retry claims it again at once. Never
    /// fails: a release that cannot be written leaves the claim for its lease to end
    /// (an error line says so). In a transaction nothing is written (the rollback
    /// undoes the claim).
    ///
    /// Notes: the heartbeat's; `released` (with the error class), or the error line of
    /// a release that failed.
    pub fn release(
        &self,
        channel: &mut dyn Channel,
        interrupt: &Interrupt<'_>,
        mut claim: Claim,
        error_class: &str,
        message: &str,
        notes: &mut Notes,
    ) {
        claim.stop_heartbeat(notes);
        if channel.rolled_back_on_raise() {
            return;
        }
        let text = format!("{error_class}: {message}");
        match channel.fenced(
            interrupt,
            Fenced::Release,
            &claim.info,
            Some(&limited(&text)),
        ) {
            Ok(()) => notes.push(Note::claim(
                &claim.info,
                NoteKind::Released {
                    error_class: error_class.to_string(),
                },
            )),
            Err(e) => notes.push(Note::claim(
                &claim.info,
                NoteKind::ReleaseFailed {
                    error: e.to_string(),
                    error_class: e.class_name(),
                },
            )),
        }
    }

    /// Keeps the claim after a crash (the binding's door says the body's error means
    /// the worker is going away: its effect may have happened): stops the heartbeat
    /// and writes nothing, so the lease decides what a later delivery does.
    ///
    /// Notes: the heartbeat's; a warning that the claim is kept.
    pub fn keep(&self, mut claim: Claim, notes: &mut Notes) {
        claim.stop_heartbeat(notes);
        notes.push(Note::claim(&claim.info, NoteKind::Kept));
    }

    /// [`Step::Run`] for `claim`, its heartbeat started when the options and the
    /// channel have one.
    pub(super) fn run(&self, channel: &mut dyn Channel, mut claim: Claim) -> Step {
        if self.options.heartbeat {
            if let Some(handles) = channel.heartbeat_pool() {
                claim.heartbeat = Some(handles.heartbeat(
                    claim.info.job_type.clone(),
                    claim.info.operation_key.clone(),
                    claim.info.token,
                    self.options.lease_seconds,
                    self.options.max_run_seconds,
                ));
            }
        }
        claim.started = Instant::now();
        Step::Run(claim)
    }

    pub(super) fn ran(&self, claim: &Claim, result_state: Option<ResultState>) -> Outcome {
        let mut outcome = Outcome::of(Decision::Ran);
        outcome.claim = Some(claim.info.clone());
        outcome.result_state = result_state;
        outcome
    }
}
