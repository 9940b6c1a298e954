//! `#[tool_set]` on an `impl` block (rmcp's `#[tool_router]` is the model): expands each
//! `#[tool]` method in place and adds `fn tool_set(self: &Arc<Self>) -> ToolSet` holding them.
//! Method bodies are kept as tokens, never parsed (see `parse_fn`).

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::Attribute;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};

use crate::parse::Errors;

/// `#[tool_set(crate = "..", fn_name = "..")]`.
struct SetAttr {
    krate: Option<syn::Path>,
    /// The method that returns the set: `tool_set` unless named, so that two blocks of one type
    /// (one per file, say) each add their own.
    set_fn: syn::Ident,
}

fn parse_attr(tokens: TokenStream, errors: &mut Errors) -> SetAttr {
    let mut krate = None;
    let mut set_fn: Option<syn::Ident> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("fn_name") {
            let lit: syn::LitStr = meta.value()?.parse()?;
            let mut ident = lit.parse::<syn::Ident>().map_err(|_| {
                syn::Error::new(
                    lit.span(),
                    "`fn_name` names the method that returns the set: write an identifier, such as `fn_name = \"billing_tools\"`",
                )
            })?;
            if set_fn.is_some() {
                return Err(syn::Error::new_spanned(
                    &meta.path,
                    "`fn_name` is given twice; keep one",
                ));
            }
            // Kept as parsed (`r#match` stays raw), located at the value.
            ident.set_span(lit.span());
            set_fn = Some(ident);
            Ok(())
        } else if meta.path.is_ident("crate") {
            let lit: syn::LitStr = meta.value()?.parse()?;
            let path = lit.parse::<syn::Path>()?;
            // As `#[tool]` says: the last would win silently.
            if krate.is_some() {
                return Err(syn::Error::new_spanned(
                    &meta.path,
                    "`crate` is given twice; keep one",
                ));
            }
            krate = Some(path);
            Ok(())
        } else {
            Err(meta.error(
                "unknown option: `#[tool_set]` takes `crate = \"..\"` and `fn_name = \"..\"`",
            ))
        }
    });
    if let Err(e) = parser.parse2(tokens) {
        errors.push(e);
    }
    let set_fn = set_fn.unwrap_or_else(|| syn::Ident::new("tool_set", Span::call_site()));
    SetAttr { krate, set_fn }
}

/// An item of the block: a fn (body kept as tokens) or anything else, emitted as written.
enum Entry {
    Fn(Box<syn::ItemFn>),
    Other(TokenStream),
}

fn parse_entries(input: ParseStream<'_>) -> syn::Result<(Vec<Attribute>, Vec<Entry>)> {
    let inner = input.call(Attribute::parse_inner)?;
    let mut entries = Vec::new();
    while !input.is_empty() {
        let fork = input.fork();
        if fork.call(crate::parse_fn).is_ok() {
            entries.push(Entry::Fn(Box::new(input.call(crate::parse_fn)?)));
        } else {
            let item: syn::ImplItem = input.parse()?;
            entries.push(Entry::Other(quote!(#item)));
        }
    }
    Ok((inner, entries))
}

/// How far a visibility reaches, to give `tool_set` that of the most visible tool: `pub`, then
/// `pub(crate)`, then any other restricted `pub(..)`, then private (`pub(self)` is private too).
/// (Two restricted to modules, `pub(super)` and `pub(in crate::a)`, are not compared here: see
/// [`wider`].)
fn reach(vis: &syn::Visibility) -> u8 {
    match vis {
        syn::Visibility::Public(_) => 3,
        syn::Visibility::Restricted(r) if r.path.is_ident("crate") => 2,
        syn::Visibility::Restricted(r) if r.path.is_ident("self") => 0,
        syn::Visibility::Restricted(_) => 1,
        syn::Visibility::Inherited => 0,
    }
}

/// The visibility that reaches as far as both. Two restricted to different modules
/// (`pub(super)`, `pub(in crate::a)`) cannot be compared without the block's module path, which a
/// macro does not know: `pub(crate)` reaches both, where keeping either could leave `tool_set`
/// private where the other tool is not.
fn wider(a: syn::Visibility, b: &syn::Visibility) -> syn::Visibility {
    match reach(&a).cmp(&reach(b)) {
        std::cmp::Ordering::Less => b.clone(),
        std::cmp::Ordering::Greater => a,
        std::cmp::Ordering::Equal => match (&a, b) {
            (syn::Visibility::Restricted(x), syn::Visibility::Restricted(y))
                if reach(b) == 1
                    && x.path.to_token_stream().to_string()
                        != y.path.to_token_stream().to_string() =>
            {
                syn::parse_quote!(pub(crate))
            }
            _ => a,
        },
    }
}

/// The conditions of an item's `#[cfg(..)]` attributes (all must hold for it to be compiled);
/// `cfg_attr` changes attributes, not whether the item exists, so it adds none.
fn cfg_conditions(cfg: &[Attribute]) -> Vec<TokenStream> {
    cfg.iter()
        .filter(|a| a.path().is_ident("cfg"))
        .filter_map(|a| match &a.meta {
            syn::Meta::List(list) => Some(list.tokens.clone()),
            _ => None,
        })
        .collect()
}

/// `#[tool(..)]`, `#[idem::tool(..)]`, `#[idem_core::tool(..)]`: the last segment is `tool`.
fn is_tool_attr(attr: &Attribute) -> bool {
    attr.path().segments.last().is_some_and(|s| s.ident == "tool")
}

/// A `#[tool(..)]` applied by a `cfg_attr` (nested ones too): the predicates it is under, the
/// `tool` attribute, and the `cfg_attr` without it (`None` when it applied nothing else).
fn conditional_tool(attr: &Attribute) -> Option<(Vec<syn::Meta>, Attribute, Option<Attribute>)> {
    let syn::Meta::List(list) = &attr.meta else { return None };
    if !list.path.is_ident("cfg_attr") {
        return None;
    }
    let (predicate, applied) = list.parse_args_with(crate::expand::cfg_attr_args).ok()?;
    let mut found = None;
    let mut rest = Vec::new();
    for meta in applied {
        if found.is_none() {
            let mut inner = attr.clone();
            inner.meta = meta.clone();
            if is_tool_attr(&inner) {
                found = Some((vec![predicate.clone()], inner));
                continue;
            }
            if let Some((mut conditions, tool, inner_rest)) = conditional_tool(&inner) {
                conditions.insert(0, predicate.clone());
                found = Some((conditions, tool));
                rest.extend(inner_rest.map(|r| r.meta));
                continue;
            }
        }
        rest.push(meta);
    }
    let (conditions, tool) = found?;
    let rest = (!rest.is_empty()).then(|| {
        let mut without = attr.clone();
        without.meta = syn::Meta::List(syn::MetaList {
            path: list.path.clone(),
            delimiter: list.delimiter.clone(),
            tokens: quote!(#predicate, #(#rest),*),
        });
        without
    });
    Some((conditions, tool, rest))
}

/// An attribute with a path not ending in `tool` whose arguments start with `retry = ..`, as only
/// `#[tool]`'s do.
fn looks_like_tool(attr: &Attribute) -> bool {
    let syn::Meta::List(list) = &attr.meta else { return false };
    let mut tokens = list.tokens.clone().into_iter();
    matches!(
        (tokens.next(), tokens.next()),
        (Some(TokenTree::Ident(i)), Some(TokenTree::Punct(p))) if i == "retry" && p.as_char() == '='
    )
}

/// The header (`impl<..> Type where ..`) read as syn reads an `impl` (with an empty body): a
/// trait impl is told by syn, not by looking for `for` (a bound of the inherent block may be
/// higher-ranked: `where F: for<'a> Fn(&'a str)`). A header that is not an `impl` is `None`,
/// left to the parse of the body.
fn read_header(header: &TokenStream) -> Option<syn::ItemImpl> {
    syn::parse2::<syn::ItemImpl>(quote!(#header {})).ok()
}

pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let SetAttr { krate: default_krate, set_fn } = parse_attr(attr, &mut errors);
    if let Some(e) = crate::krate::not_a_dependency(default_krate.as_ref()) {
        errors.push(e);
    }

    // The header (`impl<..> Type where ..`) is emitted as written; the last brace group is the body.
    let mut header: Vec<TokenTree> = item.into_iter().collect();
    let body = match header.pop() {
        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => g,
        other => {
            let span = other.map_or(Span::call_site(), |t| t.span());
            return syn::Error::new(span, "`#[tool_set]` goes on an `impl` block")
                .to_compile_error();
        }
    };
    let header: TokenStream = header.into_iter().collect();
    let read = read_header(&header);
    if read.as_ref().is_some_and(|i| i.trait_.is_some()) {
        errors.at(
            &header,
            "`#[tool_set]` goes on an inherent `impl` block (`impl Payments { .. }`), not a trait impl",
        );
        // As written: a `tool_set` fn added to a trait impl would be a second error.
        let mut out = quote!(#header #body);
        if let Err(e) = errors.into_result() {
            out.extend(e.to_compile_error());
        }
        return out;
    }
    let borrowing = read.filter(crate::enclosing::impl_borrows);
    let (inner, entries) = match parse_entries.parse2(body.stream()) {
        Ok(parsed) => parsed,
        Err(e) => {
            errors.push(e);
            let mut out = quote!(#header #body);
            if let Err(e) = errors.into_result() {
                out.extend(e.to_compile_error());
            }
            return out;
        }
    };

    if let Some(item) = borrowing {
        return borrowing_set(
            &header,
            &set_fn,
            &item.self_ty,
            inner,
            entries,
            default_krate.as_ref(),
            errors,
        );
    }
    let krate = crate::krate::resolve(default_krate.as_ref());
    // The block's own fns and consts (one namespace) that no `#[cfg]` leaves out, by name: the
    // expansion adds `<tool>_tool` for each tool and `tool_set` to the block, which must not be
    // one of them (rustc's "duplicate definitions" would point at this attribute).
    let defined: Vec<(String, Span)> = entries.iter().filter_map(defined_name).collect();
    let mut items = Vec::new();
    let mut adds = Vec::new();
    // Each tool's name, where it is written, and the conditions of its `#[cfg(..)]`s.
    let mut names: Vec<(String, Span, Vec<TokenStream>)> = Vec::new();
    // Each tool's value as a method, `<method>_tool`, which the expansion adds.
    let mut factories: Vec<String> = Vec::new();
    let mut vis: Option<syn::Visibility> = None;
    // With whether the entry is a method left without its `cfg_attr`'s tool (below).
    let mut entries: std::collections::VecDeque<(Entry, bool)> =
        entries.into_iter().map(|e| (e, false)).collect();
    while let Some((entry, untooled)) = entries.pop_front() {
        let mut item = match entry {
            Entry::Other(tokens) => {
                items.push(tokens);
                continue;
            }
            Entry::Fn(item) => *item,
        };
        let conditional =
            || item.attrs.iter().enumerate().find_map(|(i, a)| conditional_tool(a).map(|c| (i, c)));
        let index = match item.attrs.iter().position(is_tool_attr) {
            Some(index) => Some(index),
            // `#[cfg_attr(feature = "x", tool(..))]`: rustc would apply the `tool` after this
            // block is read, as a tool outside the set. Expanded here: the tool under the
            // conditions (in the set under them too), the method as written without it under
            // their negation.
            None => conditional().map(|(i, (conditions, tool, rest))| {
                let mut plain = item.clone();
                match &rest {
                    Some(rest) => plain.attrs[i] = rest.clone(),
                    None => drop(plain.attrs.remove(i)),
                }
                plain.attrs.insert(0, syn::parse_quote!(#[cfg(not(all(#(#conditions),*)))]));
                // Read again: another `cfg_attr` may apply a `tool` under the negation
                // (`#[cfg_attr(not(feature = "x"), tool(..))]`), which rustc would apply outside
                // the set.
                entries.push_front((Entry::Fn(Box::new(plain)), true));
                match rest {
                    Some(rest) => item.attrs[i] = rest,
                    None => drop(item.attrs.remove(i)),
                }
                item.attrs.insert(0, syn::parse_quote!(#[cfg(all(#(#conditions),*))]));
                item.attrs.push(tool);
                item.attrs.len() - 1
            }),
        };
        let Some(index) = index else {
            // The block finds its tools by the attribute's name, so `#[tool]` imported under
            // another one (`use idem_core::tool as idem_tool;`) would still expand, outside the
            // set: a tool silently missing from `tool_set()`.
            if let Some(alias) = item.attrs.iter().find(|a| looks_like_tool(a)) {
                errors.at(
                    alias.path(),
                    "this looks like idem's `#[tool]` under another name: a `#[tool_set]` block finds its tools by the attribute's last name `tool`; write `#[tool(..)]` or `#[idem_core::tool(..)]` so that it joins the set",
                );
            }
            if untooled {
                // A parameter's doc comment and `#[idem(..)]` are the tool's to read; on a plain
                // method rustc refuses both.
                for arg in &mut item.sig.inputs {
                    if let syn::FnArg::Typed(pt) = arg {
                        pt.attrs
                            .retain(|a| !a.path().is_ident("doc") && !a.path().is_ident("idem"));
                    }
                }
            }
            items.push(quote!(#item));
            continue;
        };
        let tool_attr = item.attrs.remove(index);
        // Without `self`, `#[tool]` would expand as a free fn, whose items (a type alias, an
        // enum, an impl) cannot be in an `impl` block: say so once, and keep the fn as written.
        if !matches!(item.sig.inputs.first(), Some(syn::FnArg::Receiver(_))) {
            errors.at(
                &item.sig.ident,
                "a `#[tool]` in a `#[tool_set]` block is a method taking `&self` first; a tool that needs no state is a free `async fn` outside the block",
            );
            items.push(quote!(#item));
            continue;
        }
        let args = match &tool_attr.meta {
            syn::Meta::List(list) => list.tokens.clone(),
            _ => TokenStream::new(),
        };
        let factory = format!("{}_tool", item.sig.ident.unraw());
        if !has_cfg(&item.attrs)
            && let Some((_, other)) = defined.iter().find(|(name, _)| *name == factory)
        {
            // The typed call's shape, without the tool's items: this one error, and the block's
            // `factory` (which may be a tool too) is left as written.
            let method = item.sig.ident.unraw().to_string();
            let mut e = syn::Error::new(
                item.sig.ident.span(),
                format!(
                    "`#[tool]` adds the method `{factory}` beside `{method}` (the tool as a value, which `tool_set` holds), and this block already defines `{factory}`: rename one of the two (renamed, the tool keeps its name with `#[tool(name = \"{method}\", ..)]`)"
                ),
            );
            e.combine(syn::Error::new(*other, format!("the block's own `{factory}`")));
            items.push(crate::tool_stub(args, item, default_krate.as_ref(), Some(e)));
            continue;
        }
        // The attributes that decide whether the tool exists: `cfg`, and a `cfg_attr` applying
        // one (a `cfg_attr` applying anything else, such as `tracing::instrument`, has no place
        // on the statement that adds the tool to the set).
        let cfg: Vec<Attribute> = item
            .attrs
            .iter()
            .flat_map(crate::expand::split_cfg_attr)
            .filter(|(_, path)| path.is_ident("cfg"))
            .map(|(attr, _)| attr)
            .collect();
        let ident = item.sig.ident.clone();
        vis = Some(match vis.take() {
            None => item.vis.clone(),
            Some(v) => wider(v, &item.vis),
        });
        // The attribute's name: a span over the whole attribute shows only its `#` on stable.
        let attr_span = tool_attr.path().segments.last().map(|s| s.ident.span());
        let expanded = crate::tool_item(args, item, default_krate.as_ref(), attr_span);
        items.push(expanded.tokens);
        if let Some((name, span)) = expanded.tool {
            let conditions = cfg_conditions(&cfg);
            let clash = format!(
                "two tools of this block are named `{name}`: names select the tool and are part of every key, so give one of them `name = \"..\"`"
            );
            for (_, first, first_conditions) in names.iter().filter(|(n, ..)| *n == name) {
                if conditions.is_empty() && first_conditions.is_empty() {
                    let mut e = syn::Error::new(span, &clash);
                    e.combine(syn::Error::new(*first, format!("the first tool named `{name}`")));
                    errors.push(e);
                } else {
                    // Under `#[cfg]`s the two may never be compiled together (a feature and its
                    // negation): the error stands only where both are.
                    adds.push(quote_spanned! {span=>
                        #[cfg(all(#(#first_conditions,)* #(#conditions,)*))]
                        ::core::compile_error!(#clash);
                    });
                }
            }
            names.push((name, span, conditions));
            let factory_ident = format_ident!("{factory}", span = ident.span());
            factories.push(factory);
            adds.push(quote! {
                #(#cfg)*
                // Names are checked above (valid, unique); an arguments schema no model API
                // accepts is known only now: kept as the set's refusal, logged, and said on a call.
                set.add_or_keep_refusal(Self::#factory_ident(self));
            });
        }
    }
    let list = names.iter().map(|(n, ..)| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    let doc = format!(
        " The tools of this block as one tool set: {list}. Every call goes through idem's protocol. A tool whose arguments' schema model APIs refuse (`ToolSetError`) is left out: logged at error level, listed by `ToolSet::refusals`, and a call of it says why."
    );
    let vis = vis.unwrap_or(syn::Visibility::Inherited);
    let set_name = set_fn.unraw().to_string();
    let factory_clash = factories.contains(&set_name);
    let tool_set_fn = match defined.iter().find(|(name, _)| *name == set_name) {
        // The block's own `tool_set` is kept (its callers reach it), without the set's.
        Some((_, at)) => {
            errors.spanned(
                *at,
                format!(
                    "`#[tool_set]` adds the method `{set_name}` (the block's tools as one set) to this block, which already has an item of that name: rename this one, or name the set's method with `#[tool_set(fn_name = \"..\")]`"
                ),
            );
            quote!()
        }
        None if factory_clash => {
            errors.spanned(
                set_fn.span(),
                format!(
                    "`{set_name}` is also the name `#[tool]` gives a tool of this block as a value (`<method>_tool`): name the set's method otherwise"
                ),
            );
            quote!()
        }
        None => quote! {
            #[doc = #doc]
            #vis fn #set_fn(self: &::std::sync::Arc<Self>) -> #krate::ToolSet
            where
                Self: ::core::marker::Send + ::core::marker::Sync + 'static,
            {
                let mut set = #krate::ToolSet::new();
                #(#adds)*
                set
            }
        },
    };
    let errors = errors.into_result().err().map(|e| e.to_compile_error());
    quote! {
        #header {
            #(#inner)*
            #(#items)*

            #tool_set_fn
        }
        #errors
    }
}

/// The block of a type that borrows, with one error at the type: a tool set holds an `Arc<Self>`
/// for as long as it serves calls, which a borrow cannot outlive. Each tool keeps its typed
/// call's shape and `tool_set` is kept (empty, never reached), so that their callers add no
/// error.
fn borrowing_set(
    header: &TokenStream,
    set_fn: &syn::Ident,
    self_ty: &syn::Type,
    inner: Vec<Attribute>,
    entries: Vec<Entry>,
    default_krate: Option<&syn::Path>,
    mut errors: Errors,
) -> TokenStream {
    errors.at(
        self_ty,
        "`#[tool_set]` on a type that borrows: the set holds an `Arc<Self>` for as long as it serves calls, so `Self` must be `'static` and name no lifetime parameter; give the type owned data (`String`, `Arc<T>`) instead of references, or write the block for `'static` borrows (`impl Type<'static>`)",
    );
    // The block's own `tool_set` is kept, and none added (a second error).
    let set_name = set_fn.unraw().to_string();
    let own_tool_set = entries.iter().filter_map(defined_name).any(|(name, _)| name == set_name);
    // Each tool keeps its typed call's shape (`tool_stub`), with no error of its own.
    let items = entries.into_iter().map(|entry| match entry {
        Entry::Other(tokens) => tokens,
        Entry::Fn(mut item) => match item.attrs.iter().position(is_tool_attr) {
            Some(index) => {
                let attr = item.attrs.remove(index);
                let args = match &attr.meta {
                    syn::Meta::List(list) => list.tokens.clone(),
                    _ => TokenStream::new(),
                };
                crate::tool_stub(args, *item, default_krate, None)
            }
            None => quote!(#item),
        },
    });
    let krate = crate::krate::resolve(default_krate);
    let tool_set = (!own_tool_set).then(|| {
        quote! {
            #[allow(dead_code)]
            pub fn #set_fn(self: &::std::sync::Arc<Self>) -> #krate::ToolSet {
                #krate::ToolSet::new()
            }
        }
    });
    let errors = errors.into_result().err().map(|e| e.to_compile_error());
    quote! {
        #header {
            #(#inner)*
            #(#items)*

            #tool_set
        }
        #errors
    }
}

/// Whether an item has a `#[cfg]` of its own (a `#[cfg_attr]` may add one too): it may be left
/// out of a build, where a name it shares is no clash.
fn has_cfg(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") || a.path().is_ident("cfg_attr"))
}

/// The name an entry defines in the block's value namespace, where the expansion adds fns, and
/// where it is written; none for a type or an item under a `#[cfg]`.
fn defined_name(entry: &Entry) -> Option<(String, Span)> {
    let (attrs, ident) = match entry {
        Entry::Fn(item) => (item.attrs.clone(), item.sig.ident.clone()),
        Entry::Other(tokens) => match syn::parse2::<syn::ImplItem>(tokens.clone()).ok()? {
            syn::ImplItem::Const(c) => (c.attrs, c.ident),
            _ => return None,
        },
    };
    (!has_cfg(&attrs)).then(|| (ident.unraw().to_string(), ident.span()))
}
