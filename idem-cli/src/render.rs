//! Records as tables for people and as JSON for programs.

use std::fmt::Write;
use std::time::Duration;

use idem_core::store::{Outcome, RecordInfo, RecordState, Stats};
use serde_json::{Value, json};

/// The state's name, as `--state` takes it.
pub fn state_name(state: &RecordState) -> &'static str {
    match state {
        RecordState::InFlight { .. } => "in-flight",
        RecordState::Done(Outcome::Unknown) => "unknown",
        RecordState::Done(Outcome::Success(_)) => "completed",
        RecordState::Done(Outcome::Failure(_)) => "failed",
        RecordState::Done(Outcome::NotStorable(_)) => "not-storable",
    }
}

/// Whole seconds (or ms below one second), as humantime writes them.
pub fn duration(d: Duration) -> String {
    let d = if d >= Duration::from_secs(1) {
        Duration::from_secs(d.as_secs())
    } else {
        Duration::from_millis(d.as_millis() as u64)
    };
    humantime::format_duration(d).to_string()
}

/// A JSON payload as a value when it parses, else as a string (a record edited by hand).
fn payload(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

pub fn record_json(info: &RecordInfo) -> Value {
    let mut v = json!({
        "key": info.key.as_str(),
        "fingerprint": info.fingerprint.as_str(),
        "fence": info.fence.0,
        "state": state_name(&info.state),
        "tool": info.origin.as_ref().map(|o| o.tool.as_str()),
        "tenant": info.origin.as_ref().map(|o| o.tenant.as_str()),
        "run": info.origin.as_ref().map(|o| o.run.as_str()),
        "age_ms": info.age.map(|a| a.as_millis() as u64),
    });
    let fields = v.as_object_mut().expect("an object");
    match &info.state {
        RecordState::InFlight { lease_remaining } => {
            fields.insert("lease_remaining_ms".into(), json!(lease_remaining.as_millis() as u64));
        }
        RecordState::Done(Outcome::Success(p)) => {
            fields.insert("result".into(), payload(p));
        }
        RecordState::Done(Outcome::Failure(p)) => {
            fields.insert("error".into(), payload(p));
        }
        RecordState::Done(Outcome::NotStorable(why)) => {
            fields.insert("reason".into(), json!(why));
        }
        RecordState::Done(Outcome::Unknown) => {}
    }
    v
}

pub fn print_json(v: &Value) {
    println!("{v}");
}

fn unknown_or(v: Option<&str>) -> String {
    v.map_or_else(|| "?".to_owned(), |s| if s.is_empty() { "-".to_owned() } else { s.to_owned() })
}

fn lease(info: &RecordInfo) -> String {
    match info.state {
        RecordState::InFlight { lease_remaining } if lease_remaining.is_zero() => "ended".into(),
        RecordState::InFlight { lease_remaining } => duration(lease_remaining),
        RecordState::Done(_) => "-".into(),
    }
}

/// Plain aligned columns; the key last, whole, to copy into `show` or `resolve`.
pub fn table(records: &[RecordInfo]) -> String {
    let header = ["STATE", "TOOL", "RUN", "AGE", "LEASE", "FENCE", "KEY"].map(String::from);
    let rows: Vec<[String; 7]> = records
        .iter()
        .map(|r| {
            let origin = r.origin.as_ref();
            [
                state_name(&r.state).to_owned(),
                unknown_or(origin.map(|o| o.tool.as_str())),
                unknown_or(origin.map(|o| o.run.as_str())),
                r.age.map_or_else(|| "?".to_owned(), duration),
                lease(r),
                r.fence.0.to_string(),
                r.key.to_string(),
            ]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if records.is_empty() {
        out.push_str("(no records)\n");
    }
    out
}

/// One record, field per line.
pub fn detail(info: &RecordInfo) -> String {
    let origin = info.origin.as_ref();
    let mut out = String::new();
    let mut line = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<12} {v}");
    };
    line("key", info.key.to_string());
    line("state", state_name(&info.state).to_owned());
    line("tool", unknown_or(origin.map(|o| o.tool.as_str())));
    line("tenant", unknown_or(origin.map(|o| o.tenant.as_str())));
    line("run", unknown_or(origin.map(|o| o.run.as_str())));
    line("fence", info.fence.0.to_string());
    line("fingerprint", info.fingerprint.to_string());
    line("age", info.age.map_or_else(|| "?".to_owned(), duration));
    match &info.state {
        RecordState::InFlight { .. } => line("lease", lease(info)),
        RecordState::Done(Outcome::Success(p)) => line("result", p.clone()),
        RecordState::Done(Outcome::Failure(p)) => line("error", p.clone()),
        RecordState::Done(Outcome::NotStorable(why)) => line("reason", why.clone()),
        RecordState::Done(Outcome::Unknown) => {
            line("note", "may have taken effect: check the target system, then resolve".into())
        }
    }
    out
}

fn stats_rows(s: &Stats) -> [(&'static str, u64); 8] {
    [
        ("in-flight", s.in_flight),
        ("lease-ended", s.lease_expired),
        ("unknown", s.unknown),
        ("completed", s.completed),
        ("failed", s.failed),
        ("not-storable", s.not_storable),
        ("unreadable", s.unreadable),
        ("total", s.total()),
    ]
}

pub fn stats_json(s: &Stats) -> Value {
    Value::Object(stats_rows(s).into_iter().map(|(k, n)| (k.replace('-', "_"), json!(n))).collect())
}

pub fn stats_table(s: &Stats) -> String {
    let mut out = String::new();
    for (name, n) in stats_rows(s) {
        let _ = writeln!(out, "{name:<13} {n:>10}");
    }
    out
}
