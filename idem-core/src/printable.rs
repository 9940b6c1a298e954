//! Text that came from clients and models (tool names, run ids, argument names, results), as a
//! terminal or a log may show it: every character that could act on the terminal is written as
//! its Rust escape. A control character or a bidi control written raw could move the cursor,
//! clear or retitle the terminal, hide or fake a line, or reorder what is shown ("Trojan
//! Source"). JSON text goes through [`printable_json`]: serde_json escapes only the C0 controls,
//! and JSON's own `\uXXXX` escape writes the others as the same value.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether printing `c` raw could change how a terminal shows the rest, or hide what is there: a
/// control character (C0, DEL, C1: `\n`, ESC, CSI...), a line or paragraph separator, or a
/// format character (Unicode's General_Category `Cf`, 15.1): the `Bidi_Control` characters,
/// and the invisible ones (zero-width space and joiners, U+FEFF, the tag characters U+E0000..),
/// which make two run ids that differ look the same, shift a table's columns, or carry hidden
/// text; and the other characters Unicode calls default ignorable (`Default_Ignorable_Code_Point`,
/// 15.1: the combining grapheme joiner, the Hangul fillers, variation selectors), which a terminal
/// shows as nothing or as a blank; and the spaces other than the ASCII one, shown as it is.
fn acts_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{00AD}' | '\u{0600}'..='\u{0605}' | '\u{061C}' | '\u{06DD}' | '\u{070F}'
            | '\u{0890}'..='\u{0891}' | '\u{08E2}' | '\u{180E}'
            | '\u{200B}'..='\u{200F}' // ZWSP, ZWNJ, ZWJ, LRM, RLM
            | '\u{202A}'..='\u{202E}' // LRE, RLE, PDF, LRO, RLO
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}' // LRI, RLI, FSI, PDI among them
            | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}' | '\u{110CD}' | '\u{13430}'..='\u{1343F}' | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}' | '\u{E0001}' | '\u{E0020}'..='\u{E007F}'
            // Default ignorable, not `Cf`:
            | '\u{034F}' | '\u{115F}'..='\u{1160}' | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180D}' | '\u{180F}' | '\u{2065}' | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}' | '\u{FFA0}' | '\u{FFF0}'..='\u{FFF8}'
            | '\u{E0000}' | '\u{E0002}'..='\u{E001F}' | '\u{E0080}'..='\u{E0FFF}'
            // Spaces other than U+0020 (`Zs`: no-break, en, em, thin, ideographic...), which
            // show as a space: "a b" and "a\u{a0}b" would be two run ids shown alike.
            | '\u{00A0}' | '\u{1680}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}'
            | '\u{3000}'
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
            // JSON escapes UTF-16 code units: a character past the Basic Multilingual Plane (a
            // tag character) is its surrogate pair.
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
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
            // Rust's own escape (`\n`, `\u{1b}`), or, for a character it counts as printable
            // (a Hangul filler), its code point.
            let debug = c.escape_debug();
            if debug.len() > 1 { out.extend(debug) } else { out.extend(c.escape_unicode()) }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// At most `max` characters of `text` (an input quoted back in an error: a key, a cursor), with
/// how long the whole was when it is cut, so that a pasted file does not fill the screen.
pub fn shortened(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes in all)", &text[..cut], text.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_input_is_cut_at_a_character_and_says_how_long_it_was() {
        assert!(matches!(shortened("abc", 3), Cow::Borrowed("abc")));
        assert_eq!(shortened("abcd", 3), "abc… (4 bytes in all)");
        // Cut between characters, never inside one.
        assert_eq!(shortened("ééé", 2), "éé… (6 bytes in all)");
        let pasted = "x".repeat(100_000);
        assert!(shortened(&pasted, 128).len() < 160);
    }

    #[test]
    fn what_acts_on_a_terminal_is_escaped_and_nothing_else() {
        assert!(matches!(printable("plain, ünïcödé \\ text"), Cow::Borrowed(_)));
        assert_eq!(printable("a\nb\u{1b}[2Jc\u{202e}d\u{7}"), "a\\nb\\u{1b}[2Jc\\u{202e}d\\u{7}");
        assert_eq!(printable_lines("a\n\tb\r\u{1b}"), "a\n\tb\\r\\u{1b}");
        assert_eq!(printable("\u{2028}\u{200f}\u{85}"), "\\u{2028}\\u{200f}\\u{85}");
        // Invisible: two run ids that differ by one look the same, or carry hidden text.
        assert_eq!(printable("run\u{200b}1\u{feff}"), "run\\u{200b}1\\u{feff}");
        assert_eq!(printable("a\u{e0041}\u{ad}"), "a\\u{e0041}\\u{ad}");
        // Default ignorable though not format characters: shown as nothing or a blank.
        assert_eq!(
            printable("re\u{34f}fund conv-42\u{3164}\u{115f} a\u{fe0f}"),
            "re\\u{34f}fund conv-42\\u{3164}\\u{115f} a\\u{fe0f}"
        );
        assert!(matches!(printable("한글 ㄱ ｱ"), Cow::Borrowed(_)), "visible letters are kept");
        // Spaces that show as the ASCII one.
        assert_eq!(printable("a\u{a0}b\u{3000}c\u{2009}"), "a\\u{a0}b\\u{3000}c\\u{2009}");
    }

    #[test]
    fn json_keeps_its_value_with_what_acts_on_a_terminal_escaped() {
        let value = serde_json::json!({"a\u{202e}": ["\u{9b}2J\u{7f}\u{2028}\n\u{1b}", "ünï 🦀 \\u", "t\u{e0041}\u{200b}"]});
        let text = serde_json::to_string_pretty(&value).unwrap();
        let shown = printable_json(&text);
        assert!(!shown.contains(|c: char| c.is_control() && !matches!(c, '\n' | ' ')), "{shown}");
        assert!(!shown.contains(['\u{202e}', '\u{2028}']), "{shown}");
        assert!(shown.contains(r"\u009b2J\u007f\u2028\n\u001b"), "{shown}");
        assert!(shown.contains(r"t\udb40\udc41\u200b"), "{shown}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&shown).unwrap(), value);
        assert!(matches!(printable_json(r#"{"a":"ünï"}"#), Cow::Borrowed(_)));
    }
}
