//! Where idem-core is, in the user's crate: the generated code names its items through this
//! path, so `#[tool]` works when idem-core is renamed in Cargo.toml
//! (`idem = { package = "idem-core", .. }`) or reached through a facade crate (`crate = ".."`).

use proc_macro_crate::FoundCrate;
use proc_macro2::{Span, TokenStream};
use quote::quote;

/// idem-core's name in the user's Cargo.toml (`idem_core`, or the rename), read with
/// proc-macro-crate. `None` when it is not a direct dependency (a facade's user, or idem-core's
/// own doc tests, where `::idem_core` is right).
fn dependency_name() -> Option<String> {
    match proc_macro_crate::crate_name("idem-core") {
        Ok(FoundCrate::Name(name)) => Some(name),
        Ok(FoundCrate::Itself) | Err(_) => None,
    }
}

/// The path to emit: `crate = ".."` when given, else `::<name in Cargo.toml>`, else `::idem_core`.
pub fn resolve(explicit: Option<&syn::Path>) -> TokenStream {
    if let Some(path) = explicit {
        return quote!(#path);
    }
    let name = dependency_name().unwrap_or_else(|| "idem_core".to_owned());
    let ident = syn::Ident::new(&name, Span::call_site());
    quote!(::#ident)
}

/// The spellings of that path as segment names, for recognising `&idem::Ctx` as the context.
pub fn names(explicit: Option<&syn::Path>) -> Vec<Vec<String>> {
    let mut out = vec![vec!["idem_core".to_owned()]];
    match explicit {
        Some(path) => {
            let names: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            // `crate::facade::idem` is also written `facade::idem` inside the crate.
            if let Some(("crate" | "self", rest)) =
                names.split_first().map(|(first, rest)| (first.as_str(), rest))
            {
                out.push(rest.to_vec());
            }
            out.push(names);
        }
        None => out.extend(dependency_name().map(|name| vec![name])),
    }
    out
}
