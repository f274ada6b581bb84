//! The magnus layer: `IdempotentJob::Native`, internal to the gem. It converts Ruby
//! arguments into owned Rust values, runs the core with the GVL released, and maps
//! core errors to the exception classes defined in `lib/idempotent_job/errors.rb`.

mod channel;
mod convert;
mod declaration;
mod errors;
mod gvl;
mod heartbeat;
mod options;
mod perform;
mod protocol;
mod raised;
mod repeats;
mod store;
mod transaction;

use magnus::{function, value::ReprValue, Module, Ruby};

pub fn init(ruby: &Ruby) -> Result<(), magnus::Error> {
    let root = ruby.define_module("IdempotentJob")?;
    let native = root.define_module("Native")?;
    native.define_module_function(
        "schema_sql",
        function!(idempotent_job_core::migrate::schema_sql, 0),
    )?;
    native.define_module_function("claim_sql", function!(claim_sql, 0))?;
    native.define_module_function(
        "lock_timeout_statements",
        function!(lock_timeout_statements, 1),
    )?;
    native.define_module_function("raise_lock_timeout", function!(raise_lock_timeout, 4))?;
    native.define_module_function("deliver_sql", function!(deliver_sql, 0))?;
    native.define_module_function("repeats_sql", function!(repeats_sql, 0))?;
    native.define_module_function("classify_repeats", function!(repeats::classify_repeats, 4))?;
    native.define_module_function("restart_window", function!(repeats::restart_window, 1))?;
    native.define_module_function(
        "repeat_deliveries",
        function!(repeats::repeat_deliveries, 3),
    )?;
    native.define_module_function(
        "repeat_row_deliveries",
        function!(repeats::repeat_row_deliveries, 6),
    )?;
    native.define_module_function("epoch_seconds", function!(repeats::epoch_seconds, 1))?;
    native.define_module_function("repeat_causes", function!(repeats::repeat_causes, 0))?;
    native.define_module_function("repeats_report", function!(repeats::repeats_report, 1))?;
    native.define_module_function("describe_url", function!(describe_url, 1))?;
    native.define_module_function("database_url_params", function!(database_url_params, 1))?;
    native.define_module_function("operation_key_problem", function!(operation_key_problem, 2))?;
    native.define_module_function("key_text_problem", function!(key_text_problem, 1))?;
    native.define_module_function("key_refusal", function!(key_refusal, 2))?;
    native.define_module_function("lookup_answers_listed", function!(lookup_answers_listed, 2))?;
    native.define_module_function("decide", function!(convert::decide, 3))?;
    native.define_module_function("fenced_sql", function!(convert::fenced_sql, 1))?;
    native.define_module_function("server_error", function!(errors::server_error, 2))?;
    native.define_module_function("error_table_json", function!(errors::error_table_json, 0))?;
    native.define_module_function("error_example", function!(errors::error_example, 1))?;
    native.define_module_function("record_fields", function!(convert::record_fields, 0))?;
    native.define_module_function("job_options_json", function!(options::job_options_json, 0))?;
    native.define_module_function(
        "connection_defaults_json",
        function!(options::connection_defaults_json, 0),
    )?;
    native.define_module_function("job_option", function!(options::job_option, 4))?;
    native.define_module_function("check_wait", function!(options::check_wait, 2))?;
    native.define_module_function("resolution", function!(options::resolution, 1))?;
    native.define_module_function(
        "job_default_settings",
        function!(options::job_default_settings, 0),
    )?;
    native.define_module_function(
        "job_default_setting",
        function!(options::job_default_setting, 2),
    )?;
    native.define_module_function(
        "connection_setting",
        function!(options::connection_setting, 2),
    )?;
    native.define_module_function(
        "connection_settings",
        function!(options::connection_settings, 0),
    )?;
    native.define_module_function("check_duration", function!(options::check_duration, 2))?;
    native.define_module_function("pool_size_for", function!(options::pool_size_for, 1))?;
    native.define_module_function("env_database_url", function!(options::env_database_url, 0))?;
    native.define_module_function("not_taken", function!(options::not_taken, 6))?;
    native.define_module_function("unknown_setting", function!(options::unknown_setting, 3))?;
    native.define_module_function("canonical_json", function!(canonical_json, 1))?;
    native.define_module_function("args_digest", function!(args_digest, 1))?;
    native.define_module_function("payload_json", function!(payload_json, 1))?;
    native.define_module_function("digest_text", function!(digest_text, 1))?;
    native.define_module_function(
        "key_declaration",
        function!(declaration::key_declaration, 1),
    )?;
    native.define_module_function("declared_key", function!(declaration::declared_key, 3))?;
    native.define_module_function("facts_json", function!(convert::facts_json, 1))?;
    native.define_module_function("value_json", function!(convert::value_json, 1))?;
    // The operating calls' defaults: how many held operations `held` lists, records per
    // purge batch.
    native.const_set(
        "DEFAULT_HELD_LIMIT",
        idempotent_job_core::operations::DEFAULT_HELD_LIMIT,
    )?;
    native.const_set(
        "DEFAULT_PURGE_BATCH",
        idempotent_job_core::operations::DEFAULT_PURGE_BATCH,
    )?;
    native.const_set("MAX_KEY_BYTES", idempotent_job_core::keys::MAX_KEY_BYTES)?;
    // The names of a lookup's answers (`LookupAnswer::NAMES`: "done", "not_done", "unknown").
    native.const_set(
        "LOOKUP_ANSWERS",
        idempotent_job_core::protocol::LookupAnswer::NAMES.to_vec(),
    )?;
    // Epoch values at or above this are milliseconds (Sidekiq 8's timestamps).
    native.const_set(
        "MILLISECONDS_FROM",
        idempotent_job_core::repeats::MILLISECONDS_FROM as i64,
    )?;
    let headers = ruby.ary_from_iter(idempotent_job_core::repeats::CSV_HEADERS);
    headers.freeze();
    native.const_set("REPEATS_CSV_HEADERS", headers)?;
    native.const_set("MAX_NESTING", idempotent_job_core::canonical::MAX_NESTING)?;
    // The most deferrals a delivery can count (the core's rule).
    native.const_set(
        "MAX_DEFERRALS",
        idempotent_job_core::protocol::MAX_DEFERRALS,
    )?;
    native.const_set(
        "MAX_INTEGER_DIGITS",
        idempotent_job_core::canonical::MAX_INTEGER_DIGITS,
    )?;
    native.const_set("TOO_DEEP", idempotent_job_core::canonical::too_deep())?;
    native.define_module_function("nested_too_deep?", function!(convert::nested_too_deep, 1))?;
    let outcomes = ruby.ary_new();
    for label in idempotent_job_core::telemetry::OUTCOMES {
        outcomes.push(ruby.sym_new(label))?;
    }
    outcomes.freeze();
    native.const_set("OUTCOMES", outcomes)?;
    native.const_set(
        "REJECTED_AT_ENQUEUE",
        ruby.sym_new(idempotent_job_core::telemetry::REJECTED_AT_ENQUEUE),
    )?;
    native.define_module_function("key_hash", function!(key_hash, 2))?;
    native.define_module_function("span_name", function!(span_name, 1))?;
    {
        use idempotent_job_core::telemetry as t;
        let attributes = ruby.hash_new();
        for (name, attribute) in [
            ("outcome", t::ATTR_OUTCOME),
            ("job_type", t::ATTR_JOB_TYPE),
            ("key_hash", t::ATTR_KEY_HASH),
            ("door", t::ATTR_DOOR),
            ("attempt", t::ATTR_ATTEMPT),
            ("duplicates", t::ATTR_DUPLICATES),
        ] {
            attributes.aset(ruby.sym_new(name), attribute)?;
        }
        attributes.freeze();
        native.const_set("SPAN_ATTRIBUTES", attributes)?;
        native.const_set("TRACER_NAME", t::TRACER_NAME)?;
    }
    // The core's defaults of the settings that are no job option's (an Integer when whole).
    for (name, seconds) in [
        (
            "DEFAULT_RETENTION",
            idempotent_job_core::config::DEFAULT_RETENTION_SECONDS,
        ),
        (
            "DEFAULT_DEFER_MARGIN",
            idempotent_job_core::protocol::DEFAULT_DEFER_MARGIN_SECONDS,
        ),
        // The operating calls' defaults: `repeats`' `since` (seconds back) and `restart_window`.
        (
            "DEFAULT_REPEATS_SINCE",
            idempotent_job_core::operations::DEFAULT_REPEATS_SINCE_SECONDS,
        ),
        (
            "DEFAULT_RESTART_WINDOW",
            idempotent_job_core::repeats::DEFAULT_RESTART_WINDOW,
        ),
    ] {
        if seconds.fract() == 0.0 {
            native.const_set(name, seconds as i64)?;
        } else {
            native.const_set(name, seconds)?;
        }
    }
    errors::init(ruby)?;
    store::init(ruby, native)?;
    heartbeat::init(ruby, native)?;
    protocol::init(ruby, native)?;
    transaction::init(ruby, native)?;
    resolve_wrapped_classes(ruby);
    Ok(())
}

/// Looks up the Ruby class of every wrapped type once, now, while the extension loads
/// (one thread, before any Ruby code can wrap an object).
///
/// magnus finds a wrapped type's class lazily, on the first object wrapped: a `Lazy`
/// whose initialisation (`Object.const_get(name)`, a Ruby call at whose end Ruby may
/// switch threads) runs inside a `OnceLock`. Left to the first deliveries of a
/// multi-threaded worker, a thread switched out there holds the `OnceLock`, and the next
/// thread wrapping the same type (`Protocol.new`, the `HeartbeatReader` handed to
/// `watch`, a `Transaction`) waits on it holding the GVL: every thread of the process
/// froze for good (a Sidekiq process once started 6 jobs and finished none).
fn resolve_wrapped_classes(ruby: &Ruby) {
    use magnus::TypedData;
    store::NativeStore::class(ruby);
    heartbeat::NativeHeartbeatReader::class(ruby);
    protocol::NativeProtocol::class(ruby);
    transaction::NativeTransaction::class(ruby);
}

/// `Native.key_hash(job_type, operation_key)` → the operation key as telemetry carries it
/// (the core's `telemetry::key_hash`: 16 hex characters, never the raw key).
fn key_hash(job_type: String, operation_key: String) -> String {
    idempotent_job_core::telemetry::key_hash(&job_type, &operation_key)
}

/// `Native.span_name(job_type)` → the name of a delivery's span (the core's
/// `telemetry::span_name`, as Python's spans are named).
fn span_name(job_type: String) -> String {
    idempotent_job_core::telemetry::span_name(&job_type)
}

fn describe_url(url: String) -> String {
    idempotent_job_core::config::describe_url(&url)
}

/// `Native.database_url_params(url)` → `{pool: Integer or nil, prepared_statements:
/// true/false/nil, ignored: [String]}`: what a URL's own query parameters say (Rails'
/// `pool` and `prepared_statements`) and the parameters the gem ignores, for the log.
/// Raises `ConfigurationError` naming a parameter nobody knows or a bad value.
fn database_url_params(ruby: &Ruby, url: String) -> Result<magnus::RHash, magnus::Error> {
    let config = idempotent_job_core::config::Config {
        database_url: url,
        ..idempotent_job_core::config::Config::new("")
    };
    let (pool, prepared) = config
        .url_settings()
        .map_err(|e| errors::to_ruby(ruby, e))?;
    let out = convert::Out::new(ruby);
    out.set("pool", pool)?
        .set("prepared_statements", prepared)?
        .set("ignored", config.ignored_url_params())?;
    Ok(out.hash)
}

/// `Native.operation_key_problem(job_type, operation_key)` → what is wrong with a
/// finished key ([`idempotent_job_core::keys::problem`]: invalid UTF-8, too long, a
/// NUL), or nil. Reads the Strings' bytes as they are (keys are byte for byte).
fn operation_key_problem(job_type: magnus::RString, key: magnus::RString) -> Option<String> {
    // SAFETY: the slices are read before any Ruby code runs again.
    unsafe { idempotent_job_core::keys::problem(job_type.as_slice(), key.as_slice()) }
}

/// `Native.key_refusal(job, problem)` → the message of an operation key refused before
/// anything is claimed ([`idempotent_job_core::keys::refusal`]): "<job>: <problem>; the
/// job was not run and nothing was recorded".
fn key_refusal(job: String, problem: String) -> String {
    idempotent_job_core::keys::refusal(&job, &problem, "job")
}

/// `Native.lookup_answers_listed(before, after)` → the lookup's answers listed for a
/// message, each between `before` and `after` ([`LookupAnswer::listed`]; `(":", "")`:
/// ":done, :not_done or :unknown").
///
/// [`LookupAnswer::listed`]: idempotent_job_core::protocol::LookupAnswer::listed
fn lookup_answers_listed(before: String, after: String) -> String {
    idempotent_job_core::protocol::LookupAnswer::listed(&before, &after)
}

/// `Native.key_text_problem(string)` → nil, or why a String inside a key value is not
/// acceptable text ([`idempotent_job_core::keys::text_problem`]: not UTF-8).
fn key_text_problem(text: magnus::RString) -> Option<String> {
    // SAFETY: as above.
    unsafe { idempotent_job_core::keys::text_problem(text.as_slice()) }
}

/// `Native.canonical_json(value)` → the core's canonical JSON of a Ruby value
/// ([`idempotent_job_core::canonical`]), or nil when JSON cannot carry it
/// ([`convert::json_of`]: a Time, a non-finite Float, an Integer over the core's digit
/// limit, a Hash key that is not a String, Symbol or Integer, a String that is not
/// UTF-8, nesting past the core's limit; [`payload_json`] says why).
fn canonical_json(value: magnus::Value) -> Option<String> {
    convert::json_of(value)
        .ok()
        .map(|json| idempotent_job_core::canonical::to_string(&json))
}

/// `Native.args_digest(args)` → the payload digest of a Ruby value (the core's
/// [`idempotent_job_core::canonical::digest`]: hex SHA-256 of its canonical JSON), or
/// nil when JSON cannot carry it (see [`canonical_json`]).
fn args_digest(value: magnus::Value) -> Option<String> {
    convert::json_of(value)
        .ok()
        .map(|json| idempotent_job_core::canonical::digest(&json))
}

/// `Native.payload_json(args)` → `[text, digest, nil]`: the arguments' canonical JSON
/// text and its digest as a claim stores them (`args_json`, `args_digest`: the core's
/// [`idempotent_job_core::canonical::text_and_digest`], the same bytes in every language
/// and on every Ruby), or `[nil, nil, problem]`: what the arguments hold that JSON cannot
/// carry ("the float NaN …", "a Time", "an integer of 5000 digits …").
fn payload_json(value: magnus::Value) -> (Option<String>, Option<String>, Option<String>) {
    match convert::json_of(value) {
        Ok(json) => {
            let (text, digest) = idempotent_job_core::canonical::text_and_digest(&json);
            (Some(text), Some(digest), None)
        }
        Err(problem) => (None, None, Some(problem)),
    }
}

/// `Native.digest_text(text)` → hex SHA-256 of a String already in canonical JSON
/// ([`idempotent_job_core::canonical::digest_text`]).
fn digest_text(text: magnus::RString) -> String {
    // SAFETY: the slice is read before any Ruby code runs again.
    idempotent_job_core::canonical::digest_bytes(unsafe { text.as_slice() })
}

/// How key messages name Ruby's types (the rules and their wording are the core's,
/// [`idempotent_job_core::keys`]; `Native.declared_key` in `declaration.rs`).
const KEY_WORDS: idempotent_job_core::keys::Words = idempotent_job_core::keys::Words {
    nil: "nil",
    true_type: "TrueClass",
    false_type: "FalseClass",
    float: "Float",
    string: "String",
    list: "Array",
    map: "Hash",
    accepted: "a String, an Integer, or a Hash/Array of JSON values",
    instead_of_float: "pass an Integer or a String",
};

fn repeats_sql() -> &'static str {
    idempotent_job_core::sql::REPEATS_SQL.trim()
}

fn deliver_sql() -> &'static str {
    idempotent_job_core::sql::DELIVER_SQL.trim()
}

fn claim_sql() -> &'static str {
    idempotent_job_core::sql::CLAIM_SQL.trim()
}

/// `Native.lock_timeout_statements(seconds)` → `[set_sql, param, reset_sql]`: the
/// statement that bounds a transactional claim's wait for another delivery's open
/// transaction (`set_config('lock_timeout', $1, true)`), its parameter for `seconds`
/// (whole milliseconds, rounded up) and the statement that restores the session's own
/// lock_timeout after the claim. The core's, as its native transactions send them.
fn lock_timeout_statements(seconds: f64) -> (&'static str, String, &'static str) {
    (
        idempotent_job_core::sql::LOCK_TIMEOUT_SQL,
        idempotent_job_core::session::lock_timeout_param(seconds),
        idempotent_job_core::sql::LOCK_TIMEOUT_RESET_SQL,
    )
}

/// `Native.raise_lock_timeout(job_type, operation_key, seconds, message)` raises
/// `IdempotentJob::LockTimeoutError` (sqlstate 55P03) naming the job type, the
/// operation key and the wait (`seconds`), then PostgreSQL's `message`: the core's
/// wording for a transactional claim that waited too long. Never returns normally.
fn raise_lock_timeout(
    ruby: &Ruby,
    job_type: String,
    operation_key: String,
    seconds: f64,
    message: String,
) -> Result<(), magnus::Error> {
    let err = idempotent_job_core::session::lock_timeout_error(
        &job_type,
        &operation_key,
        seconds,
        &message,
    );
    Err(errors::to_ruby(ruby, err))
}
