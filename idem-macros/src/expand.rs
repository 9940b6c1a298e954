//! Expand: the model → the typed call, the arguments struct, the tool value and its
//! `idem_core::Tool` implementation. Also what to emit when validation failed.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, ItemFn, Type};

use crate::parse::Class;
use crate::validate::Model;

/// On failure: the fn as written (minus our parameter markers) and the errors, so that one
/// mistake gives one message instead of one per call site.
pub fn fallback(item: &ItemFn, error: syn::Error) -> TokenStream {
    let errors = error.to_compile_error();
    quote!(#item #errors)
}

pub fn expand(model: &Model) -> TokenStream {
    if model.method { expand_method(model) } else { expand_free(model) }
}

/// The attributes of the user's fn, sorted: `cfg`s go on every generated item, docs on the typed
/// call, the rest (lints, `tracing::instrument`, ...) on the body.
struct Attrs<'a> {
    cfg: Vec<&'a Attribute>,
    doc: Vec<&'a Attribute>,
    body: Vec<&'a Attribute>,
}

fn sort_attrs(attrs: &[Attribute]) -> Attrs<'_> {
    let mut out = Attrs { cfg: Vec::new(), doc: Vec::new(), body: Vec::new() };
    for attr in attrs {
        let path = attr.path();
        if path.is_ident("cfg") || path.is_ident("cfg_attr") {
            out.cfg.push(attr);
        } else if path.is_ident("doc") {
            out.doc.push(attr);
        } else {
            out.body.push(attr);
        }
    }
    out
}

fn camel(ident: &Ident) -> String {
    ident
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
        .collect()
}

fn duration(d: Option<Duration>) -> Option<TokenStream> {
    d.map(|d| {
        let secs = d.as_secs();
        let nanos = d.subsec_nanos();
        quote!(::core::option::Option::Some(::core::time::Duration::new(#secs, #nanos)))
    })
}

/// `static DEF: ToolDef = ..;`, naming only the options that are set (the others come from
/// `ToolOptions::NONE`): a smaller expansion to parse and check per tool.
fn def_static(model: &Model) -> TokenStream {
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
        quote!(::idem_core::ToolOptions::NONE)
    } else {
        quote!(::idem_core::ToolOptions { #(#set)* ..::idem_core::ToolOptions::NONE })
    };
    quote! {
        static __IDEM_DEF: ::idem_core::ToolDef = ::idem_core::ToolDef {
            name: #name,
            description: #description,
            class: ::idem_core::RetryClass::#class,
            options: #options,
        };
    }
}

/// The success and error types.
fn result_types(model: &Model) -> (TokenStream, TokenStream) {
    let ty = &model.ret.ty;
    let ok = match &model.ret.ok {
        Some(ok) => quote!(#ok),
        None => quote!(<#ty as ::idem_core::__private::ToolReturn>::Ok),
    };
    let err = match &model.ret.err {
        Some(err) => quote!(#err),
        None => quote!(<#ty as ::idem_core::__private::ToolReturn>::Err),
    };
    (ok, err)
}

/// `impl Fields for #fields_ty { .. }`: the parameters' names (the JSON keys) and which ones
/// are skipped, for the generic `idem_core::__private::Args`, whose `Serialize`, `Deserialize`
/// and `JsonSchema` are written once in idem-core instead of derived for every tool. Unknown
/// fields are refused there (and `additionalProperties: false` in the schema): a field the model
/// invents (`"currency": "EUR"` on a tool without one) would otherwise be dropped silently while
/// the model believes it was applied; refused, it comes back as an error naming the field.
/// Bounds checked at the user's spans, so rustc points at the parameter or the return type with
/// a message that says what to derive (see `idem_core::__private::ToolArg`).
fn checks(model: &Model) -> TokenStream {
    let mut out = TokenStream::new();
    for p in &model.params {
        let ty = &p.ty;
        out.extend(quote_spanned! {ty.span()=> ::idem_core::__private::assert_arg::<#ty>(); });
    }
    let ret = &model.ret;
    match (&ret.ok, &ret.err) {
        (Some(ok), Some(err)) => {
            out.extend(
                quote_spanned! {ok.span()=> ::idem_core::__private::assert_output::<#ok>(); },
            );
            out.extend(
                quote_spanned! {err.span()=> ::idem_core::__private::assert_error::<#err>(); },
            );
        }
        _ => {
            let ty = &ret.ty;
            out.extend(quote_spanned! {ty.span()=>
                ::idem_core::__private::assert_result::<#ty>();
                ::idem_core::__private::assert_output::<<#ty as ::idem_core::__private::ToolReturn>::Ok>();
                ::idem_core::__private::assert_error::<<#ty as ::idem_core::__private::ToolReturn>::Err>();
            });
        }
    }
    quote!(const { #out })
}

fn fields_impl(model: &Model, fields_ty: &TokenStream, description: Option<&str>) -> TokenStream {
    let args_name = format!("{}Args", camel(&model.item.sig.ident));
    let names = model.params.iter().map(|p| p.ident.unraw().to_string());
    let skip: u16 = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.skip)
        .fold(0, |bits, (i, _)| bits | (1 << i));
    let skip = (skip != 0).then(|| quote!(const SKIP: u16 = #skip;));
    let description = description.map(|d| quote!(const DESCRIPTION: &'static str = #d;));
    quote! {
        impl ::idem_core::__private::Fields for #fields_ty {
            const NAME: &'static str = #args_name;
            const NAMES: &'static [&'static str] = &[#(#names),*];
            #description
            #skip
        }
    }
}

/// The name of the typed call's run parameter: `run`, unless a parameter has that name.
fn run_ident(model: &Model) -> Ident {
    let taken = |name: &str| model.params.iter().any(|p| p.ident.unraw() == name);
    let name = if !taken("run") {
        "run"
    } else if !taken("idem_run") {
        "idem_run"
    } else {
        "__idem_run"
    };
    Ident::new(name, Span::call_site())
}

fn expand_free(model: &Model) -> TokenStream {
    let item = &model.item;
    let vis = &item.vis;
    let ident = &item.sig.ident;
    let attrs = sort_attrs(&item.attrs);
    let cfg = &attrs.cfg;
    let doc = &attrs.doc;
    let body_attrs = &attrs.body;
    let base = camel(ident);
    let tool_ty = format_ident!("{}Tool", base, span = ident.span());
    let args_ty = format_ident!("{}Args", base, span = ident.span());
    let fields_ty = format_ident!("__Idem{}Fields", base);
    let run = run_ident(model);
    let (ok, err) = result_types(model);
    let idents: Vec<&Ident> = model.params.iter().map(|p| &p.ident).collect();
    let tys: Vec<&Type> = model.params.iter().map(|p| &p.ty).collect();
    let indices = (0..model.params.len()).map(syn::Index::from);
    let def = def_static(model);
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
    let fields = fields_impl(model, &quote!(#fields_ty), Some(&args_doc));
    let checks = checks(model);

    let mut inner = item.clone();
    inner.vis = syn::Visibility::Inherited;
    inner.attrs = body_attrs.iter().map(|a| (*a).clone()).collect();
    let cx_arg = match &model.ctx {
        Some(_) => quote!(cx,),
        None => quote!(),
    };

    quote! {
        #(#cfg)*
        #(#doc)*
        #[doc = ""]
        #[doc = #call_doc]
        #vis fn #ident(
            #run: &::idem_core::Run,
            #(#idents: #tys),*
        ) -> impl ::core::future::Future<
            Output = ::core::result::Result<#ok, ::idem_core::Error<#err>>,
        > + '_ {
            #checks
            ::idem_core::Run::call(#run, &#tool_ty, #args_ty::new(#(#idents),*))
        }

        #(#cfg)*
        #[doc = #args_doc]
        #[doc = ""]
        #[doc = #args_new_doc]
        #vis type #args_ty = ::idem_core::__private::Args<(#(#tys,)*), #fields_ty>;

        #(#cfg)*
        #[doc(hidden)]
        #vis enum #fields_ty {}

        #(#cfg)*
        #fields

        #(#cfg)*
        #[doc = #tool_doc]
        #vis type #tool_ty = ::idem_core::__private::FnTool<#args_ty, #ok, #err>;

        #(#cfg)*
        #[doc = #tool_doc]
        #[allow(non_upper_case_globals)]
        #vis const #tool_ty: #tool_ty = {
            #def
            ::idem_core::__private::FnTool::new(&__IDEM_DEF, |cx, args: #args_ty| {
                let _ = cx;
                #inner
                ::std::boxed::Box::pin(#ident(#cx_arg #(args.0.#indices),*))
            })
        };
    }
}

fn expand_method(model: &Model) -> TokenStream {
    let item = &model.item;
    let vis = &item.vis;
    let ident = &item.sig.ident;
    let attrs = sort_attrs(&item.attrs);
    let cfg = &attrs.cfg;
    let doc = &attrs.doc;
    let body_attrs = &attrs.body;
    let hidden = format_ident!("__idem_tool_{}", ident.unraw());
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
    inner.attrs = body_attrs.iter().map(|a| (*a).clone()).collect();
    let cx_arg = match &model.ctx {
        Some(_) => quote!(cx,),
        None => quote!(),
    };
    let tuple = quote!((#(#tys,)*));

    quote! {
        #(#cfg)*
        #[doc(hidden)]
        #inner

        #(#cfg)*
        #[doc = #factory_doc]
        #vis fn #factory(
            self: &::std::sync::Arc<Self>,
        ) -> impl ::idem_core::Tool<
            Args: ::core::convert::From<#tuple>,
            Output = #ok,
            Error = #err,
        > + ::core::clone::Clone + ::core::fmt::Debug + 'static
        where
            Self: ::core::marker::Send + ::core::marker::Sync + 'static,
        {
            #checks
            enum __IdemFields {}
            #fields
            #def
            ::idem_core::__private::MethodTool::new(
                ::std::sync::Arc::clone(self),
                &__IDEM_DEF,
                |recv, cx, args: ::idem_core::__private::Args<#tuple, __IdemFields>| {
                    let _ = cx;
                    ::std::boxed::Box::pin(Self::#hidden(recv, #cx_arg #(args.0.#indices),*))
                },
            )
        }

        #(#cfg)*
        #(#doc)*
        #[doc = ""]
        #[doc = #call_doc]
        #[doc = ""]
        #[doc = " The receiver is an `Arc<Self>`: the tool holds it for retries and for duplicates that join."]
        #vis async fn #ident(
            self: &::std::sync::Arc<Self>,
            #run: &::idem_core::Run,
            #(#idents: #tys),*
        ) -> ::core::result::Result<#ok, ::idem_core::Error<#err>>
        where
            Self: ::core::marker::Send + ::core::marker::Sync + 'static,
        {
            let __idem_params = (#(#idents,)*);
            let __idem_tool = Self::#factory(self);
            let __idem_args = ::idem_core::__private::make_args(&__idem_tool, __idem_params);
            ::idem_core::Run::call(#run, &__idem_tool, __idem_args).await
        }
    }
}
