//! How the Redis store reaches its server: the client for a `redis://` or `rediss://` URL, with
//! the CA of a private TLS deployment (`?ca=/path/ca.pem`, feature `redis-tls`).

use redis::Client;

use crate::store::StoreError;
use crate::store::url_query::percent_decode;

/// The client for `url`. A `ca` query parameter names a PEM file of trusted roots for
/// `rediss://` (instead of the system's roots); it is taken off the URL.
///
/// Errors: [`StoreError::InvalidConfig`] for a malformed URL, an unreadable CA file, or
/// `rediss://` without the `redis-tls` feature.
pub(super) fn client(url: &str) -> Result<Client, StoreError> {
    let invalid = |e: &dyn std::fmt::Display| StoreError::InvalidConfig(format!("Redis URL: {e}"));
    let (url, ca) = take_ca(url);
    let tls = url.starts_with("rediss://");
    if ca.is_some() && !tls {
        return Err(StoreError::InvalidConfig(
            "the `ca` parameter needs a rediss:// URL (TLS)".to_owned(),
        ));
    }
    if tls && !cfg!(feature = "redis-tls") {
        return Err(StoreError::InvalidConfig(
            "rediss:// needs TLS: enable the cargo feature `redis-tls` of idem-core".to_owned(),
        ));
    }
    #[cfg(feature = "redis-tls")]
    if tls {
        // redis-rs builds its rustls configuration on the process's default provider; name ring
        // (the provider this crate enables) when the application installed none, so that a
        // build with two providers does not fail at the first connection.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        if let Some(path) = ca {
            let pem = std::fs::read(&path)
                .map_err(|e| StoreError::InvalidConfig(format!("Redis CA file {path}: {e}")))?;
            let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(pem) };
            return Client::build_with_tls(url, certs).map_err(|e| invalid(&e));
        }
    }
    Client::open(url).map_err(|e| invalid(&e))
}

/// Splits the `ca` query parameter off a URL: the rest and the (percent-decoded) path.
fn take_ca(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else { return (url.to_owned(), None) };
    let mut ca = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("ca=") {
            Some(path) => {
                ca = Some(percent_decode(path));
                false
            }
            None => true,
        })
        .collect();
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    (rest, ca)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_leaves_the_url() {
        assert_eq!(
            take_ca("rediss://h:1/0?ca=%2Ftmp%2Fca.pem&protocol=resp3"),
            ("rediss://h:1/0?protocol=resp3".to_owned(), Some("/tmp/ca.pem".to_owned()))
        );
        assert_eq!(take_ca("redis://h:1/0"), ("redis://h:1/0".to_owned(), None));
    }

    #[test]
    fn ca_without_tls_is_invalid_config() {
        let err = client("redis://h:1/?ca=/tmp/ca.pem").expect_err("refused");
        assert!(matches!(err, StoreError::InvalidConfig(_)), "{err}");
    }
}
