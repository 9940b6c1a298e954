//! The `#[tool]` attribute of idem, re-exported as `idem_core::tool`.
//!
//! The pipeline is visible in the files: `parse` (the attribute and the parameter markers as
//! written), `validate` (checks them against the fn, collecting every error) and `expand` (the
//! generated items, or on failure the fn as written plus the errors).

use proc_macro::TokenStream;

mod docs;
mod enclosing;
mod expand;
mod fallback;
mod krate;
mod parse;
mod tool_set;
mod validate;

/// Declares an async fn as a tool whose every call goes through idem's protocol.
///
/// ```ignore
/// use idem_core::{tool, Ctx};
///
/// /// Charge a customer's card. Amounts are in cents.
/// #[tool(retry = "keyed", timeout = "10s")]
/// async fn charge_card(cx: &Ctx, customer: String, amount_cents: u64) -> Result<Charge, PaymentError> {
///     payments.charge(&customer, amount_cents, cx.key()).await // the provider's Idempotency-Key
/// }
///
/// // charge_card(&run, "cus_1".into(), 4900).await  -> Result<Charge, idem_core::Error<PaymentError>>
/// ```
///
/// # What it generates
/// For a free `async fn charge_card(..)`:
/// - `charge_card(run: &Run, <params>)`: the typed call, same name and visibility, a plain fn
///   returning a future of `Result<T, idem_core::Error<E>>` (an `async fn` would add a second
///   state machine per tool for the compiler to check). It derives the key, claims it, runs,
///   stores and replays through `idem_core::Run::call`.
/// - `ChargeCardTool`: the tool as a value for a tool set (`&ChargeCardTool`,
///   `ChargeCardTool.def()`), a constant of the type alias of the same name for
///   `idem_core::__private::FnTool`, whose one generic `Tool` impl lives in idem-core. Its `def()`
///   is a `&'static ToolDef`: the stable name, the doc comment as description, the class and the
///   options. The body is moved into the tool, so there is no unprotected path to it.
/// - `ChargeCardArgs`: the arguments as the model sends them, one field per parameter (the
///   context excluded): a type alias for `idem_core::__private::Args<(T1, .., Tn), F>`, built
///   with `ChargeCardArgs::new(customer, amount_cents)`. `Serialize`, `Deserialize`, `JsonSchema`,
///   `Clone` and `Debug` are written once in idem-core for every such type instead of derived per
///   tool (a crate of many tools type-checks no derived code), with the JSON of the derive: an
///   object with one field per parameter. Unknown fields are refused (and
///   `additionalProperties: false` in the schema): a field the model invents would otherwise be
///   dropped silently while the model believes it was applied. At most 16 parameters.
/// - a hidden zero-sized `__IdemChargeCardFields` naming the fields.
///
/// Two fns whose names give the same type names (`get_v2` and `get_v_2` both give `GetV2Args`
/// and `GetV2Tool`) are rustc's "defined multiple times", once per name, at the second fn's
/// name: rename one, and keep its tool's name with `#[tool(name = "..", ..)]`.
///
/// For a method `async fn charge_card(&self, ..)` in an `impl` block (tools usually hold clients):
/// - `charge_card(self: &Arc<Self>, run: &Run, <params>)`: the typed call;
/// - `charge_card_tool(self: &Arc<Self>) -> impl Tool<..> + Clone`: the tool as a value holding
///   the receiver. An attribute on a method can only add items to its `impl` block, so the
///   arguments type's field names are declared inside this constructor and the type is reached
///   as `<T as Tool>::Args` (built with `From<(T1, .., Tn)>`);
/// - a hidden `__idem_tool_charge_card` holding the body. `Self` must be `Send + Sync + 'static`.
///
/// A tool that is neither called nor used as a value (in no tool set) is reported unused
/// (`dead_code`) at its name, as the fn would be; the fn's lint attributes apply to the typed
/// call too (`#[expect(dead_code)]` as an `allow`).
///
/// # Options
/// - `retry = "safe" | "keyed" | "never"` (required): how the tool may be retried (see
///   `idem_core::RetryClass`).
/// - `name = ".."`: the stable name, part of every key (default: the fn name). 1 to 64 ASCII
///   letters, digits, `_` or `-`, so OpenAI function names and MCP tool names accept it.
/// - `attempts = N`: attempts in all, the first included (at least 1; a `never` tool allows 1).
/// - `timeout`, `deadline`, `lease`, `ttl`: the per-attempt timeout, the deadline of the
///   whole call, the claim's lease and the retention of the outcome, written `"500ms"`, `"30s"`,
///   `"2m"` or `"1h"` (a whole number and a unit, greater than zero). For `never`, `deadline`,
///   `timeout`, `lease` and `ttl` keep their meaning (a timeout then ends in "outcome unknown").
/// - `skip(a, b)`, or `#[idem(skip)]` on a parameter: an argument that is not part of the intent
///   (trace ids, nonces the model invents). It is still passed to the body but not in the key.
/// - `#[idem(skip_if_none)]` on an `Option<..>` parameter: part of the intent when it holds a
///   value, left out when it is `None` (as if the parameter did not exist). Mark an optional
///   parameter so when you add it to a tool that is already deployed: every other parameter
///   counts in the key, a missing `Option` as `null`, so a new one would change the key of every
///   call, and a retry that crosses the deploy would run the tool again.
/// - `reconcile = check` (`keyed` and `never` tools): the check idem asks before it answers
///   "outcome unknown": `async fn check(key: &Key, <the tool's parameters by value, in order>) ->
///   Reconciled<T>` (the context left out). On a method tool, `reconcile = name` names a method
///   of the same type taking `&self` first. A signature that does not fit is one error at the
///   name. See `docs/design.md` §3.1.
/// - `description = ".."`: the text the model reads, instead of the doc comment.
/// - `crate = "path"`: where idem-core is. By default the macro reads idem-core's name in the
///   crate's Cargo.toml (so `idem = { package = "idem-core", .. }` and `#[idem::tool]` work), and
///   falls back to `::idem_core`; a facade crate that re-exports idem-core passes its path here.
///
/// # Descriptions
/// The doc comment is the tool's description; `#[doc = include_str!("..")]` lines are part of
/// it. A tool with neither a doc comment nor `description = ".."` is left undocumented, so that `missing_docs` reports it. Rustdoc link markup is removed from the text the model reads (`[`Charge`]` → `` `Charge` ``,
/// `[text](crate::path)` → `text`, `[ref]: crate::path` lines dropped; web links stay, and so
/// do reference links to the web (`[text][ref]` or `[ref]` with `[ref]: https://..`) with their
/// definitions; footnotes, fenced and indented code blocks are kept as written). A `///` comment on a parameter becomes that argument's JSON Schema
/// `description` (and is removed from the fn, where rustc would refuse it). `/** .. */` comments
/// read as rustdoc shows them, without their frame and the `*` that starts each line. The
/// arguments' schema has no description of its own: the generated type's rustdoc text is for
/// the programmer.
///
/// # Parameters
/// - The context: an optional first parameter whose type is written `&Ctx`, `&idem_core::Ctx` or
///   `&<idem-core's name>::Ctx`, or any parameter marked `#[idem(ctx)]` (for another spelling,
///   such as an alias). It gives the body the idempotency key to forward, the attempt number and
///   the deadline; it is not an argument. A type of your own named `Ctx` is an ordinary argument.
/// - The others (at most 16) need owned types that are `Serialize + DeserializeOwned + JsonSchema
///   + Clone + Send + Sync`; plain names only (`name: Type`), no `impl Trait`, no generics. An
///   `Option` (also through an alias) is not required in the schema. No `HashSet` written in a
///   parameter's type, unless the parameter is `#[idem(skip)]`: its order differs in every copy,
///   so it cannot be part of a key (use a `BTreeSet`).
/// - No `#[cfg]` or `#[cfg_attr]` on a parameter: the parameters are the arguments, whose schema
///   and key must not change from build to build (put the `#[cfg]` on the whole tool instead). A
///   parameter's type may not be named like the generated `ChargeCardArgs` or `ChargeCardTool`.
/// - `#[idem(flatten)] args: ChargeArgs`, as the only argument: a struct deriving `Serialize`,
///   `Deserialize`, `JsonSchema` and `Clone` whose fields are the tool's top-level JSON arguments
///   and schema (rmcp's `Parameters<T>` style; the struct's own serde and schemars attributes
///   apply). Its canonical JSON is the intent: the same text, so the same key, as the same fields
///   passed as separate parameters of a tool of the same name. Unknown fields are what the
///   struct says: separate parameters refuse them, a struct accepts and ignores them unless it
///   has `#[serde(deny_unknown_fields)]` (which also puts `"additionalProperties": false` in
///   the schema). Serde's and schemars' field attributes (`rename`, `default`) go here, not on
///   parameters.
/// - The return type is `Result<T, E>` (or an alias named `..Result`) of named types (no
///   `impl Trait`), `T: Serialize + DeserializeOwned`, `E: idem_core::Classify + Serialize +
///   DeserializeOwned + Display + Debug` (`idem_core::NoError` for a tool that cannot fail).
/// - The body's future must be `Send`: attempts are retried, joined by duplicates and run on any
///   worker thread.
///
/// # Errors
/// One mistake gives one error, at the user's token: each option and signature mistake (all
/// reported together); a type missing a required trait gives one error at the type naming that
/// trait; a body that is not `Send` one error naming the value held across an `.await`. After a
/// signature mistake the typed call is still emitted (with a body that never runs), so its call
/// sites type-check. `#[tool]` on an associated fn without `self` in a plain `impl` block, or on
/// a method of a trait or of a trait impl, is one error at the fn's name, with the fn left as
/// written; on a method of a type with a lifetime other than `'static` (`impl<'a> Desk<'a>`),
/// one error saying `Self` must be `'static`, with the typed call's shape kept (the attribute
/// finds the block by reading the fn's source file, so a fn generated by another macro may still
/// give rustc's errors about the expansion).
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item: syn::ItemFn = match syn::parse::Parser::parse(parse_fn, item.clone()) {
        Ok(item) => item,
        Err(e) => {
            let message = syn::Error::new(
                e.span(),
                "`#[tool]` goes on an `async fn` (a free fn, or a method taking `&self`)",
            );
            let mut out: proc_macro2::TokenStream = item.into();
            out.extend(message.to_compile_error());
            return out.into();
        }
    };
    let attr: proc_macro2::TokenStream = attr.into();
    if let Some(misplaced) = misplaced(&attr, &item) {
        return misplaced.into();
    }
    tool_item(attr, item, None, None).tokens.into()
}

/// One error, and the fn as written, for a `#[tool]` fn inside a block that cannot hold its
/// expansion (see `enclosing.rs`); `None` where the expansion fits or the block is not known.
/// A method of a type that borrows is a method tool by its signature, and its callers write the
/// typed call: that one keeps the typed call's shape (`tool_stub`) beside its error.
fn misplaced(
    attr: &proc_macro2::TokenStream,
    item: &syn::ItemFn,
) -> Option<proc_macro2::TokenStream> {
    let first = first_span(item);
    let name = item.sig.ident.to_string();
    let method = matches!(item.sig.inputs.first(), Some(syn::FnArg::Receiver(_)));
    let message = match enclosing::of_fn(first, item.sig.ident.span(), &name) {
        enclosing::Enclosing::Impl | enclosing::Enclosing::BorrowingImpl if !method => format!(
            "`#[tool]` on an associated fn without `self`: its expansion adds a type, a constant and an enum, which an `impl` block cannot hold; move `{name}` out of the block to make it a free `async fn` tool, or take `&self` to make it a method tool"
        ),
        enclosing::Enclosing::BorrowingImpl => {
            let message = format!(
                "`#[tool]` on a method of a type that borrows: a method tool holds an `Arc<Self>` for as long as it serves calls, so `Self` must be `'static` and name no lifetime parameter; give the type owned data (`String`, `Arc<T>`) instead of references, write the block for `'static` borrows (`impl Type<'static>`), or make `{name}` a free `async fn` tool"
            );
            let error = syn::Error::new(item.sig.ident.span(), message);
            return Some(tool_stub(attr.clone(), item.clone(), None, Some(error)));
        }
        enclosing::Enclosing::TraitImpl => format!(
            "`#[tool]` cannot go on a method of a trait impl: its expansion changes the signature and adds `{name}_tool`, which the trait does not declare; make `{name}` a `#[tool]` method of an inherent `impl` block and call it from the trait's method"
        ),
        enclosing::Enclosing::Trait => format!(
            "`#[tool]` cannot go on a trait's method: its expansion changes the signature and adds items every implementor would have to write; make the tool a `#[tool]` method of an inherent `impl` block and call it from `{name}`"
        ),
        _ => return None,
    };
    // The fn stays as written (without the parameter markers only `#[tool]` reads), so its
    // callers and its body type-check and this is the only error.
    let mut item = item.clone();
    let mut ignored = parse::Errors::default();
    validate::take_param_attrs(&mut item, &mut ignored);
    let error = syn::Error::new(item.sig.ident.span(), message).to_compile_error();
    Some(quote::quote!(#item #error))
}

/// The span of the fn's first token (an attribute's `#`, the visibility, or the signature's
/// first keyword), without writing the whole fn out as tokens.
fn first_span(item: &syn::ItemFn) -> proc_macro2::Span {
    use syn::spanned::Spanned as _;
    if let Some(attr) = item.attrs.first() {
        return attr.pound_token.span;
    }
    if !matches!(item.vis, syn::Visibility::Inherited) {
        return item.vis.span();
    }
    let sig = &item.sig;
    [
        sig.constness.map(|t| t.span),
        sig.asyncness.map(|t| t.span),
        match &sig.safety {
            syn::Safety::Safe(t) => Some(t.span),
            syn::Safety::Unsafe(t) => Some(t.span),
            syn::Safety::Default => None,
        },
        sig.abi.as_ref().map(|a| a.extern_token.span),
    ]
    .into_iter()
    .flatten()
    .next()
    .unwrap_or(sig.fn_token.span)
}

/// Collects the `#[tool]` methods of an `impl` block into one tool set.
///
/// ```ignore
/// #[idem_core::tool_set]
/// impl Payments {
///     /// Charge a card.
///     #[tool(retry = "keyed")]
///     async fn charge(&self, cx: &Ctx, customer: String, amount_cents: u64) -> Result<Charge, PayError> { .. }
///
///     /// Read a balance.
///     #[tool(retry = "safe")]
///     async fn balance(&self, customer: String) -> Result<u64, PayError> { .. }
/// }
///
/// let tools: ToolSet = Arc::new(payments).tool_set();
/// ```
///
/// Adds `fn tool_set(self: &Arc<Self>) -> idem_core::ToolSet` to the block (same visibility as
/// the most visible tool), holding every `#[tool]` method's tool (`Self::<name>_tool`), each
/// under its `cfg`. Each method expands as `#[tool]` documents, and must take `&self` (a tool
/// without state is a free `async fn` outside the block). Tool names must be unique in the block
/// (checked here; two tools of one name under `#[cfg]`s are an error only in a build that
/// compiles both, so exclusive versions of one tool may share it), and no other fn or const of
/// the block may have a name the block's expansion adds (`<method>_tool`, `tool_set`); `Self`
/// must be `Send + Sync + 'static` (a block for a type with a lifetime other than `'static` is one
/// error at the type). Options: `fn_name = ".."` names the method that returns the set
/// (default `tool_set`; a type with two blocks, one per file say, names at least one, and
/// `ToolSet::merge` joins the sets), and `crate = ".."` (see
/// `#[tool]`), applied to every tool of the block that does not give its own. The block's
/// `#[tool]` attributes are read here, so they need no import (an imported `tool` used only
/// inside the block is reported unused); one applied by `#[cfg_attr(cond, tool(..))]` makes
/// the method a tool of the set where `cond` holds, and a plain method elsewhere.
#[proc_macro_attribute]
pub fn tool_set(attr: TokenStream, item: TokenStream) -> TokenStream {
    tool_set::expand(attr.into(), item.into()).into()
}

/// A `#[tool]` fn's expansion, and its tool's name when the tool value exists (the expansion
/// succeeded, or only options were wrong).
pub(crate) struct Expanded {
    pub tokens: proc_macro2::TokenStream,
    pub tool: Option<(String, proc_macro2::Span)>,
}

/// parse -> validate -> expand (or the fallback) for one fn; `default_krate` is the enclosing
/// `#[tool_set(crate = ..)]`, `attr_span` the method's `#[tool]` inside one.
pub(crate) fn tool_item(
    attr: proc_macro2::TokenStream,
    mut item: syn::ItemFn,
    default_krate: Option<&syn::Path>,
    attr_span: Option<proc_macro2::Span>,
) -> Expanded {
    let mut errors = parse::Errors::default();
    let mut attr = parse::Attr::parse(attr, &mut errors);
    attr.span = attr_span;
    if attr.krate.is_none() {
        attr.krate = default_krate.cloned();
    }
    let explicit_krate = attr.krate.clone();
    // Inside a `#[tool_set]` (`attr_span`), the block says it once.
    if attr_span.is_none()
        && let Some(e) = krate::not_a_dependency(explicit_krate.as_ref())
    {
        errors.push(e);
    }
    validate::take_second_tool_attr(&mut item, &mut errors);
    let param_attrs = validate::take_param_attrs(&mut item, &mut errors);
    let fallback_item = item.clone();
    let fallback_attrs = param_attrs.clone();
    let name_span = attr.name.as_ref().map_or(item.sig.ident.span(), |n| n.span());
    let model = validate::validate(attr, item, param_attrs, &mut errors);
    let error = match (errors.into_result(), model) {
        (Ok(()), Some(model)) => {
            let tool = Some((model.name.clone(), name_span));
            return Expanded { tokens: expand::expand(&model), tool };
        }
        (Err(e), Some(model)) if model.shape_ok => {
            let mut tokens = expand::expand(&model);
            tokens.extend(e.to_compile_error());
            return Expanded { tokens, tool: Some((model.name.clone(), name_span)) };
        }
        (Err(e), _) => e,
        // validate returns no model only after recording an error; kept total for safety.
        (Ok(()), None) => {
            syn::Error::new(proc_macro2::Span::call_site(), "`#[tool]` could not be expanded")
        }
    };
    let krate = krate::resolve(explicit_krate.as_ref());
    let names = krate::names(explicit_krate.as_ref());
    let tokens = fallback::stub(&fallback_item, &fallback_attrs, &krate, &names, Some(error));
    Expanded { tokens, tool: None }
}

/// The fallback of a `#[tool]` fn that cannot be expanded where it is (its added names clash with
/// its block's, or its type borrows): the typed call's shape next to `error` (if the error is not
/// reported elsewhere), so that its call sites type-check.
/// Its other mistakes, if any, are reported once this one is fixed.
pub(crate) fn tool_stub(
    attr: proc_macro2::TokenStream,
    mut item: syn::ItemFn,
    default_krate: Option<&syn::Path>,
    error: Option<syn::Error>,
) -> proc_macro2::TokenStream {
    let mut errors = parse::Errors::default();
    let explicit_krate = parse::Attr::parse(attr, &mut errors).krate.or(default_krate.cloned());
    let param_attrs = validate::take_param_attrs(&mut item, &mut errors);
    let krate = krate::resolve(explicit_krate.as_ref());
    let names = krate::names(explicit_krate.as_ref());
    fallback::stub(&item, &param_attrs, &krate, &names, error)
}

/// Parses an fn whose body is kept as tokens: the body is emitted as written, never inspected,
/// and parsing it into syn's syntax tree would be most of the macro's work for a long body.
pub(crate) fn parse_fn(input: syn::parse::ParseStream<'_>) -> syn::Result<syn::ItemFn> {
    let attrs = input.call(syn::Attribute::parse_outer)?;
    let vis: syn::Visibility = input.parse()?;
    let sig: syn::Signature = input.parse()?;
    let body: proc_macro2::Group = input.parse()?;
    if body.delimiter() != proc_macro2::Delimiter::Brace {
        return Err(syn::Error::new(body.span(), "expected the fn's body in braces"));
    }
    let brace_token = syn::token::Brace { span: body.delim_span() };
    let stmts = vec![syn::Stmt::Expr(syn::Expr::Verbatim(body.stream()), None)];
    Ok(syn::ItemFn {
        attrs,
        vis,
        modifiers: syn::FnModifiers::default(),
        sig,
        block: Box::new(syn::Block { brace_token, stmts }),
    })
}
