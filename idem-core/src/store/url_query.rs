//! Values in the query of a store URL (`?sslrootcert=..`, `?ca=..`), shared by the PostgreSQL and
//! Redis URL forms.

/// A query value with its `%XX` escapes decoded (RFC 3986 §2.1); bytes that are not UTF-8 are
/// replaced, as a path naming a certificate file is expected to be text.
pub(crate) fn percent_decode(value: &str) -> String {
    percent_encoding::percent_decode_str(value).decode_utf8_lossy().into_owned()
}
