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
                let lines = s.value();
                let lines = lines
                    .split('\n')
                    .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
                    .collect::<Vec<_>>()
                    .join("\n");
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
        const __IDEM_RAW: &str = ::core::concat!(#(#pieces),*);
        static __IDEM_TEXT: #krate::__private::DocText<{ __IDEM_RAW.len() }> =
            #krate::__private::DocText::new(__IDEM_RAW);
        __IDEM_TEXT.as_str()
    }}
}
