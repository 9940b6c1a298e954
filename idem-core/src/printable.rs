//! Text that came from clients and models (tool names, run ids, argument names, results), as a
//! terminal or a log may show it: every character that could act on the terminal is written as
//! its Rust escape. A control character or a bidi control written raw could move the cursor,
//! clear or retitle the terminal, hide or fake a line, or reorder what is shown ("Trojan
//! Source"). JSON text goes through [`printable_json`]: serde_json escapes only the C0 controls,
//! and JSON's own `\uXXXX` escape writes the others as the same value.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether printing `c` raw could change how a terminal shows the rest: a control character
/// (C0, DEL, C1: `\n`, ESC, CSI...), a line or paragraph separator, or one of Unicode's
/// `Bidi_Control` characters.
fn acts_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{061C}' | '\u{200E}' | '\u{200F}' // ALM, LRM, RLM
            | '\u{202A}'..='\u{202E}' // LRE, RLE, PDF, LRO, RLO
            | '\u{2066}'..='\u{2069}' // LRI, RLI, FSI, PDI
        )
}

/// `text` with every character that could act on a terminal written as its Rust escape (`\n`,
/// `\t`, `\u{1b}`, `\u{202e}`), so it shows on one line as what it is; borrowed when there is
/// none. Other characters, backslashes included, are unchanged.
pub fn printable(text: &str) -> Cow<'_, str> {
    escape(text, |_| false)
}

/// [`printable`], keeping line feeds and tabs: for a message of several lines (an error's text).
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    escape(text, |c| matches!(c, '\n' | '\t'))
}

/// [`printable_lines`] of an owned message, without a copy when nothing is escaped.
pub(crate) fn lines_owned(text: String) -> String {
    match printable_lines(&text) {
        Cow::Owned(escaped) => escaped,
        Cow::Borrowed(_) => text,
    }
}

/// JSON text with every character that could act on a terminal written as its JSON escape
/// (`\u009b`, `\u202e`): the same JSON value, safe to print. Such a character can only be inside
/// a string of valid JSON, where the escape means it, except JSON's whitespace between tokens
/// (line feed, tab, carriage return), which is kept.
pub fn printable_json(json: &str) -> Cow<'_, str> {
    let escaped = |c: char| acts_on_terminal(c) && !matches!(c, '\n' | '\t' | '\r');
    if !json.contains(escaped) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if escaped(c) {
            // Every such character is in the Basic Multilingual Plane: one escape.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn escape(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    let escaped = |c: char| acts_on_terminal(c) && !keep(c);
    if !text.contains(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_acts_on_a_terminal_is_escaped_and_nothing_else() {
        assert!(matches!(printable("plain, ünïcödé \\ text"), Cow::Borrowed(_)));
        assert_eq!(printable("a\nb\u{1b}[2Jc\u{202e}d\u{7}"), "a\\nb\\u{1b}[2Jc\\u{202e}d\\u{7}");
        assert_eq!(printable_lines("a\n\tb\r\u{1b}"), "a\n\tb\\r\\u{1b}");
        assert_eq!(printable("\u{2028}\u{200f}\u{85}"), "\\u{2028}\\u{200f}\\u{85}");
    }

    #[test]
    fn json_keeps_its_value_with_what_acts_on_a_terminal_escaped() {
        let value =
            serde_json::json!({"a\u{202e}": ["\u{9b}2J\u{7f}\u{2028}\n\u{1b}", "ünï 🦀 \\u"]});
        let text = serde_json::to_string_pretty(&value).unwrap();
        let shown = printable_json(&text);
        assert!(!shown.contains(|c: char| c.is_control() && !matches!(c, '\n' | ' ')), "{shown}");
        assert!(!shown.contains(['\u{202e}', '\u{2028}']), "{shown}");
        assert!(shown.contains(r"\u009b2J\u007f\u2028\n\u001b"), "{shown}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&shown).unwrap(), value);
        assert!(matches!(printable_json(r#"{"a":"ünï"}"#), Cow::Borrowed(_)));
    }
}
