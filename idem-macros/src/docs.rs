//! Doc comments as the text a model reads: a tool's description and its parameters'.
//!
//! `///` lines are joined with `\n`, the one space after `///` removed. A text with `[` (rustdoc
//! link markup, maybe) or an attribute whose value is not a literal (`#[doc = include_str!(..)]`,
//! whose text only the compiler knows) is handed to `idem_core::__private::DocText`, which
//! removes the link markup at compile time: one implementation of the rule, in idem-core.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Attribute, Expr, Lit};

/// The value of every `#[doc = ..]` attribute in `attrs`, in order.
pub fn doc_values(attrs: &[Attribute]) -> Vec<Expr> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => Some(nv.value.clone()),
            _ => None,
        })
        .collect()
}

/// [`beautify_block`] for a literal whose source is not known, when it ends as a block comment
/// does (a last line of blanks or stars before `*/`); any other, such as `#[doc = "a\n* b"]`, is
/// read as it is.
fn unblock(text: &str) -> String {
    let frame = |line: &str| line.trim().chars().all(|c| c == '*');
    match text.rsplit_once('\n') {
        Some((_, last)) if frame(last) => beautify_block(text),
        _ => text.to_owned(),
    }
}

/// A doc literal's text as the model reads it: a block comment's frame removed (as it was
/// written, see [`Written`]), and on each line the space after `///` and trailing blanks.
fn literal_text(value: &str, written: Written) -> String {
    let text = match written {
        Written::Block => beautify_block(value),
        Written::Plain => value.to_owned(),
        Written::Unknown => unblock(value),
    };
    text.split('\n')
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of a `/** .. */` comment as rustdoc shows it (rustc's `beautify_doc_string` for a
/// block comment): a first line of only `*` and a last line of only `*` dropped, blank lines at
/// both ends passed over, and when every remaining line but a first one without `*` starts with
/// the same indentation and a `*`, that indentation removed from every line, and then a `*`
/// followed by a space (or alone, or doubled) removed. Used when the literal's source shows it
/// was written as a block comment; [`unblock`] guesses for the others.
fn beautify_block(text: &str) -> String {
    // rustc leaves a comment of one line as it is (`/** * a */` keeps its star).
    if !text.contains('\n') {
        return text.to_owned();
    }
    let mut lines: Vec<&str> = text.lines().collect();
    let stars = |line: &str| line.chars().all(|c| c == '*');
    let from = usize::from(lines.first().is_some_and(|l| stars(l)));
    let mut to = lines.len();
    if to > from && !lines[to - 1].is_empty() && stars(lines[to - 1]) {
        to -= 1;
    }
    let lines = &mut lines[from..to];
    if let Some(prefix) = block_prefix(lines) {
        for line in lines.iter_mut() {
            if let Some(rest) = line.strip_prefix(prefix.as_str()) {
                *line = rest;
                if *line == "*" || line.starts_with("* ") || line.starts_with("**") {
                    *line = &line[1..];
                }
            }
        }
    }
    lines.join("\n")
}

/// The indentation before the `*` that every line of a block comment (but a first one without
/// it, and blank lines at both ends) starts with, if all do.
fn block_prefix(lines: &[&str]) -> Option<String> {
    let mut i = usize::from(!lines.first().is_some_and(|l| l.trim_start().starts_with('*')));
    let mut j = lines.len();
    while i < j && lines[i].trim().is_empty() {
        i += 1;
    }
    while j > i && lines[j - 1].trim().is_empty() {
        j -= 1;
    }
    let lines = &lines[i.min(j)..j];
    let mut at: Option<usize> = None;
    for line in lines {
        let star = line.char_indices().find(|&(_, c)| !matches!(c, ' ' | '\t'))?;
        if star.1 != '*' || at.is_some_and(|at| at != star.0) {
            return None;
        }
        at = Some(star.0);
    }
    Some(lines.first()?[..at?].to_owned())
}

/// How a doc literal was written, from its source where the compiler gives it.
enum Written {
    /// A `/** .. */` comment.
    Block,
    /// A `///` line or a `#[doc = ".."]` literal: read as it is.
    Plain,
    /// No source (another tool than rustc expanded the macro): guessed from the text.
    Unknown,
}

fn written(lit: &syn::LitStr) -> Written {
    match lit.span().source_text() {
        Some(source) if source.starts_with("/**") => Written::Block,
        Some(_) => Written::Plain,
        None => Written::Unknown,
    }
}

enum Part {
    Text(String),
    Expr(Expr),
}

/// A `&'static str` expression (usable in a `static` or `const`) for the text of `docs`.
pub fn text_expr(docs: &[Expr], krate: &TokenStream) -> TokenStream {
    let mut parts: Vec<Part> = Vec::new();
    for doc in docs {
        match doc {
            Expr::Lit(syn::ExprLit { lit: Lit::Str(s), .. }) => {
                let lines = literal_text(&s.value(), written(s));
                match parts.last_mut() {
                    Some(Part::Text(text)) => {
                        text.push('\n');
                        text.push_str(&lines);
                    }
                    _ => parts.push(Part::Text(lines)),
                }
            }
            other => parts.push(Part::Expr(other.clone())),
        }
    }
    if let [Part::Text(text)] = &parts[..]
        && !text.contains('[')
    {
        let text = text.trim();
        return quote!(#text);
    }
    if parts.is_empty() {
        return quote!("");
    }
    let mut pieces = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            pieces.push(quote!("\n"));
        }
        pieces.push(match part {
            Part::Text(text) => quote!(#text),
            Part::Expr(expr) => quote!(#expr),
        });
    }
    quote! {{
        const __IDEM_RAW: &::core::primitive::str = ::core::concat!(#(#pieces),*);
        static __IDEM_TEXT: #krate::__private::DocText<{ __IDEM_RAW.len() }> =
            #krate::__private::DocText::new(__IDEM_RAW);
        __IDEM_TEXT.as_str()
    }}
}

#[cfg(test)]
mod tests {
    use super::{Written, beautify_block, literal_text};

    /// As rustdoc shows them (checked against rustdoc 1.95's output of the same comments).
    #[test]
    fn block_comments_read_as_rustdoc_reads_them() {
        // `*/` on the last text line.
        assert_eq!(
            beautify_block(" Block doc\n * with stars\n *  and more "),
            "Block doc\n with stars\n  and more "
        );
        assert_eq!(
            beautify_block("*\n * Charge a card.\n *\n * In cents.\n "),
            " Charge a card.\n\n In cents.\n"
        );
        // Lines without a star keep their text.
        assert_eq!(beautify_block(" a\n   b\n"), " a\n   b");
        // Stars at two indentations: not a frame.
        assert_eq!(beautify_block(" a\n * b\n  * c"), " a\n * b\n  * c");
        // One line: as it is.
        assert_eq!(beautify_block(" * single "), " * single ");
    }

    /// Without the literal's source, the frame is removed from what ends as a block comment.
    #[test]
    fn block_comments_lose_their_frame_and_stars() {
        let read = |text: &str| literal_text(text, Written::Unknown);
        assert_eq!(
            read("*\n * Charge a card.\n *\n * In cents.\n "),
            "Charge a card.\n\nIn cents.\n"
        );
        assert_eq!(read(" Charge a card.\n * In cents.\n "), "Charge a card.\nIn cents.\n");
        assert_eq!(read(" Charge a card.\n   In cents.\n"), "Charge a card.\n  In cents.");
        // A literal written as such, with `*` bullets: not a block comment.
        assert_eq!(read("Options:\n* a\n* b"), "Options:\n* a\n* b");
        assert_eq!(read(" One line."), "One line.");
        // A line that is not starred keeps every star of the others.
        assert_eq!(read(" a\n * b\n c\n "), "a\n* b\nc\n");
        // With the source known, a literal keeps its bullets whatever its last line.
        assert_eq!(literal_text("Options:\n* a\n* b\n", Written::Plain), "Options:\n* a\n* b\n");
    }
}
