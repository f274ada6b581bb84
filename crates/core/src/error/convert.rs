//! Errors of the database driver and of the migrations as [`Error`]s.

use super::Error;

/// The full `source()` chain of an error, joined with ": ". tokio-postgres's own
/// `Display` says only "db error" or "error connecting to server".
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

impl From<tokio_postgres::Error> for Error {
    fn from(err: tokio_postgres::Error) -> Self {
        if let Some(db) = err.as_db_error() {
            let mut message = db.message().to_string();
            if let Some(detail) = db.detail() {
                message.push_str(&format!(" DETAIL: {detail}"));
            }
            if let Some(hint) = db.hint() {
                message.push_str(&format!(" HINT: {hint}"));
            }
            Error::from_server(db.code().code(), message)
        } else if err.to_string().starts_with("error deserializing column") {
            // A value read that no Rust type can hold (a timestamptz of 'infinity' edited
            // into a record): reading it again reads the same value, so not retryable.
            Error::Unreadable(format!(
                "a value read from PostgreSQL cannot be read ({}; a timestamp of 'infinity' or \
                 '-infinity', edited into a record by hand, is one): set it to a real value",
                chain(&err)
            ))
        } else if timed_out(&err) {
            Error::Timeout {
                message: format!("{} (connect_timeout)", chain(&err)),
                sqlstate: None,
            }
        } else {
            let mut message = chain(&err);
            if message.contains("UnknownIssuer") {
                message.push_str(
                    " (the server's certificate is not signed by a trusted root: set sslrootcert \
                     to the CA that signed it)",
                );
            }
            Error::connection(message)
        }
    }
}

/// Whether an error's source chain holds an I/O time-out (tokio-postgres's connect
/// timeout).
fn timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        source = s.source();
    }
    false
}

impl From<refinery::Error> for Error {
    fn from(err: refinery::Error) -> Self {
        Error::Migration(format!("migration failed: {}", chain(&err)))
    }
}
