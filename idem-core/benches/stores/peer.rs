//! The peer: AWS Powertools' `idempotent_function` on the same Redis
//! (`benches/powertools_peer.py`), run from here so that it is measured in the same run.

use std::path::PathBuf;

use serde::Deserialize;

use super::setup::{Settings, redis_prefix};

#[derive(Debug, Deserialize)]
pub(super) struct Peer {
    pub(super) first_call_ns: f64,
    pub(super) replay_ns: f64,
    pub(super) raw_set_nx_2_ns: f64,
    pub(super) raw_get_ns: f64,
    pub(super) iterations: u64,
    pub(super) powertools_version: String,
    pub(super) redis_py_version: String,
    pub(super) python: String,
}

pub(super) fn run_peer(s: &Settings, python: &str) -> Result<Peer, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../benches/powertools_peer.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg("--redis-url")
        .arg(&s.redis_url)
        .arg("--prefix")
        .arg(format!("{}-powertools", redis_prefix(s)))
        .arg("--rounds")
        .arg(s.rounds.to_string())
        .arg("--calls")
        .arg(s.calls.to_string())
        .output()
        .map_err(|e| format!("could not run {python} {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| format!("peer output {line:?}: {e}"))
}
