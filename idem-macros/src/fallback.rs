//! What to emit when the signature cannot be expanded (thiserror's `fallback.rs`): the typed
//! call's shape with a body that is never run, next to the errors, so that the tool's call sites
//! type-check and one mistake gives one message. The user's body is not emitted: it is checked
//! once the signature is fixed.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{FnArg, ItemFn, Pat, ReturnType, Type};

use crate::parse::ParamAttr;
use crate::validate::{CtxShape, ctx_shape};

pub fn stub(
    item: &ItemFn,
    param_attrs: &[ParamAttr],
    krate: &TokenStream,
    krate_names: &[Vec<String>],
    error: Option<syn::Error>,
) -> TokenStream {
    let errors = error.map(|e| e.to_compile_error());
    let sig = &item.sig;
    let ident = &sig.ident;
    let vis = &item.vis;
    let generics = &sig.generics;
    let where_clause = &sig.generics.where_clause;
    let keep: Vec<&syn::Attribute> = item
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg") || a.path().is_ident("doc"))
        .collect();
    let mut method = false;
    let mut params = Vec::new();
    // The context's type, named in the stub's body so its import is not reported unused.
    let mut ctx_types = Vec::new();
    for (i, (arg, pattr)) in sig.inputs.iter().zip(param_attrs).enumerate() {
        match arg {
            FnArg::Receiver(_) => method = true,
            FnArg::Typed(pt) => {
                let is_ctx =
                    pattr.ctx.is_some() || !matches!(ctx_shape(&pt.ty, krate_names), CtxShape::No);
                if is_ctx {
                    let ty = &pt.ty;
                    ctx_types.push(
                        quote!(let _: ::core::option::Option<#ty> = ::core::option::Option::None;),
                    );
                    continue;
                }
                let name = match &*pt.pat {
                    Pat::Ident(pi) => pi.ident.clone(),
                    _ => format_ident!("__idem_arg{}", i),
                };
                let ty = &pt.ty;
                params.push(quote!(#name: #ty));
            }
        }
    }
    let (ok, err) = match &sig.output {
        ReturnType::Type(_, ty) => result_parts(ty, krate),
        ReturnType::Default => (quote!(()), quote!(())),
    };
    let run = syn::Ident::new("__idem_run", Span::call_site());
    let output = quote!(::core::result::Result<#ok, #krate::Error<#err>>);
    if method {
        quote! {
            #(#keep)*
            #[allow(unused_variables, unreachable_code, clippy::all)]
            #vis async fn #ident #generics(
                self: &::std::sync::Arc<Self>,
                #run: &#krate::Run,
                #(#params),*
            ) -> #output #where_clause {
                #(#ctx_types)*
                ::core::unreachable!()
            }
            #errors
        }
    } else {
        quote! {
            #(#keep)*
            #[allow(unused_variables, unreachable_code, clippy::all)]
            #vis fn #ident #generics(
                #run: &#krate::Run,
                #(#params),*
            ) -> impl ::core::future::Future<Output = #output> #where_clause {
                #(#ctx_types)*
                async {
                    let __idem_never: #output = ::core::unreachable!();
                    __idem_never
                }
            }
            #errors
        }
    }
}

/// `Result<T, E>` → (T, E); an alias through `ToolReturn`; anything else, or a type with an
/// `impl Trait` in it (refused; no binding may have an opaque type) → ((), ()).
fn result_parts(ty: &Type, krate: &TokenStream) -> (TokenStream, TokenStream) {
    if crate::validate::find_impl_trait(ty).is_some() {
        return (quote!(()), quote!(()));
    }
    if let Type::Path(tp) = ty
        && let Some(seg) = tp.path.segments.last()
        && seg.ident.to_string().ends_with("Result")
    {
        if let syn::PathArguments::AngleBracketed(args) = &seg.arguments
            && seg.ident == "Result"
            && let [syn::GenericArgument::Type(ok), syn::GenericArgument::Type(err)] =
                &args.args.iter().collect::<Vec<_>>()[..]
        {
            return (quote!(#ok), quote!(#err));
        }
        return (
            quote!(<#ty as #krate::__private::ToolReturn>::Ok),
            quote!(<#ty as #krate::__private::ToolReturn>::Err),
        );
    }
    (quote!(()), quote!(()))
}
