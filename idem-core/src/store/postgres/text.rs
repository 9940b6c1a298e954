//! Strings as a PostgreSQL `text` column takes them. `text` refuses the NUL character (SQLSTATE
//! 22021), and the run id column is indexed, where a B-tree entry may not exceed 2,704 bytes
//! (PostgreSQL 12+; SQLSTATE 54000). Either failed every call that carried such a string as
//! "store unavailable", which a client retries forever. Applied to the record's origin (tool,
//! tenant, run id: for listing only, since keys are derived from the strings as given), to the
//! listing's filters (so that a filter finds what was stored) and to an outcome's plain text (a
//! not-storable reason; JSON payloads never hold a raw NUL).

use std::borrow::Cow;

/// How much of a run id the record keeps (bytes), well under the index entry's limit.
const RUN_ID_BYTES: usize = 1024;

/// `s` with each NUL replaced by U+FFFD.
pub(super) fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') { Cow::Owned(s.replace('\0', "\u{FFFD}")) } else { Cow::Borrowed(s) }
}

/// A run id as the record stores it: [`text`], cut at [`RUN_ID_BYTES`] on a character boundary.
pub(super) fn run_text(s: &str) -> Cow<'_, str> {
    let s = text(s);
    if s.len() <= RUN_ID_BYTES {
        return s;
    }
    let mut end = RUN_ID_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(s[..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_becomes_the_replacement_character_and_a_long_run_id_is_cut_on_a_char_boundary() {
        assert_eq!(text("a\0b"), "a\u{FFFD}b");
        assert!(matches!(text("plain"), Cow::Borrowed("plain")));
        // 'é' takes bytes 1023 and 1024: the cut falls before it, not inside it.
        let long = format!("{}é{}", "a".repeat(1023), "b".repeat(50));
        assert_eq!(run_text(&long), "a".repeat(1023));
        let exact = "c".repeat(RUN_ID_BYTES);
        assert_eq!(run_text(&exact), exact);
        assert_eq!(run_text(&format!("{exact}\0")), exact);
    }
}
