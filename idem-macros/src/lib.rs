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
/// See `idem_core::tool` for the full documentation.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut item: syn::ItemFn = match syn::parse(item.clone()) {
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
