//! Shared by the MCP tests: the target directory, running a command, building the example.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use serde_json::{Value, json};

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
        // stderr first: it holds the errors, and stdout may be pages of build messages.
        Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// The features every MCP test builds idem-mcp's examples with: one set, since every build of an
/// example writes the same executable path and tests run in parallel.
pub const EXAMPLE_FEATURES: &str = "sqlite,http";

/// Builds the example `name` of idem-mcp (with [`EXAMPLE_FEATURES`]) and returns its executable.
pub fn build_example(name: &str) -> PathBuf {
    let features = EXAMPLE_FEATURES;
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

/// The pinned version of the official Python MCP SDK.
pub const MCP_VERSION: &str = "2.3.0";

/// A venv with `mcp==MCP_VERSION` under `<target>/mcp-venv`, made once; its python.
pub fn python_with_mcp() -> Result<PathBuf, String> {
    // The tests of a file run in parallel: one makes the venv while the others wait, instead of
    // each running `python3 -m venv` on the same directory.
    static MADE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = MADE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = target_dir().join("mcp-venv");
    let python = venv.join("bin").join("python");
    let marker = venv.join(format!(".mcp-{MCP_VERSION}"));
    if marker.exists() {
        return Ok(python);
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("mcp=={MCP_VERSION}"),
    ]))?;
    std::fs::write(&marker, MCP_VERSION).map_err(|e| e.to_string())?;
    Ok(python)
}

/// The payments example (SQLite store, HTTP server).
pub fn payments_mcp() -> PathBuf {
    build_example("payments_mcp")
}

/// Only a guard against a hang: every expected answer arrives in milliseconds.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// A server process spoken to with raw JSON-RPC lines.
pub struct Server {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_sentinel: i64,
}

impl Server {
    /// Starts `binary` with `env` set, speaking MCP over its stdin and stdout.
    pub fn start(binary: &Path, env: &[(&str, &str)]) -> Server {
        Server::start_with(binary, &[], env)
    }

    /// Starts `binary` with `args` and `env` set, speaking MCP over its stdin and stdout.
    pub fn start_with(binary: &Path, args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(binary)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the example starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Server { child, stdin, lines, next_sentinel: 1_000_000 }
    }

    pub fn write(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn read(&self) -> Option<Value> {
        match self.lines.recv_timeout(HANG_GUARD) {
            Ok(line) => Some(serde_json::from_str(&line).expect("the server writes JSON lines")),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("no answer after {HANG_GUARD:?}: a hang"),
        }
    }

    /// Sends `line`, then a sentinel ping; returns every response that arrived up to the
    /// sentinel's (and `wait_for`'s, if given), by id (`null` as "null").
    pub fn exchange(
        &mut self,
        line: &str,
        wait_for: Option<&Value>,
    ) -> BTreeMap<String, Vec<Value>> {
        self.write(line);
        let sentinel = self.next_sentinel;
        self.next_sentinel += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": sentinel, "method": "ping"}).to_string());
        let mut got: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let key = |id: &Value| id.to_string();
        loop {
            let done = got.contains_key(&key(&json!(sentinel)))
                && wait_for.is_none_or(|id| got.contains_key(&key(id)));
            if done {
                break;
            }
            let msg = self.read().unwrap_or_else(|| panic!("the server exited after {line}"));
            got.entry(key(&msg["id"])).or_default().push(msg);
        }
        let pong = got.remove(&key(&json!(sentinel))).unwrap();
        assert_eq!(pong.len(), 1, "one answer to the sentinel: {pong:?}");
        assert_eq!(pong[0]["result"], json!({}), "{pong:?}");
        got
    }

    pub fn initialize(&mut self) {
        self.write(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw-lines", "version": "1"}}})
            .to_string(),
        );
        let init = self.read().expect("an initialize answer");
        assert_eq!(init["id"], 0, "{init}");
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        self.write(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
