//! RFC 8785 canonical JSON, produced straight from typed values through serde.
//! TEMPORARY placeholder (serde_json::Value detour); being replaced by the real serializer.

use serde::Serialize;

/// Why arguments cannot be canonicalised. The tool is not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// A float is NaN or infinite: JSON has no such number and the intent would be ambiguous.
    #[error("argument `{path}` is {value}, which has no JSON form; pass a finite number")]
    NonFinite {
        /// Where, as a JSON pointer-like path (`amount`, `items[2].price`).
        path: String,
        /// `NaN`, `inf` or `-inf`.
        value: &'static str,
    },
    /// A map key is not a string (JSON object keys are strings).
    #[error("argument `{path}` is a map whose keys are not strings; use string keys")]
    NonStringKey {
        /// Where.
        path: String,
    },
    /// The value's `Serialize` implementation failed.
    #[error("arguments could not be serialized: {0}")]
    Custom(String),
}

/// Writes the RFC 8785 canonical text of `value` into `out`.
pub fn canonicalize<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), KeyError> {
    let v = serde_json::to_value(value).map_err(|e| KeyError::Custom(e.to_string()))?;
    serde_json::to_writer(out, &v).map_err(|e| KeyError::Custom(e.to_string()))
}

/// The RFC 8785 canonical text of `value`.
pub fn to_canonical_string<T: Serialize + ?Sized>(value: &T) -> Result<String, KeyError> {
    let mut out = Vec::new();
    canonicalize(value, &mut out)?;
    String::from_utf8(out).map_err(|e| KeyError::Custom(e.to_string()))
}
