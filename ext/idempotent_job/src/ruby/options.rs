//! The job options table of the core ([`idempotent_job_core::options`]) for Ruby:
//! `Native.job_options_json` (the table, which `lib/idempotent_job/job_options.rb`
//! freezes at load) and `Native.job_option` (one value checked and normalised).

use magnus::{prelude::*, RString, Ruby, Symbol, Value};
use serde_json::Value as Json;

use super::convert::{inspect, json_of, RbResult};
use super::errors::to_ruby;
use idempotent_job_core::config;
use idempotent_job_core::job_settings::JobDefaults;
use idempotent_job_core::options::{self, Kind};
use idempotent_job_core::records::Resolution;

/// A number Ruby spells other than as an Integer or a Float (JSON's numbers): an
/// `ActiveSupport::Duration` (`10.minutes`, as a Rails app writes a lease), a `Rational`
/// or a `BigDecimal`, as its `to_f` (a Float), for the core's rules of seconds and
/// counts; `None` for any other value (the rule then takes or refuses it as it is).
pub(crate) fn number_of(value: Value) -> RbResult<Option<Value>> {
    let ruby = Ruby::get_with(value);
    if value.is_kind_of(ruby.class_integer()) || value.is_kind_of(ruby.class_float()) {
        return Ok(None);
    }
    // SAFETY: the class name is copied before any other Ruby call.
    let class = unsafe { value.class().name() }.into_owned();
    if !matches!(
        class.as_str(),
        "Rational" | "BigDecimal" | "ActiveSupport::Duration"
    ) {
        return Ok(None);
    }
    let seconds: f64 = value.funcall("to_f", ())?;
    Ok(Some(ruby.float_from_f64(seconds).as_value()))
}

/// `Native.job_options_json` → the table as a JSON object text ([`options::table_json`]).
pub fn job_options_json() -> String {
    options::table_json().to_string()
}

/// `Native.connection_defaults_json` → the connection settings' defaults as a JSON
/// object text ([`idempotent_job_core::config::connection_defaults_json`]).
pub fn connection_defaults_json() -> String {
    idempotent_job_core::config::connection_defaults_json().to_string()
}

/// `Native.connection_settings` → the names (Strings) of the connection settings, in
/// the core's order ([`config::CONNECTION_SETTINGS`]; `database_url` first).
pub fn connection_settings() -> Vec<&'static str> {
    config::CONNECTION_SETTINGS.to_vec()
}

/// `Native.job_default_settings` → the names (Strings) of the settings that give every
/// job its defaults, in the core's order ([`JobDefaults::setting_names`]: each job
/// option's setting, then `defer_margin` and `retention`).
pub fn job_default_settings() -> Vec<&'static str> {
    JobDefaults::setting_names(&[])
}

/// `Native.job_default_setting(name, value)` → `value` as given, once the core accepts
/// it for the job default setting `name` ([`JobDefaults::check`]: `defer_margin` and
/// `retention` from 0 to ten years, an option's setting by the table).
///
/// Raises `IdempotentJob::ConfigurationError` naming the setting and the value (shown
/// by `inspect`) when the core refuses it.
pub fn job_default_setting(ruby: &Ruby, name: String, value: Value) -> RbResult<Value> {
    // As in `job_option`: a value JSON cannot carry is refused (an empty object is no
    // number of seconds and no choice).
    let shown = inspect(value)?;
    let value = number_of(value)?.unwrap_or(value);
    let json = json_of(value).unwrap_or_else(|_| Json::Object(serde_json::Map::new()));
    JobDefaults::check(&name, &json, Some(&shown)).map_err(|e| to_ruby(ruby, e))?;
    Ok(value)
}

/// `Native.check_wait(job, value)` → `value` as a Float once the core's wait rule
/// accepts it ([`idempotent_job_core::results::check_wait`]: a number of seconds from 0
/// to ten years).
///
/// Raises `IdempotentJob::ConfigurationError` naming `job` and the value (shown by
/// `inspect`) otherwise.
pub fn check_wait(ruby: &Ruby, job: String, value: Value) -> RbResult<f64> {
    let shown = inspect(value)?;
    let value = number_of(value)?.unwrap_or(value);
    let seconds = if value.is_kind_of(ruby.class_numeric()) {
        json_of(value).ok().and_then(|j| j.as_f64())
    } else {
        None
    };
    idempotent_job_core::results::check_wait(&job, seconds, Some(&shown))
        .map_err(|e| to_ruby(ruby, e))
}

/// `Native.job_option(job, prefix, name, value)` → the value checked by the core's
/// table ([`options::check`]) and normalised for Ruby: a choice or a transaction
/// flavour as a Symbol (nil when off), seconds and text as given (a Symbol of text as
/// a String), a boolean as itself, nil as nil; a key declaration or a lookup as given
/// (the Ruby side checks those against the job class).
///
/// Raises `IdempotentJob::ConfigurationError` naming `job` and `prefix` + `name` for
/// an unknown name (with the nearest known one) or a bad value (shown by `inspect`).
pub fn job_option(
    ruby: &Ruby,
    job: String,
    prefix: String,
    name: String,
    value: Value,
) -> RbResult<Value> {
    let option = options::find(&name)
        .ok_or_else(|| to_ruby(ruby, options::unknown(&job, &prefix, &name)))?;
    if matches!(option.kind, Kind::Key | Kind::Method) || value.is_nil() {
        return Ok(value);
    }
    // A value JSON cannot carry (a Proc, a Time) is refused by every other kind. No Ruby
    // method runs in `json_of` (an interrupt delivered there would be lost with its
    // refusal); `inspect` runs one, and what it raises goes on (Thread#raise, Timeout).
    let shown = inspect(value)?;
    let value = number_of(value)?.unwrap_or(value);
    let json = json_of(value).unwrap_or_else(|_| Json::Object(serde_json::Map::new()));
    let checked =
        options::check(&job, &prefix, &name, &json, Some(&shown)).map_err(|e| to_ruby(ruby, e))?;
    Ok(match (option.kind, checked) {
        (_, Json::Null) => ruby.qnil().as_value(),
        (Kind::Choice { .. } | Kind::Flavour { .. }, Json::String(s)) => {
            ruby.to_symbol(s).as_value()
        }
        (Kind::Text, Json::String(s)) => ruby.str_new(&s).as_value(),
        _ => value,
    })
}

/// `Native.not_taken(job, call, shown, name, known, suffix)` → raises the core's
/// `ConfigurationError` for a keyword `call` does not take ([`options::not_taken`]):
/// names `job`, `call`, the keyword as written (`shown`, e.g. `:on_stael`), the
/// nearest of `known` and all of them, each with `suffix` (`":"`).
pub fn not_taken(
    ruby: &Ruby,
    job: String,
    call: String,
    shown: String,
    name: String,
    known: Vec<String>,
    suffix: String,
) -> RbResult<()> {
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    Err(to_ruby(
        ruby,
        options::not_taken(&job, &call, &shown, &name, &known, &suffix),
    ))
}

/// `Native.unknown_setting(shown, name, known)` → raises the core's
/// `ConfigurationError` for a setting nobody knows
/// ([`idempotent_job_core::options::unknown_setting`]): the setting as written
/// (`shown`, e.g. `:leese`), the nearest of `known` and all of them.
pub fn unknown_setting(
    ruby: &Ruby,
    shown: String,
    name: String,
    known: Vec<String>,
) -> RbResult<()> {
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    Err(to_ruby(
        ruby,
        idempotent_job_core::options::unknown_setting(&shown, &name, &known),
    ))
}

/// `Native.connection_setting(name, value)` → `value` once the core accepts it for the
/// connection setting `name` ([`config::check_setting`]: the setting's rule, in the job
/// options' words); a choice (`compatibility`) as a Symbol, anything else as given
/// (nil for an unset one that may be unset).
///
/// Raises `IdempotentJob::ConfigurationError` naming the setting and the value (shown
/// by `inspect`; never a password's or a URL's) when the core refuses it, or when
/// `name` is no connection setting.
pub fn connection_setting(ruby: &Ruby, name: String, value: Value) -> RbResult<Value> {
    // As in `job_option`: a value JSON cannot carry is refused by every rule.
    let secret = config::setting_rule(&name).is_some_and(|r| r.secret);
    let shown = if secret {
        String::new()
    } else {
        inspect(value)?
    };
    let value = number_of(value)?.unwrap_or(value);
    let json = json_of(value).unwrap_or_else(|_| Json::Object(serde_json::Map::new()));
    let checked =
        config::check_setting(&name, &json, Some(&shown)).map_err(|e| to_ruby(ruby, e))?;
    let choice = config::setting_rule(&name)
        .is_some_and(|r| matches!(r.rule, config::Rule::Is(Kind::Choice { .. })));
    Ok(match checked {
        Json::String(s) if choice => ruby.to_symbol(s).as_value(),
        _ => value,
    })
}

/// `Native.check_duration(subject, value)` → `value` once the core's rule of a
/// duration accepts it ([`options::DURATION`]: a positive number of seconds up to ten
/// years).
///
/// Raises `IdempotentJob::ConfigurationError` "`subject` must be …, got …" (the value
/// shown by `inspect`) otherwise.
pub fn check_duration(ruby: &Ruby, subject: String, value: Value) -> RbResult<Value> {
    let shown = inspect(value)?;
    let value = number_of(value)?.unwrap_or(value);
    let json = json_of(value).unwrap_or_else(|_| Json::Object(serde_json::Map::new()));
    options::check_kind(&subject, options::DURATION, &json, Some(&shown))
        .map_err(|e| to_ruby(ruby, e))?;
    Ok(value)
}

/// `Native.pool_size_for(concurrency)` → the pool size (Integer) of an unset
/// `pool_size` ([`config::pool_size_for`]): the queue's concurrency (nil: unknown) plus
/// the core's headroom, else the core's default.
pub fn pool_size_for(concurrency: Option<usize>) -> usize {
    config::pool_size_for(concurrency)
}

/// `Native.env_database_url` → the database URL of the environment
/// ([`config::env_database_url`]: the first of `IDEMPOTENT_JOB_DATABASE_URL`,
/// `DATABASE_URL` set and not empty), read now; nil when none is. Runs with the GVL
/// held, so no Ruby thread changes `ENV` meanwhile.
pub fn env_database_url() -> Option<String> {
    config::env_database_url()
}

/// `Native.resolution(value)` → `:done` or `:rerun`: `IdempotentJob.resolve`'s `as:`
/// (a Symbol or a String) parsed by the core ([`Resolution::parse`]), so Ruby and
/// Python take the same names.
///
/// Raises `IdempotentJob::ConfigurationError` in the core's words
/// ([`Resolution::refused`]), the value shown by `inspect`, for anything else.
pub fn resolution(ruby: &Ruby, value: Value) -> RbResult<Symbol> {
    let name = if let Some(symbol) = Symbol::from_value(value) {
        Some(symbol.name()?.into_owned())
    } else {
        RString::from_value(value).and_then(|text| text.to_string().ok())
    };
    match name.as_deref().map(Resolution::parse) {
        Some(Ok(Resolution::Done)) => Ok(ruby.to_symbol("done")),
        Some(Ok(Resolution::Rerun)) => Ok(ruby.to_symbol("rerun")),
        _ => Err(to_ruby(ruby, Resolution::refused(&inspect(value)?))),
    }
}
