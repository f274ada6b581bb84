//! The magnus layer: `IdempotentJob::Native`, internal to the gem. It converts Ruby
//! arguments into owned Rust values, runs the core with the GVL released, and maps
//! core errors to the exception classes defined in `lib/idempotent_job/errors.rb`.

mod convert;
mod errors;
mod gvl;
mod heartbeat;
mod options;
mod protocol;
mod store;
mod transaction;

use magnus::{function, Module, Ruby};

pub fn init(ruby: &Ruby) -> Result<(), magnus::Error> {
    let root = ruby.define_module("IdempotentJob")?;
    let native = root.define_module("Native")?;
    native.define_module_function(
        "schema_sql",
        function!(idempotent_job_core::migrate::schema_sql, 0),
    )?;
    native.define_module_function("claim_sql", function!(claim_sql, 0))?;
    native.define_module_function("deliver_sql", function!(deliver_sql, 0))?;
    native.define_module_function("repeats_sql", function!(repeats_sql, 0))?;
    native.define_module_function("describe_url", function!(describe_url, 1))?;
    native.define_module_function("database_url_params", function!(database_url_params, 1))?;
    native.define_module_function("operation_key_problem", function!(operation_key_problem, 2))?;
    native.define_module_function("key_text_problem", function!(key_text_problem, 1))?;
    native.define_module_function("decide", function!(convert::decide, 3))?;
    native.define_module_function("fenced_sql", function!(convert::fenced_sql, 1))?;
    native.define_module_function("server_error", function!(errors::server_error, 2))?;
    native.define_module_function("record_columns", function!(convert::record_columns, 0))?;
    native.define_module_function("job_options_json", function!(options::job_options_json, 0))?;
    native.define_module_function("job_option", function!(options::job_option, 4))?;
    native.define_module_function("canonical_json", function!(canonical_json, 1))?;
    native.define_module_function("facts_json", function!(convert::facts_json, 1))?;
    native.const_set("MAX_KEY_BYTES", idempotent_job_core::keys::MAX_KEY_BYTES)?;
    errors::init(ruby)?;
    store::init(ruby, native)?;
    heartbeat::init(ruby, native)?;
    protocol::init(ruby, native)?;
    transaction::init(ruby, native)
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

/// `Native.key_text_problem(string)` → nil, or why a String inside a key value is not
/// acceptable text ([`idempotent_job_core::keys::text_problem`]: not UTF-8).
fn key_text_problem(text: magnus::RString) -> Option<String> {
    // SAFETY: as above.
    unsafe { idempotent_job_core::keys::text_problem(text.as_slice()) }
}

/// `Native.canonical_json(value)` → the core's canonical JSON of a Ruby value
/// ([`idempotent_job_core::canonical`]), or nil when JSON cannot carry it as the core
/// takes it ([`convert::json_of`]: a Time, a non-finite Float, a Bignum, a Hash key that
/// is not a String or Symbol, a String that is not UTF-8).
fn canonical_json(value: magnus::Value) -> Option<String> {
    convert::json_of(value).map(|json| idempotent_job_core::canonical::to_string(&json))
}

fn repeats_sql() -> &'static str {
    idempotent_job_core::sql::REPEATS_SQL.trim()
}

fn deliver_sql() -> &'static str {
    idempotent_job_core::sql::DELIVER_SQL.trim()
}

fn claim_sql() -> &'static str {
    idempotent_job_core::sql::CLAIM_SQL.trim()
}
