//! Worker processes for the multi-process and outage tests: spawn `idem-stress-worker`
//! (tests/bin/stress_worker.rs), collect its stdout lines, kill or stop it on a given line, and
//! read the ledger it leaves on disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::task::JoinHandle;

/// What the test does to a worker when one of its stdout lines starts with `on`.
#[derive(Clone, Debug)]
pub enum Action {
    /// Leave it alone.
    None,
    /// SIGKILL it.
    Kill {
        /// The line prefix, e.g. `"BODY charge 0 "`.
        on: String,
    },
    /// SIGSTOP it, and SIGCONT it once another worker printed a line starting with `resume_on`
    /// (or after `max`).
    Stop {
        /// The line prefix that stops it.
        on: String,
        /// The line prefix, from another worker, that resumes it.
        resume_on: String,
        /// Resume after this long at the latest.
        max: Duration,
    },
}

/// The arguments of one worker (see tests/bin/stress_worker.rs).
#[derive(Clone, Debug)]
pub struct Spec {
    /// The worker executable (`env!("CARGO_BIN_EXE_idem-stress-worker")`).
    pub exe: PathBuf,
    /// `hammer` or `final`.
    pub mode: &'static str,
    /// The store URL.
    pub url: String,
    /// The ledger directory.
    pub dir: PathBuf,
    /// The run id (the scope of every key).
    pub run: String,
    /// The worker's name.
    pub id: String,
    /// Intents per tool.
    pub intents: u32,
    /// Rounds over all intents.
    pub rounds: u32,
    /// The lease, ms.
    pub lease_ms: u64,
    /// The intent to call first.
    pub first: Option<u32>,
    /// What to do to it.
    pub action: Action,
}

/// Every line every worker printed, as `(worker, line)`, in arrival order.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<(String, String)>>>);

impl Log {
    fn push(&self, worker: &str, line: String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((worker.to_owned(), line));
    }
    /// All `(worker, line)` pairs so far.
    pub fn all(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// The lines of one worker.
    pub fn of(&self, worker: &str) -> Vec<String> {
        self.all().into_iter().filter(|(w, _)| w == worker).map(|(_, l)| l).collect()
    }
    /// Whether a worker other than `not` printed a line starting with `prefix`.
    pub fn other_printed(&self, not: &str, prefix: &str) -> bool {
        self.all().iter().any(|(w, l)| w != not && l.starts_with(prefix))
    }
    /// Waits (polling every 20 ms) until `pred` holds or `max` passes; returns whether it held.
    pub async fn wait_until(&self, max: Duration, pred: impl Fn(&Log) -> bool) -> bool {
        let end = tokio::time::Instant::now() + max;
        loop {
            if pred(self) {
                return true;
            }
            if tokio::time::Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// How a worker ended.
#[derive(Debug)]
pub struct Exit {
    /// The worker's name.
    pub id: String,
    /// Whether the action fired (killed, or stopped and resumed).
    pub acted: bool,
    /// Whether it exited by itself with success.
    pub success: bool,
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

/// Starts a worker; its lines go to `log`. The handle ends when the process has exited.
pub fn spawn(spec: Spec, log: Log) -> JoinHandle<Exit> {
    tokio::spawn(async move {
        let mut cmd = Command::new(&spec.exe);
        cmd.arg(spec.mode)
            .arg(&spec.url)
            .arg(&spec.dir)
            .arg(&spec.run)
            .arg(&spec.id)
            .arg(spec.intents.to_string())
            .arg(spec.rounds.to_string())
            .arg(spec.lease_ms.to_string());
        if let Some(first) = spec.first {
            cmd.arg(first.to_string());
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn idem-stress-worker");
        let pid = child.id().expect("worker pid");
        let stdout = child.stdout.take().expect("worker stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut acted = false;
        while let Ok(Some(line)) = lines.next_line().await {
            let fire = !acted
                && match &spec.action {
                    Action::None => false,
                    Action::Kill { on } | Action::Stop { on, .. } => line.starts_with(on.as_str()),
                };
            log.push(&spec.id, line);
            if !fire {
                continue;
            }
            acted = true;
            match &spec.action {
                Action::Kill { .. } => {
                    let _ = child.start_kill();
                }
                Action::Stop { resume_on, max, .. } => {
                    signal(pid, "STOP");
                    let (log, id, resume_on, max) =
                        (log.clone(), spec.id.clone(), resume_on.clone(), *max);
                    tokio::spawn(async move {
                        log.wait_until(max, |l| l.other_printed(&id, &resume_on)).await;
                        signal(pid, "CONT");
                    });
                }
                Action::None => {}
            }
        }
        let status = child.wait().await.ok();
        Exit { id: spec.id, acted, success: status.is_some_and(|s| s.success()) }
    })
}

/// The ledger a run of workers left in `dir`.
pub struct Ledger {
    dir: PathBuf,
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

impl Ledger {
    /// The ledger in `dir`.
    pub fn new(dir: &Path) -> Self {
        Ledger { dir: dir.to_owned() }
    }
    /// The real effects of `tool` for `intent` (new charges, wires sent), one id per effect.
    pub fn effects(&self, tool: &str, intent: u32) -> Vec<String> {
        lines(&self.dir.join("effects").join(format!("{tool}-{intent}.log")))
    }
    /// The fences under which a body of `tool` for `intent` started.
    pub fn body_fences(&self, tool: &str, intent: u32) -> Vec<u64> {
        lines(&self.dir.join("bodies").join(format!("{tool}-{intent}.log")))
            .iter()
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect()
    }
}

/// What callers received, parsed from `OK` and `ERR` lines: per `(tool, intent)`, every answer
/// (`Ok(json)` or `Err(kind)`) with the worker that received it.
pub type Answers = BTreeMap<(String, u32), Vec<(String, Result<String, String>)>>;

/// Parses the `OK`/`ERR` lines of `log`.
pub fn answers(log: &Log) -> Answers {
    let mut out = Answers::new();
    for (worker, line) in log.all() {
        let mut parts = line.splitn(4, ' ');
        let (Some(tag), Some(tool), Some(intent), rest) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(intent) = intent.parse::<u32>() else { continue };
        let rest = rest.unwrap_or_default().to_owned();
        let answer = match tag {
            "OK" => Ok(rest),
            "ERR" => Err(rest.split(' ').next().unwrap_or_default().to_owned()),
            _ => continue,
        };
        out.entry((tool.to_owned(), intent)).or_default().push((worker, answer));
    }
    out
}

/// A receipt's `(effect, fence)` from its JSON.
pub fn receipt(json: &str) -> (String, u64) {
    let v: serde_json::Value = serde_json::from_str(json).expect("receipt JSON");
    (
        v["effect"].as_str().expect("receipt effect").to_owned(),
        v["fence"].as_u64().expect("receipt fence"),
    )
}

/// A fresh temporary directory for a ledger.
pub use crate::servers::temp_dir;

/// Checks the exactly-once rules on what a run left: the ledger, every answer the workers received
/// (`seen`) and the answers of a final pass (`finals`, one call per intent after every lease
/// ended). Panics naming the broken rule.
///
/// - `charge` (keyed, deduplicated by key at the provider): exactly one effect per intent; the
///   final answer is a result carrying that effect, stored by the newest owner (the highest
///   fence under which a body ran); every result a worker received carries that effect.
/// - `wire` (never): at most one body and one effect per intent; the final answer is that
///   effect's result or `OutcomeUnknown`.
///
/// `lease_lost_by`: workers allowed to receive `LeaseLost` (the ones the test stopped past their
/// lease). With `outage`, `StoreUnavailable` and `LeaseLost` answers are allowed, and a worker may
/// hold a result whose outcome could not be stored (the final answer is then a re-run's result
/// for `charge`, `OutcomeUnknown` for `wire`): results are compared by effect, not by owner.
pub fn check(
    ledger: &Ledger,
    seen: &Answers,
    finals: &Answers,
    intents: u32,
    lease_lost_by: &[&str],
    outage: bool,
) {
    let allowed = |worker: &str, kind: &str, unknown_ok: bool| {
        (kind == "LeaseLost" && (outage || lease_lost_by.contains(&worker)))
            || (kind == "StoreUnavailable" && outage)
            || (kind == "OutcomeUnknown" && unknown_ok)
    };
    for intent in 0..intents {
        let key = ("charge".to_owned(), intent);
        let effects = ledger.effects("charge", intent);
        assert_eq!(effects.len(), 1, "charge {intent}: exactly one effect, got {effects:?}");
        let [(_, Ok(stored))] = &finals[&key][..] else {
            panic!("charge {intent} must end with a result, got {:?}", finals.get(&key));
        };
        let (effect, fence) = receipt(stored);
        assert_eq!(effect, effects[0], "charge {intent}: the stored result is the one effect");
        let bodies = ledger.body_fences("charge", intent);
        assert_eq!(
            Some(fence),
            bodies.iter().copied().max(),
            "charge {intent}: the result must come from the newest owner (bodies {bodies:?})"
        );
        for (worker, answer) in seen.get(&key).into_iter().flatten() {
            match answer {
                Ok(json) if outage => {
                    assert_eq!(
                        receipt(json).0,
                        effect,
                        "charge {intent}: {worker} got another effect"
                    )
                }
                Ok(json) => {
                    assert_eq!(json, stored, "charge {intent}: {worker} got another result")
                }
                Err(kind) => {
                    assert!(allowed(worker, kind, false), "charge {intent}: {worker} got {kind}")
                }
            }
        }

        let key = ("wire".to_owned(), intent);
        let effects = ledger.effects("wire", intent);
        let bodies = ledger.body_fences("wire", intent);
        assert!(bodies.len() <= 1, "wire {intent}: a never tool ran {} times", bodies.len());
        assert!(effects.len() <= 1, "wire {intent}: {} effects", effects.len());
        let [(_, end)] = &finals[&key][..] else {
            panic!("wire {intent}: one final answer, got {:?}", finals.get(&key))
        };
        match end {
            Ok(stored) => {
                let (effect, fence) = receipt(stored);
                assert_eq!(effects, vec![effect], "wire {intent}: the result is the one effect");
                assert_eq!(bodies, vec![fence], "wire {intent}");
            }
            Err(kind) => assert_eq!(kind, "OutcomeUnknown", "wire {intent}"),
        }
        for (worker, answer) in seen.get(&key).into_iter().flatten() {
            match (answer, end) {
                (Ok(json), Ok(stored)) if !outage => {
                    assert_eq!(json, stored, "wire {intent}: {worker} got another result")
                }
                (Ok(json), _) => {
                    assert!(
                        outage || end.is_ok(),
                        "wire {intent}: {worker} got a result, the store none"
                    );
                    assert_eq!(effects, vec![receipt(json).0], "wire {intent}: {worker}")
                }
                (Err(kind), _) => {
                    assert!(allowed(worker, kind, true), "wire {intent}: {worker} got {kind}")
                }
            }
        }
    }
}
