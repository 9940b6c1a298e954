//! The `idem` binary against SQLite, PostgreSQL and Redis, on records made by real tool calls:
//! in flight, outcome unknown, completed and failed. Each test counts how often the tool's body
//! ran, so "resolved as happened" is seen replaying without running, and "not happened" running
//! exactly once more.

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idem_core::{Classify, Failure, Idem, Store, tool};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Refund {
    refund_id: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, thiserror::Error)]
enum RefundError {
    #[error("declined")]
    Declined,
    #[error("timed out after sending")]
    Timeout,
}

impl Classify for RefundError {
    fn classify(&self) -> Failure {
        match self {
            RefundError::Declined => Failure::permanent(),
            RefundError::Timeout => Failure::ambiguous(),
        }
    }
}

/// How often the body ran, by `order`.
fn runs() -> &'static Mutex<HashMap<String, usize>> {
    static RUNS: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    RUNS.get_or_init(Default::default)
}

fn ran(order: &str) -> usize {
    runs().lock().unwrap().get(order).copied().unwrap_or(0)
}

/// What a body that must hang waits for, by `order`.
fn gates() -> &'static Mutex<HashMap<String, Arc<Notify>>> {
    static GATES: OnceLock<Mutex<HashMap<String, Arc<Notify>>>> = OnceLock::new();
    GATES.get_or_init(Default::default)
}

/// Refund an order. `order` says how the provider behaves: `declined-*` declines, `timeout-*`
/// times out on its first run (ambiguous) and succeeds afterwards, `hang-*` waits for its gate.
#[tool(retry = "never")]
async fn refund(order: String) -> Result<Refund, RefundError> {
    let n = {
        let mut runs = runs().lock().unwrap();
        let n = runs.entry(order.clone()).or_default();
        *n += 1;
        *n
    };
    if order.starts_with("declined") {
        return Err(RefundError::Declined);
    }
    if order.starts_with("timeout") && n == 1 {
        return Err(RefundError::Timeout);
    }
    if order.starts_with("hang") {
        let gate = Arc::clone(gates().lock().unwrap().entry(order.clone()).or_default());
        gate.notified().await;
    }
    Ok(Refund { refund_id: format!("re_{order}_{n}") })
}

/// Runs `idem --store URL args..` with no terminal on stdin.
/// Runs `idem --store url args..`. A command that has not ended after two minutes is killed and
/// fails the test: every command here answers in seconds, so that is a hang, the fault itself.
fn idem(url: &str, args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--store")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("IDEM_STORE")
        .spawn()
        .expect("run idem");
    let pid = child.id().to_string();
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match ended.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("run idem"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid]).status();
            panic!("idem {args:?} on {url} hung");
        }
    }
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

fn ok(url: &str, args: &[&str]) -> String {
    let out = idem(url, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "idem {args:?} must succeed; stderr: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8")
}

fn exits(url: &str, args: &[&str], want: i32) -> String {
    let out = idem(url, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(code(&out), want, "idem {args:?}: exit code; stderr: {stderr}");
    stderr
}

fn json(url: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(url, &all)).expect("JSON output")
}

/// The key of the one record of `run` in `state` that the CLI lists.
fn key_in(url: &str, run: &str, state: &str) -> String {
    let listed = json(url, &["list", "--run", run, "--state", state]);
    let records = listed["records"].as_array().expect("records");
    assert_eq!(records.len(), 1, "one {state} record of the run: {listed}");
    assert_eq!(records[0]["tool"], "refund", "the record names its tool: {listed}");
    assert_eq!(records[0]["run"], run);
    records[0]["key"].as_str().expect("key").to_owned()
}

fn unique_run(store: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("cli-{store}-{}-{nanos}", std::process::id())
}

/// The whole operator workflow on one store.
async fn workflow(url: &str, store: Arc<dyn Store>, name: &str) {
    let idem = Idem::builder_shared(store).build();
    let run_id = unique_run(name);
    let run = idem.run(&run_id);
    let tag = |what: &str| format!("{what}-{run_id}");
    let (done, declined, unknown, flaky, hang) =
        (tag("done"), tag("declined"), tag("timeout-a"), tag("timeout-b"), tag("hang"));

    refund(&run, done.clone()).await.expect("completed");
    refund(&run, declined.clone()).await.expect_err("declined");
    let e = refund(&run, unknown.clone()).await.expect_err("ambiguous");
    assert!(matches!(e, idem_core::Error::OutcomeUnknown { .. }), "{e}");
    let e = refund(&run, flaky.clone()).await.expect_err("ambiguous");
    assert!(matches!(e, idem_core::Error::OutcomeUnknown { .. }), "{e}");
    let held = tokio::spawn({
        let (run, hang) = (run.clone(), hang.clone());
        async move { refund(&run, hang).await }
    });
    while ran(&hang) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Listing: every record of the run, by state, as JSON and as a table.
    let all = json(url, &["list", "--run", &run_id]);
    assert_eq!(all["records"].as_array().expect("records").len(), 5, "{all}");
    let listed = json(url, &["list", "--run", &run_id, "--state", "unknown"]);
    assert_eq!(listed["records"].as_array().expect("records").len(), 2, "{listed}");
    let completed = key_in(url, &run_id, "completed");
    let failed = key_in(url, &run_id, "failed");
    let in_flight = key_in(url, &run_id, "in-flight");
    let table = ok(url, &["list", "--run", &run_id, "--tool", "refund"]);
    assert!(table.starts_with("STATE"), "a table with a header: {table}");
    for key in [&completed, &failed, &in_flight] {
        assert!(table.contains(key.as_str()), "the table lists {key}: {table}");
    }
    // The cursor printed after a partial listing pastes into a shell as it is.
    let first = self::idem(url, &["list", "--run", &run_id, "--limit", "1"]);
    let hint = String::from_utf8_lossy(&first.stderr).into_owned();
    let cursor = hint.trim().strip_prefix("more records follow: ").expect(&hint);
    let pasted = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} --store '{url}' --json list --run '{run_id}' --limit 10 {cursor}",
            env!("CARGO_BIN_EXE_idem")
        ))
        .stdin(Stdio::null())
        .output()
        .expect("sh");
    assert_eq!(code(&pasted), 0, "{cursor}: {}", String::from_utf8_lossy(&pasted.stderr));
    let rest: Value = serde_json::from_slice(&pasted.stdout).expect("JSON");
    assert_eq!(rest["records"].as_array().expect("records").len(), 4, "{cursor}: {rest}");
    let none = json(url, &["list", "--run", &run_id, "--older-than", "1h"]);
    assert_eq!(none["records"], serde_json::json!([]), "nothing is an hour old: {none}");
    let shown = json(url, &["show", &completed]);
    assert_eq!(shown["state"], "completed");
    assert_eq!(shown["result"]["refund_id"], format!("re_{done}_1"));

    // Resolve is fenced: a live owner's record is refused and stays in flight.
    let why = exits(url, &["resolve", &in_flight, "--happened", "{}", "--yes"], 4);
    assert!(why.contains("live owner"), "{why}");
    assert_eq!(json(url, &["show", &in_flight])["state"], "in-flight");
    exits(url, &["resolve", &completed, "--not-happened", "--yes"], 4);

    // Unknown, resolved as happened: the next call replays the result; the body ran once.
    let unknown_key = key_of(url, &run_id, &unknown);
    let result = r#"{"refund_id":"re_checked"}"#;
    let why = exits(url, &["resolve", &unknown_key, "--happened", result], 4);
    assert!(why.contains("--yes"), "no terminal and no --yes: refused: {why}");
    ok(url, &["resolve", &unknown_key, "--happened", result, "--yes"]);
    // Sent again (its answer lost), the same resolution is done, not refused; another result
    // is refused and changes nothing.
    let again = ok(url, &["resolve", &unknown_key, "--happened", result, "--yes"]);
    assert!(again.contains("already holds this result"), "{again}");
    assert!(again.contains("retention is unchanged"), "{again}");
    // The same JSON written with other whitespace, and as JSON output: told apart from a
    // resolution that changed the record.
    // Given in a file (`@FILE`), as a result too large for an argument is.
    let spaced = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cli-{name}-{}-result.json", std::process::id()));
    std::fs::write(&spaced, r#" { "refund_id" : "re_checked" } "#).expect("write");
    let from_file = format!("@{}", spaced.display());
    let said = json(url, &["resolve", &unknown_key, "--happened", &from_file, "--yes"]);
    assert_eq!(said["status"], "already-resolved", "{said}");
    let other = r#"{"refund_id":"re_other"}"#;
    let why = exits(url, &["resolve", &unknown_key, "--happened", other, "--yes"], 4);
    assert!(why.contains("already settled") && why.contains("run the tool again"), "{why}");
    let replayed = refund(&run, unknown.clone()).await.expect("replayed");
    assert_eq!(replayed, Refund { refund_id: "re_checked".into() });
    assert_eq!(ran(&unknown), 1, "the body did not run again");
    exits(url, &["resolve", &unknown_key, "--not-happened", "--yes"], 4);

    // Unknown, resolved as not happened: the next call runs, exactly once.
    let flaky_key = key_of(url, &run_id, &flaky);
    ok(url, &["resolve", &flaky_key, "--not-happened", "--yes"]);
    // Sent again, it finds no record, and says why that is so.
    let why = exits(url, &["resolve", &flaky_key, "--not-happened", "--yes"], 3);
    assert!(why.contains("the next call with this key runs the tool"), "{why}");
    let ran_again = refund(&run, flaky.clone()).await.expect("ran");
    assert_eq!(ran_again, Refund { refund_id: format!("re_{flaky}_2") });
    assert_eq!(ran(&flaky), 2, "the body ran exactly once more");
    refund(&run, flaky.clone()).await.expect("replayed");
    assert_eq!(ran(&flaky), 2, "and is replayed afterwards");

    // Forget, show of a missing record, bad keys, stats and purge. A record a live owner holds
    // is said to be one, before anything is removed.
    let why = exits(url, &["forget", &in_flight], 4);
    assert!(why.contains("live lease") && why.contains("runs the effect again"), "{why}");
    assert_eq!(json(url, &["show", &in_flight])["state"], "in-flight");
    exits(url, &["forget", &failed], 4);
    ok(url, &["forget", &failed, "--yes"]);
    exits(url, &["show", &failed], 3);
    exits(url, &["forget", &failed, "--yes"], 3);
    exits(url, &["show", "not-a-key"], 2);
    // A key shortened in a log line is refused, not matched by prefix, and the error says how to
    // find the whole key.
    let why = exits(url, &["forget", &failed[..12], "--yes"], 2);
    assert!(why.contains("12 digits") && why.contains("idem list"), "{why}");
    // A cursor no listing printed is the operator's mistake on every store, not a record of
    // another version.
    let why = exits(url, &["list", "--cursor", "zz"], 2);
    assert!(why.contains("--cursor \"zz\" is not a cursor of this store"), "{why}");
    assert!(!why.contains("store configuration"), "the store is fine: {why}");
    // A pasted file is not printed back whole.
    let why = exits(url, &["list", "--cursor", &"a".repeat(100_000)], 2);
    assert!(why.len() < 1_000, "{} bytes: {}", why.len(), &why[..300]);
    // The store is shared with the other tests, some of which leave unreadable records for a
    // moment: `stats` then exits 6, after printing the counts.
    let counted = |args: &[&str]| {
        let out = self::idem(url, args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match code(&out) {
            0 => {}
            6 => assert!(stderr.contains("`idem list` names each"), "{stderr}"),
            other => panic!("idem {args:?}: exit {other}; stderr: {stderr}"),
        }
        stdout
    };
    let stats: Value = serde_json::from_str(&counted(&["--json", "stats"])).expect("JSON");
    assert!(stats["in_flight"].as_u64().expect("count") >= 1, "{stats}");
    assert!(stats["completed"].as_u64().expect("count") >= 2, "{stats}");
    let text = counted(&["stats"]);
    assert!(text.contains("unknown"), "{text}");
    ok(url, &["purge", "--expired", "--yes"]);

    // The held call finishes normally; its record is completed.
    gates().lock().unwrap()[&hang].notify_one();
    held.await.expect("task").expect("the held call completes");
    assert_eq!(json(url, &["show", &in_flight])["state"], "completed");
}

/// The key of the record of `order` (the listed record whose result or state is its own).
fn key_of(url: &str, run: &str, order: &str) -> String {
    let scope = idem_core::Scope::run(run);
    let args = serde_json::json!({ "order": order });
    let key = idem_core::key::derive_key(&scope, "refund", args.to_string().as_bytes());
    let shown = json(url, &["show", key.as_str()]);
    assert_eq!(shown["state"], "unknown", "{shown}");
    key.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let (dir, url, store) = sqlite_store("idem-cli").await;
    workflow(&url, Arc::clone(&store), "sqlite").await;
    lease_ended(&url, &*store).await;
    // Usage and availability errors have their own exit codes.
    exits(&url, &["list", "--state", "stuck"], 2);
    exits(&url, &["resolve", &"0".repeat(64)], 2);
    exits(&url, &["show", &"0".repeat(64)], 3);
    exits(&url, &["purge"], 2);
    // A SQLite file that does not exist is not created (an operator who mistyped the path would
    // see an empty store): bad usage, and nothing is written.
    let missing = dir.join("typo.db");
    let why = exits(&format!("sqlite://{}", missing.display()), &["stats"], 2);
    assert!(why.contains("no SQLite database"), "{why}");
    assert!(!missing.exists(), "the command line created {}", missing.display());
    exits("sqlite:///nonexistent-dir/idem.db", &["stats"], 2);
    exits("mysql://h/db", &["stats"], 2);
}

/// A password in the store URL is never printed: not by `--help` (which shows `IDEM_STORE`'s
/// value unless told not to), not in the error about a URL that does not parse (a mistyped
/// scheme, a key=value string cut short), where the URL is repeated with the password masked.
#[test]
fn a_password_in_the_store_url_is_never_printed() {
    for args in [&["--help"][..], &["list", "--help"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .env("IDEM_STORE", "postgres://app:s3cretPW@127.0.0.1:5999/app")
            .output()
            .expect("run idem");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("IDEM_STORE"), "{help}");
        assert!(!help.contains("s3cretPW"), "idem {args:?} prints the password:\n{help}");
    }
    for url in [
        "postgress://app:s3cretPW@db.example/app",
        " postgres://app:s3cretPW@127.0.0.1:5999/app",
        "redis:/:s3cretPW@127.0.0.1:6379/",
        "host=127.0.0.1 password=s3cretPW dbname",
        "host=127.0.0.1 password='s3cretPW dbname=test",
        "memory://u:s3cretPW@x",
        "app:s3cretPW@db/x",
        "//app:s3cretPW@db/x",
        "host=127.0.0.1 password = s3cretPW dbname=test bogus",
        "host=127.0.0.1 password=s3cret\\PW dbname=test bogus",
        "sqlite:///tmp/a.db?password=s3cretPW",
        // A mistyped Redis socket URL: its password is the `pass` option.
        "redis+unx:///run/redis.sock?db=0&pass=s3cretPW",
        "unix:/run/redis.sock?pass=s3cretPW&bogus=1",
        // No scheme, and a `://` later in the text (a query naming a file URL).
        "app:s3cretPW@db/x?sslrootcert=file:///etc/ca.pem",
    ] {
        let why = exits(url, &["stats"], 2);
        assert!(!why.contains("s3cretPW"), "{url}: {why}");
        assert!(why.contains("***"), "the masked URL is still shown: {why}");
    }
    // A `?` or `/` in a Redis URL's password ends its user info, and the rest of the password
    // became an option or a path that the error quoted; in a connection string that does not
    // parse, a space or a quote inside the password ended the part that was masked.
    for url in [
        "redis://:s3cret?PWtail@127.0.0.1:6379/7",
        "rediss://u:s3cret#PWtail@127.0.0.1:6379/7",
        "redis+cluster://:s3cret/PWtail@10.0.0.1:6379,10.0.0.2:6379/",
        "redis://:s3cret?wait_replicas=PWtail@127.0.0.1:6379/",
        "host=127.0.0.1 user=app password=s3cret PWtail dbname=app",
        "host=127.0.0.1 user=app password='s3c'PWtail-secret' dbname=app",
    ] {
        let why = exits(url, &["stats"], 2);
        assert!(!why.contains("PWtail") && !why.contains("s3c"), "{url}: {why}");
        assert!(why.contains("***"), "the masked URL is still shown: {why}");
    }
    // A store URL typed where clap does not expect it is quoted by clap's refusal.
    for args in [
        &["postgres://app:s3cretPW@db/app", "list"][..],
        &["list", "postgres://app:s3cretPW@db/app"],
        &["--json=postgres://app:s3cretPW@db/app", "list"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_idem")).args(args).output().expect("run idem");
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(!said.contains("s3cretPW"), "{args:?}: {said}");
        assert!(said.contains("postgres://app:***@db/app"), "{args:?}: {said}");
    }
    // An `@` in the password: PostgreSQL's URL reading ends the user info at the first one, so
    // the rest of the password would be the host that connection errors name.
    let why = exits("postgresql://app:s3c@ret@PW@127.0.0.1:1/app", &["stats"], 2);
    assert!(!why.contains("ret"), "{why}");
    assert!(why.contains("%40"), "{why}");
}

/// A URL scheme is case-insensitive (RFC 3986 §3.1): `PostgreSQL://` opens the store as
/// `postgresql://` does (the client library reads only the lower-case prefix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upper_case_postgres_scheme_opens_the_store() {
    let url = pg_url();
    if idem_tests::or_skip("PostgreSQL", idem_core::store::open(&url).await).is_none() {
        return;
    }
    let (_, rest) = url.split_once(':').expect("a scheme");
    for scheme in ["PostgreSQL", "Postgres", "POSTGRES"] {
        let upper = format!("{scheme}:{rest}");
        // No such record (3), not a refused URL (2): the store opened. Not `stats`, which
        // exits 6 while another test's unreadable record is in the shared database.
        let missing = "0".repeat(64);
        tokio::task::spawn_blocking(move || exits(&upper, &["show", &missing], 3)).await.unwrap();
    }
}

/// A page that holds the last records of a listing says no more follow: two records listed two
/// at a time are one page without a cursor (it said "more records follow", and the next page was
/// empty), and one at a time two pages, the second without a cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_page_of_a_listing_has_no_cursor() {
    let (_dir, url, store) = sqlite_store("idem-cli-last-page").await;
    let run = "last-page";
    for tool in ["a", "b"] {
        let origin = idem_core::store::Origin { tool, tenant: "", run };
        record_of(&*store, origin, idem_core::store::Outcome::Success("1".into())).await;
    }
    let whole = json(&url, &["list", "--run", run, "--limit", "2"]);
    assert_eq!(whole["records"].as_array().map(Vec::len), Some(2), "{whole}");
    assert!(whole["next"].is_null(), "no page follows the last: {whole}");
    let first = json(&url, &["list", "--run", run, "--limit", "1"]);
    let cursor = first["next"].as_str().expect("a second page follows the first").to_owned();
    let second = json(&url, &["list", "--run", run, "--limit", "1", "--cursor", &cursor]);
    assert_eq!(second["records"].as_array().map(Vec::len), Some(1), "{second}");
    assert!(second["next"].is_null(), "{second}");
}

/// A negative number is a result `--happened` takes (`--happened -5`), not an unknown option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_result_is_a_value_of_happened() {
    let (_dir, url, _store) = sqlite_store("idem-cli-negative").await;
    let missing = "0".repeat(64);
    for result in ["-5", "-0", "-1.5e3"] {
        let why = exits(&url, &["resolve", &missing, "--happened", result, "--yes"], 3);
        assert!(why.contains("no record"), "{result}: {why}");
    }
}

/// What the operator typed is checked before the store is reached: a bad key on an unreachable
/// store is a usage error at once, not a connection failure after a timeout. A result larger
/// than one argument may be (128 KiB on Linux) is read from a file (`@FILE`) or standard input
/// (`-`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_is_checked_before_the_store_and_a_result_can_come_from_a_file() {
    let unreachable = "postgres://nobody@127.0.0.1:1/none";
    let why = exits(unreachable, &["show", "zz"], 2);
    assert!(why.contains("is not an idempotency key"), "{why}");
    let missing = "0".repeat(64);
    let why = exits(unreachable, &["resolve", &missing, "--happened", "{oops", "--yes"], 2);
    assert!(why.contains("--happened takes the result as JSON"), "{why}");
    // A pasted file as a key is quoted cut short.
    let why = exits(unreachable, &["forget", &"g".repeat(10_000), "--yes"], 2);
    assert!(why.len() < 600 && why.contains("10000 bytes in all"), "{why}");

    let (dir, url, _store) = sqlite_store("idem-cli-result-file").await;
    let large = dir.join("result.json");
    let result = serde_json::json!({ "receipt": "r".repeat(200 * 1024) }).to_string();
    std::fs::write(&large, &result).expect("write");
    let from_file = format!("@{}", large.display());
    // Read and checked (no record of this key: 3, not a usage error).
    let why = exits(&url, &["resolve", &missing, "--happened", &from_file, "--yes"], 3);
    assert!(why.contains("no record"), "{why}");
    let why = exits(&url, &["resolve", &missing, "--happened", "@/no/such/file", "--yes"], 2);
    assert!(why.contains("cannot read") && why.contains("/no/such/file"), "{why}");
    // `-`: standard input, here empty: not JSON; and without --yes, the question could not be
    // read from it: refused before the store is reached.
    let why = exits(&url, &["resolve", &missing, "--happened", "-", "--yes"], 2);
    assert!(why.contains("--happened takes the result as JSON"), "{why}");
    let why = exits(unreachable, &["resolve", &missing, "--happened", "-"], 2);
    assert!(why.contains("pass --yes"), "{why}");
    // No more is read than the largest output a tool may have by default (4 MiB).
    let why = exits(&url, &["resolve", &missing, "--happened", "@/dev/zero", "--yes"], 2);
    assert!(why.contains("larger than 4194304 bytes"), "{why}");
}

/// `--state lease-ended` lists the in-flight records whose owner's lease ended (a dead owner), and
/// not those with a live lease.
async fn lease_ended(url: &str, store: &dyn Store) {
    let run_id = unique_run("lease-ended");
    let scope = idem_core::Scope::run(&run_id);
    let claim = |order: &str, lease: Duration| {
        let args = serde_json::json!({ "order": order }).to_string();
        let key = idem_core::key::derive_key(&scope, "refund", args.as_bytes());
        let fingerprint = idem_core::key::fingerprint(args.as_bytes());
        let origin = idem_core::store::Origin { tool: "refund", tenant: "", run: &run_id };
        async move {
            let req = idem_core::store::ClaimRequest {
                key: &key,
                fingerprint: &fingerprint,
                lease,
                on_expired: idem_core::store::OnExpired::Unknown,
                origin,
            };
            let claim = store.claim(req).await.expect("claim");
            assert!(matches!(claim, idem_core::store::Claim::Acquired { .. }), "{claim:?}");
            key.to_string()
        }
    };
    let dead = claim("dead", Duration::from_millis(1)).await;
    let live = claim("live", Duration::from_secs(600)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let keys = |state: &str| -> Vec<String> {
        sorted_keys(&json(url, &["list", "--run", &run_id, "--state", state]))
    };
    assert_eq!(keys("lease-ended"), vec![dead.clone()]);
    let mut both = vec![dead, live];
    both.sort();
    assert_eq!(keys("in-flight"), both);
}

/// `IDEM_PG_URL` as a URL: the tests' connection string may be in libpq's keyword form.
fn pg_url() -> String {
    let conninfo = idem_tests::pg_url();
    if conninfo.starts_with("postgres") {
        return conninfo;
    }
    let field = |name: &str, default: &str| {
        conninfo
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .unwrap_or(default)
            .to_owned()
    };
    format!(
        "postgres://{}@{}:{}/{}",
        field("user", "postgres"),
        field("host", "127.0.0.1"),
        field("port", "5432"),
        field("dbname", "test")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let url = pg_url();
    let Some(store) = idem_tests::or_skip("PostgreSQL", idem_core::store::open(&url).await) else {
        return;
    };
    workflow(&url, store, "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let url = idem_tests::redis_url();
    let Some(store) = idem_tests::or_skip("Redis", idem_core::store::open(&url).await) else {
        return;
    };
    workflow(&url, store, "redis").await;
}

/// A listing of more than one page (500 records) reports its progress on stderr when stderr is a
/// terminal (run under `script`, which gives the command a pseudo-terminal), ending the line
/// before the table; without a terminal it prints no progress, so scripts read only the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_several_pages_shows_progress_on_a_terminal_only() {
    let (_, url, store) = sqlite_store("idem-cli-progress").await;
    let run = Idem::builder_shared(store).build().run("progress");
    for n in 0..600 {
        refund(&run, format!("progress-{n}")).await.expect("refund");
    }

    let plain = idem(&url, &["list", "--run", "progress", "--limit", "1000"]);
    assert_eq!(code(&plain), 0);
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(!stderr.contains("scanned"), "no progress without a terminal: {stderr}");
    let rows =
        String::from_utf8_lossy(&plain.stdout).lines().filter(|l| l.contains(" progress ")).count();
    assert_eq!(rows, 600, "every record listed");

    let command =
        format!("{} --store {url} list --run progress --limit 1000", env!("CARGO_BIN_EXE_idem"));
    let tty = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .env_remove("IDEM_STORE")
        .output()
        .expect("run idem under script (util-linux)");
    assert_eq!(code(&tty), 0, "{}", String::from_utf8_lossy(&tty.stderr));
    let screen = String::from_utf8_lossy(&tty.stdout);
    let progress = screen.find("\rscanned ").unwrap_or_else(|| panic!("no progress: {screen}"));
    let line_end = progress + screen[progress..].find('\n').expect("the progress line ends");
    assert!(
        screen[progress..line_end].trim_end().ends_with("500 selected..."),
        "after the first page: {:?}",
        &screen[progress..line_end]
    );
    let header = screen.find("STATE").expect("the table follows");
    assert!(header > line_end, "the table starts on a line of its own: {screen}");
    assert_eq!(screen.lines().filter(|l| l.contains(" progress ")).count(), 600);
}

/// A record claimed with `origin` and completed with `outcome`, as any client could make one:
/// its key.
async fn record_of(
    store: &dyn Store,
    origin: idem_core::store::Origin<'_>,
    outcome: idem_core::store::Outcome,
) -> String {
    let args = serde_json::json!({ "run": origin.run, "tool": origin.tool }).to_string();
    let key = idem_core::key::derive_key(&idem_core::Scope::run(origin.run), "t", args.as_bytes());
    let fingerprint = idem_core::key::fingerprint(args.as_bytes());
    let req = idem_core::store::ClaimRequest {
        key: &key,
        fingerprint: &fingerprint,
        lease: Duration::from_secs(60),
        on_expired: idem_core::store::OnExpired::Unknown,
        origin,
    };
    let idem_core::store::Claim::Acquired { fence, .. } = store.claim(req).await.expect("claim")
    else {
        panic!("a new key is acquired");
    };
    store.complete(&key, fence, &outcome, Duration::from_secs(3600)).await.expect("complete");
    key.to_string()
}

/// Run ids, tools, tenants and results come from clients and models. In the table, the detail
/// and the refusals, a control character (newline, ESC, CR, C1's CSI) or a bidi override shows
/// escaped on its own line, so it can neither fake a row nor act on the operator's terminal;
/// JSON keeps the exact values, and a listed key is copyable into `show`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_from_clients_cannot_act_on_the_operators_terminal() {
    use idem_core::store::{Origin, Outcome};
    let (_, url, store) = sqlite_store("idem-cli-escapes").await;

    let fake_row = format!("conv\ncompleted  refund  fake  1s  -  9  {}", "0".repeat(64));
    let tenant = "acme\x1b]0;pwned\x07";
    let a = record_of(
        &*store,
        Origin { tool: "refund", tenant, run: &fake_row },
        Outcome::Success("{\"note\":\"\u{9b}2J done\"}".into()),
    )
    .await;
    let b = record_of(
        &*store,
        Origin { tool: "re\x1b[8mfund", tenant: "", run: "r\u{202e}txt.exe" },
        Outcome::Failure("\x1b[2J\rdeclined".into()),
    )
    .await;
    let c = record_of(&*store, Origin { tool: "日本語", tenant: "", run: "🦀" }, Outcome::Unknown)
        .await;
    let raw = |out: &Output| {
        let text = String::from_utf8(out.stdout.clone()).expect("utf-8");
        for bad in ['\x1b', '\r', '\x07', '\u{9b}', '\u{202e}'] {
            assert!(!text.contains(bad), "{bad:?} reached stdout raw: {text:?}");
        }
        text
    };

    let listed = idem(&url, &["list"]);
    assert_eq!(code(&listed), 0);
    let table = raw(&listed);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "a header and one line per record: {table}");
    assert!(lines[0].starts_with("STATE") && lines[0].ends_with("KEY"), "{table}");
    for key in [&a, &b, &c] {
        let row = lines.iter().find(|l| l.ends_with(key.as_str())).expect("a row per key");
        let copied = row.split_whitespace().last().expect("the key, last");
        assert_eq!(json(&url, &["show", copied])["key"], key.as_str(), "copyable into show");
    }
    let row_of = |key: &str| *lines.iter().find(|l| l.ends_with(key)).expect("row");
    // The fake row stays inside the RUN cell, escaped, and cut to the cell's width.
    assert!(
        row_of(&a).contains("conv\\ncompleted  refund  fake  1s  -  9  0000"),
        "{}",
        row_of(&a)
    );
    assert!(row_of(&a).contains("…"), "{}", row_of(&a));
    assert!(row_of(&b).contains("re\\u{1b}[8mfund  r\\u{202e}txt.exe"), "{}", row_of(&b));
    assert!(row_of(&c).starts_with("unknown    日本語"), "{}", row_of(&c));

    let shown = raw(&idem(&url, &["show", &a]));
    let field = |text: &str, name: &str| -> String {
        let line = text.lines().find(|l| l.starts_with(&format!("{name:<12} "))).expect(name);
        line[13..].to_owned()
    };
    assert_eq!(field(&shown, "tenant"), "acme\\u{1b}]0;pwned\\u{7}");
    assert_eq!(
        field(&shown, "run"),
        format!("conv\\ncompleted  refund  fake  1s  -  9  {}", "0".repeat(64))
    );
    assert_eq!(field(&shown, "result"), "{\"note\":\"\\u{9b}2J done\"}");
    assert_eq!(shown.lines().count(), 9, "one line per field: {shown}");
    let shown = raw(&idem(&url, &["show", &b]));
    assert_eq!(field(&shown, "tool"), "re\\u{1b}[8mfund");
    assert_eq!(field(&shown, "run"), "r\\u{202e}txt.exe");
    assert_eq!(field(&shown, "error"), "\\u{1b}[2J\\rdeclined");

    // JSON is for programs: the exact values, escaped by JSON itself. It is printed to
    // terminals too: a C1 control (CSI) or a bidi override is written as a JSON escape, which
    // reads back as the same character.
    let exact = json(&url, &["show", &a]);
    assert_eq!(exact["run"], fake_row.as_str());
    assert_eq!(exact["tenant"], tenant);
    assert_eq!(exact["result"]["note"], "\u{9b}2J done");
    let lists: [&[&str]; 3] =
        [&["--json", "show", &a], &["--json", "show", &b], &["--json", "list"]];
    for args in lists {
        let text = raw(&idem(&url, args));
        assert!(text.contains(r"\u009b2J") || args.contains(&b.as_str()), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }
    assert_eq!(json(&url, &["show", &b])["run"], "r\u{202e}txt.exe");

    // A refusal on stderr names the record's tool and run the same way.
    let why = exits(&url, &["forget", &b], 4);
    assert!(why.contains("tool re\\u{1b}[8mfund in run \"r\\u{202e}txt.exe\""), "{why}");
    assert!(!why.contains('\x1b') && !why.contains('\u{202e}'), "{why:?}");
}

/// Runs `idem --store URL args..` with stdout, or stderr, a pipe whose reader is already gone,
/// as in `idem list | head -1` once `head` has its line: the exit code and stderr.
fn with_closed_pipe(url: &str, args: &[&str], on_stderr: bool) -> (i32, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    command.arg("--store").arg(url).args(args).stdin(Stdio::null()).env_remove("IDEM_STORE");
    let out = if on_stderr {
        command.stdout(Stdio::null()).stderr(writer).output().expect("run idem")
    } else {
        command.stdout(writer).output().expect("run idem")
    };
    (code(&out), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A reader that stops reading (`| head -1`) ends the output quietly with success, not a panic
/// ("failed printing to stdout"); a closed stderr does not change the exit code either; an output
/// that cannot be written for another reason (a full disk) is a failure that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_closed_pipe_or_a_full_disk() {
    use idem_core::store::{Origin, Outcome};
    let (_, url, store) = sqlite_store("idem-cli-pipe").await;
    // A result larger than a pipe's buffer, so a reader that stops early closes the pipe
    // while the output is being written.
    let big = serde_json::Value::String("x".repeat(1 << 20)).to_string();
    let key =
        record_of(&*store, Origin { tool: "t", tenant: "", run: "r" }, Outcome::Success(big)).await;

    for args in [
        &["list"][..],
        &["--json", "list"],
        &["show", &key],
        &["--json", "show", &key],
        &["stats"],
        &["purge", "--expired", "--yes"],
    ] {
        let (exit, stderr) = with_closed_pipe(&url, args, false);
        assert_eq!(exit, 0, "idem {args:?} into a closed pipe: {stderr}");
        assert!(!stderr.contains("panicked"), "idem {args:?}: {stderr}");
    }
    // The refusal goes to a closed stderr: still the refusal's exit code, not a panic's 101.
    let (exit, _) = with_closed_pipe(&url, &["forget", &key], true);
    assert_eq!(exit, 4);

    let full = std::fs::File::options().write(true).open("/dev/full").expect("/dev/full");
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", &url, "show", &key])
        .stdin(Stdio::null())
        .stdout(full)
        .env_remove("IDEM_STORE")
        .output()
        .expect("run idem");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 1, "{stderr}");
    assert!(stderr.starts_with("idem: cannot write the output: "), "{stderr}");
    let forgot = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", &url, "forget", &key, "--yes"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::options().write(true).open("/dev/full").expect("/dev/full"))
        .env_remove("IDEM_STORE")
        .output()
        .expect("run idem");
    let stderr = String::from_utf8_lossy(&forgot.stderr);
    assert_eq!(code(&forgot), 1, "{stderr}");
    assert!(stderr.contains(&format!("(key {key} was forgotten)")), "the change stands: {stderr}");
}

/// Arguments an operator can get wrong are bad usage (exit 2) with a message that says what to
/// pass, before anything is read or changed: a zero limit (which listed nothing while records
/// existed), a zero retention (a result "resolved as happened" that expired at once, so the next
/// call ran the effect again), a retention with --not-happened, numbers out of range, an
/// in-memory store (a new, empty one), an unknown scheme. An upper-case key is the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_usage_errors_that_say_what_to_do() {
    use idem_core::store::{Origin, Outcome};
    let (_, url, store) = sqlite_store("idem-cli-args").await;
    let key =
        record_of(&*store, Origin { tool: "t", tenant: "", run: "r" }, Outcome::Unknown).await;
    let upper = key.to_ascii_uppercase();

    for (args, says) in [
        (&["list", "--limit", "0"][..], "0 is not in 1.."),
        (&["list", "--limit", "-1"], "unexpected argument '-1'"),
        (&["list", "--limit", "99999999999999999999999"], "--limit"),
        (&["list", "--older-than", "99999999999999999999y"], "e.g. 90s"),
        (&["list", "--older-than", "soon"], "e.g. 90s"),
        (&["resolve", &key, "--happened", "{}", "--ttl", "0s", "--yes"], "at least 1s"),
        // Not zero, and yet gone before any repeat: stored as 0 ms once, the effect ran again.
        (&["resolve", &key, "--happened", "{}", "--ttl", "500us", "--yes"], "at least 1s"),
        (&["resolve", &key, "--happened", "{}", "--ttl", "999ms", "--yes"], "at least 1s"),
        (&["resolve", &key, "--not-happened", "--ttl", "1h", "--yes"], "cannot be used with"),
        (&["resolve", &key, "--happened", "{", "--yes"], "--happened takes the result as JSON"),
        (&["resolve", &key, "--happened", "{}", "--not-happened"], "cannot be used with"),
        (&["show", &key[1..]], "64 hex digits"),
        (&["show", "g".repeat(64).as_str()], "64 hex digits"),
    ] {
        let why = exits(&url, args, 2);
        assert!(why.contains(says), "idem {args:?}: {why}");
    }
    assert_eq!(json(&url, &["show", &upper])["key"], key.as_str(), "an upper-case key");
    assert_eq!(json(&url, &["list", "--limit", "1"])["records"].as_array().map(Vec::len), Some(1));
    assert_eq!(json(&url, &["show", &key])["state"], "unknown", "nothing was changed");

    for store in ["memory:", "MEMORY:", "sqlite::memory:", "sqlite://:memory:"] {
        let why = exits(store, &["stats"], 2);
        assert!(why.contains("new, empty"), "{store}: {why}");
    }
    for store in ["", "mysql://h/db", "redis://127.0.0.1:6379/?bogus=1"] {
        let why = exits(store, &["stats"], 2);
        assert!(why.contains("store"), "{store:?}: {why}");
    }
}

/// Records edited by hand or written otherwise than this idem writes them. A payload that is not
/// JSON and one with a NUL show as text (JSON: a string); a huge result shows whole. A record
/// that cannot be read at all (a run id that is not UTF-8) is named by the listing, which shows
/// the others and exits 6; `show` of it is an error that names its key, exit 6; and `forget`
/// with that key removes it, after which the listing works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_edited_sqlite_records() {
    use idem_core::store::{Origin, Outcome};
    let (dir, url, store) = sqlite_store("idem-cli-edited").await;
    let path = dir.join("idem.db");
    let origin = |run| Origin { tool: "t", tenant: "", run };
    let text = record_of(&*store, origin("text"), Outcome::Success("{}".into())).await;
    let nul = record_of(&*store, origin("nul"), Outcome::Failure("{}".into())).await;
    let huge = record_of(&*store, origin("huge"), Outcome::Success("{}".into())).await;
    let bad = record_of(&*store, origin("bad"), Outcome::Unknown).await;
    let db = rusqlite::Connection::open(&path).expect("open the file");
    let set = |sql: &str, key: &str| {
        assert_eq!(db.execute(sql, [key]).expect(sql), 1, "{sql}");
    };
    set("UPDATE idem_records SET payload = 'not json' WHERE key = ?1", &text);
    set("UPDATE idem_records SET payload = 'a' || char(0) || 'b' WHERE key = ?1", &nul);
    set(
        "UPDATE idem_records SET payload = '\"' || hex(zeroblob(1000000)) || '\"' WHERE key = ?1",
        &huge,
    );

    let shown = ok(&url, &["show", &text]);
    assert!(shown.contains("\nresult       not json\n"), "{shown}");
    assert_eq!(json(&url, &["show", &text])["result"], "not json");
    let shown = ok(&url, &["show", &nul]);
    assert!(shown.contains("\nerror        a\\0b\n"), "{shown}");
    assert_eq!(json(&url, &["show", &nul])["error"], "a\u{0}b");
    let shown = ok(&url, &["show", &huge]);
    assert_eq!(shown.lines().find(|l| l.starts_with("result")).map(str::len), Some(13 + 2_000_002));

    set("UPDATE idem_records SET run_id = CAST(X'ff' AS TEXT) WHERE key = ?1", &bad);
    let why = exits(&url, &["show", &bad], 6);
    assert!(why.contains(&format!("record of key \"{bad}\" cannot be read")), "{why}");
    assert!(why.contains("`idem forget`"), "{why}");
    let listed = idem(&url, &["list"]);
    let why = String::from_utf8_lossy(&listed.stderr);
    assert_eq!(code(&listed), 6, "{why}");
    assert!(why.contains(&format!("unreadable record {bad}: ")), "{why}");
    assert!(why.contains(&format!("`idem forget {bad}` removes it")), "{why}");
    let table = String::from_utf8_lossy(&listed.stdout);
    for key in [&text, &nul, &huge] {
        assert!(table.contains(key.as_str()), "the others are listed: {table}");
    }
    let why = exits(&url, &["forget", &bad], 4);
    assert!(why.contains(&format!("forget unreadable record {bad}")), "{why}");
    ok(&url, &["forget", &bad, "--yes"]);
    let listed = json(&url, &["list"]);
    assert_eq!(listed["records"].as_array().map(Vec::len), Some(3), "{listed}");

    // `stats` counts an outcome of unknown kind as unreadable and, as `list`, exits 6 after
    // printing, so that a script does not take the counts for the whole store.
    set("UPDATE idem_records SET kind = 9 WHERE key = ?1", &text);
    let counted = idem(&url, &["--json", "stats"]);
    let why = String::from_utf8_lossy(&counted.stderr);
    assert_eq!(code(&counted), 6, "{why}");
    assert!(why.contains("`idem list` names each"), "{why}");
    let stats: Value = serde_json::from_slice(&counted.stdout).expect("the counts are printed");
    assert_eq!(stats["unreadable"], 1, "{stats}");
}

/// The keys of the table rows of `stdout` (a key is the last cell) and the keys the unreadable
/// lines of `stderr` name.
fn listed_keys(stdout: &str, stderr: &str) -> (Vec<String>, Vec<String>) {
    let rows = stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().last())
        .filter(|k| idem_core::Key::parse(k).is_some())
        .map(str::to_owned)
        .collect();
    let unreadable = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("unreadable record "))
        .filter_map(|l| l.split_once(": ").map(|(k, _)| k.to_owned()))
        .collect();
    (rows, unreadable)
}

/// The keys of the records of a `--json list` output, sorted.
fn sorted_keys(listed: &Value) -> Vec<String> {
    let mut keys: Vec<String> = listed["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key"].as_str().expect("key").to_owned())
        .collect();
    keys.sort();
    keys
}

/// `idem --json list` of `run`: the readable records' keys, sorted, and the unreadable ones as
/// listed, after checking the exit code says whether there were any.
fn json_listing(url: &str, run: &str) -> (Vec<String>, Vec<Value>) {
    let out = idem(url, &["--json", "list", "--run", run]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let keys = sorted_keys(&listed);
    let unreadable = listed["unreadable"].as_array().expect("unreadable").clone();
    if unreadable.is_empty() {
        assert_eq!(code(&out), 0, "{stderr}");
    } else {
        assert_eq!(code(&out), 6, "{stderr}");
        assert!(stderr.contains("cannot be read (named under \"unreadable\")"), "{stderr}");
    }
    (keys, unreadable)
}

/// `idem list` of `run` around the unreadable record `bad` beside the readable `good` (records
/// of other runs may be there too, and on Redis other unreadable records, which a listing
/// cannot filter): the readable ones listed, the unreadable one named with its reason (`why`)
/// and how to remove it, in text and in JSON, with exit 6; page by page with pages of one
/// record, following the printed cursors as an operator pastes them, every record once, also
/// when the unreadable one ends a page; and after `forget`, no longer named.
fn around_unreadable(url: &str, run: &str, good: &[String], bad: &str, why: &str) {
    let mut want: Vec<String> = good.to_vec();
    want.sort();

    let (keys, unreadable) = json_listing(url, run);
    assert_eq!(keys, want, "{unreadable:?}");
    let named: Vec<&Value> = unreadable.iter().filter(|u| u["key"] == bad).collect();
    assert_eq!(named.len(), 1, "{unreadable:?}");
    let reason = named[0]["reason"].as_str().expect("reason");
    assert!(reason.contains(why), "{reason}");

    let out = idem(url, &["list", "--run", run]);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(code(&out), 6, "{stderr}");
    assert!(stdout.starts_with("STATE"), "the table of the others: {stdout}");
    let (mut rows, unreadable) = listed_keys(&stdout, &stderr);
    rows.sort();
    assert_eq!(rows, want, "{stdout}");
    assert_eq!(unreadable.iter().filter(|k| *k == bad).count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("`idem forget {bad}` removes it")), "{stderr}");
    assert!(stderr.contains("every other record was listed"), "{stderr}");

    let (mut rows, mut unreadable) = (Vec::new(), Vec::new());
    let (mut cursor, mut ended): (Option<String>, bool) = (None, false);
    for _ in 0..100 {
        let mut args = vec!["list", "--run", run, "--limit", "1"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c]);
        }
        let out = idem(url, &args);
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let (page, named) = listed_keys(&stdout, &stderr);
        let want_code = if named.is_empty() { 0 } else { 6 };
        assert_eq!(code(&out), want_code, "{args:?}: {stderr}");
        rows.extend(page);
        unreadable.extend(named);
        let hint = stderr.lines().find_map(|l| l.strip_prefix("more records follow: "));
        match hint.and_then(shlex::split) {
            Some(words) => cursor = Some(words.get(1).expect("--cursor and its value").clone()),
            None => {
                ended = true;
                break;
            }
        }
    }
    assert!(ended, "the listing ended");
    rows.sort();
    assert_eq!(rows, want, "pages of one: each readable record once");
    assert_eq!(unreadable.iter().filter(|k| *k == bad).count(), 1, "{unreadable:?}");

    ok(url, &["forget", bad, "--yes"]);
    let (keys, unreadable) = json_listing(url, run);
    assert_eq!(keys, want);
    assert!(unreadable.iter().all(|u| u["key"] != bad), "forgotten: {unreadable:?}");
}

/// A new SQLite store in a directory of its own under the tests' temporary directory, named
/// `name` and this process: the directory, the store's URL and the store.
async fn sqlite_store(name: &str) -> (std::path::PathBuf, String, Arc<dyn Store>) {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    let store = idem_core::store::open(&url).await.expect("open");
    (dir, url, store)
}

/// Three records of one run and the key of a fourth, which the caller makes unreadable.
async fn four_records(store: &dyn Store, run: &str) -> (Vec<String>, String) {
    use idem_core::store::{Origin, Outcome};
    let mut keys = Vec::new();
    for tool in ["a", "b", "c", "d"] {
        let origin = Origin { tool, tenant: "", run };
        keys.push(record_of(store, origin, Outcome::Success("{}".into())).await);
    }
    let bad = keys.pop().expect("four");
    (keys, bad)
}

/// An unreadable record beside readable ones on SQLite; then one whose key was edited into text
/// with a control character: named escaped, as text from the store always is, and quoted, with
/// no `idem forget` to suggest, since that takes only a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lists_around_an_unreadable_record() {
    let (dir, url, store) = sqlite_store("idem-cli-unreadable").await;
    let path = dir.join("idem.db");
    let (good, bad) = four_records(&*store, "unreadable").await;
    let db = rusqlite::Connection::open(&path).expect("open the file");
    let sql = "UPDATE idem_records SET kind = 9 WHERE key = ?1";
    assert_eq!(db.execute(sql, [&bad]).expect(sql), 1);
    tokio::task::spawn_blocking({
        let (url, good) = (url.clone(), good.clone());
        move || around_unreadable(&url, "unreadable", &good, &bad, "outcome this idem cannot read")
    })
    .await
    .expect("the listing checks");

    let sql = "UPDATE idem_records SET key = 'k' || char(27) || '[2J' WHERE key = ?1";
    assert_eq!(db.execute(sql, [&good[0]]).expect(sql), 1);
    let out = idem(&url, &["list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 6, "{stderr}");
    assert!(
        stderr.contains(r#"unreadable record with key "k\u{1b}[2J": "#)
            && stderr.contains("not an idempotency key")
            && !stderr.contains("idem forget"),
        "{stderr}"
    );
    assert!(!stderr.contains('\x1b'), "no raw escape reaches the terminal: {stderr:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The store on the tests' shared PostgreSQL database, its URL, and a plain client of that
/// database to edit records as a person might; `None` when PostgreSQL is absent outside CI.
async fn pg_store_and_client() -> Option<(String, Arc<dyn Store>, tokio_postgres::Client)> {
    let url = pg_url();
    let store = idem_tests::or_skip("PostgreSQL", idem_core::store::open(&url).await)?;
    let (client, conn) =
        tokio_postgres::connect(&idem_tests::pg_url(), tokio_postgres::NoTls).await.expect("raw");
    tokio::spawn(conn);
    Some((url, store, client))
}

/// On the tests' shared database: the listing of this test's run selects its unreadable record
/// (its run id is intact) and no other test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lists_around_an_unreadable_record() {
    let Some((url, store, client)) = pg_store_and_client().await else { return };
    let run = unique_run("pg-unreadable");
    let (good, bad) = four_records(&*store, &run).await;
    let sql = "UPDATE idem_records SET state = 7 WHERE key = $1";
    assert_eq!(client.execute(sql, &[&bad]).await.expect(sql), 1);
    let checked = tokio::task::spawn_blocking({
        let bad = bad.clone();
        move || around_unreadable(&url, &run, &good, &bad, "unknown state 7")
    })
    .await;
    // A failed check leaves no unreadable record behind for the other tests' listings.
    let _ = client.execute("DELETE FROM idem_records WHERE key = $1", &[&bad]).await;
    checked.expect("the listing checks");
}

/// The Redis store's URL names no key prefix, so this test has a database of its own on the
/// tests' server (13): listings of the other tests never meet its unreadable record, which
/// expires in ten minutes should the test fail before forgetting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lists_around_an_unreadable_record() {
    let base = idem_tests::redis_url();
    let (head, query) = base.split_once('?').map_or((base.as_str(), None), |(h, q)| (h, Some(q)));
    let start = head.find("://").map_or(0, |i| i + 3);
    let server = head[start..].find('/').map_or(head, |i| &head[..start + i]);
    let url = format!("{server}/13{}", query.map(|q| format!("?{q}")).unwrap_or_default());
    let Some(store) = idem_tests::or_skip("Redis", idem_core::store::open(&url).await) else {
        return;
    };
    let run = unique_run("redis-unreadable");
    let (good, bad) = four_records(&*store, &run).await;
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let mut raw = client.get_multiplexed_async_connection().await.expect("raw connection");
    let set = redis::cmd("SET")
        .arg(format!("idem:{{{bad}}}:rec"))
        .arg("not a record")
        .arg("PX")
        .arg(600_000)
        .to_owned();
    let () = set.query_async(&mut raw).await.expect("SET");
    tokio::task::spawn_blocking(move || {
        around_unreadable(&url, &run, &good, &bad, "schema version")
    })
    .await
    .expect("the listing checks");
}

/// A store that is down (nothing listens on the port) is exit 5 with a message that says so:
/// not a panic, not a hang (`idem` fails the test on one).
#[test]
fn a_store_that_is_down_is_exit_5() {
    for url in [
        "postgres://postgres@127.0.0.1:1/test",
        "redis://:secret@127.0.0.1:1/",
        "redis+cluster://:secret@127.0.0.1:1,127.0.0.1:2/",
    ] {
        let why = exits(url, &["stats"], 5);
        assert!(why.contains("could not be reached"), "{url}: {why}");
        // Which server, and never the password.
        assert!(why.contains("127.0.0.1:1"), "{url}: {why}");
        assert!(!why.contains("secret"), "{url}: {why}");
        assert!(!why.contains("panicked"), "{url}: {why}");
        // Each cause once (redis's error writes its I/O cause into its own text and returns it).
        if !url.contains("cluster") {
            assert_eq!(why.matches("Connection refused").count(), 1, "{url}: {why}");
        }
    }
    // An option a SQLite URL does not take is named, not read as part of the file name.
    let why = exits("sqlite:///tmp/idem-cli-no-such.db?mode=ro", &["list"], 2);
    assert!(why.contains("takes no options"), "{why}");
}

/// A `search_path` schema that does not exist: the command line says there is no idem store
/// there and names the search path (a usage error: the operator mistyped it). An application
/// opening the same string gets the server's own error, its cause written once, not again
/// under "db error".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_is_named_once() {
    let url = pg_url();
    if idem_tests::or_skip("PostgreSQL", idem_core::store::open(&url).await).is_none() {
        return;
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    let bad = format!("{url}{sep}options=-csearch_path%3Didem_no_such_schema");
    let why = exits(&bad, &["stats"], 2);
    assert!(why.contains("no idem store"), "{why}");
    assert_eq!(why.matches("idem_no_such_schema").count(), 1, "{why}");

    // The error as a program prints it with its causes (idem-core's ErrorChain, which the command
    // line uses too): the server's message once.
    let Err(e) = idem_core::store::open(&bad).await else { panic!("opened {bad}") };
    let said = idem_core::ErrorChain(&e).to_string();
    assert_eq!(said.matches("no schema has been selected").count(), 1, "{said}");
}

/// The result given to `resolve --happened` is stored as given: an integer beyond 64 bits stays
/// exact (a `u128` output replays as itself), and an object that names a member twice is refused
/// (it would have kept only the last value) before anything changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolved_result_is_stored_exactly() {
    use idem_core::store::{Origin, Outcome, RecordState};
    let (dir, url, store) = sqlite_store("idem-cli-exact").await;
    let wide =
        record_of(&*store, Origin { tool: "t", tenant: "", run: "wide" }, Outcome::Unknown).await;
    let twice =
        record_of(&*store, Origin { tool: "t", tenant: "", run: "twice" }, Outcome::Unknown).await;

    let result = r#"{"amount":18446744073709551617}"#;
    ok(&url, &["resolve", &wide, "--happened", result, "--yes"]);
    let key = idem_core::Key::parse(&wide).expect("key");
    let info = store.inspect(&key).await.expect("inspect").expect("record");
    assert_eq!(info.state, RecordState::Done(Outcome::Success(result.into())));

    let why =
        exits(&url, &["resolve", &twice, "--happened", r#"{"id":"re_1","id":"re_2"}"#, "--yes"], 2);
    assert!(why.contains("appears twice"), "{why}");
    assert_eq!(json(&url, &["show", &twice])["state"], "unknown", "nothing was changed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `show --json` gives the exact stored result: an integer beyond 64 bits, stored exactly by the
/// executor (a `u128` output) or by `resolve`, must not be shown as a float.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_json_gives_a_wide_integer_exactly() {
    use idem_core::store::{Origin, Outcome};
    let (dir, url, store) = sqlite_store("idem-cli-wide").await;
    let result = r#"{"amount":18446744073709551617}"#;
    let key = record_of(
        &*store,
        Origin { tool: "t", tenant: "", run: "w" },
        Outcome::Success(result.into()),
    )
    .await;
    let shown = ok(&url, &["--json", "show", &key]);
    assert!(shown.contains(r#""result":{"amount":18446744073709551617}"#), "{shown}");
    let listed = ok(&url, &["--json", "list", "--run", "w"]);
    assert!(listed.contains(r#""result":{"amount":18446744073709551617}"#), "{listed}");
    // Still one JSON document per command, which reads back.
    for text in [&shown, &listed] {
        assert_eq!(text.lines().count(), 1, "{text}");
        serde_json::from_str::<Value>(text).expect("JSON");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The command line does not create stores: pointed at a PostgreSQL schema with no idem tables
/// (a mistyped `search_path` or database), it must say so, not create the tables and report an
/// empty store, as it refuses a SQLite file that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_postgres_schema_is_not_made_a_store() {
    let url = pg_url();
    if idem_tests::or_skip("PostgreSQL", idem_core::store::open(&url).await).is_none() {
        return;
    }
    let schema = format!("idem_cli_empty_{}", std::process::id());
    let (admin, conn) =
        tokio_postgres::connect(&idem_tests::pg_url(), tokio_postgres::NoTls).await.expect("pg");
    let task = tokio::spawn(conn);
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))
        .await
        .expect("schema");
    let sep = if url.contains('?') { '&' } else { '?' };
    let out = idem(&format!("{url}{sep}options=-csearch_path%3D{schema}"), &["stats"]);
    let tables: i64 = admin
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .expect("count")
        .get(0);
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop");
    drop(admin);
    let _ = task.await;
    assert_ne!(code(&out), 0, "an empty schema is not a store");
    assert_eq!(tables, 0, "the command line created no tables");
}

/// `--run` selects one run by its whole id: a script that forgets what `list --run conv-1`
/// printed must not reach the records of `conv-10`. `--run-prefix` selects by prefix; the two
/// together are a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_selected_by_its_whole_id_and_a_prefix_only_when_asked() {
    let (_, url, store) = sqlite_store("idem-cli-run-exact").await;
    let idem = Idem::builder_shared(store).build();
    refund(&idem.run("conv-1"), "exact-a".into()).await.expect("refund");
    refund(&idem.run("conv-10"), "exact-b".into()).await.expect("refund");
    refund(&idem.run("conv-10"), "exact-c".into()).await.expect("refund");
    refund(&idem.run(""), "exact-d".into()).await.expect("refund");
    let count = |args: &[&str]| json(&url, args)["records"].as_array().expect("records").len();
    assert_eq!(count(&["list", "--run", "conv-1"]), 1);
    assert_eq!(count(&["list", "--run", "conv-10"]), 2);
    assert_eq!(count(&["list", "--run", "conv-"]), 0, "no run has that whole id");
    assert_eq!(count(&["list", "--run-prefix", "conv-1"]), 3);
    assert_eq!(count(&["list", "--run", ""]), 1, "the calls made without a run");
    assert_eq!(count(&["list"]), 4);
    let both = exits(&url, &["list", "--run", "conv-1", "--run-prefix", "conv"], 2);
    assert!(both.contains("cannot be used with"), "{both}");
}

/// A SQLite file whose idem tables are damaged (the schema page intact, the pages after it
/// overwritten: a bad copy, a disk error) is named damaged (exit 6, restore from a backup), not
/// "an idem_records table without a schema version; upgrade idem, or migrate the store", which
/// sends the operator after an upgrade that cannot help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_damaged_past_its_schema_page_is_named_damaged() {
    let (dir, url, store) = sqlite_store("damaged-tables").await;
    drop(store);
    let path = dir.join("idem.db");
    let mut bytes = std::fs::read(&path).expect("the store's file");
    assert!(bytes.len() > 4096, "more than the schema page");
    for b in &mut bytes[4096..] {
        *b = 0x41;
    }
    std::fs::write(&path, &bytes).expect("damage");
    let why = tokio::task::spawn_blocking(move || exits(&url, &["stats"], 6)).await.unwrap();
    assert!(why.contains("damaged"), "{why}");
    assert!(!why.contains("upgrade idem"), "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--json` prints one JSON document on one line, also when a stored result was written with
/// line breaks and indentation (as `resolve --happened` takes a pasted, pretty-printed result):
/// a script that reads the output line by line must get the whole record on one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_stays_on_one_line_for_a_pretty_printed_result() {
    use idem_core::store::{Origin, Outcome};
    let (dir, url, store) = sqlite_store("idem-cli-pretty").await;
    let pretty = "{\n  \"refund_id\": \"re_1\",\n  \"lines\": [ 1, 2 ],\n  \"note\": \"a b\\n\"\n}";
    let stored = record_of(
        &*store,
        Origin { tool: "t", tenant: "", run: "stored" },
        Outcome::Success(pretty.into()),
    )
    .await;
    let resolved =
        record_of(&*store, Origin { tool: "t", tenant: "", run: "resolved" }, Outcome::Unknown)
            .await;
    ok(&url, &["resolve", &resolved, "--happened", pretty, "--yes"]);
    let want = serde_json::json!({"refund_id": "re_1", "lines": [1, 2], "note": "a b\n"});
    for key in [&stored, &resolved] {
        let shown = ok(&url, &["--json", "show", key]);
        assert_eq!(shown.lines().count(), 1, "{shown}");
        let shown: Value = serde_json::from_str(&shown).expect("JSON");
        assert_eq!(shown["result"], want);
    }
    let listed = ok(&url, &["--json", "list"]);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    let listed: Value = serde_json::from_str(&listed).expect("JSON");
    let results: Vec<&Value> =
        listed["records"].as_array().expect("records").iter().map(|r| &r["result"]).collect();
    assert_eq!(results, [&want, &want]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The operator's view of `key`, a completed record of `run` whose end of retention was removed
/// (edited by hand, or damaged): the application still meets it (SQLite replays it, PostgreSQL
/// refuses its claims as another version's record), so the CLI lists, counts and shows it, and
/// `forget` removes it. It was hidden from all four, and `forget` said "no record".
fn without_an_end_of_retention(url: &str, run: &str, key: &str) {
    assert_eq!(sorted_keys(&json(url, &["list", "--run", run])), [key], "listed");
    assert!(ok(url, &["show", key]).contains(key), "shown");
    let stats = json(url, &["stats"]);
    assert!(stats["completed"].as_u64().is_some_and(|n| n >= 1), "counted: {stats}");
    ok(url, &["forget", key, "--yes"]);
    exits(url, &["show", key], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_shows_a_record_without_an_end_of_retention() {
    use idem_core::store::{Origin, Outcome};
    let (dir, url, store) = sqlite_store("idem-cli-no-expiry").await;
    let origin = Origin { tool: "a", tenant: "", run: "no-expiry" };
    let key = record_of(&*store, origin, Outcome::Success("{}".into())).await;
    let db = rusqlite::Connection::open(dir.join("idem.db")).expect("open the file");
    let sql = "UPDATE idem_records SET expires_at = NULL WHERE key = ?1";
    assert_eq!(db.execute(sql, [&key]).expect(sql), 1);
    tokio::task::spawn_blocking(move || {
        // The store is this test's alone: the record is its one completed record.
        assert_eq!(json(&url, &["stats"])["completed"], 1, "counted once");
        without_an_end_of_retention(&url, "no-expiry", &key);
        assert_eq!(json(&url, &["stats"])["completed"], 0, "forgotten");
    })
    .await
    .expect("the operator's view");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shows_a_record_without_an_end_of_retention() {
    use idem_core::store::{Origin, Outcome};
    let Some((url, store, client)) = pg_store_and_client().await else { return };
    let run = unique_run("pg-no-expiry");
    let origin = Origin { tool: "a", tenant: "", run: &run };
    let key = record_of(&*store, origin, Outcome::Success("{}".into())).await;
    let sql = "UPDATE idem_records SET expires_at = NULL WHERE key = $1";
    assert_eq!(client.execute(sql, &[&key]).await.expect(sql), 1);
    let checked = tokio::task::spawn_blocking({
        let key = key.clone();
        move || without_an_end_of_retention(&url, &run, &key)
    })
    .await;
    let _ = client.execute("DELETE FROM idem_records WHERE key = $1", &[&key]).await;
    checked.expect("the operator's view");
}

/// A role whose transactions are read-only by default (`default_transaction_read_only`, a
/// reporting role) lists and shows the records, but cannot settle them. The writes exited 5
/// ("unavailable", which scripts retry): it is a configuration, so they exit 2 and say which
/// setting, and the record is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writes_through_a_read_only_role_are_a_configuration_error() {
    use idem_core::store::{Origin, Outcome};
    let Some((url, store, client)) = pg_store_and_client().await else { return };
    let run = unique_run("pg-read-only");
    let origin = Origin { tool: "refund", tenant: "", run: &run };
    let key = record_of(&*store, origin, Outcome::Unknown).await;
    let sep = if url.contains('?') { '&' } else { '?' };
    let read_only = format!("{url}{sep}options=-c%20default_transaction_read_only%3Don");
    let checked = tokio::task::spawn_blocking({
        let key = key.clone();
        move || {
            assert_eq!(json(&read_only, &["show", &key])["state"], "unknown", "readable");
            for args in [
                &["resolve", &key, "--happened", "{}", "--yes"][..],
                &["resolve", &key, "--not-happened", "--yes"],
                &["forget", &key, "--yes"],
                &["purge", "--expired", "--yes"],
            ] {
                let why = exits(&read_only, args, 2);
                assert!(why.contains("default_transaction_read_only"), "{args:?}: {why}");
            }
            assert_eq!(json(&url, &["show", &key])["state"], "unknown", "nothing changed");
        }
    })
    .await;
    let _ = client.execute("DELETE FROM idem_records WHERE key = $1", &[&key]).await;
    checked.expect("the read-only role's writes");
}
