//! PostgreSQL errors as store errors, and whether a statement's reply may have been lost (see
//! `store/resend.rs`).

use tokio_postgres::error::SqlState;

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

/// A PostgreSQL error as a store error, by its SQLSTATE: what the server refuses for the role,
/// the database or the schema is a configuration error (sending again cannot fix it: class 28,
/// invalid authorization; 3D000, no such database; 3F000, no such schema; 42501, a privilege the
/// role lacks; 08P01 "unsupported startup parameter", a parameter PgBouncer does not pass on);
/// a table, column or function of idem's schema that is missing is an incompatible
/// schema (dropped or altered by hand); anything else (a connection lost, a server shutting
/// down, a read-only standby during a failover) is the store being unavailable.
pub(super) fn pg(e: tokio_postgres::Error) -> StoreError {
    if let Some(parameter) = unsupported_startup_parameter(&e).map(str::to_owned) {
        return StoreError::InvalidConfig(format!(
            "the server refused the connection string's startup parameter `{parameter}` (PgBouncer \
             refuses those it does not know, `options` among them): remove it from the \
             connection string; for a search_path, set it for the role instead (ALTER ROLE .. \
             SET search_path = ..), since a parameter PgBouncer ignores never reaches the server: \
             {}",
            PgError(e)
        ));
    }
    if let Some(hint) = client_refusal(&e) {
        return StoreError::InvalidConfig(format!("{}: {hint}", PgError(e)));
    }
    if refused_configuration(&e) {
        return StoreError::InvalidConfig(format!(
            "PostgreSQL refused the store's role, database or schema (check the connection \
             string's user, dbname and search_path, and the role's privileges on idem's tables \
             and functions): {}",
            PgError(e)
        ));
    }
    match e.code().map(SqlState::code) {
        Some("42P01" | "42703" | "42883") => StoreError::Incompatible(format!(
            "a table, column or function of idem's schema is missing ({}); re-create the schema \
             or restore it whole",
            PgError(e)
        )),
        _ => StoreError::unavailable(PgError(e)),
    }
}

/// The startup parameter the server refused, when it refused one: PgBouncer answers a parameter
/// it does not pass on (`options`, say) with SQLSTATE 08P01 "unsupported startup parameter: ..",
/// which no retry changes.
pub(super) fn unsupported_startup_parameter(e: &tokio_postgres::Error) -> Option<&str> {
    let db = e.as_db_error()?;
    if db.code() != &SqlState::PROTOCOL_VIOLATION {
        return None;
    }
    let parameter = db.message().strip_prefix("unsupported startup parameter")?;
    Some(parameter.trim_start_matches([':', ' ']).trim())
}

/// Whether the server refused the role, the database or the schema, or a startup parameter of
/// the connection string, or the client refused the server's authentication (see [`pg`]).
pub(super) fn refused_configuration(e: &tokio_postgres::Error) -> bool {
    matches!(e.code().map(SqlState::code), Some("3D000" | "3F000" | "42501" | "28000" | "28P01"))
        || unsupported_startup_parameter(e).is_some()
        || client_refusal(e).is_some()
}

/// What to change when the client itself ended the startup: the server asked for a password the
/// connection string does not hold, for an authentication method tokio-postgres does not speak
/// (GSSAPI, SSPI, Kerberos: pg_hba.conf's `gss`, `sspi`), or a SCRAM exchange or channel binding
/// the client refused. No retry changes any of them. tokio-postgres keeps an error's kind
/// private; its text is the kind's name, the cause below it.
pub(super) fn client_refusal(e: &tokio_postgres::Error) -> Option<&'static str> {
    if e.as_db_error().is_some() {
        return None;
    }
    let cause = std::error::Error::source(e).map(ToString::to_string).unwrap_or_default();
    match e.to_string().as_str() {
        "invalid configuration" if cause == "password missing" => Some(
            "the server asks this role for a password and the connection string holds none: add \
             password=.. (a URL: postgres://user:password@host/db)",
        ),
        "authentication error" if cause == "unsupported authentication method" => Some(
            "the server asks for an authentication method idem's client (tokio-postgres) does \
             not speak (GSSAPI, SSPI or Kerberos: a gss or sspi line in pg_hba.conf): give this \
             role a scram-sha-256, md5, password or cert line",
        ),
        "authentication error" => Some(
            "the client refused the server's authentication (channel binding required but not \
             offered, an unknown SASL mechanism, a SCRAM reply that does not check out): check \
             channel_binding and the role's pg_hba.conf line",
        ),
        "invalid configuration" => Some("check the connection string"),
        _ => None,
    }
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
    // Refused as read-only: nothing ran, and the connection leaves the pool (`Conn::watch`), so
    // the step is sent again, on a connection opened now, to what the address names now.
    let read_only = super::conn::read_only(&e);
    if ended || read_only || (e.as_db_error().is_none() && (e.is_closed() || io)) {
        Failed::Lost(pg(e))
    } else {
        Failed::Answered(pg(e))
    }
}
