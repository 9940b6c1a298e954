//! The `#[tool]` attribute of idem, re-exported as `idem_core::tool`.
//!
//! The pipeline is visible in the files: `parse` (the attribute and the parameter markers as
//! written), `validate` (checks them against the fn, collecting every error) and `expand` (the
//! generated items, or on failure the fn as written plus the errors).

use proc_macro::TokenStream;

mod expand;
mod parse;
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
/// For a method `async fn charge_card(&self, ..)` in an `impl` block (tools usually hold clients):
/// - `charge_card(self: &Arc<Self>, run: &Run, <params>)`: the typed call;
/// - `charge_card_tool(self: &Arc<Self>) -> impl Tool<..> + Clone`: the tool as a value holding
///   the receiver. An attribute on a method can only add items to its `impl` block, so the
///   arguments type's field names are declared inside this constructor and the type is reached
///   as `<T as Tool>::Args` (built with `From<(T1, .., Tn)>`);
/// - a hidden `__idem_tool_charge_card` holding the body. `Self` must be `Send + Sync + 'static`.
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
///
/// # Parameters
/// - An optional first parameter `cx: &Ctx` (any path ending in `Ctx`) gives the body the
///   idempotency key to forward, the attempt number and the deadline; it is not an argument.
/// - The others (at most 16) need owned types that are `Serialize + DeserializeOwned + JsonSchema
///   + Clone + Send + Sync`; plain names only (`name: Type`), no `impl Trait`, no generics.
/// - The return type is `Result<T, E>` (or an alias named `..Result`), `T: Serialize +
///   DeserializeOwned`, `E: idem_core::Classify + Serialize + DeserializeOwned + Display + Debug`.
///
/// Mistakes are reported at the user's code, all at once, and the fn is still emitted as written
/// so one mistake gives one message.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut item: syn::ItemFn = match syn::parse::Parser::parse(parse_fn, item.clone()) {
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
    let mut errors = parse::Errors::default();
    let attr = parse::Attr::parse(attr.into(), &mut errors);
    let param_attrs = validate::take_param_attrs(&mut item, &mut errors);
    let fallback_item = item.clone();
    let model = validate::validate(attr, item, param_attrs, &mut errors);
    match (errors.into_result(), model) {
        (Ok(()), Some(model)) => expand::expand(&model).into(),
        (Err(e), _) => expand::fallback(&fallback_item, e).into(),
        // validate returns no model only after recording an error; kept total for safety.
        (Ok(()), None) => expand::fallback(
            &fallback_item,
            syn::Error::new(proc_macro2::Span::call_site(), "`#[tool]` could not be expanded"),
        )
        .into(),
    }
}

/// Parses an fn whose body is kept as tokens: the body is emitted as written, never inspected,
/// and parsing it into syn's syntax tree would be most of the macro's work for a long body.
fn parse_fn(input: syn::parse::ParseStream<'_>) -> syn::Result<syn::ItemFn> {
    let attrs = input.call(syn::Attribute::parse_outer)?;
    let vis: syn::Visibility = input.parse()?;
    let sig: syn::Signature = input.parse()?;
    let body: proc_macro2::Group = input.parse()?;
    if body.delimiter() != proc_macro2::Delimiter::Brace {
        return Err(syn::Error::new(body.span(), "expected the fn's body in braces"));
    }
    let brace_token = syn::token::Brace { span: body.delim_span() };
    let stmts = vec![syn::Stmt::Expr(syn::Expr::Verbatim(body.stream()), None)];
    Ok(syn::ItemFn { attrs, vis, sig, block: Box::new(syn::Block { brace_token, stmts }) })
}
