//! Placeholder while the macro is written.
use proc_macro::TokenStream;

/// See `idem_core::tool`.
#[proc_macro_attribute]
pub fn tool(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
