//! Shared by the MCP tests: the target directory, running a command, building the example.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cargo target directory the tests were built in.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
    }
}

/// Runs `cmd`; its stdout, or what it printed when it failed.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?} could not start: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Builds the example `name` of idem-mcp with `features` and returns its executable.
pub fn build_example(name: &str, features: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = run(Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "-p", "idem-mcp", "--features", features, "--example", name])
        .arg("--message-format=json-render-diagnostics"))
    .unwrap_or_else(|e| panic!("the example {name} does not build: {e}"));
    out.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["target"]["name"] == name)
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported no {name} executable"))
}

/// The payments example with the SQLite store.
pub fn payments_mcp() -> PathBuf {
    build_example("payments_mcp", "sqlite")
}
