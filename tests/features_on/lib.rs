//! Empty: this crate only runs the key vectors with serde_json's optional features on (see
//! Cargo.toml).
