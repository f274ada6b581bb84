//! The one driver of a delivery: begin → (lookup) → (wait) → body → complete, release
//! or keep. Every binding and door calls [`Protocol::perform`] once per delivery and
//! implements [`Host`] for what is its own: running the user's body and lookup, and
//! running blocking database work with its interpreter lock released.

use super::{Channel, ClaimInfo, DeliveryRequest, LookupAnswer, Notes, Outcome, Protocol, Step};
use crate::conn::Interrupt;
use crate::error::Result;
use crate::heartbeat::HeartbeatReader;
use crate::record::{self, ResultInput};

/// What the user's body did ([`Host::body`]).
pub enum Body<V, R> {
    /// It returned `value` (handed back in [`Performed::value`]).
    Returned(V),
    /// It raised `raised` (handed back as `perform`'s error once the claim is settled).
    /// `class` and `message` are recorded with the release; `crash` (the worker is
    /// going away: SystemExit, a killed thread) keeps the claim until its lease ends.
    Raised {
        /// The host's error, handed back untouched.
        raised: R,
        /// Its class name, recorded with the release.
        class: String,
        /// Its message, recorded with the release.
        message: String,
        /// The worker is going away: keep the claim rather than release it.
        crash: bool,
    },
}

/// What a binding or door implements for one delivery: user code and the lock.
pub trait Host {
    /// The body's value, handed back untouched.
    type Value;
    /// The host's error: what the body raised, an interrupt, or a core error mapped by
    /// [`Host::blocking`].
    type Raised;

    /// Runs `call` (blocking database work) with the host's interpreter lock released
    /// and an [`Interrupt`] its signals or unblocking function can wake; maps the core's
    /// error to the host's.
    fn blocking<T: Send>(
        &mut self,
        call: impl FnOnce(&Interrupt<'_>) -> Result<T> + Send,
    ) -> std::result::Result<T, Self::Raised>;

    /// Asks the user's lookup whether the operation behind `operation_key` happened
    /// (a stale claim under `on_stale: lookup`).
    fn lookup(&mut self, operation_key: &str) -> LookupAnswer;

    /// Runs the user's body under the claim `claim` (its heartbeat renews the lease).
    fn body(&mut self, claim: &ClaimInfo) -> Body<Self::Value, Self::Raised>;

    /// The body's value for storing (called only when the job stores results): its JSON
    /// text, or why it has none (`Err("a Time at [\"at\"] is not a JSON value")`).
    fn encode(&mut self, value: &Self::Value) -> std::result::Result<String, String>;

    /// Called before user code runs (the lookup, the body) and before a wait for a live
    /// claim, with what happened so far, for a host that publishes notes as they come
    /// (Ruby's event subscribers see a takeover before its body runs, a waiter is told
    /// before it waits). A host may drain `notes`; by default they stay
    /// for the end of [`Protocol::perform`].
    fn tell(&mut self, _notes: &mut Notes) {}

    /// Asked after [`Host::tell`], before a wait for a live claim (no claim is held
    /// then): an error a host callback raised meanwhile that must end the delivery now
    /// (a signal or an interrupt that arrived while an event subscriber or the logger
    /// ran) instead of after the wait. By default none.
    fn interrupted(&mut self) -> Option<Self::Raised> {
        None
    }

    /// Called before the body runs when its claim has a heartbeat: a host may watch
    /// it (tell renewal failures while the body still runs).
    fn watch(&mut self, _heartbeat: HeartbeatReader) {}
}

/// One delivery's end: the core's outcome and, when the body ran and returned, its value.
pub struct Performed<V> {
    /// What the delivery ended with.
    pub outcome: Outcome,
    /// The body's value when it ran and returned; `None` otherwise.
    pub value: Option<V>,
}

impl Protocol {
    /// Runs one delivery on `channel` (a pool connection, a native transaction, a
    /// binding's own session), calling `host` only for user code. `max_result_bytes`
    /// bounds a stored result. What happened is also pushed on `notes` (events and log
    /// lines, heartbeat failures included) for the host to publish.
    ///
    /// Errors: the host's: a core error mapped by [`Host::blocking`] (the body did not
    /// run, or its completion could not be written), or what the body raised, after
    /// the claim was released (kept when `crash`).
    pub fn perform<H: Host>(
        &self,
        channel: &mut (dyn Channel + Send),
        delivery: &DeliveryRequest,
        max_result_bytes: usize,
        host: &mut H,
        notes: &mut Notes,
    ) -> std::result::Result<Performed<H::Value>, H::Raised> {
        let mut step = host.blocking(|i| self.begin(channel, i, delivery, notes))?;
        let mut waited = false;
        loop {
            step = match step {
                Step::AskLookup(claim) => {
                    host.tell(notes);
                    let answer = host.lookup(&claim.info().operation_key);
                    host.blocking(|i| {
                        i.end_by(delivery.wait_until);
                        self.after_lookup(channel, i, claim, answer, notes)
                    })?
                }
                // Asked to wait (`wait=`): the core waits for the live claim to end, then
                // decides again (a completion replays, a release may run, still live: defer).
                Step::InProgress(outcome) if outcome.wait_seconds.is_some() => {
                    host.tell(notes);
                    if let Some(raised) = host.interrupted() {
                        return Err(raised);
                    }
                    waited = true;
                    host.blocking(|i| self.wait(channel, i, delivery, notes))?
                }
                Step::Skip(mut outcome) | Step::InProgress(mut outcome) => {
                    outcome.waited = waited;
                    return Ok(Performed {
                        outcome,
                        value: None,
                    });
                }
                Step::Run(claim) => match self.run_body(host, &claim, notes) {
                    Body::Returned(value) => {
                        let prepared = self.options.store_result.then(|| {
                            let encoded = host.encode(&value);
                            let input = match &encoded {
                                Ok(json) => ResultInput::Json(json),
                                Err(what) => ResultInput::Unencodable(what),
                            };
                            let info = claim.info();
                            record::prepare(
                                max_result_bytes,
                                &info.job_type,
                                &info.operation_key,
                                input,
                            )
                        });
                        let completion = host.blocking(|i| {
                            self.complete_prepared(channel, i, claim, prepared, notes)
                        })?;
                        let mut outcome = completion.outcome;
                        outcome.waited = waited;
                        return Ok(Performed {
                            outcome,
                            value: Some(value),
                        });
                    }
                    Body::Raised {
                        raised,
                        class,
                        message,
                        crash,
                    } => {
                        if crash {
                            self.keep(claim, notes);
                        } else {
                            host.blocking(|i| {
                                self.release(channel, i, claim, &class, &message, notes);
                                Ok(())
                            })?;
                        }
                        return Err(raised);
                    }
                },
            }
        }
    }

    /// Tells the host what happened so far, hands it the claim's heartbeat, then runs
    /// the user's body.
    fn run_body<H: Host>(
        &self,
        host: &mut H,
        claim: &super::Claim,
        notes: &mut Notes,
    ) -> Body<H::Value, H::Raised> {
        host.tell(notes);
        if let Some(heartbeat) = claim.heartbeat_reader() {
            host.watch(heartbeat);
        }
        host.body(claim.info())
    }
}
