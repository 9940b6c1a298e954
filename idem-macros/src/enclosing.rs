//! Where a `#[tool]` fn sits: at module level, or inside an `impl` or `trait` block.
//!
//! An attribute sees only the item it is on, and rustc gives it no parent. A free fn and an
//! associated fn without `self` look the same, yet the free fn's expansion (a type, a constant,
//! an enum) is illegal in an `impl` block: rustc reported about ten errors there, none of them
//! saying what to write. So for an indented fn (one at column 1 cannot be inside a block as
//! rustfmt writes it, and that skip keeps a crate of free tools from paying for this) the macro
//! reads the source file the fn's span names (`Span::local_file`, `Span::line`, stable since
//! Rust 1.88) and scans its braces. Anything unclear (no file, a macro-generated fn, a line that
//! does not hold the fn's name) answers [`Enclosing::Unknown`], and the tool expands as before.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

/// The block around an fn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enclosing {
    /// An inherent `impl Type { .. }` block.
    Impl,
    /// An inherent impl whose type names a lifetime other than `'static` (`impl<'a> Desk<'a>`,
    /// `impl Desk<'_>`): its `Self` borrows, and a method tool holds an `Arc<Self>` that
    /// outlives any borrow.
    BorrowingImpl,
    /// `impl Trait for Type { .. }`.
    TraitImpl,
    /// `trait Name { .. }`.
    Trait,
    /// A module, a fn body, or not known.
    Unknown,
    /// A macro's input or a `macro_rules!` definition: its tokens are not items yet, so nothing
    /// inside it is known.
    Macro,
}

/// The block around the fn whose first token has `first` as its span and whose name is `name`
/// at `name_span`.
pub fn of_fn(first: proc_macro2::Span, name_span: proc_macro2::Span, name: &str) -> Enclosing {
    // `unwrap` panics outside a macro's expansion (the crate's unit tests).
    if !proc_macro::is_available() {
        return Enclosing::Unknown;
    }
    let (first, at) = (first.unwrap(), name_span.unwrap());
    if first.column() <= 1 {
        return Enclosing::Unknown;
    }
    let Some(path) = at.local_file() else { return Enclosing::Unknown };
    thread_local! {
        // One scan per file and compilation, however many tools it holds.
        static FILES: RefCell<HashMap<PathBuf, Option<Scanned>>> = RefCell::new(HashMap::new());
    }
    FILES.with(|files| {
        let mut files = files.borrow_mut();
        let scanned = files.entry(path).or_insert_with_key(|path| {
            std::fs::read_to_string(path).ok().map(|text| Scanned::new(&text))
        });
        match scanned {
            Some(scanned) => scanned.around_name(at.line(), at.column(), name),
            None => Enclosing::Unknown,
        }
    })
}

/// A source file's blocks, and where its lines start.
struct Scanned {
    text: String,
    line_starts: Vec<usize>,
    /// `(open, close, kind)` byte offsets of every brace block, in order of `open`.
    blocks: Vec<(usize, usize, Enclosing)>,
}

impl Scanned {
    fn new(text: &str) -> Self {
        let line_starts =
            std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Scanned { text: text.to_owned(), line_starts, blocks: blocks(text) }
    }

    /// The innermost block around the fn's `name` on line `line` (1-based): the occurrence of
    /// the word nearest `column` (the span's, in characters: a line may hold two fns of one
    /// name). Unknown when the line does not hold it (a span another macro made up).
    fn around_name(&self, line: usize, column: usize, name: &str) -> Enclosing {
        let Some(&start) = self.line_starts.get(line.wrapping_sub(1)) else {
            return Enclosing::Unknown;
        };
        let end = self.line_starts.get(line).copied().unwrap_or(self.text.len());
        let text = &self.text[start..end];
        let nearest = find_name(text, name)
            .min_by_key(|&at| text[..at].chars().count().abs_diff(column.saturating_sub(1)));
        let Some(at) = nearest else { return Enclosing::Unknown };
        innermost(&self.blocks, start + at)
    }
}

/// The offsets of every occurrence of `name` in `line` as a whole word (`r#name` at its `r`).
fn find_name<'a>(line: &'a str, name: &'a str) -> impl Iterator<Item = usize> + 'a {
    let name = name.strip_prefix("r#").unwrap_or(name);
    line.match_indices(name).filter_map(move |(at, _)| {
        let after_ok = line[at + name.len()..].chars().next().is_none_or(|c| !is_ident_char(c));
        let start = if line[..at].ends_with("r#") { at - 2 } else { at };
        let before_ok = line[..start].chars().next_back().is_none_or(|c| !is_ident_char(c));
        (after_ok && before_ok).then_some(start)
    })
}

/// The innermost block around `at`; unknown inside any macro's input or definition, where
/// `impl X {` may be a pattern or text a macro rearranges.
fn innermost(blocks: &[(usize, usize, Enclosing)], at: usize) -> Enclosing {
    let around = blocks.iter().filter(|(open, close, _)| *open < at && at < *close);
    if around.clone().any(|(_, _, kind)| *kind == Enclosing::Macro) {
        return Enclosing::Unknown;
    }
    around.max_by_key(|(open, _, _)| *open).map_or(Enclosing::Unknown, |(_, _, kind)| *kind)
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Every brace block of `text` with its kind. Comments, strings, raw strings, character
/// literals and attributes are skipped, so a `{` inside them opens nothing, and a brace after a
/// `!` opens a macro's input, inside which nothing is known. Only `impl` and `trait` headers are
/// told apart; every other block is unknown. (A file whose braces do not balance is one rustc
/// refuses anyway.)
fn blocks(text: &str) -> Vec<(usize, usize, Enclosing)> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    // Open blocks: index into `out`.
    let mut stack: Vec<usize> = Vec::new();
    // The words of the item being read, since the last `;`, `{` or `}`, with whether `<`
    // follows each (`for<'a>` is a bound, `for Type` a trait impl).
    let mut words: Vec<(String, bool, usize)> = Vec::new();
    // A `!` since then: the next `{` opens a macro's input (`name! {`, `macro_rules! name {`).
    let mut bang = false;
    let mut attr_depth = 0usize;
    let mut i = 0;
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    while let Some(c) = at(i) {
        let offset = chars[i].0;
        if let Some(end) = comment_end(&chars, i) {
            i = end;
            continue;
        }
        match c {
            '"' => {
                i = skip_string(&chars, i + 1);
                continue;
            }
            '\'' => {
                // A character literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
                if at(i + 1) == Some('\\') {
                    // The quote, the backslash and the escaped character ('\'', '\\').
                    i += 3;
                    while at(i).is_some_and(|c| c != '\'') {
                        i += 1;
                    }
                    i += 1;
                } else if at(i + 2) == Some('\'') {
                    i += 3;
                } else {
                    i += 1;
                }
                continue;
            }
            '#' if attr_depth == 0 => {
                let mut j = i + 1;
                if at(j) == Some('!') {
                    j += 1;
                }
                while at(j).is_some_and(char::is_whitespace) {
                    j += 1;
                }
                if at(j) == Some('[') {
                    attr_depth = 1;
                    i = j + 1;
                    continue;
                }
            }
            '[' if attr_depth > 0 => attr_depth += 1,
            ']' if attr_depth > 0 => attr_depth -= 1,
            c if c == '_' || c.is_alphabetic() => {
                let start = i;
                while at(i).is_some_and(is_ident_char) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().map(|&(_, c)| c).collect();
                // String prefixes: r"..", r#".."#, b"..", br"..", c"..", cr"..", b'x'.
                let raw = matches!(word.as_str(), "r" | "br" | "cr");
                if raw && matches!(at(i), Some('"' | '#')) {
                    let mut hashes = 0;
                    while at(i + hashes) == Some('#') {
                        hashes += 1;
                    }
                    if at(i + hashes) == Some('"') {
                        i = skip_raw_string(&chars, i + hashes + 1, hashes);
                        continue;
                    }
                    if word == "r" && hashes == 1 {
                        // A raw identifier (`r#impl`) is never a keyword.
                        i += 1;
                        while at(i).is_some_and(is_ident_char) {
                            i += 1;
                        }
                        if attr_depth == 0 {
                            words.push(("r#".into(), false, chars[start].0));
                        }
                        continue;
                    }
                }
                if matches!(word.as_str(), "b" | "c") && at(i) == Some('"') {
                    i = skip_string(&chars, i + 1);
                    continue;
                }
                if attr_depth == 0 {
                    let generic = next_significant(&chars, i) == Some('<');
                    words.push((word, generic, chars[start].0));
                }
                continue;
            }
            c if c.is_ascii_digit() => {
                while at(i).is_some_and(is_ident_char) {
                    i += 1;
                }
                continue;
            }
            _ if attr_depth > 0 => {}
            '!' => bang = true,
            '{' => {
                let kind = match if bang { Enclosing::Macro } else { classify(&words) } {
                    Enclosing::Impl if impl_header(text, &words, offset).is_some_and(borrows) => {
                        Enclosing::BorrowingImpl
                    }
                    kind => kind,
                };
                words.clear();
                bang = false;
                stack.push(out.len());
                out.push((offset, text.len(), kind));
            }
            '}' => {
                words.clear();
                bang = false;
                if let Some(open) = stack.pop() {
                    out[open].1 = offset;
                }
            }
            ';' => {
                words.clear();
                bang = false;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The index after the comment that starts at `i`, if one does: `//` to the line's end, or a
/// `/* */` with the ones nested in it.
fn comment_end(chars: &[(usize, char)], mut i: usize) -> Option<usize> {
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    match (at(i)?, at(i + 1)?) {
        ('/', '/') => {
            while at(i).is_some_and(|c| c != '\n') {
                i += 1;
            }
        }
        ('/', '*') => {
            let mut depth = 0usize;
            while let Some(c) = at(i) {
                if c == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if c == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        }
        _ => return None,
    }
    Some(i)
}

/// The first character from `i` on that is neither white space nor in a comment.
fn next_significant(chars: &[(usize, char)], mut i: usize) -> Option<char> {
    loop {
        let &(_, c) = chars.get(i)?;
        if c.is_whitespace() {
            i += 1;
        } else if let Some(end) = comment_end(chars, i) {
            i = end;
        } else {
            return Some(c);
        }
    }
}

/// The index after the closing `"` of a string whose content starts at `i`.
fn skip_string(chars: &[(usize, char)], mut i: usize) -> usize {
    while let Some(&(_, c)) = chars.get(i) {
        match c {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The index after the closing `"` and `hashes` `#` of a raw string whose content starts at `i`.
fn skip_raw_string(chars: &[(usize, char)], mut i: usize, hashes: usize) -> usize {
    while let Some(&(_, c)) = chars.get(i) {
        i += 1;
        if c == '"' && (0..hashes).all(|k| chars.get(i + k).is_some_and(|&(_, c)| c == '#')) {
            return i + hashes;
        }
    }
    i
}

/// The kind of the block an item's words open: only `impl` and `trait` items are told apart.
fn classify(words: &[(String, bool, usize)]) -> Enclosing {
    let mut rest = words
        .iter()
        .skip_while(|(w, ..)| matches!(w.as_str(), "pub" | "crate" | "super" | "self" | "in"))
        .skip_while(|(w, ..)| matches!(w.as_str(), "unsafe" | "default" | "auto"));
    match rest.next().map(|(w, ..)| w.as_str()) {
        Some("impl") if rest.any(|(w, generic, _)| w == "for" && !generic) => Enclosing::TraitImpl,
        Some("impl") => Enclosing::Impl,
        Some("trait") => Enclosing::Trait,
        _ => Enclosing::Unknown,
    }
}

/// The text of an inherent impl's header, from its `impl` to the `{` at `brace`.
fn impl_header<'a>(
    text: &'a str,
    words: &[(String, bool, usize)],
    brace: usize,
) -> Option<&'a str> {
    let start = words.iter().find(|(w, ..)| w == "impl")?.2;
    text.get(start..brace)
}

/// Whether the inherent impl whose header is `header` is for a type that borrows (see
/// [`impl_borrows`]). A header syn cannot read is not known to borrow.
fn borrows(header: &str) -> bool {
    syn::parse_str::<syn::ItemImpl>(&format!("{header} {{}}"))
        .is_ok_and(|item| item.trait_.is_none() && impl_borrows(&item))
}

/// Whether the type of `item` names a lifetime of its own: one other than `'static` and than
/// those a `for<..>` inside the type declares (`Box<dyn for<'b> Fn(&'b str)>` is `'static`). A
/// lifetime parameter bounded by `'static` (`impl<'a: 'static> Desk<'a>`) counts: the expansion
/// cannot name it either. So does an elided borrow (`impl Desk<&str>`): in an impl header it is
/// a lifetime parameter of the impl's own. A type that hides its lifetime (`Desk<Cow<str>>`) is
/// not seen, and keeps rustc's own error.
pub fn impl_borrows(item: &syn::ItemImpl) -> bool {
    named_lifetime(item) || elides_a_borrow(&item.self_ty)
}

fn named_lifetime(item: &syn::ItemImpl) -> bool {
    let mut declared = Vec::new();
    let ty = &item.self_ty;
    let tokens: Vec<_> = flatten(quote::quote!(#ty));
    let lifetime = |i: usize| match (&tokens[i], tokens.get(i + 1)) {
        (proc_macro2::TokenTree::Punct(p), Some(proc_macro2::TokenTree::Ident(name)))
            if p.as_char() == '\'' =>
        {
            Some(name.to_string())
        }
        _ => None,
    };
    for i in 0..tokens.len() {
        if matches!(&tokens[i], proc_macro2::TokenTree::Ident(w) if w == "for")
            && matches!(tokens.get(i + 1), Some(proc_macro2::TokenTree::Punct(p)) if p.as_char() == '<')
        {
            let mut j = i + 2;
            while j < tokens.len()
                && !matches!(&tokens[j], proc_macro2::TokenTree::Punct(p) if p.as_char() == '>')
            {
                declared.extend(lifetime(j));
                j += 1;
            }
        }
    }
    (0..tokens.len()).filter_map(lifetime).any(|name| name != "static" && !declared.contains(&name))
}

/// Whether `ty` holds a reference without a lifetime (`&str`, `&mut [u8]`). Not inside a fn
/// pointer or the `Fn(..)` sugar, where an elided lifetime is higher-ranked and owns nothing.
fn elides_a_borrow(ty: &syn::Type) -> bool {
    use syn::Type;
    match ty {
        Type::Reference(r) => r.lifetime.is_none() || elides_a_borrow(&r.elem),
        Type::Array(t) => elides_a_borrow(&t.elem),
        Type::Slice(t) => elides_a_borrow(&t.elem),
        Type::Group(t) => elides_a_borrow(&t.elem),
        Type::Paren(t) => elides_a_borrow(&t.elem),
        Type::Ptr(t) => elides_a_borrow(&t.elem),
        Type::Tuple(t) => t.elems.iter().any(elides_a_borrow),
        Type::Path(t) => {
            t.qself.as_ref().is_some_and(|q| elides_a_borrow(&q.ty)) || path_elides(&t.path)
        }
        Type::TraitObject(t) => bounds_elide(&t.bounds),
        Type::ImplTrait(t) => bounds_elide(&t.bounds),
        _ => false,
    }
}

fn path_elides(path: &syn::Path) -> bool {
    path.segments.iter().any(|segment| match &segment.arguments {
        syn::PathArguments::AngleBracketed(args) => args.args.iter().any(|arg| match arg {
            syn::GenericArgument::Type(ty) => elides_a_borrow(ty),
            syn::GenericArgument::AssocType(assoc) => elides_a_borrow(&assoc.ty),
            _ => false,
        }),
        _ => false,
    })
}

fn bounds_elide<P>(bounds: &syn::punctuated::Punctuated<syn::TypeParamBound, P>) -> bool {
    bounds.iter().any(|bound| match bound {
        syn::TypeParamBound::Trait(t) => path_elides(&t.path),
        _ => false,
    })
}

/// Every token of `tokens`, groups opened (their delimiters dropped).
fn flatten(tokens: proc_macro2::TokenStream) -> Vec<proc_macro2::TokenTree> {
    let mut out = Vec::new();
    for token in tokens {
        match token {
            proc_macro2::TokenTree::Group(group) => out.extend(flatten(group.stream())),
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn around(text: &str, name: &str) -> Enclosing {
        let scanned = Scanned::new(text);
        let (line, at) = text
            .lines()
            .enumerate()
            .find_map(|(i, l)| Some((i + 1, find_name(l, name).next()?)))
            .expect("fn in text");
        scanned.around_name(line, at + 1, name)
    }

    #[test]
    fn tells_impl_trait_impl_and_trait_blocks_from_modules() {
        let text = r##"
mod a {
    async fn free() {}
}
pub(crate) impl<T: Clone> Desk<T> where T: for<'a> Fn(&'a str) {
    /// A doc with a brace { and "a string }".
    #[doc = "}"]
    #[doc = r#"a quote " and a brace } in a raw string"#]
    async fn inherent(n: u32) {}
}
unsafe impl<'a> Send for Desk<'a> {
    async fn of_trait(&self) {}
}
pub trait Charge {
    async fn in_trait(&self) {}
}
fn body() {
    let s = r#"impl X { "#; let c = '{'; let l: &'static str = "";
    /* impl Y { /* nested } */ */
    async fn in_body() {}
}
"##;
        assert_eq!(around(text, "free"), Enclosing::Unknown);
        assert_eq!(around(text, "inherent"), Enclosing::Impl);
        assert_eq!(around(text, "of_trait"), Enclosing::TraitImpl);
        assert_eq!(around(text, "in_trait"), Enclosing::Trait);
        assert_eq!(around(text, "in_body"), Enclosing::Unknown);
    }

    /// Any text, however broken (unterminated strings and comments, stray quotes, multi-byte
    /// characters next to every delimiter), is scanned without a panic: a panic here would be a
    /// compile error in every crate with an indented tool.
    #[test]
    fn any_text_scans_without_a_panic() {
        const PIECES: [&str; 24] = [
            "impl", " X ", "{", "}", "'", "\"", "r#\"", "\"#", "#", "[", "]", "/*", "*/", "//",
            "\n", "é", "fn", " f", "!", "for", "<", "\\", "b'", "🦀",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..5_000 {
            let len = (next() % 40) as usize;
            let text: String = (0..len).map(|_| PIECES[(next() % 24) as usize]).collect();
            let scanned = Scanned::new(&text);
            for line in 0..4 {
                for column in [0, 1, 3, 7, 100] {
                    let _ = scanned.around_name(line, column, "f");
                    let _ = scanned.around_name(line, column, "r#fn");
                }
            }
        }
    }

    /// A macro's input or definition is not read as items: `impl X {` there may be a pattern,
    /// or text the macro turns into something else.
    #[test]
    fn inside_a_macro_nothing_is_known() {
        let text = r#"
macro_rules! make {
    (impl) => {
        async fn in_arm() {}
    };
}
delegate! {
    impl Api for X {
        fn in_input;
    }
}
make!(trait T { fn in_parens; });
impl<F> W<F> where
    for /* any lifetime */ <'a> F: Fn(&'a str) -> usize,
    for // a line comment
    <'b> F: Fn(&'b str),
{
    async fn bound_with_comments(&self) {}
}
"#;
        assert_eq!(around(text, "in_arm"), Enclosing::Unknown);
        assert_eq!(around(text, "in_input"), Enclosing::Unknown);
        assert_eq!(around(text, "in_parens"), Enclosing::Unknown);
        assert_eq!(around(text, "bound_with_comments"), Enclosing::Impl);
    }

    #[test]
    fn a_line_without_the_name_is_unknown() {
        let scanned = Scanned::new("impl X {\n    async fn a() {}\n}\n");
        assert_eq!(scanned.around_name(2, 14, "a"), Enclosing::Impl);
        assert_eq!(scanned.around_name(2, 14, "b"), Enclosing::Unknown);
        assert_eq!(scanned.around_name(2, 14, "a_b"), Enclosing::Unknown);
        assert_eq!(scanned.around_name(0, 14, "a"), Enclosing::Unknown);
        assert_eq!(scanned.around_name(99, 14, "a"), Enclosing::Unknown);
        assert_eq!(find_name("    async fn r#type() {}", "r#type").collect::<Vec<_>>(), [13]);
        assert_eq!(find_name("    async fn xa() {} // a_", "a").count(), 0);
        assert_eq!(find_name("fn a(a: u8)", "a").collect::<Vec<_>>(), [3, 5]);
    }

    /// Two fns of one name on a line (one in an impl, one free): the span's column decides.
    #[test]
    fn the_fn_nearest_the_spans_column_is_taken() {
        let text = "mod m { impl X { pub fn lookup() {} } pub async fn lookup() {} }\n";
        let scanned = Scanned::new(text);
        let second = text.rfind("lookup").unwrap() + 1;
        let first = text.find("lookup").unwrap() + 1;
        assert_eq!(scanned.around_name(1, second, "lookup"), Enclosing::Unknown);
        assert_eq!(scanned.around_name(1, first, "lookup"), Enclosing::Impl);
    }

    #[test]
    fn a_type_with_a_lifetime_of_its_own_borrows() {
        let borrows = |header: &str| {
            impl_borrows(&syn::parse_str(&format!("{header} {{}}")).expect("an impl"))
        };
        let borrowing = [
            "impl<'a> Desk<'a>",
            "impl Desk<'_>",
            "impl<'a> Desk<Vec<&'a str>>",
            "impl<'a> (Desk, Box<dyn Fn() + 'a>)",
            "impl<'a: 'static> Desk<'a>",
            "impl<'a> Desk<'a> where 'a: 'static",
            "impl Desk<&str>",
            "impl Desk<Vec<&mut [u8]>>",
            "impl Desk<(u8, &'static &str)>",
            "impl Desk<Box<dyn Iterator<Item = &u8>>>",
            "impl<T> Desk<<&T as IntoIterator>::Item>",
        ];
        for ty in borrowing {
            assert!(borrows(ty), "{ty}");
        }
        let owned = [
            "impl Desk",
            "impl Desk<'static>",
            "impl Desk<&'static str>",
            "impl Wrap<Box<dyn for<'b> Fn(&'b str) -> usize + Send + Sync>>",
            "impl Desk<fn(&str) -> &str>",
            "impl Desk<Box<dyn Fn(&str) + Send>>",
            "impl Desk<[&'static str; 2]>",
        ];
        for ty in owned {
            assert!(!borrows(ty), "{ty}");
        }
        let text = "impl<'a> Desk<'a> {\n    async fn open(&self) {}\n}\nimpl Desk<'static> {\n    async fn shut(&self) {}\n}\nimpl<'a> Show for Desk<'a> {\n    fn show(&self) {}\n}\n";
        assert_eq!(around(text, "open"), Enclosing::BorrowingImpl);
        assert_eq!(around(text, "shut"), Enclosing::Impl);
        assert_eq!(around(text, "show"), Enclosing::TraitImpl);
    }
}
