//! The multi-process scenario of tests/multiprocess.rs, shared with the tests that run it through
//! other paths (tests/pgbouncer.rs): worker processes hammer one set of intents with duplicate
//! calls while some are SIGKILLed between claim and complete and others SIGSTOPped past their
//! lease; a ledger on disk counts the side effects (see tests/multiprocess.rs for the rules).

use std::time::Duration;

use crate::workers::{self, Action, Ledger, Log, Spec};

/// Intents per tool in the scenario.
pub const INTENTS: u32 = 10;
const LEASE_MS: u64 = 1000;

fn spec(exe: &str, url: &str, dir: &std::path::Path, run: &str, id: &str) -> Spec {
    Spec {
        exe: exe.into(),
        mode: "hammer",
        url: url.to_owned(),
        dir: dir.to_owned(),
        run: run.to_owned(),
        id: id.to_owned(),
        intents: INTENTS,
        rounds: 2,
        lease_ms: LEASE_MS,
        first: None,
        action: Action::None,
    }
}

fn kill(on: &str) -> Action {
    Action::Kill { on: on.to_owned() }
}

fn stop(on: &str, resume_on: &str) -> Action {
    Action::Stop {
        on: on.to_owned(),
        resume_on: resume_on.to_owned(),
        max: Duration::from_secs(30),
    }
}

/// Runs the whole scenario with the worker binary `exe` against the store at `url` (the worker's
/// store URL: `redis://..`, `sqlite://..`, `pg:<conninfo>`); returns the run id (the keys' scope).
/// Panics naming the broken rule.
pub async fn hammer(exe: &str, url: &str, tag: &str) -> String {
    let dir = workers::temp_dir(tag);
    let run = dir.file_name().and_then(|n| n.to_str()).unwrap_or(tag).to_owned();
    let log = Log::default();
    // Victims start first, each on its own intent, so each surely runs the body it is hit in.
    let victims = [
        ("kill-before-charge", 0, kill("BODY charge 0 ")),
        ("kill-after-charge", 1, kill("EFFECT charge 1 ")),
        ("kill-before-wire", 2, kill("BODY wire 2 ")),
        ("kill-after-wire", 3, kill("EFFECT wire 3 ")),
        // Resumed once another worker took the charge over (a body under another fence).
        ("stop-charge", 4, stop("BODY charge 4 ", "BODY charge 4 ")),
        // Resumed once another worker was told the wire's outcome is unknown.
        ("stop-wire", 5, stop("BODY wire 5 ", "ERR wire 5 OutcomeUnknown")),
    ];
    let mut handles = Vec::new();
    for (id, first, action) in victims.iter().cloned() {
        let s = Spec { first: Some(first), action, ..spec(exe, url, &dir, &run, id) };
        handles.push(workers::spawn(s, log.clone()));
    }
    let hit = log
        .wait_until(Duration::from_secs(30), |l| {
            victims.iter().all(|(id, _, action)| match action {
                Action::Kill { on } | Action::Stop { on, .. } => {
                    l.of(id).iter().any(|line| line.starts_with(on.as_str()))
                }
                Action::None => true,
            })
        })
        .await;
    assert!(hit, "every victim must reach its line: {:?}", log.all());
    for id in ["steady-1", "steady-2", "steady-3"] {
        handles.push(workers::spawn(spec(exe, url, &dir, &run, id), log.clone()));
    }
    let mut exits = Vec::new();
    for h in handles {
        exits.push(h.await.expect("worker task"));
    }
    for exit in &exits {
        let victim = victims.iter().any(|(id, ..)| *id == exit.id);
        if victim {
            assert!(exit.acted, "{} was never killed or stopped", exit.id);
        }
        if !exit.id.starts_with("kill-") {
            assert!(exit.success, "{} must finish its calls: {:?}", exit.id, log.of(&exit.id));
        }
    }

    // The final pass, after every lease has ended: each intent is completed or unknown.
    let final_log = Log::default();
    let fin = Spec { mode: "final", rounds: 1, ..spec(exe, url, &dir, &run, "final") };
    let exit = workers::spawn(fin, final_log.clone()).await.expect("final task");
    assert!(exit.success, "final pass failed: {:?}", final_log.all());
    let finals = workers::answers(&final_log);
    let seen = workers::answers(&log);
    let ledger = Ledger::new(&dir);

    workers::check(&ledger, &seen, &finals, INTENTS, &["stop-charge"], false);

    // What each disruption must have led to.
    let stop_charge = workers::answers(&log)[&("charge".to_owned(), 4)]
        .iter()
        .filter(|(w, _)| w == "stop-charge")
        .map(|(_, a)| a.clone())
        .collect::<Vec<_>>();
    // The resumed keyed worker cannot store its own result over the new owner's (its complete is
    // refused by the fence); its caller receives the result that stands, another worker's.
    match stop_charge.first() {
        Some(Ok(answer)) => assert!(
            !answer.contains("\"worker\":\"stop-charge\""),
            "the resumed worker's own result must not stand: {stop_charge:?}"
        ),
        other => panic!("the resumed keyed worker must receive the standing result: {other:?}"),
    }
    assert!(ledger.body_fences("charge", 0).len() >= 2, "charge 0 was taken over and re-run");
    assert!(ledger.body_fences("charge", 1).len() >= 2, "charge 1 was re-run, deduplicated");
    assert_eq!(ledger.effects("wire", 2).len(), 0);
    assert!(
        finals[&("wire".to_owned(), 2)][0].1 == Err("OutcomeUnknown".to_owned()),
        "{:?}",
        finals[&("wire".to_owned(), 2)][0].1
    );
    assert_eq!(ledger.effects("wire", 3).len(), 1);
    assert!(
        finals[&("wire".to_owned(), 3)][0].1 == Err("OutcomeUnknown".to_owned()),
        "{:?}",
        finals[&("wire".to_owned(), 3)][0].1
    );
    // The stopped wire worker still held the current fence: its late result stands.
    assert!(finals[&("wire".to_owned(), 5)][0].1.is_ok(), "wire 5: late completion accepted");
    let _ = std::fs::remove_dir_all(&dir);
    run
}
