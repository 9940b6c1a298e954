//! What each command does against the store.

use std::io::{BufRead, IsTerminal, Read, Write};
use std::sync::Arc;

use idem_core::Key;
use idem_core::store::{
    self, ListQuery, Outcome, RecordInfo, RecordState, Resolution, Store, UnreadableRecord, admin,
};

use crate::render;
use crate::{Cli, Command, Exit, Failure, ListArgs, ResolveArgs};

/// The page size of one store call while listing.
const PAGE: usize = 500;

pub async fn run(cli: Cli) -> Result<(), Failure> {
    let Some(url) = cli.store.as_deref() else {
        return Err(Failure::new(Exit::Usage, "no store: pass --store URL or set IDEM_STORE"));
    };
    // What the operator typed is checked before the store is reached: a mistyped key or result
    // is said at once, not after a connection that may time out.
    let todo = match cli.command {
        Command::List(args) => Todo::List(args),
        Command::Show { key } => Todo::Show(parse_key(&key)?),
        Command::Resolve(args) => {
            Todo::Resolve(parse_key(&args.key)?, resolution(&args)?, args.yes)
        }
        Command::Forget { key, yes } => Todo::Forget(parse_key(&key)?, yes),
        Command::Purge { expired: _, yes } => Todo::Purge(yes),
        Command::Stats => Todo::Stats,
    };
    // Never creates a store: a mistyped PostgreSQL database or SQLite path, and a store that
    // lives in one process, are refused, not shown as an empty store.
    let store = store::open_existing(url).await?;
    let json = cli.json;
    match todo {
        Todo::List(args) => list(&*store, args, json).await,
        Todo::Show(key) => show(&*store, &key, json).await,
        Todo::Resolve(key, resolution, yes) => resolve(&store, key, resolution, yes, json).await,
        Todo::Forget(key, yes) => forget(&*store, &key, yes, json).await,
        Todo::Purge(yes) => purge(&*store, yes, json).await,
        Todo::Stats => stats(&*store, json).await,
    }
}

/// A command with what the operator typed read (keys parsed, the result read and checked).
enum Todo {
    List(ListArgs),
    Show(Key),
    Resolve(Key, Resolution, bool),
    Forget(Key, bool),
    Purge(bool),
    Stats,
}

/// Keys are printed in lowercase; one copied from a tool that upper-cases hex is the same key.
fn parse_key(key: &str) -> Result<Key, Failure> {
    let lower = key.trim().to_ascii_lowercase();
    Key::parse(&lower).ok_or_else(|| {
        // A log line or an example may print a key shortened; a prefix could name two records,
        // and `forget` must not guess which.
        let shortened =
            !lower.is_empty() && lower.len() < 64 && lower.bytes().all(|b| b.is_ascii_hexdigit());
        let hint = if shortened {
            format!(
                ": this one has {} digits, as a shortened key would; `idem list` (filter with \
                 --run or --tool) prints whole keys",
                lower.len()
            )
        } else {
            String::new()
        };
        Failure::new(
            Exit::Usage,
            format!(
                "{:?} is not an idempotency key (64 hex digits){hint}",
                idem_core::shortened(key, 80)
            ),
        )
    })
}

/// Lists the records the query selects. A record that cannot be read (edited by hand, written
/// by another idem version) does not hide the others: the readable ones are printed as always,
/// each unreadable one is named with its key, why, and how to remove it (on stderr after the
/// table; in JSON under `unreadable`), and the command then exits 6, as `show` of that key does.
/// Nonzero, although everything readable was printed, so that a script (or `set -e`) notices a
/// listing that is not the whole store rather than taking it for complete.
async fn list(store: &dyn Store, args: ListArgs, json: bool) -> Result<(), Failure> {
    let mut query = ListQuery {
        state: args.state.map(Into::into),
        tool: args.tool,
        run: args.run,
        run_prefix: args.run_prefix,
        older_than: args.older_than,
        limit: 0,
        cursor: args.cursor,
    };
    let progress = Progress::new();
    let mut records: Vec<RecordInfo> = Vec::new();
    let mut unreadable: Vec<UnreadableRecord> = Vec::new();
    let mut scanned = 0u64;
    let mut next = None;
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let given = query.cursor.clone();
    while records.len() < limit {
        query.limit = (limit - records.len()).min(PAGE);
        let page = match store.list(&query).await {
            // The operator's --cursor (a later page's refusal, after a Redis Cluster changed,
            // says so itself).
            Err(store::StoreError::InvalidCursor(cursor)) if query.cursor == given => {
                // Cut: a pasted file must not fill the screen.
                let cursor = render::clip(cursor, 128);
                return Err(Failure::new(
                    Exit::Usage,
                    format!(
                        "--cursor {cursor:?} is not a cursor of this store: pass the one an earlier `list` printed after \"more records follow\", or none for the first page"
                    ),
                ));
            }
            page => page?,
        };
        scanned += page.scanned;
        records.extend(page.records);
        unreadable.extend(page.unreadable);
        next = page.next;
        match &next {
            Some(cursor) => query.cursor = Some(cursor.clone()),
            None => break,
        }
        progress.show(scanned, records.len());
    }
    progress.done();
    if json {
        #[derive(serde::Serialize)]
        struct Listing<'a> {
            records: Vec<render::RecordJson<'a>>,
            unreadable: Vec<serde_json::Value>,
            next: Option<String>,
        }
        let listing = Listing {
            records: records.iter().map(render::record_json).collect(),
            unreadable: unreadable.iter().map(render::unreadable_json).collect(),
            next,
        };
        out(&render::json_line(&listing))?;
    } else {
        out(&render::table(&records))?;
        for record in &unreadable {
            note(&render::unreadable_line(record));
        }
        if let Some(cursor) = next {
            // Quoted for a shell: a Redis cursor holds `;`, which would end the pasted command.
            let quoted = shlex::try_quote(&cursor).unwrap_or_else(|_| format!("{cursor:?}").into());
            note(&format!("more records follow: --cursor {}", render::printable(&quoted)));
        }
    }
    match unreadable.len() {
        0 => Ok(()),
        n => Err(Failure::new(
            Exit::Incompatible,
            format!(
                "{n} listed record{} cannot be read (named {}); every other record was listed",
                if n == 1 { "" } else { "s" },
                if json { "under \"unreadable\"" } else { "above" }
            ),
        )),
    }
}

async fn show(store: &dyn Store, key: &Key, json: bool) -> Result<(), Failure> {
    let info = found(store, key).await?;
    if json {
        out(&render::json_line(&render::record_json(&info)))?;
    } else {
        out(&render::detail(&info))?;
    }
    Ok(())
}

async fn found(store: &dyn Store, key: &Key) -> Result<RecordInfo, Failure> {
    store
        .inspect(key)
        .await?
        .ok_or_else(|| Failure::new(Exit::NotFound, format!("no record of key {key}")))
}

/// Why a record cannot be resolved, for the refusal.
fn not_resolvable(info: &RecordInfo) -> String {
    match &info.state {
        RecordState::InFlight { lease_remaining } => format!(
            "key {} is held by a live owner (fence {}, lease ends in {}); resolve it once the \
             lease has ended",
            info.key,
            info.fence.0,
            render::duration(*lease_remaining)
        ),
        RecordState::Done(outcome) => format!(
            "key {} is already settled ({}), and later calls replay it; see it with `idem show`. \
             `idem forget` would remove it, and the next call would then run the tool again",
            info.key,
            render::state_name(&RecordState::Done(outcome.clone()))
        ),
    }
}

const ALREADY_RESOLVED: &str = "the record already holds this result (stored by the tool, or \
     by an earlier resolve): later calls replay it, and its retention is unchanged";

/// Whether the record already holds the result `resolution` would store (the same JSON up to
/// whitespace, member order and string escapes: `idem_core::json_text::same_json`): a repeat
/// of a `resolve --happened` whose answer was lost (a connection cut after the store wrote it)
/// is then done, not refused as "already settled", which would point the operator at `forget`
/// and so at losing the result just stored.
fn already_resolved(info: &RecordInfo, resolution: &Resolution) -> bool {
    match (&info.state, resolution) {
        (
            RecordState::Done(Outcome::Success(stored)),
            Resolution::Happened { outcome: Outcome::Success(given), .. },
        ) => idem_core::json_text::same_json(stored, given),
        _ => false,
    }
}

/// What `resolve` is to store: the result given to `--happened` (as JSON text, `-` for standard
/// input, `@FILE` for a file's content: a result larger than the system lets one argument be,
/// 128 KiB on Linux), or that nothing happened.
fn resolution(args: &ResolveArgs) -> Result<Resolution, Failure> {
    let Some(given) = &args.happened else { return Ok(Resolution::NotHappened) };
    // What the executor stores at most by default (`Policy::max_outcome_bytes`): read no more
    // than that and one byte, so that a wrong file (`@/dev/zero`, a dump) is refused at once.
    let limit = idem_core::Policy::default().max_outcome_bytes;
    let read = |what: &str, from: std::io::Result<Box<dyn std::io::Read>>| {
        let mut text = String::new();
        from.and_then(|from| from.take(limit as u64 + 1).read_to_string(&mut text)).map_err(
            |e| Failure::new(Exit::Usage, format!("--happened: cannot read {what}: {e}")),
        )?;
        Ok::<_, Failure>(text)
    };
    // Neither `-` nor `@..` is JSON, so neither takes a result's place.
    let result = match given.as_str() {
        "-" => {
            if !args.yes && !std::io::stdin().is_terminal() {
                return Err(Failure::new(
                    Exit::Usage,
                    "--happened - reads the result from standard input, so the question cannot \
                     be asked there: pass --yes",
                ));
            }
            read("standard input", Ok(Box::new(std::io::stdin())))?
        }
        path if path.starts_with('@') => {
            let path = &path[1..];
            let file = std::fs::File::open(path).map(|f| Box::new(f) as Box<dyn std::io::Read>);
            read(&format!("{path:?}"), file)?
        }
        text => text.to_owned(),
    };
    if result.len() > limit {
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "--happened: the result is larger than {limit} bytes, the most a tool's output may \
                 be by default (Policy::max_outcome_bytes); the rest was not read"
            ),
        ));
    }
    // Stored as given, not as a `serde_json::Value` writes it back: that would turn an integer
    // beyond 64 bits into a float and keep only the last of two equal member names, so later
    // calls would replay another result than the operator gave.
    idem_core::json_text::check_unique(&result).map_err(|e| {
        Failure::new(Exit::Usage, format!("--happened takes the result as JSON: {e}"))
    })?;
    let outcome = Outcome::Success(result.trim().to_owned());
    Ok(Resolution::Happened { outcome, ttl: args.ttl })
}

async fn resolve(
    store: &Arc<dyn Store>,
    key: Key,
    resolution: Resolution,
    yes: bool,
    json: bool,
) -> Result<(), Failure> {
    let info = match found(&**store, &key).await {
        Err(missing) if missing.exit == Exit::NotFound && resolution == Resolution::NotHappened => {
            return Err(Failure::new(
                Exit::NotFound,
                format!(
                    "no record of key {key}, so nothing to resolve: a `resolve --not-happened` \
                     that went through removes it, as do `forget` and the end of its retention; \
                     the next call with this key runs the tool"
                ),
            ));
        }
        other => other?,
    };
    if already_resolved(&info, &resolution) {
        return report(json, "already-resolved", &key, ALREADY_RESOLVED);
    }
    if !admin::resolvable(&info.state) {
        return Err(Failure::new(Exit::Refused, not_resolvable(&info)));
    }
    let what = match &resolution {
        Resolution::Happened { .. } => "store this result for",
        Resolution::NotHappened => "remove (the next call runs)",
    };
    confirm(
        &format!(
            "{what} {} record {key} of {}",
            render::state_in_words(&info.state),
            origin(&info)
        ),
        yes,
    )?;
    match store.resolve(&key, info.fence, &resolution).await {
        Ok(()) => {}
        Err(idem_core::StoreError::LeaseLost) => {
            let now = store.inspect(&key).await?;
            let why = match now {
                Some(now) if already_resolved(&now, &resolution) => {
                    return report(json, "already-resolved", &key, ALREADY_RESOLVED);
                }
                None => format!("key {key} was removed meanwhile"),
                Some(now) if now.fence != info.fence => {
                    format!("key {key} was claimed again meanwhile (fence {})", now.fence.0)
                }
                Some(now) => not_resolvable(&now),
            };
            return Err(Failure::new(Exit::Refused, format!("not resolved: {why}")));
        }
        Err(e) => return Err(e.into()),
    }
    let done = match resolution {
        Resolution::Happened { .. } => "resolved as happened: later calls replay the result",
        Resolution::NotHappened => "resolved as not happened: the next call runs",
    };
    report(json, "resolved", &key, done)
}

async fn forget(store: &dyn Store, key: &Key, yes: bool, json: bool) -> Result<(), Failure> {
    // The record as shown, which is the one removed: not one that another owner took over or
    // completed while the question was on screen (its result would be lost, and the next call
    // would run the effect again).
    let (what, seen) = match store.inspect(key).await {
        Ok(Some(info)) => {
            let what = format!(
                "{} record {key} of {}",
                render::state_in_words(&info.state),
                origin(&info)
            );
            // The one state where forgetting loses a result on its way: said first (`resolve`
            // refuses such a record; `forget` removes it if told to).
            if let RecordState::InFlight { lease_remaining } = info.state
                && !lease_remaining.is_zero()
            {
                note(&format!(
                    "idem: warning: its owner holds a live lease for {} more and may be running \
                     the effect now; forgotten, its result is not stored and the next call runs \
                     the effect again",
                    render::duration(lease_remaining)
                ));
            }
            (what, Some((info.fence, info.state.is_done())))
        }
        Ok(None) => return Err(Failure::new(Exit::NotFound, format!("no record of key {key}"))),
        // An unreadable record (edited by hand, another version) is what forget is for.
        Err(idem_core::StoreError::Incompatible(why)) => {
            (format!("unreadable record {key} ({})", render::printable(&why)), None)
        }
        Err(e) => return Err(e.into()),
    };
    confirm(&format!("forget {what}"), yes)?;
    let removed = match seen {
        Some((fence, done)) => match store.forget_seen(key, fence, done).await {
            Err(idem_core::StoreError::LeaseLost) => {
                return Err(Failure::new(
                    Exit::Refused,
                    format!(
                        "record {key} changed meanwhile (taken over or completed); nothing was \
                         removed: `idem show {key}` shows it now"
                    ),
                ));
            }
            removed => removed?,
        },
        None => store.forget(key).await?,
    };
    if !removed {
        return Err(Failure::new(Exit::NotFound, format!("no record of key {key}")));
    }
    report(json, "forgotten", key, "forgotten: the next call runs")
}

async fn purge(store: &dyn Store, yes: bool, json: bool) -> Result<(), Failure> {
    confirm("remove every record whose retention ended", yes)?;
    let purged = store.purge_expired().await?;
    if json {
        out(&render::json_line(&serde_json::json!({ "purged": purged })))?;
    } else {
        out(&format!("purged {purged} expired records\n"))?;
    }
    Ok(())
}

async fn stats(store: &dyn Store, json: bool) -> Result<(), Failure> {
    let stats = store.stats().await?;
    if json {
        out(&render::json_line(&render::stats_json(&stats)))?;
    } else {
        out(&render::stats_table(&stats))?;
    }
    // As `list` does: a script must not take counts that leave records out for the whole store.
    if stats.unreadable > 0 {
        return Err(Failure::new(
            Exit::Incompatible,
            format!(
                "{} record(s) have a state this idem cannot read; `idem list` names each, with \
                 how to remove it (the counts read each record's state only: `list`, which \
                 reads whole records, may find more)",
                stats.unreadable
            ),
        ));
    }
    Ok(())
}

fn origin(info: &RecordInfo) -> String {
    match &info.origin {
        Some(o) => {
            format!("tool {} in run \"{}\"", render::printable(&o.tool), render::printable(&o.run))
        }
        None => "unknown tool and run".into(),
    }
}

/// Reports a change made; when that cannot be written, the failure says the change stands.
fn report(json: bool, status: &str, key: &Key, text: &str) -> Result<(), Failure> {
    let written = if json {
        out(&render::json_line(&serde_json::json!({ "status": status, "key": key.as_str() })))
    } else {
        out(&format!("{key}: {text}\n"))
    };
    written.map_err(|f| Failure::new(f.exit, format!("{} (key {key} was {status})", f.message)))
}

/// Writes `text` to stdout. `print!` panics when the reader has gone (`idem list | head -1`
/// closes the pipe early); a reader that stopped reading wanted no more, so that ends the output
/// quietly. Any other write error (a full disk) is the command's failure.
pub fn out(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::new(Exit::Failed, format!("cannot write the output: {e}")))
        }
        _ => Ok(()),
    }
}

/// A line for the operator on stderr. `eprintln!` panics when stderr is a closed pipe; with
/// nowhere to report that, the line is dropped.
pub fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Asks on the terminal unless `yes`; without a terminal and without `yes`, refuses.
fn confirm(action: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::new(
            Exit::Refused,
            format!(
                "refusing to {action} without confirmation: pass --yes (no terminal to ask on)"
            ),
        ));
    }
    let _ = write!(std::io::stderr(), "{action}? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::new(Exit::Failed, format!("reading the answer: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(Failure::new(Exit::Refused, "not confirmed; nothing changed"))
    }
}

/// Progress of a listing that takes more than one page, on stderr when it is a terminal. Its
/// line is ended when the listing ends, and also when it fails (dropped on the error's way out),
/// so the error is printed on a line of its own.
struct Progress<W: Write = std::io::Stderr> {
    shown: std::cell::Cell<bool>,
    out: std::cell::RefCell<W>,
    tty: bool,
}

impl Progress {
    fn new() -> Self {
        let stderr = std::io::stderr();
        let tty = stderr.is_terminal();
        Progress { shown: false.into(), out: stderr.into(), tty }
    }
}

impl<W: Write> Progress<W> {
    fn show(&self, scanned: u64, found: usize) {
        if self.tty {
            let mut out = self.out.borrow_mut();
            let _ = write!(out, "\rscanned {scanned} records, {found} selected...");
            let _ = out.flush();
            self.shown.set(true);
        }
    }

    fn done(&self) {
        if self.shown.replace(false) {
            let _ = writeln!(self.out.borrow_mut());
        }
    }
}

impl<W: Write> Drop for Progress<W> {
    fn drop(&mut self) {
        self.done();
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::io::Write;
    use std::rc::Rc;

    use super::Progress;

    /// What a terminal receives, kept after the progress is gone.
    #[derive(Clone, Default)]
    struct Screen(Rc<RefCell<Vec<u8>>>);

    impl Write for Screen {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Screen {
        fn text(&self) -> String {
            String::from_utf8(self.0.borrow().clone()).unwrap()
        }
    }

    fn on(screen: &Screen) -> Progress<Screen> {
        Progress { shown: false.into(), out: screen.clone().into(), tty: true }
    }

    /// A listing that fails after its first page (the store went away: its `?` returns) ends
    /// the progress line on its way out, so the error is printed on a line of its own instead
    /// of after `scanned ..`; a listing that ends ends the line once.
    #[test]
    fn the_progress_line_is_ended_when_the_listing_fails_or_ends() {
        let screen = Screen::default();
        let listing = |fail: bool| -> Result<(), ()> {
            let progress = on(&screen);
            progress.show(500, 3);
            if fail {
                return Err(());
            }
            progress.show(1000, 4);
            progress.done();
            Ok(())
        };
        assert!(listing(true).is_err());
        assert_eq!(screen.text(), "\rscanned 500 records, 3 selected...\n");
        screen.0.borrow_mut().clear();
        assert!(listing(false).is_ok());
        assert_eq!(
            screen.text(),
            "\rscanned 500 records, 3 selected...\rscanned 1000 records, 4 selected...\n"
        );
        // Not a terminal: nothing at all.
        let quiet = Screen::default();
        let progress = Progress { shown: false.into(), out: quiet.clone().into(), tty: false };
        progress.show(1, 1);
        drop(progress);
        assert_eq!(quiet.text(), "");
    }
}
