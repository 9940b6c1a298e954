//! The rustls client configuration for each `sslmode` (see `tls.rs`): which roots, and which
//! checks of the server's certificate.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// The connector: `checks` is `None` for no certificate check (encryption only, as libpq's
/// `require`), `Some(false)` for the chain only (`verify-ca`), `Some(true)` for the chain and
/// the host name (`verify-full`). `root` is a PEM file, or `None`/`system` for the system roots.
pub(super) fn connector(
    checks: Option<bool>,
    root: Option<&str>,
) -> Result<MakeRustlsConnect, StoreError> {
    // The ring provider, named here rather than taken from the process default, so that the
    // store works whatever provider (if any) the application installed.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::InvalidConfig(format!("TLS configuration: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match checks {
        None => Arc::new(Unchecked(provider.signature_verification_algorithms)),
        Some(full) => {
            let roots = Arc::new(roots(root)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| StoreError::InvalidConfig(format!("TLS roots: {e}")))?;
            if full { webpki } else { Arc::new(ChainOnly(webpki)) }
        }
    };
    let config =
        builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn roots(root: Option<&str>) -> Result<RootCertStore, StoreError> {
    let mut store = RootCertStore::empty();
    match root {
        None | Some("system") => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(StoreError::InvalidConfig(format!(
                    "no system CA roots found ({:?}): install the system's CA certificates or \
                     name a PEM file with sslrootcert",
                    found.errors.first().map(ToString::to_string)
                )));
            }
        }
        Some(path) => {
            let bad = |e: &dyn std::fmt::Display| {
                StoreError::InvalidConfig(format!("sslrootcert={path}: {e}"))
            };
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))? {
                store.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
            }
            if store.is_empty() {
                return Err(bad(&"no PEM certificate in the file"));
            }
        }
    }
    Ok(store)
}

/// `require` (and `prefer`) without a root file: the connection is encrypted, the certificate is
/// not checked (libpq's meaning). The handshake's signatures are still verified.
#[derive(Debug)]
struct Unchecked(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not checked. webpki
/// checks the name only after the chain passed, so a name error means the chain is good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
