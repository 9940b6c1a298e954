//! A worker process for `tests/multiprocess.rs` and `tests/outage.rs` (not an example: it exists to
//! be spawned, killed, stopped and resumed by those tests).
//!
//! ```text
//! idem-stress-worker <mode> <store-url> <ledger-dir> <run-id> <worker-id> <intents> <rounds> <lease-ms> [first]
//! ```
//! `store-url` is `redis://..`, `redis+cluster://..`, `sqlite://PATH`, or `pg:` followed by a PostgreSQL connection
//! string (libpq key=value or URL). `mode` is `hammer` (call every intent of both tools `rounds` times, in a per-worker shuffled
//! order, starting with intent `first` if given) or `final` (call every intent of both tools
//! once, in order). Two tools:
//! - `charge` (keyed): its fake provider deduplicates by the forwarded idempotency key;
//! - `wire` (never): its effect is an append to a ledger file, with no deduplication at all.
//!
//! The ledger lives in files under `<ledger-dir>`, outside the store:
//! - `bodies/<tool>-<intent>.log`: one line `<fence> <worker>` per tool body that started;
//! - `provider/<key>`: the charge the provider made for a key (created once, atomically);
//! - `effects/<tool>-<intent>.log`: one line per real effect (a new charge, a wire sent).
//!
//! Stdout, one line per event, flushed at once (the tests act on them):
//! `BODY <tool> <intent> <fence>` when a body starts (claim held, nothing done yet),
//! `EFFECT <tool> <intent> <fence>` after the effect, before the outcome is stored,
//! `OK <tool> <intent> <json>` and `ERR <tool> <intent> <error kind> <message>` per call (a call
//! that meets an unavailable store is repeated every 100 ms, printing each `StoreUnavailable`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::store::Store;
use idem_core::{Classify, Ctx, Error, Failure, Idem, Policy, RetryClass, Run, Tool, ToolDef};
use serde::{Deserialize, Serialize};

/// What both tools return: which effect, and which owner stored it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    effect: String,
    fence: u64,
    worker: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct LedgerError(String);

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ledger: {}", self.0)
    }
}

impl Classify for LedgerError {
    fn classify(&self) -> Failure {
        // A ledger write that failed half-way is the honest analogue of a reset after send.
        Failure::ambiguous()
    }
}

fn io(e: std::io::Error) -> LedgerError {
    LedgerError(e.to_string())
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn append(path: &Path, line: &str) -> Result<(), LedgerError> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
    f.write_all(format!("{line}\n").as_bytes()).map_err(io)
}

fn nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

struct Ledger {
    dir: PathBuf,
    worker: String,
    /// How long a body lingers before and after its effect (so tests can act in between).
    linger: Duration,
}

impl Ledger {
    async fn body(&self, tool: &str, intent: u32, cx: &Ctx) -> Result<u64, LedgerError> {
        let fence = cx.fence().map(|f| f.0).unwrap_or(0);
        let path = self.dir.join("bodies").join(format!("{tool}-{intent}.log"));
        append(&path, &format!("{fence} {}", self.worker))?;
        say(format!("BODY {tool} {intent} {fence}"));
        tokio::time::sleep(self.linger).await;
        Ok(fence)
    }

    async fn after_effect(&self, tool: &str, intent: u32, fence: u64) {
        say(format!("EFFECT {tool} {intent} {fence}"));
        tokio::time::sleep(self.linger).await;
    }

    fn effect(&self, tool: &str, intent: u32, id: &str) -> Result<(), LedgerError> {
        append(&self.dir.join("effects").join(format!("{tool}-{intent}.log")), id)
    }
}

static CHARGE: ToolDef = ToolDef {
    name: "charge",
    description: "Charges a card; the provider deduplicates by idempotency key.",
    class: RetryClass::Keyed,
    options: idem_core::ToolOptions::NONE,
};

static WIRE: ToolDef = ToolDef {
    name: "wire",
    description: "Sends a wire transfer; nothing deduplicates it.",
    class: RetryClass::Never,
    options: CHARGE.options,
};

struct Charge(Arc<Ledger>);
struct Wire(Arc<Ledger>);

impl Tool for Charge {
    type Args = u32;
    type Output = Receipt;
    type Error = LedgerError;
    fn def(&self) -> &'static ToolDef {
        &CHARGE
    }
    async fn run(&self, cx: &Ctx, intent: u32) -> Result<Receipt, LedgerError> {
        let l = &self.0;
        let fence = l.body("charge", intent, cx).await?;
        // The provider: the first request with a key makes the charge; repeats get it back.
        let target = l.dir.join("provider").join(cx.key());
        let id = format!("ch-{}-{}", l.worker, nanos());
        let tmp = l.dir.join("provider").join(format!(".{id}"));
        std::fs::write(&tmp, &id).map_err(io)?;
        let made = match std::fs::hard_link(&tmp, &target) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io(e)),
        };
        let _ = std::fs::remove_file(&tmp);
        if made {
            l.effect("charge", intent, &id)?;
        }
        let effect = std::fs::read_to_string(&target).map_err(io)?;
        l.after_effect("charge", intent, fence).await;
        Ok(Receipt { effect, fence, worker: l.worker.clone() })
    }
}

impl Tool for Wire {
    type Args = u32;
    type Output = Receipt;
    type Error = LedgerError;
    fn def(&self) -> &'static ToolDef {
        &WIRE
    }
    async fn run(&self, cx: &Ctx, intent: u32) -> Result<Receipt, LedgerError> {
        let l = &self.0;
        let fence = l.body("wire", intent, cx).await?;
        let effect = format!("wire-{}-{}", l.worker, nanos());
        l.effect("wire", intent, &effect)?;
        l.after_effect("wire", intent, fence).await;
        Ok(Receipt { effect, fence, worker: l.worker.clone() })
    }
}

async fn open_store(url: &str) -> Result<Arc<dyn Store>, String> {
    #[cfg(feature = "redis")]
    if url.starts_with("redis://") || url.starts_with("redis+cluster://") {
        // Lazy: a worker started while Redis is down fails its calls closed, then recovers.
        return idem_core::store::RedisStore::builder(url)
            .open_lazy()
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .map_err(|e| e.to_string());
    }
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") {
        return idem_core::SqliteStore::open_url(url)
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .map_err(|e| e.to_string());
    }
    #[cfg(feature = "postgres")]
    if let Some(conninfo) = url.strip_prefix("pg:") {
        return idem_core::PostgresStore::connect(conninfo)
            .await
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .map_err(|e| e.to_string());
    }
    Err(format!("no store compiled in for {url:?} (enable the matching cargo feature)"))
}

/// One call, like an agent would make it: while the store is unavailable, the same call is
/// repeated every 100 ms (up to 30 s), each failure printed.
async fn call<T: Tool<Args = u32, Output = Receipt>>(run: &Run, tool: &T, intent: u32) {
    let name = tool.def().name;
    let mut tries = 0;
    let answer = loop {
        match run.call(tool, intent).await {
            Err(e @ Error::StoreUnavailable { .. }) if tries < 300 => {
                tries += 1;
                say(format!("ERR {name} {intent} StoreUnavailable {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other,
        }
    };
    match answer {
        Ok(r) => {
            say(format!("OK {name} {intent} {}", serde_json::to_string(&r).unwrap_or_default()))
        }
        Err(e) => {
            let kind = match &e {
                Error::StoreUnavailable { .. } => "StoreUnavailable",
                Error::LeaseLost { .. } => "LeaseLost",
                Error::OutcomeUnknown { .. } => "OutcomeUnknown",
                Error::BudgetExhausted { .. } => "BudgetExhausted",
                Error::Tool { .. } => "Tool",
                _ => "Other",
            };
            say(format!("ERR {name} {intent} {kind} {e}"));
        }
    }
}

/// A small deterministic shuffle (xorshift), so each worker visits intents in its own order.
fn shuffled(n: u32, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n).collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = usize::try_from(x % (i as u64 + 1)).unwrap_or(0);
        v.swap(i, j);
    }
    v
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, url, dir, run_id, worker, intents, rounds, lease_ms, first) = match &args[..] {
        [m, u, d, r, w, i, n, l] => (m, u, d, r, w, i, n, l, None),
        [m, u, d, r, w, i, n, l, f] => (m, u, d, r, w, i, n, l, f.parse::<u32>().ok()),
        _ => {
            eprintln!(
                "usage: idem-stress-worker <hammer|final> <store-url> <ledger-dir> <run-id> <worker-id> <intents> <rounds> <lease-ms> [first]"
            );
            return std::process::ExitCode::from(2);
        }
    };
    let (Ok(intents), Ok(rounds), Ok(lease_ms)) =
        (intents.parse::<u32>(), rounds.parse::<u32>(), lease_ms.parse::<u64>())
    else {
        eprintln!("intents, rounds and lease-ms must be numbers");
        return std::process::ExitCode::from(2);
    };
    for sub in ["bodies", "provider", "effects"] {
        if let Err(e) = std::fs::create_dir_all(Path::new(dir).join(sub)) {
            eprintln!("cannot create the ledger: {e}");
            return std::process::ExitCode::from(2);
        }
    }
    let store = match open_store(url).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(2);
        }
    };
    let policy = Policy {
        lease: Duration::from_millis(lease_ms),
        attempt_timeout: Duration::from_secs(20),
        deadline: Duration::from_secs(60),
        backoff: idem_core::Backoff {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(200),
        },
        ..Policy::default()
    };
    let idem = Idem::builder_shared(store).policy(policy).build();
    let run = idem.run(run_id.clone());
    let ledger = Arc::new(Ledger {
        dir: PathBuf::from(dir),
        worker: worker.clone(),
        linger: Duration::from_millis(if mode == "final" { 0 } else { 60 }),
    });
    let (charge, wire) = (Charge(Arc::clone(&ledger)), Wire(ledger));
    let seed = worker.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    match mode.as_str() {
        "hammer" => {
            if let Some(first) = first {
                call(&run, &charge, first).await;
                call(&run, &wire, first).await;
            }
            for round in 0..rounds {
                for intent in shuffled(intents, seed.wrapping_add(u64::from(round))) {
                    call(&run, &charge, intent).await;
                    call(&run, &wire, intent).await;
                }
            }
        }
        "final" => {
            for intent in 0..intents {
                call(&run, &charge, intent).await;
                call(&run, &wire, intent).await;
            }
        }
        other => {
            eprintln!("unknown mode {other:?}");
            return std::process::ExitCode::from(2);
        }
    }
    say("DONE".into());
    std::process::ExitCode::SUCCESS
}
