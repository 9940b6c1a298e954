//! Which TLS check refused a connection, in words, for the PostgreSQL and Redis stores: their
//! client libraries report a refused certificate as a connection or I/O error, with the rustls
//! error somewhere among its causes.

/// The rustls error among the causes of `e`, if any.
pub(crate) fn rustls_cause<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut cause = Some(e);
    while let Some(mut c) = cause {
        // The redis crate keeps its cause in an Arc, which is an error of its own type.
        if let Some(inner) = c.downcast_ref::<Shared>() {
            c = &**inner;
        }
        let tls = c.downcast_ref::<rustls::Error>().or_else(|| {
            // io::Error's own `source` skips the error it wraps.
            c.downcast_ref::<std::io::Error>()?.get_ref()?.downcast_ref::<rustls::Error>()
        });
        if tls.is_some() {
            return tls;
        }
        cause = c.source();
    }
    None
}

/// Which check `tls` failed: the certificate chain (against `roots`, the trusted roots as the
/// store was configured), the host name, another certificate check, or the handshake.
pub(crate) fn why(tls: &rustls::Error, roots: &str) -> String {
    match tls {
        rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature,
        ) => format!(
            "certificate chain check failed: the server's certificate is not signed by a trusted \
             CA ({roots})"
        ),
        rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. },
        ) => "host name check failed: the server's certificate is not valid for the host name \
              connected to"
            .to_owned(),
        rustls::Error::InvalidCertificate(_) => format!("certificate check failed ({roots})"),
        _ => "TLS handshake failed".to_owned(),
    }
}
