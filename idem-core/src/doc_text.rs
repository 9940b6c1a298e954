//! The text a model reads from a doc comment, computed at compile time: rustdoc's link markup
//! removed (`[`Foo`]` → `` `Foo` ``, `[text](crate::path)` → `text`, `[text][ref]` → `text`,
//! `[ref]: crate::path` lines dropped), web links kept (`[text](https://..)`, and a reference
//! link whose definition is a web address, `[text][ref]` or `[ref]` with `[ref]: https://..`,
//! kept with its definition), footnotes (`[^1]` and `[^1]: ..`) kept, code spans, fenced code
//! blocks (closed only by a fence of the same character at least as long, CommonMark §4.5) and
//! indented code blocks left as written, and the whole trimmed. `#[tool]` uses it for descriptions that
//! contain `[` or come from `#[doc = include_str!(..)]`, whose text only the compiler knows.
//! The link syntax is rustdoc's ("Linking to items by name" in the rustdoc book).

/// A doc text of at most `N` bytes with its link markup removed; build it in a `static` with
/// [`DocText::new`] and read it with [`DocText::as_str`].
#[derive(Debug)]
pub struct DocText<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> DocText<N> {
    /// Removes the link markup of `text` (at most `N` bytes; a longer text is cut at `N`).
    pub const fn new(text: &str) -> Self {
        let src = text.as_bytes();
        let end = if src.len() < N { src.len() } else { N };
        let mut out = DocText { bytes: [0; N], len: 0 };
        let mut i = 0;
        // The length of the backtick run that opened the code span we are in (0: none). A span
        // closes at a run of the same length (CommonMark), so ``a`b`` is one span.
        let web = WebDefinitions::find(src, end);
        let mut in_code = 0;
        // The open fence's character and length (0: none).
        let (mut fence_char, mut fence_len) = (0u8, 0usize);
        // Whether the previous line was blank (or there was none), and whether it was a line of
        // an indented code block.
        let (mut after_blank, mut in_indented) = (true, false);
        let mut line_start = true;
        while i < end {
            if line_start {
                line_start = false;
                let first = skip_spaces(src, i, end);
                let next = line_end(src, i, end);
                let blank = first == next;
                // An indented code block (CommonMark §4.4): four spaces, after a blank line, to
                // the next line indented less. Written as it is.
                in_indented =
                    fence_len == 0 && !blank && first - i >= 4 && (in_indented || after_blank);
                after_blank = blank;
                let run = fence_run(src, first, next);
                let closes = fence_len > 0
                    && first - i <= 3
                    && run >= fence_len
                    && src[first] == fence_char
                    && skip_spaces(src, first + run, next) == next;
                let opens = fence_len == 0 && !in_indented && first - i <= 3 && run >= 3;
                if in_indented || closes || opens {
                    if closes {
                        fence_len = 0;
                    } else if opens {
                        (fence_char, fence_len) = (src[first], run);
                    }
                    // The line is written as it is: its backticks do not open or close a span.
                    out.copy(src, i, next);
                    i = next;
                    continue;
                } else if fence_len == 0 && is_link_definition(src, first, end) {
                    i = line_end(src, i, end);
                    // Also drop the newline, so the definitions leave no blank lines.
                    i += 1;
                    line_start = true;
                    continue;
                }
            }
            let b = src[i];
            if b == b'\n' {
                line_start = true;
            } else if fence_len == 0 && b == b'`' {
                let mut run = 0;
                while i + run < end && src[i + run] == b'`' {
                    run += 1;
                }
                if in_code == 0 {
                    in_code = run;
                } else if in_code == run {
                    in_code = 0;
                }
                out.copy(src, i, i + run);
                i += run;
                continue;
            } else if fence_len == 0 && in_code == 0 && b == b'[' && can_open_link(src, i) {
                let next = out.link(src, i, end, &web);
                if next > i {
                    i = next;
                    continue;
                }
            }
            out.push(b);
            i += 1;
        }
        out
    }

    /// The text, trimmed of whitespace at both ends.
    pub const fn as_str(&'static self) -> &'static str {
        let (bytes, _) = self.bytes.split_at(self.len);
        match core::str::from_utf8(bytes) {
            Ok(s) => s.trim_ascii(),
            // Only whole ASCII runs are removed from valid UTF-8, so this is not reached.
            Err(_) => "",
        }
    }

    const fn push(&mut self, b: u8) {
        if self.len < N {
            self.bytes[self.len] = b;
            self.len += 1;
        }
    }

    const fn copy(&mut self, src: &[u8], from: usize, to: usize) {
        let mut i = from;
        while i < to {
            self.push(src[i]);
            i += 1;
        }
    }

    /// At `[` (index `open`): writes the link's text and returns the index after the link, or
    /// returns `open` when this is not rustdoc link markup (kept as written).
    const fn link(&mut self, src: &[u8], open: usize, end: usize, web: &WebDefinitions) -> usize {
        let Some(close) = closing_bracket(src, open + 1, end) else { return open };
        let after = close + 1;
        if open + 1 < close && src[open + 1] == b'^' {
            // A footnote reference: markdown, not a link to an item.
            return open;
        }
        if holds_a_link(src, open + 1, close) {
            // Links do not nest (CommonMark §6.3): the inner one is the link, read when the
            // loop reaches it, and these brackets are text.
            return open;
        }
        if after < end && src[after] == b'(' {
            let Some(paren) = find(src, after + 1, end, b')') else { return open };
            if contains(src, after + 1, paren, b"://")
                || starts_with(src, after + 1, paren, b"mailto:")
            {
                return open;
            }
            self.copy(src, open + 1, close);
            paren + 1
        } else if after < end && src[after] == b'[' {
            let Some(reference) = find(src, after + 1, end, b']') else { return open };
            // `[text][]` names its label by its text.
            let label =
                if reference == after + 1 { (open + 1, close) } else { (after + 1, reference) };
            if web.has(src, label.0, label.1) {
                return open;
            }
            self.copy(src, open + 1, close);
            reference + 1
        } else if web.has(src, open + 1, close) {
            // `[label]` defined as a web address: kept, with its definition.
            open
        } else if names_an_item(src, open + 1, close) {
            // `struct@Charge`: rustdoc's disambiguator is not part of the name.
            let start = match find(src, open + 1, close, b'@') {
                Some(at) => at + 1,
                None => open + 1,
            };
            self.copy(src, start, close);
            after
        } else {
            open
        }
    }
}

/// The `]` that closes the `[` before `from`: brackets between them pair up (a link's text may
/// hold `[1]`), a backslash escapes one.
const fn closing_bracket(src: &[u8], from: usize, end: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = from;
    while i < end {
        match src[i] {
            b'\\' => i += 1,
            b'[' => depth += 1,
            b']' if depth == 0 => return Some(i),
            b']' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether `src[from..to]`, a link's text, holds a link itself: `[Item]`, `[text](target)` or
/// `[text][label]`.
const fn holds_a_link(src: &[u8], from: usize, to: usize) -> bool {
    let mut i = from;
    while i < to {
        if src[i] == b'['
            && can_open_link(src, i)
            && let Some(close) = closing_bracket(src, i + 1, to)
        {
            let followed = close + 1 < to && (src[close + 1] == b'(' || src[close + 1] == b'[');
            if followed || names_an_item(src, i + 1, close) {
                return true;
            }
        }
        i += 1;
    }
    false
}

/// `[` can open a link unless it follows a word or is escaped (`a[0]`, `\[`).
const fn can_open_link(src: &[u8], i: usize) -> bool {
    if is_task_box(src, i) {
        return false;
    }
    if i == 0 {
        return true;
    }
    let prev = src[i - 1];
    !(prev.is_ascii_alphanumeric() || prev == b'_' || prev == b'\\' || prev == b']')
}

/// `[x]`, `[X]` or `[ ]` right after a list item's marker (`- `, `* `, `+ `, `1. `): a task
/// list's box, which rustdoc shows as a checkbox, not a link.
const fn is_task_box(src: &[u8], i: usize) -> bool {
    if i + 3 > src.len() || !matches!(src[i + 1], b'x' | b'X' | b' ') || src[i + 2] != b']' {
        return false;
    }
    // Back over one space, then the marker, then only indentation to the line's start.
    if i < 2 || src[i - 1] != b' ' {
        return false;
    }
    let mut j = i - 1;
    if matches!(src[j - 1], b'-' | b'*' | b'+') {
        j -= 1;
    } else if src[j - 1] == b'.' || src[j - 1] == b')' {
        j -= 1;
        let digits = j;
        while j > 0 && src[j - 1].is_ascii_digit() {
            j -= 1;
        }
        if j == digits {
            return false;
        }
    } else {
        return false;
    }
    while j > 0 && src[j - 1] == b' ' {
        j -= 1;
    }
    j == 0 || src[j - 1] == b'\n'
}

/// `` `code` `` or a path (`Foo`, `crate::Foo`, `Vec<T>`, `foo()`, `struct@Foo`) with a letter.
const fn names_an_item(src: &[u8], from: usize, to: usize) -> bool {
    if to <= from {
        return false;
    }
    if to - from >= 2 && src[from] == b'`' && src[to - 1] == b'`' {
        return find(src, from + 1, to - 1, b'`').is_none();
    }
    let mut letter = false;
    let mut i = from;
    while i < to {
        let b = src[i];
        if b.is_ascii_alphabetic() {
            letter = true;
        } else if !(b.is_ascii_digit()
            || matches!(b, b'_' | b':' | b'<' | b'>' | b'!' | b'(' | b')' | b'@'))
        {
            return false;
        }
        i += 1;
    }
    letter
}

/// `[label]: target` at the start of a line, to drop: not a footnote's (`[^1]: ..`), nor one
/// whose target is a web address (the links that use it are kept).
const fn is_link_definition(src: &[u8], i: usize, end: usize) -> bool {
    match definition_target(src, i, end) {
        Some((_, target)) => !is_web(src, target, line_end(src, target, end)),
        None => false,
    }
}

/// At a line's first non-space byte `i`: for `[label]: target`, the label's closing `]` and where
/// the target starts. Footnote definitions (`[^1]: ..`) are not link definitions.
const fn definition_target(src: &[u8], i: usize, end: usize) -> Option<(usize, usize)> {
    if i + 1 >= end || src[i] != b'[' || src[i + 1] == b'^' {
        return None;
    }
    match find(src, i + 1, end, b']') {
        Some(close) if close + 1 < end && src[close + 1] == b':' => {
            Some((close, skip_spaces(src, close + 2, end)))
        }
        _ => None,
    }
}

/// Whether `src[from..to]` (a link target, maybe in `<..>`) is a web address or `mailto:`.
const fn is_web(src: &[u8], from: usize, to: usize) -> bool {
    let from = if from < to && src[from] == b'<' { from + 1 } else { from };
    let mut i = from;
    while i < to && src[i] != b' ' && src[i] != b'>' {
        i += 1;
    }
    contains(src, from, i, b"://") || starts_with(src, from, i, b"mailto:")
}

/// The most web definitions a text's links are matched against; the links of any beyond them
/// lose their markup (their definitions are kept). Bounded so that the work at compile time stays
/// linear in the text (rustc stops a constant evaluation that runs long).
const MAX_WEB_DEFINITIONS: usize = 32;

/// The labels the text defines as web addresses (`[label]: https://..`), found in one pass.
struct WebDefinitions {
    labels: [(usize, usize); MAX_WEB_DEFINITIONS],
    len: usize,
}

impl WebDefinitions {
    const fn find(src: &[u8], end: usize) -> Self {
        let mut defs = WebDefinitions { labels: [(0, 0); MAX_WEB_DEFINITIONS], len: 0 };
        let mut line = 0;
        while line < end && defs.len < MAX_WEB_DEFINITIONS {
            let first = skip_spaces(src, line, end);
            let next = line_end(src, line, end);
            if let Some((close, target)) = definition_target(src, first, end)
                && is_web(src, target, next)
            {
                defs.labels[defs.len] = (first + 1, close);
                defs.len += 1;
            }
            line = next + 1;
        }
        defs
    }

    /// Whether the label `src[from..to]` is one of them (compared without ASCII case, as
    /// CommonMark matches labels).
    const fn has(&self, src: &[u8], from: usize, to: usize) -> bool {
        let mut k = 0;
        while k < self.len {
            let (a, a_end) = self.labels[k];
            if same_label(src, a, a_end, from, to) {
                return true;
            }
            k += 1;
        }
        false
    }
}

const fn same_label(src: &[u8], a: usize, a_end: usize, b: usize, b_end: usize) -> bool {
    if a_end - a != b_end - b || a_end == a {
        return false;
    }
    let mut k = 0;
    while k < a_end - a {
        if !src[a + k].eq_ignore_ascii_case(&src[b + k]) {
            return false;
        }
        k += 1;
    }
    true
}

/// The length of the run of backticks or tildes at `i` (0 when there is none).
const fn fence_run(src: &[u8], i: usize, to: usize) -> usize {
    if i >= to || !(src[i] == b'`' || src[i] == b'~') {
        return 0;
    }
    let mut run = 0;
    while i + run < to && src[i + run] == src[i] {
        run += 1;
    }
    run
}

const fn skip_spaces(src: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && src[i] == b' ' {
        i += 1;
    }
    i
}

const fn line_end(src: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && src[i] != b'\n' {
        i += 1;
    }
    i
}

/// The index of `needle` in `src[from..to]` before the end of the line.
const fn find(src: &[u8], from: usize, to: usize, needle: u8) -> Option<usize> {
    let mut i = from;
    while i < to && src[i] != b'\n' {
        if src[i] == needle {
            return Some(i);
        }
        i += 1;
    }
    None
}

const fn starts_with(src: &[u8], at: usize, to: usize, prefix: &[u8]) -> bool {
    if to < at || to - at < prefix.len() {
        return false;
    }
    let mut k = 0;
    while k < prefix.len() {
        if src[at + k] != prefix[k] {
            return false;
        }
        k += 1;
    }
    true
}

const fn contains(src: &[u8], from: usize, to: usize, needle: &[u8]) -> bool {
    let mut i = from;
    while i < to {
        if starts_with(src, i, to, needle) {
            return true;
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::DocText;

    macro_rules! text {
        ($s:expr) => {{
            static T: DocText<{ $s.len() }> = DocText::new($s);
            T.as_str()
        }};
    }

    #[test]
    fn intra_doc_links_become_their_text() {
        assert_eq!(text!("Returns a [`Charge`]."), "Returns a `Charge`.");
        assert_eq!(text!("See [the ledger](crate::Ledger) first"), "See the ledger first");
        assert_eq!(text!("See [`Ledger::post`][post]."), "See `Ledger::post`.");
        assert_eq!(text!("A [Charge] or [`Vec<u8>`]"), "A Charge or `Vec<u8>`");
        assert_eq!(text!("Uses [struct@Charge]"), "Uses Charge");
    }

    #[test]
    fn a_link_text_may_hold_brackets_but_not_another_link() {
        assert_eq!(text!("See [the [1] ledger](crate::Ledger)."), "See the [1] ledger.");
        assert_eq!(text!("See [a [b, c] list](crate::List)."), "See a [b, c] list.");
        // The inner link is the link (as rustdoc renders it); the outer brackets stay text.
        assert_eq!(text!("See [the [`Ledger`] docs](x)."), "See [the `Ledger` docs](x).");
    }

    #[test]
    fn web_links_code_and_brackets_that_are_not_links_are_kept() {
        assert_eq!(text!("[docs](https://example.com/x)"), "[docs](https://example.com/x)");
        assert_eq!(text!("values in [0, 1]; a[0]; `[Foo]`"), "values in [0, 1]; a[0]; `[Foo]`");
        assert_eq!(text!("```\nlet v = [Foo];\n```"), "```\nlet v = [Foo];\n```");
        assert_eq!(text!("an [unclosed bracket"), "an [unclosed bracket");
    }

    #[test]
    fn task_list_boxes_are_not_links() {
        assert_eq!(
            text!("Steps:\n- [x] charged\n- [ ] mailed\n  1. [X] logged, see [`Ledger`]"),
            "Steps:\n- [x] charged\n- [ ] mailed\n  1. [X] logged, see `Ledger`"
        );
        // Not after a list marker: an intra-doc link to `x` as before.
        assert_eq!(text!("see [x] here"), "see x here");
    }

    #[test]
    fn a_code_span_closes_at_a_run_of_its_own_length() {
        // ``a`b`` is one code span: the single backtick inside it once left the rest as code.
        assert_eq!(text!("``a`b`` then [`Charge`]"), "``a`b`` then `Charge`");
        assert_eq!(text!("`[x]` and ``[y]`` stay; [`z`] goes"), "`[x]` and ``[y]`` stay; `z` goes");
    }

    #[test]
    fn links_after_a_fenced_code_block_are_still_removed() {
        // The closing fence's backticks once opened a code span that hid every later link.
        assert_eq!(
            text!(
                "Example:\n```rust\nlet v = [Foo];\n```\nSee [`Charge`] and [the ledger](crate::Ledger)."
            ),
            "Example:\n```rust\nlet v = [Foo];\n```\nSee `Charge` and the ledger."
        );
        assert_eq!(text!("~~~\nx\n~~~\n[`A`] `[B]` [`C`]"), "~~~\nx\n~~~\n`A` `[B]` `C`");
    }

    #[test]
    fn code_blocks_are_written_as_they_are() {
        // Indented code, after a blank line; a line indented less ends it.
        assert_eq!(
            text!("Call it:\n\n    code [`Foo`] and [a](crate::b)\n    more [`Bar`]\nthen [`Baz`]"),
            "Call it:\n\n    code [`Foo`] and [a](crate::b)\n    more [`Bar`]\nthen `Baz`"
        );
        // A fence closes only at one of its character at least as long: the inner ``` is text.
        assert_eq!(
            text!("````md\n```\n[`Foo`] nested\n```\n[`Bar`] still inside\n````\n[`Baz`]"),
            "````md\n```\n[`Foo`] nested\n```\n[`Bar`] still inside\n````\n`Baz`"
        );
        assert_eq!(text!("~~~\n```\n[`A`]\n~~~\n[`B`]"), "~~~\n```\n[`A`]\n~~~\n`B`");
        // Four spaces inside a paragraph continue it: not code.
        assert_eq!(text!("a [`A`]\n    b [`B`]"), "a `A`\n    b `B`");
    }

    #[test]
    fn footnotes_and_links_to_the_web_are_kept_with_their_definitions() {
        assert_eq!(text!("Note[^1].\n\n[^1]: The note."), "Note[^1].\n\n[^1]: The note.");
        assert_eq!(
            text!(
                "[API docs][api] and [RFC 8785].\n\n[api]: https://example.com/api\n[rfc 8785]: <https://www.rfc-editor.org/rfc/rfc8785>"
            ),
            "[API docs][api] and [RFC 8785].\n\n[api]: https://example.com/api\n[rfc 8785]: <https://www.rfc-editor.org/rfc/rfc8785>"
        );
        // A collapsed reference to the web, beside one to an item.
        assert_eq!(
            text!("[Spec][] and [`Ledger`][l]\n[spec]: mailto:a@b.c\n[l]: crate::Ledger"),
            "[Spec][] and `Ledger`\n[spec]: mailto:a@b.c"
        );
    }

    #[test]
    fn reference_definitions_are_dropped_and_the_text_trimmed() {
        assert_eq!(text!("  See [post].\n\n[post]: crate::Ledger::post\n"), "See post.");
        assert_eq!(text!("Grüße [`Straße`] ✓"), "Grüße `Straße` ✓");
    }
}
