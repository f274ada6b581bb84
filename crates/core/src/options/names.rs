//! Names nobody knows: the nearest known name ([`nearest`], [`suggestion`]) and the
//! errors for an unknown option, a keyword a call does not take and an unknown setting.

use super::table::JOB_OPTIONS;
use crate::error::Error;

/// `job: ` to begin a message with (nothing for a setting, whose `job` is empty).
pub(super) fn owner(job: &str) -> String {
    if job.is_empty() {
        String::new()
    } else {
        format!("{job}: ")
    }
}

/// The known name nearest to `name` (both without a prefix), if one is close enough
/// to be a likely misspelling.
pub fn suggestion(name: &str) -> Option<&'static str> {
    let names: Vec<&'static str> = JOB_OPTIONS.iter().map(|o| o.name).collect();
    nearest(name, &names)
}

/// The name of `known` nearest to `name`, if one is close enough to be a likely
/// misspelling (Jaro-Winkler similarity 0.8 or more), or one that `name` ends with
/// after an underscore (a door's prefix written where none is taken:
/// `idempotency_lease` for `lease`).
pub fn nearest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    if let Some(found) = known.iter().find(|k| {
        name.strip_suffix(**k)
            .is_some_and(|head| head.ends_with('_'))
    }) {
        return Some(found);
    }
    known
        .iter()
        .map(|k| (*k, strsim::jaro_winkler(name, k)))
        .filter(|(_, score)| *score >= 0.8)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, _)| n)
}

/// The error for an option name nobody knows: names the job, the option as written
/// (`prefix` + `name`), the nearest known one ("did you mean …?") and every known one.
pub fn unknown(job: &str, prefix: &str, name: &str) -> Error {
    let names: Vec<&str> = JOB_OPTIONS.iter().map(|o| o.name).collect();
    unknown_among(job, prefix, name, &names)
}

/// [`unknown`] for a door or binding that takes only some of the options (`known`,
/// without a prefix): suggests and lists only those.
pub fn unknown_among(job: &str, prefix: &str, name: &str, known: &[&str]) -> Error {
    let hint = nearest(name, known)
        .map(|s| format!(" (did you mean {prefix}{s}?)"))
        .unwrap_or_default();
    let listed: Vec<String> = known.iter().map(|o| format!("{prefix}{o}")).collect();
    Error::Config(format!(
        "{}unknown option {prefix}{name}{hint}; known options: {}",
        owner(job),
        listed.join(", ")
    ))
}

/// The error for a keyword a call does not take (the plain API's `perform_once`): names
/// the job, the call, the keyword as the host writes it (`shown`: Ruby's `:on_stael`),
/// the nearest of `known` and every one of them, each written with `suffix` (Ruby's
/// keyword colon, `lease:`; nothing in Python).
pub fn not_taken(
    job: &str,
    call: &str,
    shown: &str,
    name: &str,
    known: &[&str],
    suffix: &str,
) -> Error {
    let hint = nearest(name, known)
        .map(|s| format!(" (did you mean {s}{suffix}?)"))
        .unwrap_or_default();
    let listed: Vec<String> = known.iter().map(|k| format!("{k}{suffix}")).collect();
    Error::Config(format!(
        "{}{call} does not take {shown}{hint} (it takes {})",
        owner(job),
        listed.join(", ")
    ))
}

/// The error for a setting nobody knows: names it as the host wrote it (`shown`, e.g.
/// Ruby's `:leese`), the nearest of `known` ("did you mean lease?") and every known one.
pub fn unknown_setting(shown: &str, name: &str, known: &[&str]) -> Error {
    let hint = nearest(name, known)
        .map(|s| format!(" (did you mean {s}?)"))
        .unwrap_or_default();
    Error::Config(format!(
        "unknown idempotent_job setting {shown}{hint} (known: {})",
        known.join(", ")
    ))
}
