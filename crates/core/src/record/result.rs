//! A stored result: what became of it ([`ResultState`]), what a repeat replays
//! ([`Replay`]), and the check of a body's value before the completion stores it
//! ([`prepare`], giving a [`PreparedResult`]).

use crate::error::{Error, Result};

/// What became of the result a completion was asked to store (`result_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultState {
    /// Stored in `result`: a repeat replays it.
    Stored,
    /// Larger than `max_result_bytes`: not stored.
    TooLarge,
    /// Not JSON (or JSON that jsonb cannot hold, such as `\u0000`): not stored.
    Unencodable,
}

impl ResultState {
    /// The name stored in `result_state`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultState::Stored => "stored",
            ResultState::TooLarge => "too_large",
            ResultState::Unencodable => "unencodable",
        }
    }

    /// The state named `name` in `result_state`.
    ///
    /// Errors: [`Error::Database`] for a name this version does not know.
    pub fn parse(name: &str) -> Result<ResultState> {
        match name {
            "stored" => Ok(ResultState::Stored),
            "too_large" => Ok(ResultState::TooLarge),
            "unencodable" => Ok(ResultState::Unencodable),
            other => Err(Error::Database {
                message: format!(
                    "an idempotency record has result_state {other:?}, which this version of \
                     idempotent_job does not know (upgrade idempotent_job)"
                ),
                sqlstate: "XX000".into(),
            }),
        }
    }
}

/// What a repeat of a completed operation learns of its first run's result: the
/// stored JSON text (None unless `state` is [`ResultState::Stored`]) and the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The stored result as JSON text, when `state` is `Stored`.
    pub json: Option<String>,
    /// What became of the result.
    pub state: ResultState,
}

impl Replay {
    /// The replay of a record's `result` and `result_state` columns; None when its
    /// completion stored nothing (no store requested, or a record from before V7).
    ///
    /// Errors: an unknown `result_state` ([`ResultState::parse`]).
    pub fn from_columns(json: Option<String>, state: Option<&str>) -> Result<Option<Replay>> {
        let Some(state) = state else {
            return Ok(None);
        };
        Ok(Some(Replay {
            json,
            state: ResultState::parse(state)?,
        }))
    }

    /// Whether the first run's value was stored (a repeat gets it).
    pub fn stored(&self) -> bool {
        self.state == ResultState::Stored
    }
}

/// What the body gave a completion to store.
#[derive(Debug, Clone, Copy)]
pub enum ResultInput<'a> {
    /// The body's value as JSON text (the host language encoded it).
    Json(&'a str),
    /// The host language could not encode the value as JSON; the text says why (e.g.
    /// `"a Time at [\"at\"] is not a JSON value"`).
    Unencodable(&'a str),
}

/// A result ready for the completion statement ([`prepare`]): the JSON text to store
/// (None when it is not stored), its `result_state`, and, when it is not stored, the
/// warning to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedResult {
    /// The JSON text to store; `None` when it is not stored.
    pub json: Option<String>,
    /// The `result_state` to write.
    pub state: ResultState,
    /// When not stored: the warning to log (the completion stands).
    pub warning: Option<String>,
}

/// Checks a body's result for storing with the completion: JSON that jsonb holds, at
/// most `max_bytes` bytes. Never fails: a value that cannot be stored is prepared as
/// not stored ([`ResultState::TooLarge`] / [`ResultState::Unencodable`]) with a
/// warning naming the job, the operation and the reason, and the completion goes on.
pub fn prepare(
    max_bytes: usize,
    job_type: &str,
    operation_key: &str,
    input: ResultInput<'_>,
) -> PreparedResult {
    let not_stored = |state: ResultState, why: String| {
        PreparedResult {
        json: None,
        state,
        warning: Some(format!(
            "{job_type} operation {operation_key:?} completed, but its result was not stored: \
             {why}; a repeat gets no value (its result_state says why) and the operation is not run \
             again"
        )),
    }
    };
    match input {
        ResultInput::Unencodable(why) => not_stored(
            ResultState::Unencodable,
            format!("it cannot be encoded as JSON ({why})"),
        ),
        ResultInput::Json(json) if json.len() > max_bytes => not_stored(
            ResultState::TooLarge,
            format!(
                "its JSON is {} bytes, over max_result_bytes ({max_bytes})",
                json.len()
            ),
        ),
        ResultInput::Json(json) => {
            if let Err(e) = serde_json::from_str::<serde_json::Value>(json) {
                return not_stored(
                    ResultState::Unencodable,
                    format!("it is not valid JSON ({e})"),
                );
            }
            if json.contains("\\u0000") {
                return not_stored(
                    ResultState::Unencodable,
                    "its JSON contains the character U+0000, which PostgreSQL's jsonb cannot \
                     hold"
                        .into(),
                );
            }
            PreparedResult {
                json: Some(json.to_string()),
                state: ResultState::Stored,
                warning: None,
            }
        }
    }
}

/// The completion statement's $4 (JSON text) and $5 (`result_state`) for `result`
/// (both NULL when no store was requested).
pub(crate) fn params(result: Option<&PreparedResult>) -> (Option<&str>, Option<&str>) {
    match result {
        Some(r) => (r.json.as_deref(), Some(r.state.as_str())),
        None => (None, None),
    }
}
