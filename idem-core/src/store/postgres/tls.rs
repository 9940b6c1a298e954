//! How the PostgreSQL store reaches its server: the connection string, with `sslmode` and
//! `sslrootcert` read as libpq reads them (PostgreSQL manual, "SSL Support" in the libpq
//! chapter), and TLS through rustls (feature `postgres-tls`).
//!
//! | `sslmode`       | TLS                    | certificate checked                        |
//! |-----------------|------------------------|--------------------------------------------|
//! | `disable`       | never                  | -                                          |
//! | `prefer` (default) | if the server offers it | no (as `verify-ca` when `sslrootcert` is set) |
//! | `require`       | always                 | no (as `verify-ca` when `sslrootcert` is set) |
//! | `verify-ca`     | always                 | chain to a trusted root                    |
//! | `verify-full`   | always                 | chain to a trusted root, and the host name |
//!
//! Trusted roots: the PEM file `sslrootcert` names, or the operating system's roots
//! (rustls-native-certs) when it is absent or `system`. libpq reads `~/.postgresql/root.crt`
//! instead when `sslrootcert` is absent; this store does not.

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Socket};

use super::CONNECT_TIMEOUT;
use super::error::PgError;
use crate::store::StoreError;
use crate::store::url_query::percent_decode;

#[cfg(feature = "postgres-tls")]
type Connector = tokio_postgres_rustls::MakeRustlsConnect;
#[cfg(not(feature = "postgres-tls"))]
type Connector = tokio_postgres::NoTls;

/// A connection's driver, to spawn or poll (notifications).
pub(super) type Connection =
    tokio_postgres::Connection<Socket, <Connector as MakeTlsConnect<Socket>>::Stream>;

/// libpq's `sslmode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, StoreError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's `allow` tries plaintext first; nobody needs it for a managed database.
            other => {
                return Err(StoreError::InvalidConfig(format!(
                    "sslmode={other:?} is not supported: use disable, prefer, require, \
                     verify-ca or verify-full"
                )));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where and how to connect: the parsed configuration and its TLS connector.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) config: Config,
    tls: Connector,
    mode: SslMode,
    /// Whether certificates are checked, and against what (for error messages).
    #[cfg_attr(not(feature = "postgres-tls"), allow(dead_code))]
    roots: Option<String>,
    /// Through PgBouncer in transaction mode (`pgbouncer=true`): unnamed statements only, and no
    /// `LISTEN` (waiters poll).
    pub(super) pgbouncer: bool,
}

impl Target {
    /// Parses a libpq connection string (`host=.. sslmode=verify-full sslrootcert=/ca.pem`) or
    /// URL (`postgresql://user@host/db?sslmode=verify-full&sslrootcert=/ca.pem`).
    pub(super) fn parse(url: &str) -> Result<Target, StoreError> {
        // The user info ends at the first `@` (libpq, tokio-postgres): a second one before the
        // path means an `@` in the user name or password, and the text after the first would be
        // read as the host or port and shown in messages.
        // Only in a URL: a key=value string's value may hold `://` (a password, a file URL).
        if let Some((scheme, after)) = url.trim_start().split_once("://")
            && !scheme.is_empty()
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            && after.split('/').next().is_some_and(|authority| authority.matches('@').count() > 1)
        {
            return Err(StoreError::InvalidConfig(AT_IN_USER_INFO.to_owned()));
        }
        let (rest, mode, root, pgbouncer) = take_own_params(url)?;
        let config = Config::from_str(&rest).map_err(|e| {
            StoreError::InvalidConfig(format!("PostgreSQL connection string: {}", PgError(e)))
        })?;
        let mode = match mode.as_deref() {
            Some(m) => SslMode::parse(m)?,
            // libpq: `sslrootcert=system` without a mode means verify-full.
            None if root.as_deref() == Some("system") => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        let mut target = Target::new(config, mode, root)?;
        target.pgbouncer = match pgbouncer.as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(StoreError::InvalidConfig(format!(
                    "pgbouncer={other:?}: use true (through PgBouncer in transaction mode) or \
                     false"
                )));
            }
        };
        Ok(target)
    }

    /// A parsed [`Config`]: its `ssl_mode` (disable, prefer, require), certificates unchecked.
    pub(super) fn from_config(config: Config) -> Result<Target, StoreError> {
        let mode = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        Target::new(config, mode, None)
    }

    fn new(mut config: Config, mode: SslMode, root: Option<String>) -> Result<Target, StoreError> {
        check_hosts(&config)?;
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // libpq: with a root file, prefer and require check the chain as verify-ca does.
        let checks = match mode {
            SslMode::Disable => None,
            SslMode::Prefer | SslMode::Require if root.is_none() => None,
            SslMode::Prefer | SslMode::Require | SslMode::VerifyCa => Some(false),
            SslMode::VerifyFull => Some(true),
        };
        let roots = checks.map(|_| match root.as_deref() {
            None | Some("system") => "the system's CA roots".to_owned(),
            Some(path) => format!("sslrootcert={path}"),
        });
        let tls = connector(mode, checks, root.as_deref())?;
        Ok(Target { config, tls, mode, roots, pgbouncer: false })
    }

    /// How long opening a connection may take: the string's `connect_timeout`, else 5 s.
    pub(super) fn connect_bound(&self) -> Duration {
        self.config.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT)
    }

    /// A deadpool-postgres manager that opens connections here, with this TLS setup; a
    /// connection found closed when checked out is replaced (`RecyclingMethod::Fast`).
    #[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
    pub(super) fn manager(&self) -> deadpool_postgres::Manager {
        let recycling = deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        };
        deadpool_postgres::Manager::from_config(self.config.clone(), self.tls.clone(), recycling)
    }

    /// Opens one connection, bounded by the connect timeout (which tokio-postgres applies to the
    /// TCP connect only: a server that accepts and never answers the startup would hang here).
    // Without TLS the connector is `NoTls`, which is Copy.
    #[cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]
    pub(super) async fn connect(&self) -> Result<(Client, Connection), StoreError> {
        let bound = self.connect_bound();
        let connected = tokio::time::timeout(bound, self.config.connect(self.tls.clone()));
        match connected.await {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(e)) => Err(self.refused(e)),
            Err(_) => Err(StoreError::unavailable(format!(
                "PostgreSQL at {} accepted the connection but did not complete the startup \
                 within {}",
                self.addresses(),
                ms_text(bound)
            ))),
        }
    }

    /// A connection error, saying which TLS check failed when one did.
    pub(super) fn refused(&self, e: tokio_postgres::Error) -> StoreError {
        let mode = self.mode.name();
        #[cfg(feature = "postgres-tls")]
        if let Some(tls) = crate::store::tls_refusal::rustls_cause(&e) {
            let why =
                crate::store::tls_refusal::why(tls, self.roots.as_deref().unwrap_or("no roots"));
            return StoreError::unavailable(format!(
                "PostgreSQL at {} TLS {why} (sslmode={mode}): {}",
                self.addresses(),
                PgError(e)
            ));
        }
        let hint = match self.mode {
            // A hostssl-only pg_hba.conf refuses a plaintext connection with 28000.
            SslMode::Disable
                if e.code()
                    == Some(
                        &tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                    ) =>
            {
                "; the server may require TLS (a hostssl line in pg_hba.conf): use sslmode=require \
                 or stronger"
            }
            _ if let Some(hint) = super::error::client_refusal(&e) => {
                return StoreError::InvalidConfig(format!(
                    "PostgreSQL at {} (sslmode={mode}): {}: {hint}",
                    self.addresses(),
                    PgError(e)
                ));
            }
            _ if super::error::unsupported_startup_parameter(&e).is_some() => {
                "; remove that parameter from the connection string (for a search_path, set it \
                 for the role: ALTER ROLE .. SET search_path = ..; a parameter PgBouncer's \
                 ignore_startup_parameters lists is dropped, and the store would open on another \
                 schema)"
            }
            _ => "",
        };
        let configuration = super::error::refused_configuration(&e);
        let text =
            format!("PostgreSQL at {} (sslmode={mode}): {}{hint}", self.addresses(), PgError(e));
        if configuration {
            // A password, a database that does not exist: sending again cannot fix it.
            StoreError::InvalidConfig(text)
        } else {
            StoreError::unavailable(text)
        }
    }

    /// Where the store connects, for error messages: `host:port` (a socket's directory), each
    /// host of the string; never its password.
    pub(super) fn addresses(&self) -> String {
        let hosts = self.config.get_hosts();
        let ports = self.config.get_ports();
        if hosts.is_empty() {
            return "the default host".to_owned();
        }
        hosts
            .iter()
            .enumerate()
            .map(|(i, host)| {
                // libpq: one port for every host, or one per host; 5432 by default.
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(dir) => {
                        format!("{}/.s.PGSQL.{port}", dir.display())
                    }
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn ms_text(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

#[cfg(not(feature = "postgres-tls"))]
fn connector(
    mode: SslMode,
    _checks: Option<bool>,
    _root: Option<&str>,
) -> Result<Connector, StoreError> {
    match mode {
        // Prefer without TLS support connects in plaintext, as libpq built without SSL does.
        SslMode::Disable | SslMode::Prefer => Ok(tokio_postgres::NoTls),
        other => Err(StoreError::InvalidConfig(format!(
            "sslmode={} needs TLS, which is not compiled in: {}",
            other.name(),
            crate::store::open::enable_feature("postgres-tls")
        ))),
    }
}

#[cfg(feature = "postgres-tls")]
fn connector(
    _mode: SslMode,
    checks: Option<bool>,
    root: Option<&str>,
) -> Result<Connector, StoreError> {
    super::verify::connector(checks, root)
}

/// Why a connection string whose host holds an `@` is refused; the host is not shown.
const AT_IN_USER_INFO: &str = "PostgreSQL connection string: an `@` in the user name or password \
     must be written `%40` (the text after the first `@` would be read as the host, so it is not \
     shown)";

/// The host and port counts tokio-postgres refuses only when it connects (as a connection
/// error, which would read as an unreachable server), refused here as a bad configuration, and
/// a host holding an `@`.
fn check_hosts(config: &Config) -> Result<(), StoreError> {
    let (hosts, addrs) = (config.get_hosts().len(), config.get_hostaddrs().len());
    let ports = config.get_ports().len();
    // libpq and tokio-postgres read a URL's user info up to its first `@`: in
    // `postgres://app:pa@ss@db/app` the host is `ss@db`, the rest of the password, which every
    // message naming the host would print. No host name holds an `@`.
    let at_in_host = config.get_hosts().iter().any(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => name.contains('@'),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => false,
    });
    let why = if at_in_host {
        return Err(StoreError::InvalidConfig(AT_IN_USER_INFO.to_owned()));
    } else if hosts == 0 && addrs == 0 {
        "no host: give host or hostaddr".to_owned()
    } else if hosts != 0 && addrs != 0 && hosts != addrs {
        format!("{hosts} hosts but {addrs} hostaddrs: give as many of each")
    } else if ports > 1 && ports != hosts.max(addrs) {
        format!("{ports} ports for {} hosts: give one port, or one per host", hosts.max(addrs))
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidConfig(format!("PostgreSQL connection string: {why}")))
}

/// The connection string without idem's own parameters, and theirs: `sslmode`, `sslrootcert`
/// (tokio-postgres knows neither `verify-ca`/`verify-full` nor `sslrootcert`) and `pgbouncer`.
type Taken = (String, Option<String>, Option<String>, Option<String>);

fn take_own_params(url: &str) -> Result<Taken, StoreError> {
    let (mut mode, mut root, mut pgbouncer) = (None, None, None);
    let mut take = |key: &str, value: String| match key {
        "sslmode" => {
            mode = Some(value);
            true
        }
        "sslrootcert" => {
            root = Some(value);
            true
        }
        "pgbouncer" => {
            pgbouncer = Some(value);
            true
        }
        _ => false,
    };
    let rest = if let Some((base, query)) = url_query(url) {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                !take(k, percent_decode(v))
            })
            .collect();
        if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) }
    } else if url.contains("://") {
        url.to_owned()
    } else {
        let mut kept = Vec::new();
        for (span, key, value) in conninfo_pairs(url)? {
            if !take(key, value) {
                kept.push(span);
            }
        }
        kept.join(" ")
    };
    Ok((rest, mode, root, pgbouncer))
}

/// A `postgres://` or `postgresql://` URL split at the `?` that starts its query: the first one
/// after the user info, which ends at the first `@` before any `/` (as libpq reads it, and
/// tokio-postgres, which parses the rest), so that a `?` in a password written as it is does
/// not start the query.
fn url_query(url: &str) -> Option<(&str, &str)> {
    let start = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|s| url.starts_with(s).then_some(s.len()))?;
    let authority = url[start..].find('/').map_or(&url[start..], |end| &url[start..start + end]);
    let after_user = authority.find('@').map_or(start, |at| start + at + 1);
    let q = after_user + url[after_user..].find('?')?;
    Some((&url[..q], &url[q + 1..]))
}

/// The `key=value` pairs of a libpq keyword/value string, each with its text as written: values
/// may be single-quoted, and a backslash escapes the next character.
fn conninfo_pairs(s: &str) -> Result<Vec<(&str, &str, String)>, StoreError> {
    let bad = |why: &str| {
        // Malformed: where its password ends cannot be told, so nothing after it is shown.
        let shown = crate::store::redact::redacted_unparsed(s);
        StoreError::InvalidConfig(format!("PostgreSQL connection string {shown:?}: {why}"))
    };
    let mut pairs = Vec::new();
    let mut chars = s.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else { break };
        let mut key_end = start;
        while let Some((i, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key_end = i + c.len_utf8();
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next().map(|(_, c)| c) != Some('=') {
            return Err(bad("expected key=value"));
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let mut end = s.len();
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        loop {
            match chars.next() {
                None if quoted => return Err(bad("unterminated quoted value")),
                None => break,
                Some((_, '\\')) => match chars.next() {
                    Some((_, c)) => value.push(c),
                    None => return Err(bad("a backslash ends the string")),
                },
                Some((i, '\'')) if quoted => {
                    end = i + 1;
                    break;
                }
                Some((i, c)) if c.is_whitespace() && !quoted => {
                    end = i;
                    break;
                }
                Some((_, c)) => value.push(c),
            }
        }
        pairs.push((&s[start..end], &s[start..key_end], value));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> (String, Option<String>, Option<String>) {
        let (rest, mode, root, _) = take_own_params(s).expect("parses");
        (rest, mode, root)
    }

    #[test]
    fn ssl_params_leave_the_url() {
        assert_eq!(
            split("postgresql://u@h:5/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem"),
            (
                "postgresql://u@h:5/db".into(),
                Some("verify-full".into()),
                Some("/tmp/ca.pem".into())
            )
        );
        assert_eq!(
            split("postgres://h/db?application_name=x&sslmode=require"),
            ("postgres://h/db?application_name=x".into(), Some("require".into()), None)
        );
        assert_eq!(split("postgres://h/db"), ("postgres://h/db".into(), None, None));
        // A `?` in a password written as it is: the query starts after the user info.
        assert_eq!(
            split("postgres://u:pa?ss@h/db?sslmode=require&application_name=x"),
            ("postgres://u:pa?ss@h/db?application_name=x".into(), Some("require".into()), None)
        );
        assert_eq!(
            split("postgres://u:pa?ss@h/db"),
            ("postgres://u:pa?ss@h/db".into(), None, None)
        );
        // An `@` in the query is not user info.
        assert_eq!(
            split("postgres://h/db?sslmode=require&application_name=a@b"),
            ("postgres://h/db?application_name=a@b".into(), Some("require".into()), None)
        );
    }

    #[test]
    fn ssl_params_leave_the_keyword_string() {
        assert_eq!(
            split("host=127.0.0.1  sslmode = verify-ca sslrootcert='/a b/c\\'s.pem' dbname=test"),
            (
                "host=127.0.0.1 dbname=test".into(),
                Some("verify-ca".into()),
                Some("/a b/c's.pem".into())
            )
        );
        assert!(take_own_params("host='open").is_err());
        assert!(take_own_params("host").is_err());
    }

    #[test]
    fn an_at_sign_in_a_url_password_is_refused_without_printing_it() {
        for url in [
            "postgresql://postgres:s3c@ret@PW@127.0.0.1:1/test",
            "postgres://app@corp:s3c@retPW@db.example/app",
            "host=ret@PW@db.example user=app",
        ] {
            let err = Target::parse(url).err().expect("refused");
            let text = err.to_string();
            assert!(matches!(&err, StoreError::InvalidConfig(m) if m.contains("%40")), "{text}");
            assert!(!text.contains("ret"), "{url}: {text}");
        }
        // A key=value string's password may hold `://` and `@`s.
        let target =
            Target::parse("host=db.example password='x://a@b@c' user=app").expect("parses");
        assert_eq!(target.config.get_password(), Some(&b"x://a@b@c"[..]));
        // Written as `%40`, the same password opens as usual.
        let target =
            Target::parse("postgresql://postgres:s3c%40ret%40PW@127.0.0.1:1/test").expect("parses");
        assert_eq!(target.config.get_password(), Some(&b"s3c@ret@PW"[..]));
    }

    #[test]
    fn unknown_sslmode_is_invalid_config() {
        let err = Target::parse("host=h sslmode=allow").err().expect("refused");
        assert!(matches!(&err, StoreError::InvalidConfig(m) if m.contains("allow")), "{err}");
        let err = Target::parse("host=h nonsense=1").err().expect("refused");
        assert!(matches!(err, StoreError::InvalidConfig(_)), "{err}");
    }

    #[cfg(feature = "postgres-tls")]
    #[test]
    fn missing_root_file_is_invalid_config() {
        let err = Target::parse("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.pem")
            .err()
            .expect("refused");
        assert!(
            matches!(&err, StoreError::InvalidConfig(m) if m.contains("/nonexistent/ca.pem")),
            "{err}"
        );
    }
}
