//! The MCP server, driven by a client nobody on this team wrote: the official Python MCP SDK
//! (`mcp` on PyPI, pinned below), running `tests/mcp/client_test.py` against the `payments_mcp`
//! example (idem-mcp, SQLite store), restarted once in the middle, and `tests/mcp/mixed_test.py`
//! against `mixed_mcp` (idem tools inside a plain rmcp server, over stdio and over HTTP), and
//! `tests/mcp/http_test.py`
//! against `payments_mcp --http` (two users with bearer tokens over streamable HTTP).
//!
//! The tests build the examples with `cargo build -p idem-mcp --features sqlite,http --example
//! ..`, and create (once) a virtual environment under `<target>/mcp-venv` with `python3 -m venv`
//! and `pip install mcp==MCP_VERSION` (`mcp_support::python_with_mcp`). Without python3 or PyPI
//! they print a skip line, unless `CI=true`, where they fail. The cases held over stdio are held
//! over HTTP in `tests/mcp_http.rs`.

use std::path::Path;
use std::process::Command;

use idem_tests::or_skip;
use mcp_support::{payments_mcp, python_with_mcp, target_dir};

mod mcp_support;

#[test]
fn python_mcp_client_sees_one_charge_and_an_honest_unknown_refund() {
    let Some(python) = or_skip("python3 with the `mcp` package", python_with_mcp()) else {
        return;
    };
    let server = payments_mcp();
    let work = target_dir().join("mcp-python-test");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client_test.py");
    let out = Command::new(python).arg(script).arg(&server).arg(&work).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python MCP client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ok: one charge ch_0001 for cus_1"), "{stdout}");
}

#[test]
fn python_mcp_client_drives_idem_tools_inside_a_plain_rmcp_server() {
    let Some(python) = or_skip("python3 with the `mcp` package", python_with_mcp()) else {
        return;
    };
    let server = mcp_support::build_example("mixed_mcp");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/mixed_test.py");
    let out = Command::new(python).arg(script).arg(&server).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python MCP client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ok: rmcp tool and idem tools in one server"), "{stdout}");
}

/// The same server over streamable HTTP (`mixed_mcp --http`, mounted with `service_for`): the
/// rmcp tool and the idem tools in one session, each bearer token's user in a scope of its own.
#[test]
fn python_mcp_client_drives_idem_tools_inside_a_plain_rmcp_server_over_http() {
    let Some(python) = or_skip("python3 with the `mcp` package", python_with_mcp()) else {
        return;
    };
    let server = mcp_support::build_example("mixed_mcp");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/mixed_test.py");
    let out = Command::new(python).arg(script).arg(&server).arg("--http").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python MCP client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ok: rmcp tool and idem tools in one server"), "{stdout}");
    assert!(stdout.contains("ok: over HTTP too, each user in a scope of their own"), "{stdout}");
}

#[test]
fn python_mcp_client_over_http_sees_each_principal_in_its_own_scope() {
    let Some(python) = or_skip("python3 with the `mcp` package", python_with_mcp()) else {
        return;
    };
    let server = mcp_support::payments_mcp();
    let work = target_dir().join("mcp-python-http-test");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/http_test.py");
    let out = Command::new(python).arg(script).arg(&server).arg(&work).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python MCP client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ok: two principals over HTTP"), "{stdout}");
}
