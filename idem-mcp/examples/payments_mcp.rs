//! An MCP server (stdio) for a fake payment provider: `charge_card` (keyed), `get_balance` (safe)
//! and `refund` (never), every call protected by idem.
//!
//! ```text
//! cargo run -p idem-mcp --example payments_mcp -- [--sqlite PATH] [--ledger PATH] [--http ADDR]
//! ```
//!
//! - `--sqlite PATH`: keep idempotency records in SQLite at PATH (needs `--features sqlite`), so
//!   a restarted server replays earlier outcomes. Without it, records live in memory.
//! - `--ledger PATH`: where the provider keeps its own ledger (JSON). Default: `PATH.ledger.json`
//!   next to the SQLite file, or in memory only without `--sqlite`.
//! - `--http ADDR` (needs `--features http`): serve MCP over streamable HTTP at
//!   `http://ADDR/mcp` instead of stdio. Every request needs `Authorization: Bearer TOKEN` with a
//!   token of `PAYMENTS_TOKENS` (`token=user,token=user`), else HTTP 401; the token's user is
//!   the principal, the scope of every key (see `idem_mcp::http`). `PAYMENTS_NO_PRINCIPAL=1`
//!   leaves the principal out, to show that such a server refuses keyed and never calls.
//!
//! The provider deduplicates charges by the idempotency key idem forwards (as a real provider does
//! with its `Idempotency-Key` header), and persists its ledger, so a restarted server still
//! knows every charge.
//!
//! Environment:
//! - `PAYMENTS_DELAY_MS` (default 0): how long the provider takes to answer a charge, in ms
//!   (lets a client time out while the charge is still in flight).
//! - `PAYMENTS_SESSION_IDLE_MS` (default rmcp's 5 minutes; only with `--http`): how long an MCP
//!   session may be idle (no request, no call's response being sent) before the server closes it
//!   (a request in it then gets HTTP 404).
//! - `PAYMENTS_SESSIONS_PER_USER` and `PAYMENTS_SESSIONS_TOTAL` (defaults 100 and 10,000; `none`:
//!   no bound; only with `--http`): how many MCP sessions one user, and everyone, may have open
//!   (`idem_mcp::http::SessionLimits`); past a user's bound, that user's least recently used idle
//!   session is closed to open another.
//! - `PAYMENTS_AMBIGUOUS_REFUND_CENTS` (default 13): a refund of exactly this amount reaches the
//!   provider, takes effect, and then times out. `refund` then reconciles: it looks the refund up
//!   in the provider's list of refunds by its idempotency key, finds it and answers with it.
//! - `PAYMENTS_REFUND_LOOKUP=down`: the provider's list of refunds cannot be read, so an
//!   ambiguous refund stays unknown to the caller ("outcome unknown, do not retry").

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Classify, Ctx, Failure, Idem, Key, Reconciled, ToolSet, tool};
use idem_mcp::IdemServer;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// A charge as the provider records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ChargeRecord {
    id: String,
    customer: String,
    amount_cents: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reference: Option<u128>,
    idempotency_key: String,
}

/// A refund as the provider records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RefundRecord {
    id: String,
    charge_id: String,
    amount_cents: u64,
    idempotency_key: String,
}

/// The provider's own state, persisted as JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Ledger {
    charges: Vec<ChargeRecord>,
    refunds: Vec<RefundRecord>,
    /// Charge requests that reached the provider (deduplicated ones included).
    charge_requests: u64,
    /// Refund requests that reached the provider.
    refund_requests: u64,
}

/// The provider's errors, as the model reads them.
#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PaymentError {
    #[error("card declined: {0}")]
    Declined(String),
    #[error("no charge `{0}`")]
    UnknownCharge(String),
    #[error("the provider did not answer in time (the request was sent)")]
    Timeout,
    #[error("the provider could not save its ledger: {0}")]
    Unavailable(String),
}

impl Classify for PaymentError {
    fn classify(&self) -> Failure {
        match self {
            PaymentError::Declined(_) | PaymentError::UnknownCharge(_) => Failure::permanent(),
            PaymentError::Timeout => Failure::ambiguous(),
            // The ledger is written before the change takes effect: nothing happened.
            PaymentError::Unavailable(_) => Failure::transient(),
        }
    }
}

/// The fake provider: dedups charges by idempotency key, persists its ledger.
struct Provider {
    path: Option<PathBuf>,
    ledger: Mutex<Ledger>,
    delay: Duration,
    ambiguous_refund_cents: u64,
    refund_lookup_down: bool,
}

impl Provider {
    fn open(path: Option<PathBuf>) -> Result<Provider, String> {
        let ledger = match &path {
            Some(p) if p.exists() => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read ledger {}: {e}", p.display()))?;
                serde_json::from_str(&text)
                    .map_err(|e| format!("ledger {} is not valid: {e}", p.display()))?
            }
            _ => Ledger::default(),
        };
        let env_u64 = |name: &str, default: u64| -> Result<u64, String> {
            match std::env::var(name) {
                Ok(v) => v.parse().map_err(|e| format!("{name}={v:?} is not a number: {e}")),
                Err(_) => Ok(default),
            }
        };
        Ok(Provider {
            path,
            ledger: Mutex::new(ledger),
            delay: Duration::from_millis(env_u64("PAYMENTS_DELAY_MS", 0)?),
            ambiguous_refund_cents: env_u64("PAYMENTS_AMBIGUOUS_REFUND_CENTS", 13)?,
            refund_lookup_down: std::env::var("PAYMENTS_REFUND_LOOKUP").is_ok_and(|v| v == "down"),
        })
    }

    /// Writes `next` (to a temporary file, then renamed) before it becomes the state.
    fn save(&self, next: &Ledger) -> Result<(), PaymentError> {
        let Some(path) = &self.path else { return Ok(()) };
        let text = serde_json::to_string_pretty(next)
            .map_err(|e| PaymentError::Unavailable(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| PaymentError::Unavailable(e.to_string()))
    }

    async fn charge(
        &self,
        customer: &str,
        amount_cents: u64,
        reference: Option<u128>,
        key: &str,
    ) -> Result<ChargeRecord, PaymentError> {
        tokio::time::sleep(self.delay).await;
        let mut ledger = self.ledger.lock().await;
        let mut next = ledger.clone();
        next.charge_requests += 1;
        let charge = match next.charges.iter().find(|c| c.idempotency_key == key) {
            Some(existing) => existing.clone(),
            None => {
                if amount_cents == 0 {
                    return Err(PaymentError::Declined("the amount must be positive".into()));
                }
                let charge = ChargeRecord {
                    id: format!("ch_{:04}", next.charges.len() + 1),
                    customer: customer.to_owned(),
                    amount_cents,
                    reference,
                    idempotency_key: key.to_owned(),
                };
                next.charges.push(charge.clone());
                charge
            }
        };
        self.save(&next)?;
        *ledger = next;
        Ok(charge)
    }

    async fn refund(
        &self,
        charge_id: &str,
        amount_cents: u64,
        key: &str,
    ) -> Result<RefundRecord, PaymentError> {
        let mut ledger = self.ledger.lock().await;
        let mut next = ledger.clone();
        next.refund_requests += 1;
        if !next.charges.iter().any(|c| c.id == charge_id) {
            self.save(&next)?;
            *ledger = next;
            return Err(PaymentError::UnknownCharge(charge_id.to_owned()));
        }
        let refund = RefundRecord {
            id: format!("re_{:04}", next.refunds.len() + 1),
            charge_id: charge_id.to_owned(),
            amount_cents,
            idempotency_key: key.to_owned(),
        };
        next.refunds.push(refund.clone());
        self.save(&next)?;
        *ledger = next;
        if amount_cents == self.ambiguous_refund_cents {
            // The refund took effect, but the answer is lost on the way back.
            return Err(PaymentError::Timeout);
        }
        Ok(refund)
    }

    /// The refund made with idempotency key `key`, from the provider's list of refunds.
    async fn refund_by_key(&self, key: &str) -> Result<Option<RefundRecord>, PaymentError> {
        if self.refund_lookup_down {
            return Err(PaymentError::Unavailable("the list of refunds cannot be read".into()));
        }
        let ledger = self.ledger.lock().await;
        Ok(ledger.refunds.iter().find(|r| r.idempotency_key == key).cloned())
    }

    async fn balance(&self, customer: &str) -> i128 {
        let ledger = self.ledger.lock().await;
        let charged: i128 = ledger
            .charges
            .iter()
            .filter(|c| c.customer == customer)
            .map(|c| i128::from(c.amount_cents))
            .sum();
        let refunded: i128 = ledger
            .refunds
            .iter()
            .filter(|r| {
                ledger.charges.iter().any(|c| c.id == r.charge_id && c.customer == customer)
            })
            .map(|r| i128::from(r.amount_cents))
            .sum();
        charged - refunded
    }
}

/// What `charge_card` returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Charge {
    charge_id: String,
    customer: String,
    amount_cents: u64,
    /// The order number as decimal text: an output is stored as a JSON value, which holds
    /// integers of up to 64 bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
}

/// What `get_balance` returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Balance {
    customer: String,
    /// Charged minus refunded, in cents.
    balance_cents: i64,
}

/// What `refund` returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Refund {
    refund_id: String,
    charge_id: String,
    amount_cents: u64,
}

/// The tools the model sees, over the provider.
struct Payments {
    provider: Provider,
}

impl Payments {
    /// Charge a customer's card `amount_cents` (in cents, positive). Returns the charge id.
    /// Repeating the call with the same arguments in the same run returns the same charge.
    #[tool(retry = "keyed")]
    async fn charge_card(
        &self,
        cx: &Ctx,
        customer: String,
        amount_cents: u64,
        /// The merchant's order number, if any (an integer of up to 128 bits), kept with the
        /// charge.
        reference: Option<u128>,
    ) -> Result<Charge, PaymentError> {
        // The key goes to the provider as its Idempotency-Key: a re-run after a takeover or an
        // ambiguous failure is deduplicated there.
        let c = self.provider.charge(&customer, amount_cents, reference, cx.key()).await?;
        Ok(Charge {
            charge_id: c.id,
            customer: c.customer,
            amount_cents: c.amount_cents,
            reference: c.reference.map(|r| r.to_string()),
        })
    }

    /// A customer's balance: charged minus refunded, in cents.
    #[tool(retry = "safe")]
    async fn get_balance(&self, customer: String) -> Result<Balance, PaymentError> {
        let cents = self.provider.balance(&customer).await;
        let balance_cents = i64::try_from(cents)
            .map_err(|_| PaymentError::Unavailable("balance out of range".into()))?;
        Ok(Balance { customer, balance_cents })
    }

    /// Refund `amount_cents` (in cents) of the charge `charge_id`. The provider cannot
    /// deduplicate refunds, so a refund is attempted once and never retried.
    #[tool(retry = "never", reconcile = refund_made)]
    async fn refund(
        &self,
        cx: &Ctx,
        charge_id: String,
        amount_cents: u64,
    ) -> Result<Refund, PaymentError> {
        let r = self.provider.refund(&charge_id, amount_cents, cx.key()).await?;
        Ok(Refund { refund_id: r.id, charge_id: r.charge_id, amount_cents: r.amount_cents })
    }

    /// Whether a refund whose outcome is unknown took effect: the provider's list of refunds,
    /// looked up by the idempotency key the refund was sent with (`cx.key()` above). Called by
    /// idem before it would answer "outcome unknown".
    async fn refund_made(
        &self,
        key: &Key,
        charge_id: String,
        amount_cents: u64,
    ) -> Reconciled<Refund> {
        let _ = (charge_id, amount_cents);
        match self.provider.refund_by_key(key.as_str()).await {
            Ok(Some(r)) => Reconciled::Happened(Refund {
                refund_id: r.id,
                charge_id: r.charge_id,
                amount_cents: r.amount_cents,
            }),
            Ok(None) => Reconciled::NotHappened,
            Err(_) => Reconciled::Unknown,
        }
    }
}

struct Options {
    sqlite: Option<PathBuf>,
    ledger: Option<PathBuf>,
    http: Option<PathBuf>,
}

const USAGE: &str = "usage: payments_mcp [--sqlite PATH] [--ledger PATH] [--http ADDR]";

fn parse_args() -> Result<Options, String> {
    let mut opts = Options { sqlite: None, ledger: None, http: None };
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        let slot = match arg.to_str() {
            Some("--sqlite") => &mut opts.sqlite,
            Some("--ledger") => &mut opts.ledger,
            Some("--http") => &mut opts.http,
            Some("-h" | "--help") => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {arg:?}\n{USAGE}")),
        };
        let value = args.next().ok_or_else(|| format!("{arg:?} needs a PATH\n{USAGE}"))?;
        *slot = Some(PathBuf::from(value));
    }
    if opts.ledger.is_none()
        && let Some(db) = &opts.sqlite
    {
        let mut name = db.as_os_str().to_owned();
        name.push(".ledger.json");
        opts.ledger = Some(PathBuf::from(name));
    }
    Ok(opts)
}

#[cfg(feature = "sqlite")]
fn executor(sqlite: Option<&Path>) -> Result<Idem, String> {
    match sqlite {
        Some(path) => {
            let store = idem_core::store::sqlite::SqliteStore::open(path)
                .map_err(|e| format!("cannot open SQLite store {}: {e}", path.display()))?;
            Ok(Idem::new(store))
        }
        None => Ok(Idem::in_memory()),
    }
}

#[cfg(not(feature = "sqlite"))]
fn executor(sqlite: Option<&Path>) -> Result<Idem, String> {
    match sqlite {
        Some(path) => Err(format!(
            "--sqlite {}: this build has no SQLite store; run with `--features sqlite`",
            path.display()
        )),
        None => Ok(Idem::in_memory()),
    }
}

fn tools(payments: &Arc<Payments>) -> Result<ToolSet, idem_core::ToolSetError> {
    ToolSet::new()
        .with(payments.charge_card_tool())?
        .with(payments.get_balance_tool())?
        .with(payments.refund_tool())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // 2 for a wrong command line, 1 for anything that failed after it was read.
    let opts = match parse_args() {
        Ok(opts) => opts,
        Err(message) => {
            eprintln!("payments_mcp: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    match serve(opts).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("payments_mcp: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

const INSTRUCTIONS: &str = "Payments. charge_card charges a card: a repeat with the same \
    arguments in the same run returns the first charge, but the same call in another run (or with \
    no run id, after a reconnect) is a new charge. refund is never repeated: if its outcome is \
    unknown, check get_balance instead of calling it again.";

fn server(payments: &Arc<Payments>, idem: &Idem) -> Result<IdemServer, String> {
    let tools = tools(payments).map_err(|e| e.to_string())?;
    Ok(IdemServer::new(tools, idem)
        .with_implementation("payments_mcp", env!("CARGO_PKG_VERSION"))
        .with_instructions(INSTRUCTIONS))
}

async fn serve(opts: Options) -> Result<(), String> {
    let idem = executor(opts.sqlite.as_deref())?;
    let payments = Arc::new(Payments { provider: Provider::open(opts.ledger)? });
    if let Some(addr) = opts.http {
        return serve_http(&addr, payments, idem).await;
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        // Someone ran it by hand: say why nothing happens. A host's pipe gets no such line.
        eprintln!(
            "payments_mcp: serving MCP over stdio: waiting for JSON-RPC messages on standard \
             input, one per line (an MCP host starts this program and speaks first)"
        );
    }
    match server(&payments, &idem)?.serve_stdio().await {
        // A host that starts the server and leaves before the handshake is not a failure.
        Err(idem_mcp::ServeError::Initialize(e))
            if matches!(*e, rmcp::service::ServerInitializeError::ConnectionClosed(_)) =>
        {
            Ok(())
        }
        served => served.map_err(|e| e.to_string()),
    }
}

#[cfg(not(feature = "http"))]
async fn serve_http(addr: &Path, _: Arc<Payments>, _: Idem) -> Result<(), String> {
    Err(format!(
        "--http {}: this build has no HTTP server; run with `--features http`",
        addr.display()
    ))
}

#[cfg(feature = "http")]
#[path = "common/bearer.rs"]
mod bearer;

#[cfg(feature = "http")]
async fn serve_http(addr: &Path, payments: Arc<Payments>, idem: Idem) -> Result<(), String> {
    let addr = addr.to_str().ok_or("--http ADDR is not text")?.to_owned();
    let tokens = bearer::tokens(&std::env::var("PAYMENTS_TOKENS").unwrap_or_default());
    server(&payments, &idem)?; // the tool set is valid
    // Only to show the refusal of a multi-user server with no principal (tests/mcp/http_test.py).
    let bound = std::env::var_os("PAYMENTS_NO_PRINCIPAL").is_none();
    // One `IdemTools` for every session (each still gets a run of its own): its clones share
    // the calls in flight, which the process waits for when it is stopped.
    let mut tools = idem_mcp::IdemTools::new(tools(&payments).map_err(|e| e.to_string())?, &idem);
    if bound {
        tools = tools.with_principal(bearer::principal);
    }
    let make = {
        let tools = tools.clone();
        move || {
            IdemServer::from_tools(tools.clone())
                .with_implementation("payments_mcp", env!("CARGO_PKG_VERSION"))
                .with_instructions(INSTRUCTIONS)
        }
    };
    let mut sessions = idem_mcp::http::SessionConfig::default();
    if let Ok(ms) = std::env::var("PAYMENTS_SESSION_IDLE_MS") {
        let ms: u64 = ms.parse().map_err(|e| format!("PAYMENTS_SESSION_IDLE_MS={ms:?}: {e}"))?;
        sessions.keep_alive = Some(Duration::from_millis(ms));
    }
    let config = idem_mcp::http::StreamableHttpServerConfig::default();
    let mut limits = idem_mcp::http::SessionLimits::default();
    for (name, bound) in [
        ("PAYMENTS_SESSIONS_PER_USER", &mut limits.per_principal),
        ("PAYMENTS_SESSIONS_TOTAL", &mut limits.total),
    ] {
        match std::env::var(name).as_deref() {
            Ok("none") => *bound = None,
            Ok(n) => *bound = Some(n.parse().map_err(|e| format!("{name}={n:?}: {e}"))?),
            Err(_) => {}
        }
    }
    let mcp =
        idem_mcp::http::service_with_sessions(make, config, sessions).with_session_limits(limits);
    let shutdown = mcp.shutdown();
    let app = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(tokens, bearer::authenticate));
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("payments_mcp: listening on http://{local}/mcp");
    // SIGTERM (a container stop) closes the listener, lets the charges in flight finish and
    // store their outcomes, sends their clients the results, then ends the open streams.
    let served = shutdown
        .serve(tools, |draining| {
            let draining = async move {
                draining.await;
                eprintln!("payments_mcp: draining: finishing the calls in flight, then exiting");
            };
            axum::serve(listener, app).with_graceful_shutdown(draining).into_future()
        })
        .await;
    match served {
        idem_mcp::http::Served::Ended(served) => served.map_err(|e| e.to_string()),
        // Every call finished and was stored; returning ends the connections left open.
        idem_mcp::http::Served::Drained => Ok(()),
        // A supervisor hears that calls were left to their leases.
        idem_mcp::http::Served::Cut { calls } => Err(format!(
            "stopped by a second signal with {calls} call(s) still running, left to their leases"
        )),
    }
}
