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
    if plainly_named() {
        return Some("idem_core".to_owned());
    }
    match proc_macro_crate::crate_name("idem-core") {
        Ok(FoundCrate::Name(name)) => Some(name),
        Ok(FoundCrate::Itself) | Err(_) => None,
    }
}

/// Whether the crate's own Cargo.toml names idem-core under its own name (`idem-core = ..` or a
/// `[..dependencies.idem-core]` table) and nowhere as `"idem-core"` in quotes (a rename's
/// `package = "idem-core"`, or idem-core's own manifest). Then the name is `idem_core` without
/// proc-macro-crate, whose first lookup in each compilation runs `cargo locate-project` (a
/// process, tens of milliseconds) to find the workspace manifest. Anything else (a workspace
/// dependency, a rename, a facade, an unreadable file) is left to proc-macro-crate.
fn plainly_named() -> bool {
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") else { return false };
    let Ok(manifest) = std::fs::read_to_string(std::path::Path::new(&dir).join("Cargo.toml"))
    else {
        return false;
    };
    plain_in(&manifest)
}

fn plain_in(manifest: &str) -> bool {
    if manifest.contains("\"idem-core\"") || manifest.contains("'idem-core'") {
        return false;
    }
    manifest.lines().map(str::trim_start).any(|line| {
        let key = line.strip_prefix("idem-core").map(str::trim_start);
        matches!(key, Some(rest) if rest.starts_with('=') || rest.starts_with('.'))
            || (line.starts_with('[') && line.contains("dependencies.idem-core]"))
    })
}

/// Said once per `#[tool]` or `#[tool_set]` when no `crate = ".."` is given and the crate's
/// Cargo.toml does not depend on idem-core (proc-macro-crate found no such dependency): the
/// generated code's `::idem_core` then fails with rustc's "cannot find `idem_core`", which does
/// not say that a facade crate's users name its path. `None` when the dependency is there, or
/// the manifest could not be read (another build system: `::idem_core` stays the guess).
pub fn not_a_dependency(explicit: Option<&syn::Path>) -> Option<syn::Error> {
    if explicit.is_some() || plainly_named() {
        return None;
    }
    match proc_macro_crate::crate_name("idem-core") {
        Err(proc_macro_crate::Error::CrateNotFound { .. }) => Some(syn::Error::new(
            Span::call_site(),
            "idem-core is not a dependency of this crate: when a crate of yours re-exports it, name that path with `crate = \"my_facade::idem_core\"` in this attribute; otherwise add `idem-core` to [dependencies]",
        )),
        _ => None,
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

#[cfg(test)]
mod tests {
    use super::plain_in;

    #[test]
    fn a_plain_dependency_is_recognised_without_proc_macro_crate() {
        assert!(plain_in("[dependencies]\nidem-core = { path = \"../idem-core\" }\n"));
        assert!(plain_in("[dependencies]\n  idem-core=\"0.1\"\n"));
        assert!(plain_in("[dependencies]\nidem-core.workspace = true\n"));
        assert!(plain_in("[dev-dependencies.idem-core]\nversion = \"0.1\"\n"));
        assert!(plain_in("[target.'cfg(unix)'.dependencies.idem-core]\nversion = \"0.1\"\n"));
    }

    #[test]
    fn a_rename_or_anything_unclear_is_left_to_proc_macro_crate() {
        // a rename: the key is not idem-core
        assert!(!plain_in("[dependencies]\nidem = { package = \"idem-core\", path = \"..\" }\n"));
        // both spellings: the rename decides, so proc-macro-crate reads it
        assert!(!plain_in(
            "[dependencies]\nidem-core = \"0.1\"\n[dev-dependencies]\nidem = { package = \"idem-core\", version = \"0.1\" }\n"
        ));
        // idem-core's own manifest
        assert!(!plain_in("[package]\nname = \"idem-core\"\n"));
        // a workspace dependency renamed in the workspace's manifest, or a facade
        assert!(!plain_in("[dependencies]\nidem = { workspace = true }\n"));
        assert!(!plain_in("[dependencies]\nidem-core-extra = \"1\"\n"));
    }
}
