//! PostgreSQL errors as store errors, and whether a statement's reply may have been lost (see
//! `store/resend.rs`).

use crate::store::StoreError;
use crate::store::resend::Failed;

/// A PostgreSQL error whose text carries the server's message or the I/O cause (tokio-postgres
/// alone prints "db error" or "error connecting to server" and keeps the rest in its source).
#[derive(Debug)]
pub(super) struct PgError(pub(super) tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => {
                write!(f, "{} {}: {}", db.severity(), db.code().code(), db.message())?;
                if let Some(detail) = db.detail() {
                    write!(f, " (detail: {detail})")?;
                }
                if let Some(hint) = db.hint() {
                    write!(f, " (hint: {hint})")?;
                }
                Ok(())
            }
            // "error connecting to server" alone hides the reason ("Connection refused").
            None => match std::error::Error::source(&self.0) {
                Some(cause) => write!(f, "{}: {cause}", self.0),
                None => write!(f, "{}", self.0),
            },
        }
    }
}

impl std::error::Error for PgError {
    /// What the text above does not already say (docs/design.md §8: each cause once): nothing
    /// for a server's error, whose message, detail and hint the text holds; below a client error
    /// and its cause, the cause's own cause.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        if self.0.as_db_error().is_some() {
            return None;
        }
        std::error::Error::source(&self.0).and_then(|cause| cause.source())
    }
}

pub(super) fn pg(e: tokio_postgres::Error) -> StoreError {
    StoreError::unavailable(PgError(e))
}

/// A connection could not be had: nothing was sent, so sending again is harmless.
pub(super) fn unreached(e: StoreError) -> Failed {
    match e {
        StoreError::Unavailable(_) => Failed::Lost(e),
        other => Failed::Answered(other),
    }
}

/// The failure of a statement that was sent: [`Failed::Lost`] when the server may have run it
/// and its reply was lost (the connection closed or broke, or the server ended it with a FATAL
/// error instead of answering, e.g. `pg_terminate_backend`), else the server's answer.
pub(super) fn sent(e: tokio_postgres::Error) -> Failed {
    use tokio_postgres::error::Severity;
    let io = std::error::Error::source(&e).is_some_and(|c| c.is::<std::io::Error>());
    let ended = e
        .as_db_error()
        .is_some_and(|db| matches!(db.parsed_severity(), Some(Severity::Fatal | Severity::Panic)));
    if ended || (e.as_db_error().is_none() && (e.is_closed() || io)) {
        Failed::Lost(pg(e))
    } else {
        Failed::Answered(pg(e))
    }
}
