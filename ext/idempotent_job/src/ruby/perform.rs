//! `IdempotentJob::Native::Protocol#perform`: one delivery in one native call. The
//! core's driver ([`Protocol::perform`]) runs the whole protocol; this file is its
//! [`Host`] for Ruby (statements with the GVL released, the lookup, the body with its
//! claim and heartbeat watch, the result's JSON and the notes handed to a Ruby handler);
//! the statements go to one of the channels of `channel.rs`; what the body raised is
//! read by `raised.rs`.

use std::cell::RefCell;
use std::sync::Mutex;

use magnus::{
    typed_data::Obj, value::ReprValue, IntoValue, Module, RArray, RHash, RModule, RString, Ruby,
    Symbol, TryConvert, Value,
};

use super::channel::{SessionChannel, TxChannel, RAISED_IN_RUBY};
use super::convert::{json_of, RbResult};
use super::errors::to_ruby;
use super::gvl::without_gvl;
use super::heartbeat::{heartbeat_hash, NativeHeartbeatReader};
use super::protocol::{claim_object, notes_array, outcome_hash, NativeProtocol};
use super::raised::{left_body, raised_body};
use super::store::NativeStore;
use super::transaction::NativeTransaction;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::heartbeat::HeartbeatReader;
use idempotent_job_core::keys;
use idempotent_job_core::protocol::{
    Body, Channel, ClaimInfo, DeliveryRequest, Direct, Host, LookupAnswer, Notes, Protocol,
    Replaceable,
};
use idempotent_job_core::session::Session;

/// Ruby's side of one delivery: the handler (`Protocol::Driver`) answers `lookup(key)`
/// (a Symbol or a pair, see `NativeProtocol::lookup_answer`), `body(claim,
/// native_transaction_or_nil)` → the body's value (raising what the body raised; see
/// [`raised_body`]), `encode(value)` → `[json_or_nil, why_not_or_nil]`,
/// `tell(notes)` and `refuse_key(problem)` (see [`checked_key`]). `door` answers
/// `crash?(error)` (see [`raised_body`]).
struct RbHost<'a> {
    ruby: &'a Ruby,
    handler: Value,
    door: Value,
    release_gvl: bool,
    raised: &'a RefCell<Option<magnus::Error>>,
    protocol: &'a Protocol,
    delivery: &'a DeliveryRequest,
    /// The first error a `tell`, `watch`, `stopped` or `encode` callback raised (raised
    /// after the call).
    failed: Option<magnus::Error>,
    /// The store the delivery began on, and where a newer one goes (see [`Replaceable`]).
    store: Value,
    next_pool: &'a Mutex<Option<Direct>>,
    /// The transaction the body writes through (`transaction: true`), handed to `body`.
    transaction: Option<Value>,
    /// The running body's heartbeat ([`Host::watch`]) and its Ruby reader: watched by
    /// `HeartbeatWatch` while the body runs, stopped with its last report when it ends.
    heartbeat: Option<(HeartbeatReader, Value)>,
    /// The `Claim` the body ran under (the `:ran` outcome's).
    claim: Option<Value>,
}

impl RbHost<'_> {
    fn core_error(&self, err: Error) -> magnus::Error {
        if matches!(&err, Error::Panic(m) if m == RAISED_IN_RUBY) {
            if let Some(raised) = self.raised.borrow_mut().take() {
                return raised;
            }
        }
        to_ruby(self.ruby, err)
    }

    /// After the body, `IdempotentJob.store`: a store configured anew while the body ran
    /// takes the statements after it (one that cannot be had is not followed).
    fn follow_store(&mut self) {
        let store = match self
            .gem()
            .and_then(|gem| gem.funcall::<_, _, Value>("store", ()))
        {
            Ok(store) => store,
            Err(e) if !e.is_kind_of(self.ruby.exception_standard_error()) => {
                return self.keep_failure(e);
            }
            Err(_) => return,
        };
        if store.is_nil() || store.equal(self.store).unwrap_or(false) {
            return;
        }
        let native = <&NativeStore>::try_convert(store);
        if let Ok(direct) = native.and_then(|native| NativeProtocol::direct(self.ruby, native)) {
            *self.next_pool.lock().unwrap_or_else(|p| p.into_inner()) = Some(direct);
            self.store = store;
        }
    }

    fn keep_failure(&mut self, err: magnus::Error) {
        self.failed.get_or_insert(err);
    }

    /// `IdempotentJob`.
    fn gem(&self) -> RbResult<RModule> {
        self.ruby.class_object().const_get("IdempotentJob")
    }

    /// `HeartbeatWatch.watch(reader, claim)` before the body, `HeartbeatWatch.stop(reader,
    /// last_report)` after it (renewal failures not told yet are told then).
    fn heartbeat_watch(&mut self, claim: Value, start: bool) {
        let Some((heartbeat, reader)) = (if start {
            self.heartbeat.clone()
        } else {
            self.heartbeat.take()
        }) else {
            return;
        };
        let watch = self
            .gem()
            .and_then(|gem| gem.const_get::<_, RModule>("HeartbeatWatch"));
        let told = if start {
            watch.and_then(|w| w.funcall::<_, _, Value>("watch", (reader, claim)))
        } else {
            let report = heartbeat_hash(self.ruby, heartbeat.report());
            watch.and_then(|w| w.funcall::<_, _, Value>("stop", (reader, report?)))
        };
        if let Err(e) = told {
            self.keep_failure(e);
        }
    }

    /// Hands `notes` (drained) to the handler's `tell`.
    fn publish(&mut self, notes: &mut Notes) {
        if notes.is_empty() {
            return;
        }
        let told = notes_array(self.ruby, notes, self.delivery, self.protocol.words())
            .and_then(|array| self.handler.funcall::<_, _, Value>("tell", (array,)));
        notes.clear();
        if let Err(e) = told {
            self.keep_failure(e);
        }
    }
}

impl Host for RbHost<'_> {
    type Value = Value;
    type Raised = magnus::Error;

    fn blocking<T: Send>(
        &mut self,
        call: impl FnOnce(&Interrupt<'_>) -> Result<T> + Send,
    ) -> std::result::Result<T, magnus::Error> {
        let done = if self.release_gvl {
            without_gvl(self.ruby, call)?
        } else {
            call(&Interrupt::none())
        };
        done.map_err(|e| self.core_error(e))
    }

    fn lookup(&mut self, operation_key: &str) -> LookupAnswer {
        let asked = self
            .handler
            .funcall::<_, _, Value>("lookup", (operation_key,))
            .and_then(|answer| NativeProtocol::lookup_answer(self.ruby, answer));
        asked.unwrap_or_else(|e| {
            let error = e.to_string();
            // `Driver#lookup` answers a StandardError itself: anything else left the lookup
            // another way (a throw — Ruby 3.1's Timeout —, a signal, Thread#raise, exit).
            // The core leaves the claim stale as for a failed lookup; that jump or error
            // goes on after it, never turned into a LookupError.
            if !e.is_kind_of(self.ruby.exception_standard_error()) {
                self.keep_failure(e);
            }
            LookupAnswer::Raised { error }
        })
    }

    fn body(&mut self, info: &ClaimInfo) -> Body<Value, magnus::Error> {
        let claim = match claim_object(self.ruby, info) {
            Ok(claim) => claim,
            Err(e) => return left_body(e),
        };
        self.claim = Some(claim);
        self.heartbeat_watch(claim, true);
        let ran = self
            .handler
            .funcall::<_, _, Value>("body", (claim, self.transaction));
        self.heartbeat_watch(claim, false);
        let ended = match ran {
            Ok(value) => Body::Returned(value),
            Err(left) => raised_body(self.ruby, self.door, left),
        };
        self.follow_store();
        ended
    }

    fn encode(&mut self, value: &Value) -> std::result::Result<String, String> {
        let pair = self
            .handler
            .funcall::<_, _, RArray>("encode", (*value,))
            .and_then(|pair| {
                Ok((
                    pair.entry::<Option<String>>(0)?,
                    pair.entry::<Option<String>>(1)?,
                ))
            });
        match pair {
            Ok((Some(json), _)) => Ok(json),
            Ok((None, why)) => Err(why.unwrap_or_else(|| "no JSON text was given".into())),
            // `encode` answers a refusal itself and never raises: what left it is an
            // interrupt Ruby delivered at one of its method calls (Thread#raise, Thread#kill,
            // Timeout) or a broken handler. It goes on after the call, like a `tell`'s,
            // never only worded as a refusal (the thread would carry on as if nothing came).
            Err(e) => {
                let why = e.to_string();
                self.keep_failure(e);
                Err(why)
            }
        }
    }

    fn tell(&mut self, notes: &mut Notes) {
        self.publish(notes);
    }

    /// What a `tell` raised before a wait (a signal, Thread#raise or Timeout landing in
    /// an event subscriber or the logger, or their own non-StandardError): raised now,
    /// not after waiting up to `wait:` seconds.
    fn interrupted(&mut self) -> Option<magnus::Error> {
        self.failed.take()
    }

    fn watch(&mut self, heartbeat: HeartbeatReader) {
        let reader = NativeHeartbeatReader(heartbeat.clone()).into_value_with(self.ruby);
        self.heartbeat = Some((heartbeat, reader));
    }
}

/// The delivery's payload and facts, carried by the request Hash as Ruby values
/// (`payload:` an Array, `facts:` a Hash or nil), written by the core
/// ([`DeliveryRequest::write_payload`]: a value JSON cannot carry is refused, naming the
/// job, before anything is claimed). A request with no `payload:` is left as it came.
fn written(ruby: &Ruby, request: RHash, delivery: &mut DeliveryRequest) -> RbResult<()> {
    let Some(payload) = request.get(ruby.sym_new("payload")) else {
        return Ok(());
    };
    let facts = request.get(ruby.sym_new("facts")).filter(|f| !f.is_nil());
    delivery
        .write_payload(json_of(payload), facts.map(json_of))
        .map_err(|e| to_ruby(ruby, e))
}

/// Checks the request's operation key by the core's rules ([`keys::problem`]: UTF-8,
/// size, no NUL) before anything is claimed; a key the core refuses goes to the
/// handler's `refuse_key(problem)`, which raises the job's `OperationKeyError`.
fn checked_key(ruby: &Ruby, request: RHash, handler: Value) -> RbResult<()> {
    let text = |key: &str| -> RbResult<RString> { request.fetch(ruby.sym_new(key)) };
    let (job_type, operation_key) = (text("job_type")?, text("operation_key")?);
    // SAFETY: the slices are read before any Ruby code runs again.
    let problem = unsafe { keys::problem(job_type.as_slice(), operation_key.as_slice()) };
    let Some(problem) = problem else {
        return Ok(());
    };
    handler.funcall::<_, _, Value>("refuse_key", (problem.as_str(),))?;
    Err(to_ruby(ruby, Error::OperationKey(problem)))
}

impl NativeProtocol {
    /// `perform(store, channel, request, door, deferrals, wait, handler)` runs one delivery
    /// (the claim, a wait, the lookup, the body, the completion or release) and answers
    /// `[decision, keywords, notes]` (`Outcome.new(decision, **keywords)`, see
    /// [`outcome_hash`]) or `[:error, exception, notes]` (what the body raised after its
    /// claim was released or kept, or the core's error). `channel`: nil (the store's
    /// pool), `:transaction` (the gem's own transaction: begun here, committed after a
    /// delivery that did not fail, rolled back otherwise; the body gets it as `body`'s
    /// second argument), or a Ruby session (`Transactional::ActiveRecord`); `request`:
    /// the claim request Hash (see `convert::claim_request`), with the delivery's
    /// `payload:` and `facts:` in place of its JSON texts (see [`written`]); `door`: the
    /// door whose words tell the notes and errors (see [`NativeProtocol::told`]) and
    /// whose `crash?` rule applies; `wait`: seconds to wait for a live claim (pool only)
    /// or nil; `handler`: see [`RbHost`]. Notes already handed to `handler.tell` are not
    /// repeated. A jump with no exception (Thread#kill, throw) goes on at once.
    #[allow(clippy::too_many_arguments)]
    pub fn perform(
        ruby: &Ruby,
        rb_self: &Self,
        store_value: Value,
        channel: Value,
        request: RHash,
        door: Value,
        deferrals: u32,
        wait: Option<f64>,
        handler: Value,
    ) -> RbResult<RArray> {
        checked_key(ruby, request, handler)?;
        let protocol = rb_self.told(door)?;
        let mut delivery = Self::delivery(ruby, request, deferrals, wait)?;
        written(ruby, request, &mut delivery)?;
        let store = <&NativeStore>::try_convert(store_value)?;
        let raised = RefCell::new(None);
        let next_pool = Mutex::new(None);
        // `:transaction`: the gem's own transaction, opened here and ended below.
        let opened: Option<Obj<NativeTransaction>> = match Symbol::from_value(channel) {
            Some(_) => {
                // A transaction that cannot begin (a wrong password, no database…) is
                // this delivery's claim failing: its error names the job and operation.
                let session = store.run(ruby, |pool, interrupt| {
                    Session::begin(pool, interrupt)
                        .map_err(|e| e.naming_claim(&delivery.job_type, &delivery.operation_key))
                })?;
                Some(ruby.obj_wrap(NativeTransaction::new(session)))
            }
            None => None,
        };
        // Where the statements go: the gem's transaction (opened here or given), a Ruby
        // session (called with the GVL held), or the store's pool.
        let tx = match &opened {
            Some(tx) => Some(&**tx),
            None => <&NativeTransaction>::try_convert(channel).ok(),
        };
        let mut session = (tx.is_none() && !channel.is_nil()).then_some(SessionChannel {
            session: channel,
            raised: &raised,
            repeat: None,
        });
        let release_gvl = session.is_none();
        let (mut pool, mut in_tx) = (None, None);
        let rb_channel: &mut (dyn Channel + Send) = match (tx, &mut session) {
            (Some(tx), _) => in_tx.insert(TxChannel(tx)),
            (None, Some(session)) => session,
            (None, None) => pool.insert(Replaceable::new(Self::direct(ruby, store)?, &next_pool)),
        };
        let mut host = RbHost {
            ruby,
            handler,
            door,
            release_gvl,
            raised: &raised,
            protocol: &protocol,
            delivery: &delivery,
            failed: None,
            store: store_value,
            next_pool: &next_pool,
            heartbeat: None,
            claim: None,
            transaction: opened.map(|tx| tx.as_value()),
        };
        let mut notes = Notes::new();
        let max_result_bytes = store.0.config().max_result_bytes;
        let performed = protocol.perform(
            rb_channel,
            &delivery,
            max_result_bytes,
            &mut host,
            &mut notes,
        );
        // The gem's transaction commits what the delivery did (the claim, the body's
        // writes, the completion) unless it failed; an error rolls everything back (a
        // rollback that fails closes the connection instead: PostgreSQL rolls back). It
        // is ended before a callback's error (a raising event subscriber or logger) is
        // raised below: never left open, holding the record's row lock, until a GC.
        let performed = match (performed, opened) {
            (Ok(done), Some(tx)) => tx.finish(ruby, true).map(|_| done),
            (Err(e), Some(tx)) => {
                let _ = tx.finish(ruby, false);
                Err(e)
            }
            (done, None) => done,
        };
        // A repeat claimed on another driver's transaction (ActiveRecord's) is queued for
        // the bookkeeping now, in this call, when the delivery did not fail and no
        // callback raised (an event subscriber's or a logger's error is raised below,
        // inside that transaction, which then rolls back with the claim's counting; a
        // delivery that ends well commits right after): the batches skip the record's
        // row while that transaction holds it (`FLUSH_SQL`), so the writer never waits
        // on it.
        if let (Ok(_), None, Some(session)) = (&performed, &host.failed, &mut session) {
            if let (Some(repeat), Ok(pool)) = (session.repeat.take(), store.0.pool()) {
                pool.bookkeeper().record(repeat);
            }
        }
        if let Some(failed) = host.failed.take() {
            return Err(failed);
        }
        let (kind, value): (&str, Value) = match performed {
            // The keywords of `Outcome.new(kind, **value)`; a stored result that cannot be
            // read back raises after the notes are told.
            Ok(done) => {
                let ran = done.value.map(|value| (value, host.claim));
                match outcome_hash(ruby, &done.outcome, ran) {
                    Ok(hash) => (done.outcome.decision.as_str(), hash.as_value()),
                    Err(e) => {
                        host.publish(&mut notes);
                        return Err(e);
                    }
                }
            }
            Err(e) => match e.value() {
                Some(exception) => ("error", exception),
                None => {
                    host.publish(&mut notes);
                    return Err(e);
                }
            },
        };
        let notes = notes_array(ruby, &notes, &delivery, protocol.words())?;
        Ok(ruby.ary_new_from_values(&[ruby.sym_new(kind).as_value(), value, notes.as_value()]))
    }
}
