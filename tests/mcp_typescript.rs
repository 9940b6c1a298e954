//! The HTTP server driven by the official TypeScript MCP SDK (`@modelcontextprotocol/sdk` from
//! npm, pinned below): `tests/mcp/ts_client.mjs` against `payments_mcp --http` with two bearer
//! tokens: list, call, repeat and replay, a new session, another user.
//!
//! The SDK is installed once with `npm install` into `<target>/ts-mcp` (never at library run
//! time). Without node and npm it prints a skip line, unless `CI=true`, where it fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use idem_tests::or_skip;
use mcp_support::{run, target_dir};

mod mcp_support;

/// The pinned version of the official TypeScript MCP SDK.
const SDK_VERSION: &str = "1.32.2";

/// A directory whose `node_modules` holds the SDK, made once.
fn sdk_dir() -> Result<PathBuf, String> {
    let dir = target_dir().join("ts-mcp");
    let marker = dir.join(format!(".sdk-{SDK_VERSION}"));
    if marker.exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("package.json"), r#"{"private":true,"type":"module"}"#)
        .map_err(|e| e.to_string())?;
    run(Command::new("npm").current_dir(&dir).args([
        "install",
        "--no-audit",
        "--no-fund",
        &format!("@modelcontextprotocol/sdk@{SDK_VERSION}"),
    ]))?;
    std::fs::write(&marker, SDK_VERSION).map_err(|e| e.to_string())?;
    Ok(dir)
}

#[test]
fn typescript_mcp_client_lists_calls_repeats_and_replays_over_http() {
    let Some(dir) = or_skip("node and npm with @modelcontextprotocol/sdk", sdk_dir()) else {
        return;
    };
    // The script must sit beside node_modules for ESM resolution.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/ts_client.mjs");
    std::fs::copy(&script, dir.join("ts_client.mjs")).unwrap();
    let mut server = Command::new(mcp_support::payments_mcp())
        .args(["--http", "127.0.0.1:0"])
        .env("PAYMENTS_TOKENS", "tok-alice=alice,tok-bob=bob")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.split("listening on ").nth(1).map(str::trim).map(str::to_owned);
    let Some(url) = url else {
        let _ = server.kill();
        panic!("the server did not start: {line}");
    };
    let out = Command::new("node").current_dir(&dir).arg("ts_client.mjs").arg(&url).output();
    let _ = server.kill();
    let _ = server.wait();
    let out = out.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the TypeScript MCP client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ok: typescript client"), "{stdout}");
}
