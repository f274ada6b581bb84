//! The magnus layer: `IdempotentJob::Native`, internal to the gem. It converts Ruby
//! arguments into owned Rust values, runs the core with the GVL released, and maps
//! core errors to the exception classes defined in `lib/idempotent_job/errors.rb`.

mod convert;
mod errors;
mod gvl;
mod heartbeat;
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
    native.define_module_function("decide", function!(convert::decide, 3))?;
    native.define_module_function("fenced_sql", function!(convert::fenced_sql, 1))?;
    native.define_module_function("server_error", function!(errors::server_error, 2))?;
    native.define_module_function("record_columns", function!(convert::record_columns, 0))?;
    errors::init(ruby)?;
    store::init(ruby, native)?;
    heartbeat::init(ruby, native)?;
    protocol::init(ruby, native)?;
    transaction::init(ruby, native)
}

fn describe_url(url: String) -> String {
    idempotent_job_core::config::describe_url(&url)
}

fn repeats_sql() -> &'static str {
    idempotent_job_core::claim::REPEATS_SQL.trim()
}

fn deliver_sql() -> &'static str {
    idempotent_job_core::claim::DELIVER_SQL.trim()
}

fn claim_sql() -> &'static str {
    idempotent_job_core::claim::CLAIM_SQL.trim()
}
