//! Records as tables for people and as JSON for programs.
//!
//! Run ids, tool names, tenants, results and errors are chosen by clients and models. In text
//! for people every such field goes through [`printable`]: a control character or a bidi
//! control written raw could move the cursor, clear or retitle the terminal, hide or fake a row,
//! or reorder what is shown. JSON keeps the exact values, with those characters written as JSON
//! escapes ([`json_line`]).

use std::fmt::Write;
use std::time::Duration;

use idem_core::Key;
use idem_core::store::{Outcome, RecordInfo, RecordState, Stats, UnreadableRecord};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// `text` with every character that could act on the terminal written as its Rust escape
/// (`\n`, `\t`, `\u{1b}`, `\u{202e}`), so it shows on one line, as what it is. Other characters,
/// backslashes included, are unchanged: `--json` gives the exact value when it matters.
pub use idem_core::printable;

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

/// The state as a question names it: an in-flight record whose owner's lease ended is said to be
/// one (a dead owner), so an operator does not take it for a call still running.
pub fn state_in_words(state: &RecordState) -> &'static str {
    match state {
        RecordState::InFlight { lease_remaining } if lease_remaining.is_zero() => {
            "lease-ended (in flight, its owner's lease over)"
        }
        other => state_name(other),
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

/// A stored JSON payload as it is stored, when it is JSON: not read into a `serde_json::Value`,
/// which would turn an integer beyond 64 bits into a float and keep one of two equal member
/// names. Else (a record edited by hand) as a string.
#[derive(Serialize)]
#[serde(untagged)]
enum Payload<'a> {
    Json(&'a RawValue),
    /// Stored with whitespace between its tokens (`resolve --happened` takes a pretty-printed
    /// result as given): the same tokens without it, so the document stays on one line.
    Compacted(Box<RawValue>),
    Text(&'a str),
}

fn payload(text: &str) -> Payload<'_> {
    match serde_json::from_str::<&RawValue>(text) {
        Err(_) => Payload::Text(text),
        Ok(raw) if !raw.get().contains(JSON_WHITESPACE) => Payload::Json(raw),
        Ok(raw) => {
            RawValue::from_string(compact(raw.get())).map_or(Payload::Json(raw), Payload::Compacted)
        }
    }
}

/// RFC 8259 §2: the whitespace JSON allows between tokens.
const JSON_WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// Valid JSON `text` without the whitespace between its tokens: strings (whose line breaks are
/// escaped), numbers and member order are kept as written.
fn compact(text: &str) -> String {
    idem_core::json_text::chars_in_strings(text)
        .filter(|&(_, c, in_string)| in_string || !JSON_WHITESPACE.contains(&c))
        .map(|(_, c, _)| c)
        .collect()
}

/// One record as `show --json` and `list --json` give it: its fields, and the stored result or
/// error exactly as stored.
#[derive(Serialize)]
pub struct RecordJson<'a> {
    key: &'a str,
    fingerprint: &'a str,
    fence: u64,
    state: &'static str,
    tool: Option<&'a str>,
    tenant: Option<&'a str>,
    run: Option<&'a str>,
    age_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_remaining_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Payload<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Payload<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

pub fn record_json(info: &RecordInfo) -> RecordJson<'_> {
    let mut v = RecordJson {
        key: info.key.as_str(),
        fingerprint: info.fingerprint.as_str(),
        fence: info.fence.0,
        state: state_name(&info.state),
        tool: info.origin.as_ref().map(|o| o.tool.as_str()),
        tenant: info.origin.as_ref().map(|o| o.tenant.as_str()),
        run: info.origin.as_ref().map(|o| o.run.as_str()),
        age_ms: info.age.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
        lease_remaining_ms: None,
        result: None,
        error: None,
        reason: None,
    };
    match &info.state {
        RecordState::InFlight { lease_remaining } => {
            v.lease_remaining_ms =
                Some(u64::try_from(lease_remaining.as_millis()).unwrap_or(u64::MAX));
        }
        RecordState::Done(Outcome::Success(p)) => v.result = Some(payload(p)),
        RecordState::Done(Outcome::Failure(p)) => v.error = Some(payload(p)),
        RecordState::Done(Outcome::NotStorable(why)) => v.reason = Some(why),
        RecordState::Done(Outcome::Unknown) => {}
    }
    v
}

pub fn unreadable_json(record: &UnreadableRecord) -> Value {
    json!({ "key": record.key, "reason": record.reason })
}

/// The line naming a record that cannot be read, with how to remove it. `idem forget` takes
/// only an idempotency key as this idem writes it (lowercase hex: it lowercases what it is
/// given), so a key edited into anything else is for the operator to remove in the store.
pub fn unreadable_line(record: &UnreadableRecord) -> String {
    let reason = printable(&record.reason);
    if Key::parse(&record.key).is_some() {
        let key = &record.key;
        // Not "forget it" alone: a record a newer idem wrote is fine for that version to read.
        format!(
            "unreadable record {key}: {reason}; if a newer idem wrote it, read it with that \
             version; if it is damaged, `idem forget {key}` removes it"
        )
    } else {
        // Quoted, as Rust writes a string: the key may be empty, or end in spaces.
        let key = format!("{:?}", record.key);
        format!(
            "unreadable record with key {}: {reason}; that is not an idempotency key (edited by \
             hand?): remove the record in the store itself",
            printable(&key)
        )
    }
}

/// One JSON document on a line, with what could act on a terminal (a C1 control, a bidi
/// control: serde_json writes them raw) as JSON escapes, which read back as the same values.
pub fn json_line(v: &impl Serialize) -> String {
    // Serializing these types cannot fail: their maps have string keys.
    let text = serde_json::to_string(v).unwrap_or_default();
    let mut text = idem_core::printable_json(&text).into_owned();
    text.push('\n');
    text
}

/// A field from the store as shown: `?` when not stored, `-` when empty, else [`printable`],
/// in quotes when it would not show as what it is: with a space at either end (invisible at the
/// end of a cell, and two run ids apart by it shown alike), or one of those two marks, or
/// starting with a quote.
fn unknown_or(v: Option<&str>) -> String {
    match v {
        None => "?".to_owned(),
        Some("") => "-".to_owned(),
        Some(s) if s.starts_with([' ', '"']) || s.ends_with(' ') || matches!(s, "-" | "?") => {
            format!("\"{}\"", printable(s))
        }
        Some(s) => printable(s).into_owned(),
    }
}

fn lease(info: &RecordInfo) -> String {
    match info.state {
        RecordState::InFlight { lease_remaining } if lease_remaining.is_zero() => "ended".into(),
        RecordState::InFlight { lease_remaining } => duration(lease_remaining),
        RecordState::Done(_) => "-".into(),
    }
}

/// The widest a TOOL or RUN cell is shown in the table, in terminal columns. Run ids are chosen
/// by clients and may be kilobytes long (`show` prints them whole).
const CELL_MAX: usize = 48;

/// `cell` cut to at most `max` terminal columns, ending in `…` when cut.
pub fn clip(cell: String, max: usize) -> String {
    if cell.width() <= max {
        return cell;
    }
    let mut out = String::new();
    let mut used = 0;
    for c in cell.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > max {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    out
}

/// Plain aligned columns; the key last, whole, to copy into `show` or `resolve`. Tool and run
/// are cut to [`CELL_MAX`] columns.
pub fn table(records: &[RecordInfo]) -> String {
    let header = ["STATE", "TOOL", "RUN", "AGE", "LEASE", "FENCE", "KEY"].map(String::from);
    let rows: Vec<[String; 7]> = records
        .iter()
        .map(|r| {
            let origin = r.origin.as_ref();
            [
                state_name(&r.state).to_owned(),
                clip(unknown_or(origin.map(|o| o.tool.as_str())), CELL_MAX),
                clip(unknown_or(origin.map(|o| o.run.as_str())), CELL_MAX),
                r.age.map_or_else(|| "?".to_owned(), duration),
                lease(r),
                r.fence.0.to_string(),
                r.key.to_string(),
            ]
        })
        .collect();
    // Columns on the terminal, not chars: a CJK character or an emoji takes two.
    let mut widths = header.clone().map(|h| h.width());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.width());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = w.saturating_sub(cell.width()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
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
        RecordState::Done(Outcome::Success(p)) => line("result", printable(p).into_owned()),
        RecordState::Done(Outcome::Failure(p)) => line("error", printable(p).into_owned()),
        RecordState::Done(Outcome::NotStorable(why)) => line("reason", printable(why).into_owned()),
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

#[cfg(test)]
mod tests {
    use idem_core::store::{Fence, StoredOrigin};
    use idem_core::{Fingerprint, Key};

    use super::*;

    fn record(n: char, tool: &str, run: &str, state: RecordState) -> RecordInfo {
        let hex = |c: char| std::iter::repeat_n(c, 64).collect::<String>();
        RecordInfo {
            key: Key::parse(&hex(n)).expect("key"),
            fingerprint: Fingerprint::parse(&hex('f')).expect("fingerprint"),
            fence: Fence(7),
            origin: Some(StoredOrigin {
                tool: tool.into(),
                tenant: "acme".into(),
                run: run.into(),
            }),
            state,
            age: Some(Duration::from_secs(90)),
        }
    }

    fn completed(result: &str) -> RecordState {
        RecordState::Done(Outcome::Success(result.into()))
    }

    #[test]
    fn printable_escapes_what_acts_on_a_terminal_and_keeps_the_rest() {
        assert_eq!(printable("conv-42 日本 🦀 a\\b \"q\""), "conv-42 日本 🦀 a\\b \"q\"");
        assert_eq!(printable("a\nb\r\tc\0"), "a\\nb\\r\\tc\\0");
        assert_eq!(printable("\x1b[2J\x1b]0;title\x07"), "\\u{1b}[2J\\u{1b}]0;title\\u{7}");
        // DEL, and C1's single-character CSI and OSC, which some terminals obey.
        assert_eq!(printable("\x7f\u{9b}31m\u{9d}"), "\\u{7f}\\u{9b}31m\\u{9d}");
        // Bidi controls that reorder what follows, and the line separators.
        assert_eq!(printable("r\u{202e}txt.exe"), "r\\u{202e}txt.exe");
        assert_eq!(
            printable("\u{2066}\u{2069}\u{200f}\u{61c}"),
            "\\u{2066}\\u{2069}\\u{200f}\\u{61c}"
        );
        assert_eq!(printable("a\u{2028}b\u{2029}"), "a\\u{2028}b\\u{2029}");
    }

    #[test]
    fn a_run_id_with_control_characters_stays_on_its_own_row() {
        let records = [
            record('a', "refund", "x\ny", completed("{}")),
            record('c', "re\x1b[8mfund", "\x1b[2J\rok", completed("{}")),
        ];
        let table = table(&records);
        let (a, c) = ("a".repeat(64), "c".repeat(64));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                r"STATE      TOOL             RUN            AGE     LEASE  FENCE  KEY".to_owned(),
                format!(r"completed  refund           x\ny           1m 30s  -      7      {a}"),
                format!(
                    r"completed  re\u{{1b}}[8mfund  \u{{1b}}[2J\rok  1m 30s  -      7      {c}"
                ),
            ]
        );
        assert!(!table.contains('\x1b') && !table.contains('\r'), "{table:?}");
    }

    #[test]
    fn a_run_id_that_would_show_as_another_is_quoted() {
        let records = [
            record('a', "refund", "conv-1 ", completed("{}")),
            record('b', "refund", "conv-1", completed("{}")),
            record('c', "-", " conv-1", completed("{}")),
            record('d', "?", "\"conv-1\"", completed("{}")),
            record('e', "", "conv 1", completed("{}")),
        ];
        let table = table(&records);
        let cells: Vec<Vec<&str>> = table
            .lines()
            .skip(1)
            .map(|l| l.split("  ").filter(|c| !c.is_empty()).collect())
            .collect();
        let shown: Vec<[&str; 2]> = cells.iter().map(|c| [c[1].trim(), c[2].trim()]).collect();
        assert_eq!(
            shown,
            [
                ["refund", "\"conv-1 \""],
                ["refund", "conv-1"],
                ["\"-\"", "\" conv-1\""],
                ["\"?\"", "\"\"conv-1\"\""],
                ["-", "conv 1"],
            ],
            "{table}"
        );
        assert!(
            detail(&records[0]).contains("run          \"conv-1 \"\n"),
            "{}",
            detail(&records[0])
        );
    }

    #[test]
    fn wide_characters_keep_the_columns_aligned() {
        let records = [
            record('a', "日本語ツール", "🦀-run", completed("{}")),
            record('b', "refund", "conv-42", completed("{}")),
        ];
        let table = table(&records);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "STATE      TOOL          RUN      AGE     LEASE  FENCE  KEY".to_owned(),
                format!(
                    "completed  日本語ツール  🦀-run   1m 30s  -      7      {}",
                    "a".repeat(64)
                ),
                format!(
                    "completed  refund        conv-42  1m 30s  -      7      {}",
                    "b".repeat(64)
                ),
            ]
        );
    }

    #[test]
    fn a_long_run_id_is_cut_in_the_table_and_whole_in_the_detail() {
        let long = "r".repeat(100_000);
        let wide = "日".repeat(40);
        let records = [
            record('a', "refund", &long, completed("{}")),
            record('b', "t", &wide, completed("{}")),
        ];
        let table = table(&records);
        let lines: Vec<&str> = table.lines().collect();
        let cut = format!("{}…", "r".repeat(47));
        assert!(lines[1].contains(&format!("  {cut}  ")), "{:?}", lines[1]);
        assert!(lines[1].ends_with(&"a".repeat(64)), "the key stays whole");
        // 23 two-column characters and the ellipsis: 47 columns, never a half character.
        assert!(lines[2].contains(&format!("  {}…   ", "日".repeat(23))), "{:?}", lines[2]);
        assert!(lines.iter().all(|l| l.width() < 200), "every row stays narrow");
        assert!(detail(&records[0]).contains(&format!("run          {long}\n")));
    }

    #[test]
    fn an_unreadable_record_is_named_on_one_line_with_how_to_remove_it() {
        let key = "a".repeat(64);
        let line =
            unreadable_line(&UnreadableRecord { key: key.clone(), reason: "kind 9\n".into() });
        assert_eq!(
            line,
            format!(
                "unreadable record {key}: kind 9\\n; if a newer idem wrote it, read it with that \
                 version; if it is damaged, `idem forget {key}` removes it"
            )
        );
        // A key edited by hand: quoted, escaped, and not offered to `idem forget`, which
        // takes only a key.
        let edited = UnreadableRecord { key: "k\x1b[2J ".into(), reason: "malformed key".into() };
        let line = unreadable_line(&edited);
        assert!(line.starts_with(r#"unreadable record with key "k\u{1b}[2J ": malformed key; "#));
        assert!(!line.contains('\x1b') && !line.contains("idem forget"), "{line:?}");
        assert_eq!(
            unreadable_json(&edited),
            json!({ "key": "k\u{1b}[2J ", "reason": "malformed key" })
        );
    }

    #[test]
    fn the_detail_escapes_every_field_from_the_store() {
        let mut info = record('a', "to\x1bol", "r\u{202e}un", completed("{\"x\":\"\u{9b}2J\"}"));
        if let Some(o) = info.origin.as_mut() {
            o.tenant = "ten\nant".into();
        }
        let shown = detail(&info);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(
            lines[2..5],
            ["tool         to\\u{1b}ol", "tenant       ten\\nant", "run          r\\u{202e}un"]
        );
        assert_eq!(lines[8], "result       {\"x\":\"\\u{9b}2J\"}");
        info.state = RecordState::Done(Outcome::Failure("line 1\nline 2\x1b[2J".into()));
        assert!(detail(&info).contains("error        line 1\\nline 2\\u{1b}[2J\n"));
        info.state = RecordState::Done(Outcome::NotStorable("big\r".into()));
        assert!(detail(&info).contains("reason       big\\r\n"));
    }

    #[test]
    fn a_stored_payload_with_whitespace_is_shown_compact_with_its_strings_kept() {
        let stored = "{ \"a b\" : [ 1 ,\n\t2.50 ] ,\r\n \"q\\\" \\\\\" : \" x \" }";
        let shown = serde_json::to_string(&payload(stored)).unwrap();
        assert_eq!(shown, r#"{"a b":[1,2.50],"q\" \\":" x "}"#);
        assert!(matches!(payload("{\"a\":1}"), Payload::Json(_)));
        assert!(matches!(payload("not json"), Payload::Text(_)));
    }

    #[test]
    fn a_question_says_when_an_owners_lease_ended() {
        let ended = RecordState::InFlight { lease_remaining: Duration::ZERO };
        let live = RecordState::InFlight { lease_remaining: Duration::from_secs(5) };
        assert!(state_in_words(&ended).starts_with("lease-ended"));
        assert_eq!(state_in_words(&live), "in-flight");
        assert_eq!(state_in_words(&RecordState::Done(Outcome::Unknown)), "unknown");
        // The listing's state names stay as they are.
        assert_eq!(state_name(&ended), "in-flight");
    }
}
