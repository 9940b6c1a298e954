//! Expand: the model → the typed call, the arguments struct, the tool value and its
//! `idem_core::Tool` implementation. Also what to emit when validation failed.

use std::time::Duration;

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, Type};

use crate::parse::Class;
use crate::validate::Model;

pub fn expand(model: &Model) -> TokenStream {
    if model.method { expand_method(model) } else { expand_free(model) }
}

/// The attributes of the user's fn, sorted: `cfg`s go on every generated item, docs and
/// `deprecated` on the typed call (what callers call: a deprecation warns at their call, not at
/// the definition), lint levels on the body and the typed call too (both repeat the user's
/// names; `dead_code` speaks only on the typed call), the rest (`tracing::instrument`, ...) on
/// the body. A `cfg_attr` goes where
/// the attributes it applies go (see `split_cfg_attr`).
struct Attrs {
    cfg: Vec<Attribute>,
    doc: Vec<Attribute>,
    deprecated: Vec<Attribute>,
    lints: Vec<Attribute>,
    body: Vec<Attribute>,
}

/// `allow`, `warn`, `deny`, `forbid`, `expect`.
fn is_lint_attr(attr: &Attribute) -> bool {
    is_lint_path(attr.path())
}

fn is_lint_path(path: &syn::Path) -> bool {
    ["allow", "warn", "deny", "forbid", "expect"].iter().any(|l| path.is_ident(l))
}

/// A lint attribute of the user's for the typed call of a method, which repeats the user's
/// names: `expect` becomes `allow`. The typed call need not raise the lint the body raises (a
/// parameter the body leaves unused is used there), and an expectation unfulfilled on the copy
/// would be reported although the body fulfils it.
fn copied_lint(attr: &Attribute) -> Attribute {
    through_cfg_attr(attr, &|attr| {
        let mut attr = attr.clone();
        if let syn::Meta::List(list) = &mut attr.meta
            && list.path.is_ident("expect")
        {
            list.path = Ident::new("allow", list.path.span()).into();
        }
        attr
    })
}

/// The lints about the fn as an item (`dead_code`), which rustc reports on the typed call and a
/// method's factory, never on the body: the body is always used, by the tool.
const ITEM_LINTS: [&str; 1] = ["dead_code"];

/// A lint attribute of the user's for the body: an `#[expect(..)]` without the item lints, which
/// the body never raises (none when it expected nothing else). The typed call has them as an
/// `allow` (see [`copied_lint`]), since rustc does not fulfil an `expect(dead_code)` there: on
/// a tool, `#[expect(dead_code)]` silences the lint as `allow` does, without checking it.
fn body_lint(attr: Attribute) -> Option<Attribute> {
    let syn::Meta::List(list) = &attr.meta else { return Some(attr) };
    if !list.path.is_ident("expect") {
        return Some(attr);
    }
    type Metas = syn::punctuated::Punctuated<syn::Meta, syn::Token![,]>;
    let Ok(metas) = list.parse_args_with(Metas::parse_terminated) else { return Some(attr) };
    let is_item_lint = |m: &&syn::Meta| ITEM_LINTS.iter().any(|l| m.path().is_ident(l));
    if !metas.iter().any(|m| is_item_lint(&m)) {
        return Some(attr);
    }
    // The others, and the `reason = ".."`.
    let rest: Vec<&syn::Meta> = metas.iter().filter(|m| !is_item_lint(m)).collect();
    if rest.iter().all(|m| matches!(m, syn::Meta::NameValue(_))) {
        return None;
    }
    let mut attr = attr.clone();
    if let syn::Meta::List(list) = &mut attr.meta {
        list.tokens = quote!(#(#rest),*);
    }
    Some(attr)
}

/// A `#[tracing::instrument]` on a method tool's body, which is the hidden
/// `__idem_tool_<name>`: given `name = "<the method's name>"` unless it names its span, so the
/// span is named as the user's method (instrument names it after the fn it is on). Any other
/// attribute comes back as it is.
fn instrument_named(attr: &Attribute, fn_name: &str) -> Attribute {
    let is_instrument =
        |path: &syn::Path| path.segments.last().is_some_and(|s| s.ident == "instrument");
    through_cfg_attr(attr, &|attr| {
        let mut attr = attr.clone();
        match &mut attr.meta {
            syn::Meta::Path(path) if is_instrument(path) => {
                let path = path.clone();
                attr.meta = syn::parse_quote!(#path(name = #fn_name));
            }
            syn::Meta::List(list) if is_instrument(&list.path) => {
                let tokens = list.tokens.clone().into_iter().collect::<Vec<_>>();
                let named = tokens.windows(2).any(|w| {
                    matches!(
                        (&w[0], &w[1]),
                        (proc_macro2::TokenTree::Ident(i), proc_macro2::TokenTree::Punct(p))
                            if i == "name" && p.as_char() == '='
                    )
                }) || tokens.iter().enumerate().any(|(i, t)| {
                    // A string literal as an argument of its own names the span too
                    // (`#[instrument("orders.cancel")]`), and a second name is refused.
                    matches!(t, proc_macro2::TokenTree::Literal(_))
                        && (i == 0
                            || matches!(&tokens[i - 1], proc_macro2::TokenTree::Punct(p) if p.as_char() == ','))
                });
                if !named {
                    let tokens = &list.tokens;
                    list.tokens = quote!(name = #fn_name, #tokens);
                }
            }
            _ => {}
        }
        attr
    })
}

/// `change` applied to `attr`, or, for a `#[cfg_attr(pred, a)]` that applies one attribute (as
/// [`split_cfg_attr`] leaves them), to `a` under the same predicate, through nested ones.
fn through_cfg_attr(attr: &Attribute, change: &dyn Fn(&Attribute) -> Attribute) -> Attribute {
    if let syn::Meta::List(list) = &attr.meta
        && list.path.is_ident("cfg_attr")
        && let Ok((predicate, applied)) = list.parse_args_with(cfg_attr_args)
        && let [meta] = &applied.into_iter().collect::<Vec<_>>()[..]
    {
        let mut inner = attr.clone();
        inner.meta = meta.clone();
        let applies = through_cfg_attr(&inner, change).meta;
        let mut attr = attr.clone();
        if let syn::Meta::List(list) = &mut attr.meta {
            list.tokens = quote!(#predicate, #applies);
        }
        return attr;
    }
    change(attr)
}

/// The arguments of `cfg_attr`: the predicate and the attributes it applies.
pub(crate) fn cfg_attr_args(
    input: syn::parse::ParseStream<'_>,
) -> syn::Result<(syn::Meta, syn::punctuated::Punctuated<syn::Meta, syn::Token![,]>)> {
    let predicate: syn::Meta = input.parse()?;
    input.parse::<syn::Token![,]>()?;
    Ok((predicate, syn::punctuated::Punctuated::parse_terminated(input)?))
}

/// For the body's fn: `#[tool]` requires an `async fn` (the tool's future is awaited), so a body
/// that awaits nothing is not one clippy's `unused_async` may ask to make synchronous; and the
/// expansion is what calls it, once (`single_call_fn`).
fn body_allows() -> Attribute {
    syn::parse_quote!(#[allow(clippy::unused_async, clippy::single_call_fn)])
}

/// The typed call's parameter list and body, delimited by groups spanned at the user's own
/// parentheses and braces: the typed call then spans the user's code, so rustc reports it unused
/// (`dead_code`, at the fn's name) as it would the fn as written. (An item spanning only the
/// expansion is taken for the macro's own, which no lint speaks about: a tool neither called
/// nor put in any set would go unnoticed.) The tool value and the factory refer to the typed
/// call, so a tool used either way is used.
fn user_delimited(item: &syn::ItemFn, params: TokenStream, body: TokenStream) -> (Group, Group) {
    let mut params = Group::new(Delimiter::Parenthesis, params);
    params.set_span(item.sig.paren_token.span.join());
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(item.block.brace_token.span.join());
    (params, body)
}

/// For the typed call and a method's factory, which span the user's fn (see
/// [`user_delimited`]): clippy's lints about a fn's shape would speak there as about the user's
/// code, on what the expansion wrote (a future is `must_use` already; its body's tail).
fn generated_fn_allows() -> Attribute {
    syn::parse_quote!(#[allow(
        clippy::must_use_candidate,
        clippy::missing_inline_in_public_items,
        clippy::implicit_return
    )])
}

/// `#[allow(deprecated)]` for the expansion's own use of a deprecated tool's typed call, which
/// only a caller's use should report.
fn deprecated_allow(attrs: &Attrs) -> Option<Attribute> {
    (!attrs.deprecated.is_empty()).then(|| syn::parse_quote!(#[allow(deprecated)]))
}

/// `#[allow(non_snake_case)]` when the fn's name or a parameter's is not snake case (`userId`,
/// which the user allowed on their fn): the generated fns repeat those names, and the lint would
/// speak there again. Only then: a crate that `forbid`s the lint refuses any `allow` of it
/// (E0453), and its names are snake case anyway.
fn non_snake_allow(item: &syn::ItemFn) -> Option<Attribute> {
    // rustc's rule: no upper case letter, and no `__` once leading and trailing `_` are trimmed.
    let snake = |ident: &Ident| {
        let name = ident.unraw().to_string();
        let name = name.trim_matches('_');
        !name.contains("__") && !name.chars().any(char::is_uppercase)
    };
    let params = item.sig.inputs.iter().filter_map(|arg| match arg {
        syn::FnArg::Typed(pt) => match &*pt.pat {
            syn::Pat::Ident(pi) => Some(&pi.ident),
            _ => None,
        },
        syn::FnArg::Receiver(_) => None,
    });
    let all_snake = snake(&item.sig.ident) && params.into_iter().all(snake);
    (!all_snake).then(|| syn::parse_quote!(#[allow(non_snake_case)]))
}

fn sort_attrs(attrs: &[Attribute]) -> Attrs {
    let mut out = Attrs {
        cfg: Vec::new(),
        doc: Vec::new(),
        deprecated: Vec::new(),
        lints: Vec::new(),
        body: Vec::new(),
    };
    for (attr, path) in attrs.iter().flat_map(split_cfg_attr) {
        if path.is_ident("cfg") {
            out.cfg.push(attr);
        } else if path.is_ident("doc") {
            out.doc.push(attr);
        } else if path.is_ident("deprecated") {
            out.deprecated.push(attr);
        } else {
            if is_lint_path(&path) {
                out.lints.push(attr.clone());
                out.body.extend(body_lint(attr));
            } else {
                out.body.push(attr);
            }
        }
    }
    out
}

/// `#[cfg_attr(pred, a, b)]` as one attribute per attribute it applies (`#[cfg_attr(pred, a)]`,
/// `#[cfg_attr(pred, b)]`), each with the path of that attribute (through nested `cfg_attr`s),
/// so that it goes where the attribute would: `#[cfg_attr(feature = "otel",
/// tracing::instrument(err))]` on the body only, not on the typed call, the tool value and, in a
/// `#[tool_set]`, the statement adding the tool to the set. (Outside a `#[tool_set]`, rustc
/// applies a `cfg_attr` written after `#[tool]` before the macro sees the fn.) Any other
/// attribute, or one rustc will refuse, comes back as it is.
pub(crate) fn split_cfg_attr(attr: &Attribute) -> Vec<(Attribute, syn::Path)> {
    let as_is = || vec![(attr.clone(), attr.path().clone())];
    let syn::Meta::List(list) = &attr.meta else { return as_is() };
    if !list.path.is_ident("cfg_attr") {
        return as_is();
    }
    let Ok((predicate, applied)) = list.parse_args_with(cfg_attr_args) else { return as_is() };
    let mut out = Vec::new();
    for meta in applied {
        let mut inner = attr.clone();
        inner.meta = meta;
        for (one, path) in split_cfg_attr(&inner) {
            let mut wrapped = attr.clone();
            let applies = one.meta;
            wrapped.meta = syn::Meta::List(syn::MetaList {
                path: list.path.clone(),
                delimiter: list.delimiter.clone(),
                tokens: quote!(#predicate, #applies),
            });
            out.push((wrapped, path));
        }
    }
    out
}

/// The user's `#[doc(hidden)]` (or `#[cfg_attr(.., doc(hidden))]`), for the items generated
/// beside the tool: a tool hidden from the crate's docs hides its tool value, arguments type and
/// factory too, not only the typed call.
fn doc_hidden(doc: &[Attribute]) -> Vec<&Attribute> {
    fn hides(meta: &syn::Meta) -> bool {
        let syn::Meta::List(list) = meta else { return false };
        if list.path.is_ident("doc") {
            return list.tokens.to_string() == "hidden";
        }
        list.path.is_ident("cfg_attr")
            && list
                .parse_args_with(cfg_attr_args)
                .is_ok_and(|(_, applied)| applied.iter().any(hides))
    }
    doc.iter().filter(|attr| hides(&attr.meta)).collect()
}

/// The typed call's own doc attributes, and whether they give it text: the user's doc comment,
/// or else the text of `description = ".."` (which documents the tool as the comment would);
/// no text for a tool with neither, so that `missing_docs` reports it. Only a `#[doc = ..]` is
/// text: `#[doc(alias = "..")]` and the like are kept, but document nothing (the description
/// the model reads is the same `#[doc = ..]` lines).
fn user_doc(doc: &[Attribute], model: &Model) -> (Vec<Attribute>, bool) {
    let mut out = doc.to_vec();
    if !crate::docs::doc_values(doc).is_empty() {
        return (out, true);
    }
    match syn::parse2::<syn::LitStr>(model.description.clone()) {
        Ok(text) if !text.value().trim().is_empty() => {
            let line = format!(" {}", text.value());
            out.push(syn::parse_quote!(#[doc = #line]));
            (out, true)
        }
        _ => (out, false),
    }
}

/// The body's context argument, `cx` as the type the body names (a check at the parameter's
/// name: `&Ctx` of a type of the user's own gets one error saying it is read as the context).
fn context_arg(model: &Model, cx: &TokenStream) -> TokenStream {
    let Some(name) = &model.ctx else { return quote!() };
    let krate = &model.krate;
    let at = Span::call_site().located_at(name.span());
    quote_spanned!(at=> #krate::__private::checks::context(#cx),)
}

/// `name: Type` of each parameter for the typed call of a method, with the parameter's lint
/// attributes (`#[allow(non_snake_case)] userId: String`).
fn typed_params(model: &Model) -> Vec<TokenStream> {
    model
        .item
        .sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            syn::FnArg::Typed(pt) => Some(pt),
            syn::FnArg::Receiver(_) => None,
        })
        .filter_map(|pt| {
            let syn::Pat::Ident(pi) = &*pt.pat else { return None };
            let param = model.params.iter().find(|p| p.ident == pi.ident)?;
            let lints = pt.attrs.iter().filter(|a| is_lint_attr(a)).map(copied_lint);
            let (ident, ty) = (&param.ident, &param.ty);
            Some(quote!(#(#lints)* #ident: #ty))
        })
        .collect()
}

pub(crate) fn camel(ident: &Ident) -> String {
    let camel: String = ident
        .unraw()
        .to_string()
        .split('_')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().chain(chars).collect::<String>(),
                None => String::new(),
            }
        })
        .collect();
    // `_2fa_verify` → `_2faVerify`: a name cannot start with a digit, and `format_ident!` would
    // panic on `2faVerifyTool`.
    if camel.starts_with(|c: char| !c.is_alphabetic()) { format!("_{camel}") } else { camel }
}

/// Empty when `camel` kept everything of the fn's name (its snake case gives the name back);
/// otherwise a hash of the name, so that the hidden names of `get_v2` and `get_v_2` (both
/// `GetV2`) differ and a clash is only rustc's one report per public name, at the fns' names.
fn lossy_suffix(ident: &Ident, camel: &str) -> String {
    let name = ident.unraw().to_string();
    let mut snake = String::with_capacity(name.len() + 4);
    for (i, c) in camel.trim_start_matches('_').chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                snake.push('_');
            }
            snake.extend(c.to_lowercase());
        } else {
            snake.push(c);
        }
    }
    if snake == name {
        return String::new();
    }
    // FNV-1a: stable across builds and hosts, which `std`'s hasher does not promise.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

fn duration(d: Option<Duration>) -> Option<TokenStream> {
    d.map(|d| {
        let secs = d.as_secs();
        let nanos = d.subsec_nanos();
        quote!(::core::option::Option::Some(::core::time::Duration::new(#secs, #nanos)))
    })
}

/// The `ToolDef` expression, naming only the options that are set (the others come from
/// `ToolOptions::NONE`): a smaller expansion to parse and check per tool.
fn def_expr(model: &Model) -> TokenStream {
    let krate = &model.krate;
    let name = &model.name;
    let description = &model.description;
    let class = match model.class {
        Class::Safe => quote!(Safe),
        Class::Keyed => quote!(Keyed),
        Class::Never => quote!(Never),
    };
    let opts = &model.options;
    let mut set = Vec::new();
    if let Some(n) = opts.attempts {
        set.push(quote!(attempts: ::core::option::Option::Some(#n),));
    }
    for (field, value) in [
        (quote!(attempt_timeout), opts.timeout),
        (quote!(deadline), opts.deadline),
        (quote!(lease), opts.lease),
        (quote!(ttl), opts.ttl),
    ] {
        if let Some(d) = duration(value) {
            set.push(quote!(#field: #d,));
        }
    }
    let options = if set.is_empty() {
        quote!(#krate::ToolOptions::NONE)
    } else {
        quote!(#krate::ToolOptions { #(#set)* ..#krate::ToolOptions::NONE })
    };
    quote! {
        #krate::ToolDef {
            name: #name,
            description: #description,
            class: #krate::RetryClass::#class,
            options: #options,
        }
    }
}

/// Where the tool is declared, for `Tool::declared_at`: `module::path::fn`, told apart from
/// another tool that took the same name from its fn (`users::get`, `orders::get`); a method is
/// told apart by its type too (`Tool::declared_on`). No file and line: they cost a tenth more
/// of what this adds per tool to a check, and the path names the fn. Empty for a tool given its name (`name = ".."`):
/// that one says it is the tool of that name, as a renamed or rewritten version may.
fn declared_at(model: &Model) -> TokenStream {
    if model.named {
        return quote!("");
    }
    let name = format!("::{}", model.item.sig.ident.unraw());
    quote!(::core::concat!(::core::module_path!(), #name))
}

/// `static DEF: ToolDef = ..;`, for a method tool's constructor (a fn body, where a borrowed
/// `ToolDef` calling `Duration::new` would not be promoted to `'static`).
fn def_static(model: &Model) -> TokenStream {
    let krate = &model.krate;
    let def = def_expr(model);
    quote!(static __IDEM_DEF: #krate::ToolDef = #def;)
}

/// The success and error types.
fn result_types(model: &Model) -> (TokenStream, TokenStream) {
    let krate = &model.krate;
    let ty = &model.ret.ty;
    let ok = match &model.ret.ok {
        Some(ok) => quote!(#ok),
        None => quote!(<#ty as #krate::__private::ToolReturn>::Ok),
    };
    let err = match &model.ret.err {
        Some(err) => quote!(#err),
        None => quote!(<#ty as #krate::__private::ToolReturn>::Err),
    };
    (ok, err)
}

/// `let __idem_checked = checked(|(p, o, e)| ..);`: every parameter, the success and the error
/// type checked by method calls spanned at the user's types, in a closure that is never called
/// (see `idem_core::__private::checks`). A type missing a trait gives one error there, naming
/// the trait; its type is then rustc's error type, which the later uses (`Checked::tool`,
/// `Checked::method`) take, so nothing else is reported about it.
fn checks(model: &Model) -> TokenStream {
    let krate = &model.krate;
    let (ok, err) = result_types(model);
    let tys = model.params.iter().map(|p| &p.ty);
    let elems = model.params.iter().enumerate().map(|(i, p)| {
        let index = syn::Index::from(i);
        let ty = &p.ty;
        if is_std_data(ty) {
            return quote!(__idem_p.#index);
        }
        let calls = quote_spanned! {ty.span()=>
            .__idem_arg_json_schema()
            .__idem_arg_serialize()
            .__idem_arg_deserialize()
            .__idem_arg_clone()
            .__idem_arg_send_sync()
        };
        quote!((#krate::__private::checks::Checking(__idem_p.#index) #calls).0)
    });
    let (ok_span, err_span) = match (&model.ret.ok, &model.ret.err) {
        (Some(ok), Some(err)) => (ok.span(), err.span()),
        _ => (model.ret.ty.span(), model.ret.ty.span()),
    };
    let ok_calls = match &model.ret.ok {
        Some(ok) if is_std_data(ok) => quote!(),
        _ => quote_spanned! {ok_span=>
            .__idem_output_serialize().__idem_output_deserialize().__idem_output_send()
        },
    };
    let err_calls = quote_spanned! {err_span=>
        .__idem_error_classify()
        .__idem_error_serialize()
        .__idem_error_deserialize()
        .__idem_error_display()
        .__idem_error_send()
    };
    quote! {
        let __idem_checked = #krate::__private::checks::checked(
            |(__idem_p, __idem_o, __idem_e): ((#(#tys,)*), #ok, #err)| {
                use #krate::__private::checks::*;
                (
                    (#(#elems,)*),
                    (#krate::__private::checks::Checking(__idem_o) #ok_calls).0,
                    (#krate::__private::checks::Checking(__idem_e) #err_calls).0,
                )
            },
        );
    }
}

/// `uses`: a statement naming a free tool's typed call, in `NAME` so that the tool counts as used
/// where only its arguments type is (a test of its schema): rustc reads the impl of a type it
/// sees used.
fn fields_impl(model: &Model, fields_ty: &TokenStream, uses: Option<TokenStream>) -> TokenStream {
    let krate = &model.krate;
    let args_name = format!("{}Args", camel(&model.item.sig.ident));
    let names = model.params.iter().map(|p| p.ident.unraw().to_string());
    // One bit per parameter that has the property; the constant is left out when none has it.
    let bits = |name: &str, has: &dyn Fn(&crate::validate::Param) -> bool| {
        let bits: u16 = model
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| has(p))
            .fold(0, |bits, (i, _)| bits | (1 << i));
        let name = format_ident!("{name}");
        (bits != 0).then(|| quote!(const #name: ::core::primitive::u16 = #bits;))
    };
    let skip = bits("SKIP", &|p| p.skip);
    let if_none = bits("SKIP_IF_NONE", &|p| p.skip_if_none);
    // Written even when zero: the trait's default (every bit set) checks every parameter.
    let may_hold_set: u16 = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| !is_std_data(&p.ty))
        .fold(0, |bits, (i, _)| bits | (1 << i));
    // Every parameter in the intent and of a type that reads back from it as written: a retry
    // reads its arguments back instead of each attempt copying them first.
    let from_intent =
        model.params.iter().all(|p| !p.skip && !p.skip_if_none && is_exact_data(&p.ty)).then(
            || {
                quote!(
                    const FROM_INTENT: ::core::primitive::bool = true;
                )
            },
        );
    let docs = model.params.iter().any(|p| !p.docs.is_empty()).then(|| {
        let texts = model.params.iter().map(|p| crate::docs::text_expr(&p.docs, krate));
        quote!(const DOCS: &'static [&'static ::core::primitive::str] = &[#(#texts),*];)
    });
    quote! {
        impl #krate::__private::Fields for #fields_ty {
            const NAME: &'static ::core::primitive::str = { #uses #args_name };
            const NAMES: &'static [&'static ::core::primitive::str] = &[#(#names),*];
            #skip
            #if_none
            #docs
            const MAY_HOLD_SET: ::core::primitive::u16 = #may_hold_set;
            #from_intent
        }
    }
}

/// A standard type written by its usual name that has every trait a tool argument or output
/// needs (`String`, `bool`, `char`, the integers and floats, `()`, and `Option` or `Vec` of
/// these): its checks are left out of the expansion, since they cannot fail and cost type
/// checking per tool. (A user type that shadows one of these names and lacks a trait is still
/// refused, by the bounds of the generic tool types, in a less precise message.)
fn is_std_data(ty: &Type) -> bool {
    is_plain_data(ty, false)
}

/// A standard type (as [`is_std_data`] reads it) whose value reads back from its canonical text
/// as written: not the floats (RFC 8785 writes `-0.0` as `0`), and also `BTreeMap<String, _>`.
/// The executor checks at each retry that what it read writes the same intent again, so a user
/// type that shadows one of these names cannot make a retry run other arguments.
fn is_exact_data(ty: &Type) -> bool {
    is_plain_data(ty, true)
}

/// The generic arguments of a path segment, when all are types.
fn type_args(args: &syn::AngleBracketedGenericArguments) -> Option<Vec<&Type>> {
    args.args
        .iter()
        .map(|a| match a {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// Whether a value of `ty` may be written `null`: an `Option` or `()`.
fn writes_null(ty: &Type) -> bool {
    match ty {
        Type::Tuple(t) => t.elems.is_empty(),
        Type::Paren(p) => writes_null(&p.elem),
        Type::Group(g) => writes_null(&g.elem),
        Type::Path(tp) => tp.path.segments.last().is_some_and(|s| s.ident == "Option"),
        _ => false,
    }
}

/// [`is_std_data`], or with `exact` [`is_exact_data`].
fn is_plain_data(ty: &Type, exact: bool) -> bool {
    const SCALARS: &[&str] = &[
        "String", "bool", "char", "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32",
        "u64", "u128", "usize", "f32", "f64",
    ];
    match ty {
        Type::Tuple(t) => t.elems.is_empty(),
        Type::Paren(p) => is_plain_data(&p.elem, exact),
        Type::Group(g) => is_plain_data(&g.elem, exact),
        Type::Path(tp) if tp.qself.is_none() && tp.path.leading_colon.is_none() => {
            let [segment] = &tp.path.segments.iter().collect::<Vec<_>>()[..] else {
                return false;
            };
            let name = segment.ident.to_string();
            match (&segment.arguments, name.as_str()) {
                (syn::PathArguments::None, "f32" | "f64") => !exact,
                (syn::PathArguments::None, name) => SCALARS.contains(&name),
                // `Some` of what is written `null` (an `Option`, `()`) reads back as `None`.
                (syn::PathArguments::AngleBracketed(args), "Option") if exact => matches!(
                    type_args(args).as_deref(),
                    Some([inner]) if !writes_null(inner) && is_plain_data(inner, exact)
                ),
                (syn::PathArguments::AngleBracketed(args), "Option" | "Vec") => {
                    matches!(type_args(args).as_deref(), Some([inner]) if is_plain_data(inner, exact))
                }
                (syn::PathArguments::AngleBracketed(args), "BTreeMap") if exact => matches!(
                    type_args(args).as_deref(),
                    Some([Type::Path(key), value])
                        if key.qself.is_none() && key.path.is_ident("String")
                            && is_plain_data(value, exact)
                ),
                _ => false,
            }
        }
        _ => false,
    }
}

/// `Option<T>` as written (also `std::option::Option<T>`), for `#[idem(skip_if_none)]`. (Whether
/// a parameter is `required` in the schema is asked of its type, in idem-core.)
pub(crate) fn is_option(ty: &Type) -> bool {
    match ty {
        Type::Path(tp) if tp.qself.is_none() => {
            let names: Vec<String> = tp.path.segments.iter().map(|s| s.ident.to_string()).collect();
            let last_ok = tp
                .path
                .segments
                .last()
                .is_some_and(|s| matches!(s.arguments, syn::PathArguments::AngleBracketed(_)));
            last_ok
                && matches!(
                    names.iter().map(String::as_str).collect::<Vec<_>>()[..],
                    ["Option"] | ["std" | "core", "option", "Option"]
                )
        }
        Type::Paren(p) => is_option(&p.elem),
        Type::Group(g) => is_option(&g.elem),
        _ => false,
    }
}

/// The name of the typed call's run parameter: `run`, or else the first of `idem_run`,
/// `__idem_run`, `__idem_run1`, .. that no parameter has.
fn run_ident(model: &Model) -> Ident {
    let taken = |name: &str| model.params.iter().any(|p| p.ident.unraw() == name);
    // A numbered name after these, so that parameters that take all three leave one free.
    let names = ["run", "idem_run", "__idem_run"].map(str::to_owned);
    let name = names
        .into_iter()
        .chain((1..).map(|i| format!("__idem_run{i}")))
        .find(|name| !taken(name))
        .unwrap_or_default();
    Ident::new(&name, Span::call_site())
}

/// `.reconciled_by(|.., key, args| ..)` when the tool names a check: the check is called with
/// the key and a copy of every parameter, in order, everything spanned at the check's path, and
/// its future's output is checked against the tool's success type there: a signature that does
/// not fit is one error at the name in the attribute. `recv` is the receiver of a method tool.
/// The closure's parameters are named `__idem_..`: the check's path resolves among them, so a
/// check named `key` or `args` would otherwise be the closure's parameter, not the fn.
fn reconcile_call(model: &Model, args_ty: &TokenStream) -> TokenStream {
    let Some(path) = &model.reconcile else { return quote!() };
    let krate = &model.krate;
    // Located at the check's name, resolved where the key and the receiver are declared (the
    // name may come from a `macro_rules!` caller, whose hygiene would hide them).
    let span = Span::call_site().located_at(path.span());
    let (ok, _) = result_types(model);
    // The copies are typed by the arguments (one clone of the whole), so a parameter of the check
    // that does not fit is reported at the call, not inside a `clone`.
    let (copy, values) = match model.params.first().filter(|p| p.flatten) {
        Some(_) => {
            let v = format_ident!("__idem_a0", span = span);
            (quote!(let #v = ::core::clone::Clone::clone(&__idem_args.0);), vec![v])
        }
        None => {
            let vs: Vec<Ident> = (0..model.params.len())
                .map(|i| format_ident!("__idem_a{}", i, span = span))
                .collect();
            (quote!(let (#(#vs,)*) = ::core::clone::Clone::clone(&__idem_args.0);), vs)
        }
    };
    let recv_param = model.method.then(|| quote!(__idem_recv,));
    let recv = model.method.then(|| quote_spanned!(span=> __idem_recv,));
    let callee = match (model.method, path.get_ident()) {
        (true, Some(ident)) => quote_spanned!(span=> Self::#ident),
        _ => quote!(#path),
    };
    let call = quote_spanned! {span=>
        #krate::__private::checks::reconcile_check::<#ok, _>(#callee(#recv __idem_key, #(#values),*))
    };
    quote! {
        .reconciled_by(|#recv_param __idem_key, __idem_args: &#args_ty| {
            #copy
            #call
        })
    }
}

fn expand_free(model: &Model) -> TokenStream {
    let krate = &model.krate;
    let item = &model.item;
    let vis = &item.vis;
    let ident = &item.sig.ident;
    let attrs = sort_attrs(&item.attrs);
    let cfg = &attrs.cfg;
    let (doc, documented) = &user_doc(&attrs.doc, model);
    let body_attrs = &attrs.body;
    let base = camel(ident);
    let tool_ty = format_ident!("{}Tool", base, span = ident.span());
    let non_snake = non_snake_allow(item);
    let hidden_doc = doc_hidden(&attrs.doc);
    // The tool as a value is a constant named like a type. Named in the expansion's context (at
    // the user's name's location), `non_upper_case_globals` sees generated code and stays quiet,
    // so no `allow` is needed, which a crate that `forbid`s the lint would refuse (E0453).
    let tool_const = Ident::new(&tool_ty.to_string(), Span::call_site().located_at(ident.span()));
    let args_ty = format_ident!("{}Args", base, span = ident.span());
    let fields_ty = format_ident!("__Idem{}Fields{}", base, lossy_suffix(ident, &base));
    // The public names' items start at the fn's name: two fns whose names give the same type
    // names (`get_v2`, `get_v_2`) are reported there, not at their attributes.
    // In the expansion's context, so that lints about the items (`dead_code`) stay quiet as for
    // any generated item: the fn itself is what a user is told about.
    let span = Span::call_site().located_at(ident.span());
    let (type_kw, const_kw) = (quote_spanned!(span=> type), quote_spanned!(span=> const));
    let semi = quote_spanned!(span=> ;);
    let run = run_ident(model);
    let (ok, err) = result_types(model);
    let idents: Vec<&Ident> = model.params.iter().map(|p| &p.ident).collect();
    let tys: Vec<&Type> = model.params.iter().map(|p| &p.ty).collect();
    let indices = (0..model.params.len()).map(syn::Index::from);
    // A literal description: the `ToolDef` borrowed in the constant's initializer is promoted to
    // `'static`, so no `static` item (one item less to check per tool). A description built from
    // `include_str!` is a block, which is not promoted: a `static` then.
    let def = if syn::parse2::<syn::LitStr>(model.description.clone()).is_ok() {
        let def = def_expr(model);
        quote!(&#def)
    } else {
        let def = def_static(model);
        quote!({ #def &__IDEM_DEF })
    };
    let name = &model.name;
    let fn_name = ident.unraw().to_string();

    let args_doc = format!(
        "The arguments of the tool `{name}` (see [`{fn_name}`]), as the model sends them: a JSON object with one field per parameter; unknown fields are refused."
    );
    let args_new_doc = format!(
        " `{args_ty}::new({})` builds them, in parameter order.",
        model.params.iter().map(|p| p.ident.unraw().to_string()).collect::<Vec<_>>().join(", ")
    );
    let tool_doc = format!(
        "The tool `{name}` as a value, for a tool set (see [`{fn_name}`]). Every call goes through idem's protocol."
    );
    let call_doc = format!(
        " Calls the tool `{name}` through idem: the key is derived from the run and the arguments, the call is claimed, run with its retry class, stored and replayed to repeats. [`{tool_ty}`] is the tool as a value."
    );
    // The alias's rustdoc text (with its link markup) is for the programmer; the schema the
    // model reads gets no description of its own, as for a method tool.
    let allow_deprecated = deprecated_allow(&attrs);
    let use_call = quote!(#allow_deprecated let _ = #ident;);
    let fields = fields_impl(model, &quote!(#fields_ty), Some(use_call.clone()));
    let checks = checks(model);

    let mut inner = item.clone();
    inner.vis = syn::Visibility::Inherited;
    inner.attrs = body_attrs.clone();
    inner.attrs.push(body_allows());
    // The body's fn is an item of the closure's block, where it shadows the closure's
    // parameters: named `__idem_..`, they cannot be a tool's name (`async fn args(..)`).
    let cx_arg = context_arg(model, &quote!(__idem_cx));
    let flat = model.params.first().filter(|p| p.flatten);
    let (call, ctor, body_args, tool_args, args_items) = match flat {
        // One arguments struct: its fields are the arguments; no `..Args` type of our own (the
        // user's struct often has that name).
        Some(p) => {
            let (pi, pty) = (&p.ident, &p.ty);
            (
                quote!(#tool_ty.call(#run, #krate::__private::Flat(#pi))),
                quote!(tool_flat),
                quote!(__idem_args.0),
                quote!(#krate::__private::Flat<#pty>),
                quote!(),
            )
        }
        None => (
            quote!(#tool_ty.call(#run, #args_ty::new(#(#idents),*))),
            quote!(tool),
            quote!(#(__idem_args.0.#indices),*),
            quote!(#args_ty),
            quote! {
                #(#cfg)*
                #[doc = #args_doc]
                #[doc = ""]
                #[doc = #args_new_doc]
                #(#hidden_doc)*
                #vis #type_kw #args_ty = #krate::__private::Args<(#(#tys,)*), #fields_ty> #semi

                #(#cfg)*
                #[doc(hidden)]
                // Never a value: a name for the parameters, not an enum to add variants to.
                #[allow(clippy::exhaustive_enums)]
                #vis enum #fields_ty {}

                #(#cfg)*
                #fields
            },
        ),
    };
    let send_check = quote_spanned! {ident.span()=>
        #krate::__private::checks::tool_body(#ident(#cx_arg #body_args))
    };
    let reconcile = reconcile_call(model, &tool_args);
    let declared_at = declared_at(model);

    let deprecated = &attrs.deprecated;
    // After the user's doc comment only: an undocumented tool stays undocumented, so that
    // `missing_docs` reports it (its doc comment is also the description the model reads).
    let call_doc = documented.then(|| quote!(#[doc = ""] #[doc = #call_doc]));
    let lints: Vec<Attribute> = attrs.lints.iter().map(copied_lint).collect();
    let generated_allows = generated_fn_allows();
    let fn_token = &item.sig.fn_token;
    let (params, body) =
        user_delimited(item, quote!(#run: &'__idem #krate::Run, #(#idents: #tys),*), call);
    quote! {
        #(#cfg)*
        #(#doc)*
        #call_doc
        #(#deprecated)*
        // The body's fn has the same name and parameters, with the user's lint levels: the
        // style lints speak there, once; here, those about the fn as an item (`dead_code`). A
        // parameter named `_note` is passed on here, which is not the user's use of it.
        #(#lints)*
        #[allow(clippy::too_many_arguments, clippy::used_underscore_binding)]
        #generated_allows
        #non_snake
        #vis #fn_token #ident<'__idem> #params
            -> #krate::__private::BoxFuture<'__idem, ::core::result::Result<#ok, #krate::Error<#err>>>
        #body

        #args_items

        #(#cfg)*
        #[doc = #tool_doc]
        #(#hidden_doc)*
        #vis #type_kw #tool_ty = #krate::__private::FnTool<#tool_args, #ok, #err> #semi

        #(#cfg)*
        #[doc = #tool_doc]
        #(#hidden_doc)*
        #vis #const_kw #tool_const: #tool_ty = {
            // The tool is used when its value is, even if its typed call is not.
            #use_call
            #checks
            __idem_checked.#ctor(
                #def,
                |__idem_cx, __idem_args: #tool_args| {
                    let _ = __idem_cx;
                    #inner
                    #send_check
                },
                #declared_at,
            )
            #reconcile
        } #semi
    }
}

fn expand_method(model: &Model) -> TokenStream {
    let krate = &model.krate;
    let item = &model.item;
    let vis = &item.vis;
    let ident = &item.sig.ident;
    let attrs = sort_attrs(&item.attrs);
    let cfg = &attrs.cfg;
    let (doc, documented) = &user_doc(&attrs.doc, model);
    let body_attrs = &attrs.body;
    let hidden = format_ident!("__idem_tool_{}", ident.unraw());
    let non_snake = non_snake_allow(item);
    let hidden_doc = doc_hidden(&attrs.doc);
    let factory = format_ident!("{}_tool", ident.unraw(), span = ident.span());
    let run = run_ident(model);
    let (ok, err) = result_types(model);
    let idents: Vec<&Ident> = model.params.iter().map(|p| &p.ident).collect();
    let tys: Vec<&Type> = model.params.iter().map(|p| &p.ty).collect();
    let indices = (0..model.params.len()).map(syn::Index::from);
    let def = def_static(model);
    let checks = checks(model);
    let fields = fields_impl(model, &quote!(__IdemFields), None);
    let name = &model.name;

    let factory_doc = format!(
        " The tool `{name}` as a value holding this receiver, for a tool set (see [`Self::{ident}`]). Every call goes through idem's protocol."
    );
    let call_doc = format!(
        " Calls the tool `{name}` through idem: the key is derived from the run and the arguments, the call is claimed, run with its retry class, stored and replayed to repeats. [`Self::{factory}`] gives the tool as a value."
    );

    let mut inner = item.clone();
    inner.vis = syn::Visibility::Inherited;
    inner.sig.ident = hidden.clone();
    let fn_name = ident.unraw().to_string();
    inner.attrs = body_attrs.iter().map(|a| instrument_named(a, &fn_name)).collect();
    inner.attrs.push(body_allows());
    let cx_arg = context_arg(model, &quote!(cx));
    let tuple = quote!((#(#tys,)*));
    let (body_args, args_ty, wrap, fields) = match model.params.first().filter(|p| p.flatten) {
        Some(p) => {
            let pty = &p.ty;
            (quote!(args.0), quote!(#krate::__private::Flat<#pty>), quote!(method_flat), quote!())
        }
        None => (
            quote!(#(args.0.#indices),*),
            quote!(#krate::__private::Args<#tuple, __IdemFields>),
            quote!(method),
            quote!(enum __IdemFields {} #fields),
        ),
    };
    // Located at the method's name, resolved where the closure's `recv` is declared (the name
    // may come from a `macro_rules!` caller, whose hygiene would hide `recv`).
    let at = Span::call_site().located_at(ident.span());
    let send_check = quote_spanned! {at=>
        #krate::__private::checks::tool_body(Self::#hidden(recv, #cx_arg #body_args))
    };
    let reconcile = reconcile_call(model, &args_ty);
    let declared_at = declared_at(model);

    let deprecated = &attrs.deprecated;
    let lints: Vec<Attribute> = attrs.lints.iter().map(copied_lint).collect();
    // After the user's doc comment only, as for a free fn.
    let call_doc = documented.then(|| {
        quote! {
            #[doc = ""]
            #[doc = #call_doc]
            #[doc = ""]
            #[doc = " The receiver is an `Arc<Self>`: the tool holds it for retries and for duplicates that join."]
        }
    });
    let params = typed_params(model);
    let generated_allows = generated_fn_allows();
    let fn_token = &item.sig.fn_token;
    let (call_params, call_body) = user_delimited(
        item,
        quote!(self: &::std::sync::Arc<Self>, #run: &'__idem #krate::Run, #(#params),*),
        quote! {
            let __idem_params = (#(#idents,)*);
            let __idem_tool = Self::#factory(self);
            let __idem_args = #krate::__private::make_args(&__idem_tool, __idem_params);
            #krate::__private::call_owned(#run, __idem_tool, __idem_args)
        },
    );
    let allow_deprecated = deprecated_allow(&attrs);
    // Spanned at the method too: rustc reports the unused methods of a block together, and says
    // nothing when one of them is the macro's own.
    let (factory_params, factory_body) = user_delimited(
        item,
        quote!(self: &::std::sync::Arc<Self>),
        quote! {
            // The tool is used when its value is, even if its typed call is not.
            #allow_deprecated
            let _ = Self::#ident;
            #checks
            #fields
            #def
            __idem_checked.#wrap(
                #krate::__private::MethodTool::new(
                    <::std::sync::Arc<Self> as ::core::clone::Clone>::clone(self),
                    &__IDEM_DEF,
                    |recv, cx, args: #args_ty| {
                        let _ = cx;
                        #send_check
                    },
                    #declared_at,
                )
                #reconcile,
            )
        },
    );
    quote! {
        #(#cfg)*
        #[doc(hidden)]
        // Its parameters repeat the typed call's, where the style lints speak (with the user's
        // lint levels).
        #non_snake
        #inner

        #(#cfg)*
        #[doc = #factory_doc]
        #(#hidden_doc)*
        // Named after the method: the user's lint levels, as on the typed call.
        #(#lints)*
        #generated_allows
        #vis #fn_token #factory #factory_params -> impl #krate::Tool<
            Args: ::core::convert::From<#tuple>,
            Output = #ok,
            Error = #err,
        > + ::core::clone::Clone + ::core::fmt::Debug + 'static
        where
            Self: ::core::marker::Send + ::core::marker::Sync + 'static,
        #factory_body

        #(#cfg)*
        #(#doc)*
        #call_doc
        #(#deprecated)*
        #(#lints)*
        // A parameter named `_note` is passed on here, which is not the user's use of it.
        #[allow(clippy::too_many_arguments, clippy::used_underscore_binding)]
        #generated_allows
        #vis #fn_token #ident<'__idem> #call_params
            -> #krate::__private::BoxFuture<'__idem, ::core::result::Result<#ok, #krate::Error<#err>>>
        where
            Self: ::core::marker::Send + ::core::marker::Sync + 'static,
        #call_body
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    /// The expansion's fns, types and constants, each with its attributes as text.
    fn items(item: syn::ItemFn) -> Vec<(String, Vec<String>)> {
        let out = crate::tool_item(quote!(retry = "safe"), item, None, None).tokens;
        let file: syn::File = syn::parse2(out).expect("the expansion parses as items");
        file.items
            .iter()
            .filter_map(|item| {
                let (name, attrs) = match item {
                    syn::Item::Fn(f) => (f.sig.ident.to_string(), &f.attrs),
                    syn::Item::Type(t) => (t.ident.to_string(), &t.attrs),
                    syn::Item::Const(c) => (format!("const {}", c.ident), &c.attrs),
                    _ => return None,
                };
                Some((name, attrs.iter().map(|a| quote!(#a).to_string()).collect()))
            })
            .collect()
    }

    fn all_have(items: &[(String, Vec<String>)], attr: &str) -> bool {
        items.iter().all(|(_, attrs)| attrs.iter().any(|a| a == attr))
    }

    fn any_has(items: &[(String, Vec<String>)], attr: &str) -> bool {
        items.iter().any(|(_, attrs)| attrs.iter().any(|a| a == attr))
    }

    /// The hidden fields enum of each free tool, by fn name.
    fn fields_enum(item: syn::ItemFn) -> String {
        let out = crate::tool_item(quote!(retry = "safe"), item, None, None).tokens;
        let file: syn::File = syn::parse2(out).expect("the expansion parses as items");
        let names = file.items.iter().filter_map(|item| match item {
            syn::Item::Enum(e) => Some(e.ident.to_string()),
            _ => None,
        });
        names.collect::<Vec<_>>().concat()
    }

    #[test]
    fn names_that_give_the_same_type_names_keep_distinct_hidden_items() {
        let v2 = fields_enum(syn::parse_quote!(
            async fn get_v2(n: u32) -> Result<u32, E> {}
        ));
        let v_2 = fields_enum(syn::parse_quote!(
            async fn get_v_2(n: u32) -> Result<u32, E> {}
        ));
        let lead = fields_enum(syn::parse_quote!(
            async fn _get_v2(n: u32) -> Result<u32, E> {}
        ));
        assert_eq!(v2, "__IdemGetV2Fields", "a name camel case keeps whole is unchanged");
        assert!(v_2.starts_with("__IdemGetV2Fields") && v_2 != v2, "{v_2}");
        assert!(lead.starts_with("__IdemGetV2Fields") && lead != v2 && lead != v_2, "{lead}");
        let card = fields_enum(syn::parse_quote!(
            async fn charge_card(n: u32) -> Result<u32, E> {}
        ));
        assert_eq!(card, "__IdemChargeCardFields");
    }

    #[test]
    fn a_hidden_tool_hides_its_value_and_arguments_type() {
        let hidden = items(syn::parse_quote! {
            #[doc(hidden)]
            pub async fn charge(customer: String) -> Result<(), Failed> { Ok(()) }
        });
        let names: Vec<&str> = hidden.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["charge", "ChargeArgs", "ChargeTool", "const ChargeTool"]);
        assert!(all_have(&hidden, "# [doc (hidden)]"), "{hidden:?}");

        let cfg_hidden = items(syn::parse_quote! {
            #[cfg_attr(docsrs, doc(hidden))]
            pub async fn charge(customer: String) -> Result<(), Failed> { Ok(()) }
        });
        assert!(all_have(&cfg_hidden, "# [cfg_attr (docsrs , doc (hidden))]"), "{cfg_hidden:?}");

        let shown = items(syn::parse_quote! {
            /// Charges.
            pub async fn charge(customer: String) -> Result<(), Failed> { Ok(()) }
        });
        assert!(!any_has(&shown, "# [doc (hidden)]"), "{shown:?}");
    }

    #[test]
    fn non_snake_case_is_allowed_only_where_a_name_needs_it() {
        let allow = "# [allow (non_snake_case)]";
        let snake = items(syn::parse_quote! {
            pub async fn charge(customer_id: String, _note: String) -> Result<(), Failed> { Ok(()) }
        });
        assert!(!any_has(&snake, allow), "{snake:?}");
        for item in [
            syn::parse_quote! { pub async fn charge(customerId: String) -> Result<(), Failed> { Ok(()) } },
            syn::parse_quote! { pub async fn chargeCard(id: String) -> Result<(), Failed> { Ok(()) } },
            syn::parse_quote! { pub async fn charge(customer__id: String) -> Result<(), Failed> { Ok(()) } },
        ] {
            let camel = items(item);
            assert!(any_has(&camel, allow), "{camel:?}");
        }
    }
}
