//! `idem`: list, inspect and settle the records of an idem store from the command line
//! (`docs/design.md` §5.1). The store is named by a URL, as for `idem_core::store::open`.
//!
//! Exit codes: 0 done; 1 any other failure; 2 bad usage (arguments, key, JSON, store URL) or a
//! store configuration the store refuses (no such database or file, a role it refuses);
//! 3 no such record; 4 refused (the record is held by a live owner, already settled, changed
//! meanwhile, or the operator did not confirm); 5 store unavailable; 6 a record or schema of
//! another idem version. `list` exits 6 when a record it met cannot be read, after printing
//! every record that can and naming each that cannot, and `stats` when it counted one: a
//! script must not take such a listing or count for the whole store.

mod commands;
mod render;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idem_core::store::StateFilter;

/// List, inspect and settle the records of an idem store.
#[derive(Parser, Debug)]
#[command(name = "idem", version, about, long_about = None, after_help = EXIT_CODES)]
struct Cli {
    /// The store the application uses: sqlite:///abs/path.db, postgres://user@host/db (or
    /// "host=.. dbname=.."), redis://host:6379/, redis+cluster://h1:p1,h2:p2/ (TLS: rediss://,
    /// sslmode=verify-full, with the features postgres-tls, redis-tls). Nothing is created: a
    /// file or database without idem's tables, and memory:, are refused
    // The value is not shown in --help: it may hold a password.
    #[arg(long, env = "IDEM_STORE", global = true, hide_env_values = true)]
    store: Option<String>,

    /// Print JSON instead of a table. The text shows control characters and bidi controls in
    /// fields as escapes (\n, \u{1b}, \u{202e}); JSON gives the exact values.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES: &str = "Exit codes: 0 done, 1 other failure, 2 bad usage or a refused store configuration, \
3 no such record, \
4 refused (live owner, already settled, changed meanwhile, not confirmed), 5 store unavailable, \
6 record or schema this idem cannot read: another idem version, a damaged file (list: the readable records are printed all the same, \
and each unreadable one is named; stats: after the counts).";

#[derive(Subcommand, Debug)]
enum Command {
    /// List records (SQLite and PostgreSQL in key order; Redis in its scan's order: a record may
    /// be listed twice when the server resizes its key table, or a cluster slot migrates, during
    /// the listing). A record that cannot be read is named on stderr, with how
    /// to remove it (with --json, under "unreadable"), the others are listed, and the exit code
    /// is 6.
    List(ListArgs),
    /// Show one record.
    Show {
        /// The idempotency key (64 hex digits, as in errors and listings).
        key: String,
    },
    /// Settle a record whose outcome is unknown or whose owner died: fenced, so a record that a
    /// live owner holds or completes meanwhile is never overwritten.
    Resolve(ResolveArgs),
    /// Remove a record whatever its state; the next call with its key runs. Only the record
    /// shown: one taken over or completed meanwhile is refused (exit 4).
    Forget {
        /// The idempotency key.
        key: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Remove records whose retention ended.
    Purge {
        /// Records whose retention ended (the only kind purged).
        #[arg(long, required = true)]
        expired: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Count records by state.
    Stats,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Only records in this state.
    #[arg(long, value_enum)]
    state: Option<State>,
    /// Only records of this tool (its stable name).
    #[arg(long)]
    tool: Option<String>,
    /// Only records of this run (its whole id: `--run conv-1` does not list `conv-10`; `--run ''`
    /// lists calls made without a run).
    #[arg(long)]
    run: Option<String>,
    /// Only records whose run id starts with this.
    #[arg(long, value_name = "PREFIX", conflicts_with = "run")]
    run_prefix: Option<String>,
    /// Only records in their state for at least this long (e.g. 90s, 15m, 1h, 2d). A record
    /// written before idem kept when a record began (its age shows as `?`) never matches: list
    /// without --older-than to see those.
    #[arg(long, value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// Print at most this many records (1 or more).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// Go on from the cursor a previous listing printed.
    #[arg(long)]
    cursor: Option<String>,
}

#[derive(Args, Debug)]
struct ResolveArgs {
    /// The idempotency key.
    key: String,
    /// The effect took place and returned this result (JSON): it is stored and later calls
    /// replay it. `-` reads it from standard input and `@FILE` from a file (for a result larger
    /// than one argument may be; with `-`, confirm with --yes, as the prompt cannot read).
    #[arg(
        long,
        value_name = "RESULT_JSON",
        // A result may be a negative number (`--happened -5`), not an option.
        allow_hyphen_values = true,
        conflicts_with = "not_happened",
        required_unless_present = "not_happened"
    )]
    happened: Option<String>,
    /// The effect did not take place: the record is removed and the next call runs.
    #[arg(long)]
    not_happened: bool,
    /// How long a stored result is kept and replayed (e.g. 24h, 7d; at least 1s; the stores keep
    /// one longer than about a century for a century). Only with --happened: --not-happened
    /// stores nothing.
    #[arg(
        long,
        value_parser = parse_retention,
        default_value = "24h",
        conflicts_with = "not_happened"
    )]
    ttl: Duration,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum State {
    /// Held by an owner, lease live or ended.
    InFlight,
    /// In flight with the owner's lease ended and no result: a dead owner (the records `stats`
    /// counts as lease-ended).
    LeaseEnded,
    Unknown,
    Completed,
    Failed,
    NotStorable,
}

impl From<State> for StateFilter {
    fn from(s: State) -> Self {
        match s {
            State::InFlight => StateFilter::InFlight,
            State::LeaseEnded => StateFilter::LeaseEnded,
            State::Unknown => StateFilter::Unknown,
            State::Completed => StateFilter::Completed,
            State::Failed => StateFilter::Failed,
            State::NotStorable => StateFilter::NotStorable,
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 90s, 15m, 1h, 2d)"))
}

/// A retention: a result kept for zero time would be gone at once, and the next call would run
/// the effect the operator just said had happened.
fn parse_retention(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d < MIN_RETENTION => Err(format!(
            "a result must be kept for at least {}s: kept for less, it is gone before a repeat arrives, and the repeat runs the effect again (e.g. 24h, the default)",
            MIN_RETENTION.as_secs()
        )),
        d => Ok(d),
    }
}

/// The shortest `--ttl` a resolution takes: the point of recording that an effect happened is
/// that repeats arriving later replay it, and a model's repeat comes seconds to hours later.
const MIN_RETENTION: Duration = Duration::from_secs(1);

/// How a command ended, as the process's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Failed = 1,
    Usage = 2,
    NotFound = 3,
    Refused = 4,
    Unavailable = 5,
    Incompatible = 6,
}

/// A command's failure: the exit code and what to tell the operator.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Failure { exit, message: message.into() }
    }
}

impl From<idem_core::StoreError> for Failure {
    fn from(e: idem_core::StoreError) -> Self {
        use idem_core::StoreError as E;
        let exit = match &e {
            E::Unavailable(_) => Exit::Unavailable,
            E::Incompatible(_) | E::Damaged(_) => Exit::Incompatible,
            E::InvalidConfig(_) | E::InvalidCursor(_) => Exit::Usage,
            E::LeaseLost => Exit::Refused,
            _ => Exit::Failed,
        };
        // The error and its causes, each once (idem-core's ErrorChain).
        Failure { exit, message: idem_core::ErrorChain(&e).to_string() }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            commands::note(&format!("idem: cannot start: {e}"));
            return ExitCode::from(Exit::Failed as u8);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Store errors may quote what a record holds.
            commands::note(&format!("idem: {}", render::printable(&f.message)));
            ExitCode::from(f.exit as u8)
        }
    }
}

/// clap's message for a command line it refused, with every argument that holds a password
/// masked: a store URL typed without `--store` (`idem postgres://app:pw@db list`) is quoted as an
/// unknown subcommand or value, and the message lands in terminals, logs and bug reports.
fn usage_error(e: &clap::Error) -> ExitCode {
    let mut said = e.render().to_string();
    for arg in std::env::args_os().skip(1) {
        let arg = arg.to_string_lossy();
        // `--store=URL` is quoted as the URL alone.
        let value = arg.split_once('=').map(|(_, value)| value);
        for text in std::iter::once(arg.as_ref()).chain(value) {
            let shown = idem_core::store::redacted_url(text);
            if shown != text {
                said = said.replace(text, &shown);
            }
        }
    }
    // Help and version are printed to standard output and end well; the rest is an error.
    if e.use_stderr() {
        eprint!("{said}");
    } else {
        print!("{said}");
    }
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(Exit::Usage as u8))
}
