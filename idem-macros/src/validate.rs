//! Validate: checks the fn and the options together and builds the model `expand` works from.
//! Every mistake is collected and reported at once, each spanned at the user's code.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Type};

use crate::parse::{Attr, Class, Errors, ParamAttr};

/// The most parameters a tool may have: `idem_core::__private::MAX_PARAMS`.
const MAX_PARAMS: usize = 16;

/// The shortest `ttl`: `idem_core::MIN_TTL`.
const MIN_TTL: Duration = Duration::from_secs(1);

/// The shortest `lease`: `idem_core::MIN_LEASE`.
const MIN_LEASE: Duration = Duration::from_millis(100);

/// A parameter that becomes a field of the tool's arguments.
pub struct Param {
    pub ident: Ident,
    pub ty: Type,
    /// Marked `#[idem(skip)]` (or named in `skip(..)`): an argument, not part of the key.
    pub skip: bool,
    /// Marked `#[idem(skip_if_none)]`: part of the key unless it is `None`.
    pub skip_if_none: bool,
    /// Marked `#[idem(flatten)]`: a struct whose fields are the tool's arguments.
    pub flatten: bool,
    /// The parameter's `///` lines: its JSON Schema `description`.
    pub docs: Vec<syn::Expr>,
}

/// The return type: `Result<ok, err>` when written that way, else an alias resolved through
/// `idem_core::__private::ToolReturn`.
pub struct Ret {
    pub ty: Type,
    pub ok: Option<Type>,
    pub err: Option<Type>,
}

/// Options with values, ready to emit.
#[derive(Default)]
pub struct Options {
    pub attempts: Option<u32>,
    pub timeout: Option<Duration>,
    pub deadline: Option<Duration>,
    pub lease: Option<Duration>,
    pub ttl: Option<Duration>,
}

/// Everything `expand` needs.
pub struct Model {
    /// The user's fn, `#[idem(..)]` markers removed.
    pub item: ItemFn,
    pub class: Class,
    /// The stable name (key and model-facing).
    pub name: String,
    /// The name is given (`name = ".."`), not the fn's own: declared deliberately, it may be
    /// shared with another declaration (a tool renamed or rewritten, in one process).
    pub named: bool,
    /// A `&'static str` expression: `description = ".."`, or the doc comment's text.
    pub description: TokenStream,
    /// The path idem-core is reached at (`::idem_core`, `::idem`, or `crate = ".."`).
    pub krate: TokenStream,
    pub options: Options,
    /// A method taking `&self`.
    pub method: bool,
    /// The context parameter's name, if declared.
    pub ctx: Option<Ident>,
    pub params: Vec<Param>,
    pub ret: Ret,
    /// `reconcile = check`, when valid: the path as written.
    pub reconcile: Option<syn::Path>,
    /// The signature is sound (errors, if any, are in the options): the full expansion can be
    /// emitted next to the errors, so call sites and the tool value type-check.
    pub shape_ok: bool,
}

/// Removes the parameters' `#[idem(..)]` markers from `item` (also done on failure, so the fn
/// emitted as is does not add "cannot find attribute `idem`" to the real error).
/// A parameter under a refused `#[cfg]` is removed as well.
pub fn take_param_attrs(item: &mut ItemFn, errors: &mut Errors) -> Vec<ParamAttr> {
    let inputs = std::mem::take(&mut item.sig.inputs);
    let mut attrs = Vec::with_capacity(inputs.len());
    for mut arg in inputs {
        let pattr = match &mut arg {
            FnArg::Typed(pt) => ParamAttr::take(&mut pt.attrs, errors),
            FnArg::Receiver(r) => ParamAttr::take(&mut r.attrs, errors),
        };
        if !pattr.cfg {
            item.sig.inputs.push(arg);
            attrs.push(pattr);
        }
    }
    attrs
}

/// Removes a second `#[tool(..)]` from `item` (any path ending in `tool`, as `#[tool_set]`
/// finds them), with one error at it: left on the fn, it would go on the body, which it would
/// expand as a tool of its own, and the errors would be about that.
pub fn take_second_tool_attr(item: &mut ItemFn, errors: &mut Errors) {
    let fn_name = item.sig.ident.unraw().to_string();
    item.attrs.retain(|attr| {
        let is_tool = attr.path().segments.last().is_some_and(|s| s.ident == "tool");
        if is_tool {
            errors.at(
                attr.path(),
                format!("`#[tool]` is given twice on `{fn_name}`; keep one, with all its options"),
            );
        }
        !is_tool
    });
}

/// One error at `value` when it is set below `min` (written `min_text`): `why` says what the
/// shortest is for, `default` what the option is when left out.
fn too_short(
    errors: &mut Errors,
    option: &str,
    value: Option<&crate::parse::DurationOpt>,
    (min, min_text): (Duration, &str),
    why: &str,
    default: &str,
) {
    if let Some(value) = value
        && value.value < min
    {
        errors.spanned(
            value.lit.span(),
            format!(
                "`{option} = {:?}` is shorter than {min_text}, {why}. Write at least {option} = \"{min_text}\" (the default is \"{default}\")",
                value.lit.value()
            ),
        );
    }
}

/// Checks `item` against `attr`.
pub fn validate(
    attr: Attr,
    item: ItemFn,
    param_attrs: Vec<ParamAttr>,
    errors: &mut Errors,
) -> Option<Model> {
    let krate = crate::krate::resolve(attr.krate.as_ref());
    let krate_names = crate::krate::names(attr.krate.as_ref());
    let sig = &item.sig;
    let fn_name = sig.ident.unraw().to_string();

    let class = match &attr.retry {
        Some((class, _)) => *class,
        None if attr.retry_written => Class::Safe,
        None => {
            errors.spanned(
                attr.span.unwrap_or_else(Span::call_site),
                format!(
                    "tool `{fn_name}` must declare how it may be retried: #[tool(retry = \"safe\" | \"keyed\" | \"never\")]"
                ),
            );
            Class::Safe
        }
    };

    let before_shape = errors.len();
    // `fn f() -> impl Future<Output = ..>`: one mistake, said once (not also "must return
    // Result").
    let returns_impl =
        matches!(&sig.output, ReturnType::Type(_, ty) if matches!(**ty, Type::ImplTrait(_)));
    if sig.asyncness.is_none() {
        let hint =
            if returns_impl { ", returning the future's output (`-> Result<T, E>`)" } else { "" };
        errors.spanned(
            sig.fn_token.span,
            format!("`#[tool]` needs an `async fn`: write `async fn {fn_name}(..)`{hint}"),
        );
    }
    if let Some(c) = &sig.constness {
        errors.spanned(c.span, "`#[tool]` does not support `const fn`");
    }
    if let syn::Safety::Unsafe(u) = &sig.safety {
        errors.spanned(u.span, "`#[tool]` does not support `unsafe fn`: a model can call a tool");
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi.span(), "`#[tool]` does not support `extern` fns");
    }
    if let Some(v) = &sig.variadic {
        errors.spanned(v.span(), "`#[tool]` does not support variadic parameters");
    }
    let only_lifetimes = sig.generics.where_clause.is_none()
        && sig.generics.params.iter().all(|p| matches!(p, syn::GenericParam::Lifetime(_)));
    if !sig.generics.params.is_empty() && only_lifetimes {
        errors.at(
            &sig.generics,
            "`#[tool]` does not support lifetime parameters: a tool's future outlives the call that started it (retries, duplicates that join), so its arguments own their data (`String`, not `&'a str`) and a method takes plain `&self`",
        );
    } else if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        let why = "`#[tool]` does not support generic parameters or where clauses: arguments are deserialized from the model's JSON into concrete types, so use concrete types";
        // `Generics` writes no tokens for a where clause alone: the error would land on the
        // attribute.
        match &sig.generics.where_clause {
            // A clause without predicates (`where {}`) writes no tokens either: at its keyword.
            Some(clause) if sig.generics.params.is_empty() && clause.predicates.is_empty() => {
                errors.spanned(clause.where_token.span, why)
            }
            Some(clause) if sig.generics.params.is_empty() => errors.at(clause, why),
            _ => errors.at(&sig.generics, why),
        }
    }

    let named = attr.name.is_some();
    let name = match &attr.name {
        Some(lit) => {
            let name = lit.value();
            if let Err(why) = check_name(&name) {
                errors.spanned(lit.span(), why);
            }
            name
        }
        None => {
            if let Err(why) = check_name(&fn_name) {
                errors.spanned(
                    sig.ident.span(),
                    format!("{why}; or give a stable name: #[tool(name = \"..\")]"),
                );
            }
            fn_name.clone()
        }
    };

    if class == Class::Never
        && let Some((n, lit)) = &attr.attempts
        && *n > 1
    {
        errors.spanned(
            lit.span(),
            format!(
                "a `never` tool runs exactly one attempt: remove `attempts = {n}`, or declare retry = \"keyed\" if the provider deduplicates by the idempotency key"
            ),
        );
    }

    // The lease is renewed every third of it while the tool runs: a shorter one than the
    // executor keeps would lapse between renewals and let a duplicate run beside the tool.
    let lease_why = "the shortest lease idem keeps: it is renewed every third of it while the tool runs, and a shorter one would lapse between renewals and let a duplicate run beside the tool";
    too_short(errors, "lease", attr.lease.as_ref(), (MIN_LEASE, "100ms"), lease_why, "30s");
    // A result is kept for the repeats that come seconds to hours later: one kept for less is
    // not replayed, and a never tool's repeat would run its effect again.
    let ttl_why = "the shortest retention idem keeps: a result is kept so that repeats, which come seconds to hours later, replay it, and a `never` tool's repeat would otherwise run its effect again";
    too_short(errors, "ttl", attr.ttl.as_ref(), (MIN_TTL, "1s"), ttl_why, "24h");

    // The deadline bounds every attempt, so a longer timeout would never apply: the author
    // likely swapped the two, or expects a timeout that never fires.
    if let (Some(timeout), Some(deadline)) = (&attr.timeout, &attr.deadline)
        && timeout.value > deadline.value
    {
        let (t, d) = (timeout.lit.value(), deadline.lit.value());
        errors.spanned(
            timeout.lit.span(),
            format!(
                "`timeout = {t:?}` is longer than `deadline = {d:?}`: the deadline bounds the whole call, every attempt included, so this timeout could never end an attempt. Write a timeout of at most {d:?} (one attempt), or a deadline longer than {t:?}"
            ),
        );
    }

    let reconcile = match attr.reconcile {
        Some(path) if class == Class::Safe => {
            errors.at(
                &path,
                "a `safe` tool runs again when its outcome is unknown, so it has nothing to reconcile: `reconcile` applies to `keyed` and `never` tools",
            );
            None
        }
        other => other,
    };

    let mut shape_errors = errors.len() - before_shape;
    let before_params = errors.len();
    let mut method = false;
    let mut ctx: Option<Ident> = None;
    let mut params = Vec::new();
    for (index, (arg, pattr)) in sig.inputs.iter().zip(&param_attrs).enumerate() {
        match arg {
            FnArg::Receiver(r) => {
                let markers = [pattr.skip, pattr.skip_if_none, pattr.ctx, pattr.flatten];
                for span in markers.into_iter().flatten() {
                    errors.spanned(span, "the receiver is not an argument; remove this marker");
                }
                let by_mut_ref = matches!(r.kind, syn::ReceiverKind::Reference(_, _, Some(_)));
                if let syn::ReceiverKind::Typed(..) = &r.kind {
                    errors.at(
                        r,
                        "write the receiver as `&self`: `#[tool]` methods take `&self` in its short form (the tool holds its receiver in an `Arc` and lends it to every attempt and duplicate), not `self: ..`",
                    );
                } else if !matches!(r.kind, syn::ReceiverKind::Reference(..)) {
                    errors.at(
                        r,
                        "`#[tool]` methods take `&self`: the tool holds its receiver in an `Arc` and calls it for every attempt and duplicate",
                    );
                } else if by_mut_ref {
                    errors.at(
                        r,
                        "`#[tool]` methods take `&self`, not `&mut self`: retries and concurrent duplicates share the receiver; keep state behind a `Mutex`",
                    );
                }
                method = true;
            }
            FnArg::Typed(pt) => {
                let ident = match &*pt.pat {
                    Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                        pi.ident.clone()
                    }
                    // An unused context (`_: &Ctx`): it is not an argument, so it needs no name.
                    Pat::Wild(w)
                        if pattr.ctx.is_some()
                            || matches!(ctx_shape(&pt.ty, &krate_names), CtxShape::Ref) =>
                    {
                        Ident::new("__idem_cx", w.underscore_token.span)
                    }
                    other => {
                        errors.at(
                            other,
                            "tool parameters must be plain names, which become the fields of the JSON arguments: write `name: Type`",
                        );
                        continue;
                    }
                };
                let shape = match ctx_shape(&pt.ty, &krate_names) {
                    CtxShape::No if pattr.ctx.is_some() => match &*pt.ty {
                        Type::Reference(r) if r.mutability.is_none() => CtxShape::Ref,
                        _ => CtxShape::Other,
                    },
                    shape => shape,
                };
                match shape {
                    CtxShape::Ref => {
                        if let Some(span) = pattr.flatten {
                            errors.spanned(
                                span,
                                "the context is not an argument; remove `#[idem(flatten)]`",
                            );
                        }
                        let first = index == usize::from(method);
                        for (span, marker) in
                            [(pattr.skip, "skip"), (pattr.skip_if_none, "skip_if_none")]
                        {
                            if let Some(span) = span {
                                errors.spanned(
                                    span,
                                    format!(
                                        "the context parameter `{ident}` is never part of the key; remove `#[idem({marker})]`"
                                    ),
                                );
                            }
                        }
                        if ctx.is_some() {
                            errors.at(pt, "only one context parameter is allowed");
                        } else if !first {
                            errors.at(
                                pt,
                                format!(
                                    "the context parameter comes first: `{}{ident}: &Ctx, ..`",
                                    if method { "&self, " } else { "" }
                                ),
                            );
                        }
                        // Lent to the body for one attempt: a `'static` borrow cannot be
                        // given, and rustc would say so about the generated code's names.
                        if let Type::Reference(r) = &*pt.ty
                            && let Some(lifetime) =
                                r.lifetime.as_ref().filter(|l| l.ident == "static")
                        {
                            errors.at(
                                lifetime,
                                format!(
                                    "the context is lent to the tool for one attempt, not for `'static`: take it as `{ident}: &Ctx`, and copy what must outlive the attempt (`{ident}.key().to_owned()`)"
                                ),
                            );
                        }
                        ctx = Some(ident);
                        continue;
                    }
                    CtxShape::Other => {
                        errors.at(
                            &pt.ty,
                            format!("take the context by shared reference: `{ident}: &Ctx`"),
                        );
                        continue;
                    }
                    CtxShape::No => {}
                }
                // A name Anthropic's API refuses fails every request that lists the tool; the
                // set would refuse it at run time (`ToolSetError::InvalidArgumentName`), and a
                // parameter cannot be renamed with serde's `rename`.
                let published = ident.unraw().to_string();
                if pattr.flatten.is_none() && !valid_argument_name(&published) {
                    errors.spanned(
                        ident.span(),
                        format!(
                            "tool parameter `{published}` becomes an argument name that Anthropic's API refuses for the whole request ({}): name it with 1 to 64 ASCII letters, digits or `_`",
                            if published.is_ascii() {
                                format!("it is {} characters long", published.len())
                            } else {
                                "it is not ASCII".to_owned()
                            }
                        ),
                    );
                }
                if let Some(it) = find_impl_trait(&pt.ty) {
                    errors.at(
                        it,
                        "`impl Trait` cannot be a tool argument: arguments are deserialized from the model's JSON, so use a concrete type",
                    );
                } else if let Type::Reference(r) = &*pt.ty {
                    errors.at(
                        r,
                        format!(
                            "tool parameter `{ident}` borrows: arguments are deserialized from JSON and stored, so take an owned type (`String` instead of `&str`, `Vec<T>` instead of `&[T]`)"
                        ),
                    );
                } else if method && mentions_self(&pt.ty) {
                    errors.at(
                        &pt.ty,
                        "a method tool's parameter types cannot mention `Self`: name the type",
                    );
                } else if pattr.skip.is_none()
                    && let Some(set) = find_hash_set(&pt.ty)
                {
                    errors.at(
                        set,
                        format!(
                            "tool parameter `{ident}` holds a `HashSet`, which lists its members in another order in every copy, so the same arguments would get another key on every call and run again; declare it a `BTreeSet` (or a `Vec` in an order of your own), or mark it `#[idem(skip)]` if it is not part of the intent"
                        ),
                    );
                }
                if let Some(span) = pattr.skip_if_none {
                    if pattr.skip.is_some() {
                        errors.spanned(
                            span,
                            format!(
                                "`{ident}` is already left out of the key by `#[idem(skip)]`; keep one of the two"
                            ),
                        );
                    } else if pattr.flatten.is_some() {
                        errors.spanned(
                            span,
                            "a flattened parameter is the tool's whole intent; mark its optional fields `#[serde(skip_serializing_if = \"Option::is_none\")]` instead",
                        );
                    } else if !crate::expand::is_option(&pt.ty) {
                        errors.at(
                            &pt.ty,
                            format!(
                                "`#[idem(skip_if_none)]` leaves `{ident}` out of the key when it is `None`, so its type must be written `Option<..>`"
                            ),
                        );
                    }
                }
                params.push(Param {
                    ident,
                    ty: (*pt.ty).clone(),
                    skip: pattr.skip.is_some(),
                    skip_if_none: pattr.skip_if_none.is_some(),
                    flatten: pattr.flatten.is_some(),
                    docs: pattr.docs.clone(),
                });
            }
        }
    }

    if let Some(flat) = params.iter().find(|p| p.flatten) {
        if params.len() > 1 {
            errors.spanned(
                flat.ident.span(),
                format!(
                    "`#[idem(flatten)]` makes the fields of `{}` the tool's arguments, so it must be the tool's only parameter (the context aside): move the other parameters into the struct",
                    flat.ident
                ),
            );
        }
        if flat.skip {
            errors.spanned(
                flat.ident.span(),
                "a flattened parameter is the tool's whole intent; it cannot be skipped",
            );
        }
    }

    // A free tool's generated `..Args`/`..Tool` items would collide with a type of the same name
    // taken as an argument (often the user's own arguments struct): one error here, instead of
    // rustc's "defined multiple times" and three errors about the generated code.
    if !method {
        let base = crate::expand::camel(&sig.ident);
        let generated = [format!("{base}Args"), format!("{base}Tool")];
        // The module's own type of a generated name (`SearchArgs`, `self::SearchArgs`), which
        // the generated one would clash with: a parameter's type or one inside it
        // (`Vec<SearchArgs>`), or inside the return type.
        let named = |t: &Type| {
            matches!(t, Type::Path(tp) if tp.qself.is_none()
                && tp.path.leading_colon.is_none()
                && tp.path.segments.iter().rev().skip(1).all(|s| s.ident == "self")
                && tp.path.segments.last().is_some_and(|last| generated.iter().any(|g| last.ident == g)))
        };
        let output = match &sig.output {
            syn::ReturnType::Type(_, ty) => Some((&**ty, false)),
            syn::ReturnType::Default => None,
        };
        let typed = params.iter().filter(|p| !p.flatten).map(|p| (&p.ty, true));
        for (ty, is_param) in typed.chain(output) {
            let mut clash = None;
            visit_types(ty, &mut |t| {
                if named(t) {
                    clash.get_or_insert_with(|| t.clone());
                }
            });
            let Some(clash) = clash else { continue };
            let advice = if is_param && named(ty) {
                "mark the parameter `#[idem(flatten)]` if its fields are the tool's arguments, or rename the type".to_owned()
            } else {
                format!(
                    "rename the type, or the fn (keeping the tool's name with `#[tool(name = \"{name}\", ..)]`)"
                )
            };
            errors.at(
                &clash,
                format!(
                    "`#[tool]` generates `{base}Args` and `{base}Tool` for `{fn_name}`, so a type of that name here would be defined twice: {advice}"
                ),
            );
        }
    }

    // The generic arguments type in idem-core is implemented for tuples of up to 16 elements.
    if let Some(extra) = params.get(MAX_PARAMS) {
        errors.spanned(
            extra.ident.span(),
            format!(
                "tool `{fn_name}` has {} parameters; `#[tool]` supports at most {MAX_PARAMS} (the context not counted): group related ones in a struct deriving Serialize, Deserialize, JsonSchema and Clone",
                params.len()
            ),
        );
    }

    shape_errors += errors.len() - before_params;
    for skipped in &attr.skip {
        // `skip(type)` or `skip(r#type)` for a parameter `r#type`: the name without `r#` is the
        // argument's JSON name, which is what is skipped.
        let named = |ident: &Ident| ident.unraw() == skipped.unraw();
        if ctx.as_ref().is_some_and(named) {
            errors.spanned(
                skipped.span(),
                format!(
                    "the context parameter `{skipped}` is never part of the key; remove it from `skip(..)`"
                ),
            );
        } else if let Some(p) = params.iter_mut().find(|p| named(&p.ident)) {
            if p.skip {
                errors.spanned(skipped.span(), format!("`{skipped}` is skipped twice; keep one"));
            } else if p.skip_if_none {
                errors.spanned(
                    skipped.span(),
                    format!(
                        "`{skipped}` is marked `#[idem(skip_if_none)]` and named in `skip(..)`; keep one of the two"
                    ),
                );
            }
            p.skip = true;
        } else {
            errors.spanned(
                skipped.span(),
                format!("cannot skip `{skipped}`: tool `{fn_name}` has no parameter of that name"),
            );
        }
    }

    let ret = match &sig.output {
        // The output and the error are named in the tool's type and stored: no opaque type.
        ReturnType::Type(_, ty)
            if !(returns_impl && sig.asyncness.is_none())
                && let Some(it) = find_impl_trait(ty) =>
        {
            errors.at(
                it,
                "`impl Trait` cannot be in a tool's return type: the output and the error are part of the tool's type, stored as JSON and replayed to every repeat, so write the concrete type",
            );
            None
        }
        ReturnType::Type(_, ty) if names_a_result(ty) => {
            let ret = split_result(ty);
            // One error naming what to use instead: rustc's own, for a type with a trait object
            // in it, is its raw E0599 listing every unmet bound.
            let unstorable = match &ret.err {
                Some(err) => unstorable_error(err).map(|what| (err, what)),
                None => unstorable_result_alias(ty).map(|what| (ty.as_ref(), what)),
            };
            match unstorable {
                Some((at, what)) => {
                    errors.at(at, format!(
                        "{what} cannot be a tool error: a tool's error is stored as JSON and replayed to every repeat, and says whether a failure may be retried (`idem_core::Classify`). Return `Result<T, idem_core::ToolFailure>` (`?` converts any `std::error::Error` into an ambiguous failure{}), or an error type of your own that derives `serde::Serialize` and `serde::Deserialize` and implements `Classify`{}",
                        if what.starts_with("`String`") || what.starts_with("`&str`") {
                            "; a string says nothing about whether the failure may be retried, and `Classify` cannot be implemented for it outside idem: `.map_err(idem_core::ToolFailure::permanent)` (or `transient`, `ambiguous`, as the failure is), or `Err(ToolFailure::permanent(\"..\"))`"
                        } else if CATCH_ALL_ERRORS.iter().any(|(k, _)| what.starts_with(&format!("`{k}::"))) {
                            "; this one is not a `std::error::Error`: `.map_err(idem_core::ToolFailure::ambiguous)`"
                        } else {
                            ""
                        },
                        if what.contains("std::error::Error") {
                            " (if this `Error` is a trait of your own, write its path: `crate::Error`)"
                        } else {
                            ""
                        }
                    ));
                    None
                }
                None => Some(ret),
            }
        }
        _ if returns_impl && sig.asyncness.is_none() => None,
        other => {
            let msg = format!(
                "tool `{fn_name}` must return `Result<T, E>` (or an alias named `..Result`): `T` is stored and replayed to every repeat, `E` implements `idem_core::Classify`"
            );
            match other {
                ReturnType::Type(_, ty) => errors.at(ty, msg),
                ReturnType::Default => errors.spanned(sig.ident.span(), msg),
            }
            None
        }
    };

    let options = Options {
        attempts: attr.attempts.map(|(n, _)| n),
        timeout: attr.timeout.map(|d| d.value),
        deadline: attr.deadline.map(|d| d.value),
        lease: attr.lease.map(|d| d.value),
        ttl: attr.ttl.map(|d| d.value),
    };
    let description = match &attr.description {
        Some(lit) => quote::quote!(#lit),
        None => crate::docs::text_expr(&crate::docs::doc_values(&item.attrs), &krate),
    };
    let ret = ret?;
    let shape_ok = shape_errors == 0;
    Some(Model {
        item,
        class,
        name,
        named,
        description,
        krate,
        options,
        method,
        ctx,
        params,
        ret,
        reconcile,
        shape_ok,
    })
}

/// What `ToolSet` accepts as a top-level argument name (`^[a-zA-Z0-9_.-]{1,64}$`, Anthropic's
/// rule for property keys).
fn valid_argument_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Tool names must be usable by every agent protocol: OpenAI function names are
/// `^[a-zA-Z0-9_-]{1,64}$`, and MCP (spec 2025-11-25, "Tool names") allows a superset.
fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if name.is_empty() || name.len() > 64 || !ok_chars {
        let why = if name.is_empty() {
            "it is empty".to_owned()
        } else if !ok_chars {
            let bad = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')));
            format!("{:?} is not allowed", bad.unwrap_or_default())
        } else {
            format!("it is {} characters long", name.len())
        };
        return Err(format!(
            "tool name {name:?} is not usable by agents ({why}): use 1 to 64 ASCII letters, digits, `_` or `-` (OpenAI function names; MCP tool names)"
        ));
    }
    Ok(())
}

pub(crate) enum CtxShape {
    /// `&Ctx`
    Ref,
    /// `&mut Ctx`, or a marked parameter that is not a shared reference
    Other,
    No,
}

/// The context parameter, unmarked: a shared reference to `Ctx`, `idem_core::Ctx` or
/// `<idem-core's name>::Ctx`, as written, or a path through a re-export ending in
/// `idem_core::Ctx`. Any other path ending in `Ctx` (a type of the user's)
/// is an ordinary parameter; `#[idem(ctx)]` marks the context under any other spelling.
fn is_ctx_path(ty: &Type, krate_names: &[Vec<String>]) -> bool {
    match ty {
        Type::Path(tp) if tp.qself.is_none() => {
            let segments: Vec<&syn::PathSegment> = tp.path.segments.iter().collect();
            let Some((last, prefix)) = segments.split_last() else { return false };
            if last.ident != "Ctx" || !last.arguments.is_empty() {
                return false;
            }
            let prefix: Vec<String> = prefix.iter().map(|s| s.ident.to_string()).collect();
            // `facade::idem_core::Ctx`: idem-core reached through a crate that re-exports it.
            (prefix.is_empty() && tp.path.leading_colon.is_none())
                || krate_names.contains(&prefix)
                || prefix.last().is_some_and(|s| s == "idem_core")
        }
        Type::Paren(p) => is_ctx_path(&p.elem, krate_names),
        Type::Group(g) => is_ctx_path(&g.elem, krate_names),
        _ => false,
    }
}

pub(crate) fn ctx_shape(ty: &Type, krate_names: &[Vec<String>]) -> CtxShape {
    match ty {
        Type::Reference(r) if is_ctx_path(&r.elem, krate_names) => {
            if r.mutability.is_some() {
                CtxShape::Other
            } else {
                CtxShape::Ref
            }
        }
        _ => CtxShape::No,
    }
}

pub(crate) fn find_impl_trait(ty: &Type) -> Option<syn::TypeImplTrait> {
    let mut found = None;
    visit_types(ty, &mut |t| {
        if let Type::ImplTrait(it) = t {
            found.get_or_insert_with(|| it.clone());
        }
    });
    found
}

/// The first `HashSet` written in `ty` (`HashSet<T>`, `Option<HashSet<T>>`, any path ending in
/// `HashSet`): its members' order differs between two copies, so it cannot be part of a key
/// (docs/key-spec.md, "Sets"). One behind an alias or inside a type of the application's own is
/// not seen here, and is refused when the call is made.
fn find_hash_set(ty: &Type) -> Option<Type> {
    let mut found = None;
    visit_types(ty, &mut |t| {
        if let Type::Path(tp) = t
            && tp.path.segments.last().is_some_and(|s| s.ident == "HashSet")
        {
            found.get_or_insert_with(|| t.clone());
        }
    });
    found
}

fn mentions_self(ty: &Type) -> bool {
    fn walk(ts: proc_macro2::TokenStream) -> bool {
        ts.into_iter().any(|tt| match tt {
            proc_macro2::TokenTree::Ident(i) => i == "Self",
            proc_macro2::TokenTree::Group(g) => walk(g.stream()),
            _ => false,
        })
    }
    walk(quote::ToTokens::to_token_stream(ty))
}

/// Calls `f` on `ty` and on the types nested in it (generic arguments, tuples, arrays).
fn visit_types(ty: &Type, f: &mut dyn FnMut(&Type)) {
    f(ty);
    match ty {
        Type::Array(a) => visit_types(&a.elem, f),
        Type::Slice(s) => visit_types(&s.elem, f),
        Type::Group(g) => visit_types(&g.elem, f),
        Type::Paren(p) => visit_types(&p.elem, f),
        Type::Ptr(p) => visit_types(&p.elem, f),
        Type::Reference(r) => visit_types(&r.elem, f),
        Type::Tuple(t) => t.elems.iter().for_each(|e| visit_types(e, f)),
        Type::Path(p) => {
            for seg in &p.path.segments {
                if let syn::PathArguments::AngleBracketed(args) = &seg.arguments {
                    for arg in &args.args {
                        if let syn::GenericArgument::Type(t) = arg {
                            visit_types(t, f);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// A path whose last segment ends in `Result`: `Result<T, E>`, `io::Result<T>`, `PayResult<T>`.
fn names_a_result(ty: &Type) -> bool {
    match ty {
        Type::Path(tp) => {
            tp.path.segments.last().is_some_and(|s| s.ident.to_string().ends_with("Result"))
        }
        Type::Paren(p) => names_a_result(&p.elem),
        Type::Group(g) => names_a_result(&g.elem),
        _ => false,
    }
}

/// The crates whose catch-all error types cannot be a tool's error (no `Serialize`, and
/// `Classify` cannot be implemented for a foreign type), with those types' names.
const CATCH_ALL_ERRORS: [(&str, &str); 3] =
    [("anyhow", "Error"), ("eyre", "Report"), ("color_eyre", "Report")];

/// How to name an error type that can never be a tool's error: a trait object of an `Error`
/// trait (`Box<dyn Error + Send + Sync>`: `Classify` cannot be implemented for it outside
/// idem-core), or a catch-all crate's error (`anyhow::Error`).
fn unstorable_error(ty: &Type) -> Option<String> {
    match ty {
        Type::Paren(p) => unstorable_error(&p.elem),
        Type::Group(g) => unstorable_error(&g.elem),
        Type::TraitObject(object) if names_error_trait(object.bounds.iter()) => {
            Some("a trait object of `std::error::Error`".into())
        }
        Type::Reference(r) if matches!(&*r.elem, Type::Path(p) if p.path.is_ident("str")) => {
            Some("`&str`".into())
        }
        Type::Path(tp) if tp.qself.is_none() => {
            let segments: Vec<_> = tp.path.segments.iter().collect();
            // `String` as it is written (bare or by its std path): a string says nothing about
            // the failure, and no crate but idem may implement `Classify` for it.
            let names: Vec<String> = segments.iter().map(|s| s.ident.to_string()).collect();
            if segments.iter().all(|s| s.arguments.is_none())
                && matches!(
                    names.iter().map(String::as_str).collect::<Vec<_>>()[..],
                    ["String"] | ["std" | "alloc", "string", "String"]
                )
            {
                return Some("`String`".into());
            }
            // Exactly `anyhow::Error` (or `::anyhow::Error`): a type of that name elsewhere may
            // be the application's own.
            if let [krate, last] = &segments[..]
                && CATCH_ALL_ERRORS.iter().any(|(k, t)| krate.ident == k && last.ident == t)
            {
                return Some(format!("`{}::{}`", krate.ident, last.ident));
            }
            let last = segments.last()?;
            let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return None };
            let pointer = ["Box", "Arc", "Rc"].iter().any(|p| last.ident == p);
            match &args.args.iter().collect::<Vec<_>>()[..] {
                [syn::GenericArgument::Type(Type::TraitObject(object))]
                    if pointer && names_error_trait(object.bounds.iter()) =>
                {
                    Some(format!("`{}<dyn std::error::Error>`", last.ident))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether a trait object's bounds name the standard `Error` trait: `std::error::Error`,
/// `core::error::Error`, or `Error` as most code imports it. A trait of another path
/// (`app::Error`) may be the application's own, for which it can implement serde's traits and
/// `Classify`: left to rustc.
fn names_error_trait<'a>(mut bounds: impl Iterator<Item = &'a syn::TypeParamBound>) -> bool {
    bounds.any(|b| {
        let syn::TypeParamBound::Trait(t) = b else { return false };
        let names: Vec<String> = t.path.segments.iter().map(|s| s.ident.to_string()).collect();
        matches!(
            names.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ["Error"] | ["std" | "core", "error", "Error"]
        )
    })
}

/// `anyhow::Result<T>` and its likes: an alias whose error is a catch-all crate's.
fn unstorable_result_alias(ty: &Type) -> Option<String> {
    let Type::Path(tp) = ty else { return None };
    let segments: Vec<_> = tp.path.segments.iter().collect();
    let [krate, last] = &segments[..] else { return None };
    let (name, error) = CATCH_ALL_ERRORS.iter().find(|(k, _)| krate.ident == k)?;
    (last.ident == "Result").then(|| format!("`{name}::{error}` (in `{name}::Result`)"))
}

/// `Result<T, E>` (any path ending in `Result` with two type arguments) → its parts.
fn split_result(ty: &Type) -> Ret {
    let mut ret = Ret { ty: ty.clone(), ok: None, err: None };
    if let Type::Path(tp) = ty
        && let Some(seg) = tp.path.segments.last()
        && seg.ident == "Result"
        && let syn::PathArguments::AngleBracketed(args) = &seg.arguments
        && let [syn::GenericArgument::Type(ok), syn::GenericArgument::Type(err)] =
            &args.args.iter().collect::<Vec<_>>()[..]
    {
        ret.ok = Some(ok.clone());
        ret.err = Some(err.clone());
    }
    ret
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_of(attr: TokenStream) -> Vec<String> {
        let mut errors = Errors::default();
        let attr = Attr::parse(attr, &mut errors);
        let mut item: ItemFn = syn::parse_quote!(
            async fn charge() -> Result<(), Failed> {
                Ok(())
            }
        );
        let params = take_param_attrs(&mut item, &mut errors);
        validate(attr, item, params, &mut errors);
        errors
            .into_result()
            .err()
            .map_or(vec![], |e| e.into_iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn a_timeout_longer_than_the_deadline_is_refused() {
        let errors = errors_of(quote::quote!(retry = "keyed", timeout = "5m", deadline = "1m"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("at most \"1m\""), "{}", errors[0]);
        let equal = quote::quote!(retry = "keyed", timeout = "1m", deadline = "60s");
        assert_eq!(errors_of(equal), Vec::<String>::new());
        // Either alone is compared with the executor's defaults at run time, not here.
        assert_eq!(
            errors_of(quote::quote!(retry = "keyed", deadline = "1s")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_lease_shorter_than_renewals_can_keep_is_refused() {
        for short in ["1ms", "99ms"] {
            let errors = errors_of(quote::quote!(retry = "keyed", lease = #short));
            assert_eq!(errors.len(), 1, "{short}: {errors:?}");
            assert!(errors[0].contains("at least lease = \"100ms\""), "{}", errors[0]);
        }
        assert_eq!(
            errors_of(quote::quote!(retry = "keyed", lease = "100ms")),
            Vec::<String>::new()
        );
        // Other durations may be short.
        assert_eq!(
            errors_of(quote::quote!(retry = "keyed", timeout = "1ms")),
            Vec::<String>::new()
        );
    }
}
