//! Parse: the attribute's options and the parameters' `#[idem(..)]` markers, as written. Every
//! mistake is collected; nothing is checked against the fn here (see `validate`).

use std::time::Duration;

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Ident, LitInt, LitStr, Token};

/// The options allowed in `#[tool(..)]`, for the "unknown option" message.
pub const OPTIONS: &str =
    "retry, name, description, attempts, timeout, deadline, lease, ttl, skip, reconcile, crate";

/// What `retry` accepts, for the messages.
const CLASSES: &str = "\"safe\" (reads; running twice changes nothing), \"keyed\" (effects the provider deduplicates by the idempotency key) or \"never\" (one attempt, outcome unknown when ambiguous)";

/// How a tool may be retried (mirrors `idem_core::RetryClass`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Safe,
    Keyed,
    Never,
}

/// A duration option's value.
pub struct DurationOpt {
    pub value: Duration,
    /// The value as written, for messages spanning it.
    pub lit: LitStr,
}

/// `#[tool(..)]` as written.
#[derive(Default)]
pub struct Attr {
    /// Where the `#[tool]` attribute is, for errors about what it lacks: the macro's call site
    /// for a free fn, the method's own attribute inside a `#[tool_set]` block (whose call site
    /// is the block's attribute).
    pub span: Option<Span>,
    pub retry: Option<(Class, LitStr)>,
    /// `retry = ..` was written, valid or not (so a bad class is not also reported as missing).
    pub retry_written: bool,
    pub name: Option<LitStr>,
    /// `description = ".."`: replaces the doc comment as the text the model reads.
    pub description: Option<LitStr>,
    /// `crate = "path"`: where idem-core is, when neither its name in Cargo.toml nor
    /// `idem_core` reaches it (a facade crate re-exporting it).
    pub krate: Option<syn::Path>,
    pub attempts: Option<(u32, LitInt)>,
    pub timeout: Option<DurationOpt>,
    pub deadline: Option<DurationOpt>,
    pub lease: Option<DurationOpt>,
    pub ttl: Option<DurationOpt>,
    /// `skip(a, b)`: parameters excluded from the key, named in the attribute.
    pub skip: Vec<Ident>,
    /// `reconcile = check`: the fn (or, on a method tool, the method) that asks the target
    /// system whether an attempt whose outcome is unknown took effect.
    pub reconcile: Option<syn::Path>,
}

/// Collected errors, reported together (serde_derive's `Ctxt`).
#[derive(Default)]
pub struct Errors(Option<syn::Error>, usize);

impl Errors {
    pub fn push(&mut self, e: syn::Error) {
        self.1 += 1;
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
    /// How many errors were recorded.
    pub fn len(&self) -> usize {
        self.1
    }
    pub fn spanned(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }
    /// An error spanning all of `tokens` (a plain `Span` covers only the first token on stable).
    pub fn at(&mut self, tokens: impl quote::ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }
    pub fn into_result(self) -> Result<(), syn::Error> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Attr {
    /// Parses the attribute's tokens; syntax errors and bad values are added to `errors`.
    pub fn parse(tokens: proc_macro2::TokenStream, errors: &mut Errors) -> Attr {
        let mut attr = Attr::default();
        let parser = syn::meta::parser(|meta| attr.option(meta, errors));
        if let Err(e) = syn::parse::Parser::parse2(parser, tokens) {
            errors.push(e);
        }
        attr
    }

    fn option(&mut self, meta: ParseNestedMeta<'_>, errors: &mut Errors) -> syn::Result<()> {
        let Some(key) = meta.path.get_ident().cloned() else {
            errors.spanned(
                syn::spanned::Spanned::span(&meta.path),
                format!("unknown option: expected one of {OPTIONS}"),
            );
            return skip_value(&meta);
        };
        let duplicate = |errors: &mut Errors| {
            errors.spanned(key.span(), format!("`{key}` is given twice; keep one"));
        };
        match key.to_string().as_str() {
            "retry" => {
                self.retry_written = true;
                let Some(lit) = string_value(&meta, &key, errors, &format!("one of {CLASSES}"))?
                else {
                    return Ok(());
                };
                let class = match lit.value().as_str() {
                    "safe" => Class::Safe,
                    "keyed" => Class::Keyed,
                    "never" => Class::Never,
                    other => {
                        errors.spanned(
                            lit.span(),
                            format!("unknown retry class `{other}`: expected {CLASSES}"),
                        );
                        return Ok(());
                    }
                };
                if self.retry.is_some() {
                    duplicate(errors);
                } else {
                    self.retry = Some((class, lit));
                }
            }
            "name" | "description" => {
                let hint = if key == "name" {
                    "the tool's stable name, as in name = \"charge_card\""
                } else {
                    "the text the model reads, as in description = \"Charge a card.\""
                };
                let Some(lit) = string_value(&meta, &key, errors, hint)? else {
                    return Ok(());
                };
                let slot = if key == "name" { &mut self.name } else { &mut self.description };
                if slot.is_some() {
                    duplicate(errors);
                } else {
                    *slot = Some(lit);
                }
            }
            "crate" => {
                let Some(lit) =
                    string_value(&meta, &key, errors, "a path, as in crate = \"my_facade::idem\"")?
                else {
                    return Ok(());
                };
                match lit.parse::<syn::Path>() {
                    Ok(_) if self.krate.is_some() => duplicate(errors),
                    Ok(path) => self.krate = Some(path),
                    Err(_) => errors.spanned(
                        lit.span(),
                        "`crate` takes the path idem-core is reachable at, as in crate = \"my_facade::idem\"",
                    ),
                }
            }
            "attempts" => {
                let value = meta.value()?;
                if !value.peek(LitInt) {
                    let tokens = rest_of_option(value)?;
                    errors.at(
                        tokens,
                        "`attempts` takes a whole number, not a string: write attempts = 3",
                    );
                    return Ok(());
                }
                let lit: LitInt = value.parse()?;
                match lit.base10_parse::<u32>() {
                    Ok(0) => errors.spanned(
                        lit.span(),
                        "`attempts` counts the first attempt too: it must be at least 1",
                    ),
                    Ok(n) if self.attempts.is_none() => self.attempts = Some((n, lit)),
                    Ok(_) => duplicate(errors),
                    Err(_) => errors.spanned(
                        lit.span(),
                        "`attempts` must be a whole number from 1 to 4294967295",
                    ),
                }
            }
            "timeout" | "deadline" | "lease" | "ttl" => {
                let hint = format!("a duration, as in {key} = \"30s\" (ms, s, m or h)");
                let Some(lit) = string_value(&meta, &key, errors, &hint)? else {
                    return Ok(());
                };
                let slot = match key.to_string().as_str() {
                    "timeout" => &mut self.timeout,
                    "deadline" => &mut self.deadline,
                    "lease" => &mut self.lease,
                    _ => &mut self.ttl,
                };
                match parse_duration(&lit.value()) {
                    Err(why) => errors.spanned(
                        lit.span(),
                        format!(
                            "malformed duration {:?} for `{key}`: {why}. Write a whole number and a unit (ms, s, m, h) without a space: \"500ms\", \"30s\", \"2m\", \"1h\"",
                            lit.value()
                        ),
                    ),
                    Ok(_) if slot.is_some() => duplicate(errors),
                    Ok(value) => *slot = Some(DurationOpt { value, lit }),
                }
            }
            "reconcile" => {
                let value = meta.value()?;
                let hint = "`reconcile` names the check: write reconcile = check_fn, an `async fn(key: &Key, <the tool's parameters by value>) -> Reconciled<Output>`";
                if value.peek(LitStr) {
                    let lit: LitStr = value.parse()?;
                    errors.spanned(
                        lit.span(),
                        format!("{hint}; without quotes: reconcile = {}", lit.value()),
                    );
                    return Ok(());
                }
                let tokens = rest_of_option(value)?;
                match syn::parse2::<syn::Path>(tokens.clone()) {
                    Ok(_) if self.reconcile.is_some() => duplicate(errors),
                    Ok(path) => self.reconcile = Some(path),
                    Err(_) if tokens.is_empty() => errors.spanned(key.span(), hint),
                    Err(_) => errors.at(tokens, hint),
                }
            }
            "skip" => {
                meta.parse_nested_meta(|inner| {
                    match inner.path.get_ident() {
                        Some(ident) => self.skip.push(ident.clone()),
                        None => errors.spanned(
                            syn::spanned::Spanned::span(&inner.path),
                            "`skip(..)` lists parameter names",
                        ),
                    }
                    Ok(())
                })?;
            }
            "budget" => {
                errors.spanned(
                    key.span(),
                    "`budget` is now called `deadline`: the time limit of the whole call, e.g. `deadline = \"2m\"`",
                );
                return skip_value(&meta);
            }
            other => {
                errors.spanned(
                    key.span(),
                    format!("unknown option `{other}`: expected one of {OPTIONS}"),
                );
                return skip_value(&meta);
            }
        }
        Ok(())
    }
}

/// Consumes `= value` or `(..)` after an unknown key, so parsing goes on to the next option
/// without a second error about a value that was never going to be read (`vis = pub`).
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        let value = meta.value()?;
        rest_of_option(value)?;
    } else if meta.input.peek(syn::token::Paren) {
        let _: proc_macro2::Group = meta.input.parse()?;
    }
    Ok(())
}

/// The tokens up to the next `,` at this level (or the end): an option's value as written.
fn rest_of_option(input: syn::parse::ParseStream<'_>) -> syn::Result<proc_macro2::TokenStream> {
    let mut tokens = proc_macro2::TokenStream::new();
    while !input.is_empty() && !input.peek(Token![,]) {
        let tt: proc_macro2::TokenTree = input.parse()?;
        tokens.extend([tt]);
    }
    Ok(tokens)
}

/// `key = "text"`. Any other value (`retry = keyed`, `timeout = 30`) is reported once, at the
/// value, saying that the option takes a string and what it accepts; then parsing goes on.
fn string_value(
    meta: &ParseNestedMeta<'_>,
    key: &Ident,
    errors: &mut Errors,
    accepts: &str,
) -> syn::Result<Option<LitStr>> {
    let value = meta.value()?;
    if value.peek(LitStr) {
        return value.parse().map(Some);
    }
    let tokens = rest_of_option(value)?;
    let single_word = syn::parse2::<Ident>(tokens.clone()).ok();
    let message = match single_word {
        _ if tokens.is_empty() => format!("`{key}` needs a value: {accepts}"),
        Some(word) => format!(
            "`{key}` takes a string: write {key} = \"{word}\" (in quotes); it accepts {accepts}"
        ),
        None => format!("`{key}` takes a string in quotes: {accepts}"),
    };
    if tokens.is_empty() {
        errors.spanned(key.span(), message);
    } else {
        errors.at(tokens, message);
    }
    Ok(None)
}

/// `"500ms"`, `"30s"`, `"2m"`, `"1h"`: a whole number and a unit, no spaces.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    if number.is_empty() {
        return Err("it does not start with a number".into());
    }
    let too_large = || "the number is too large".to_owned();
    let n: u64 = number.parse().map_err(|_| too_large())?;
    let secs_per = match unit {
        "ms" => return nonzero(Duration::from_millis(n)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "" => return Err("the unit is missing".into()),
        other => return Err(format!("unknown unit {other:?}")),
    };
    let secs = n.checked_mul(secs_per).ok_or_else(too_large)?;
    nonzero(Duration::from_secs(secs))
}

fn nonzero(d: Duration) -> Result<Duration, String> {
    if d.is_zero() { Err("it must be longer than zero".into()) } else { Ok(d) }
}

/// The `#[idem(..)]` markers and the doc comment of one parameter.
#[derive(Default, Clone)]
pub struct ParamAttr {
    /// `#[idem(skip)]`, with the span of `skip`.
    pub skip: Option<Span>,
    /// `#[idem(skip_if_none)]`: left out of the key when `None`.
    pub skip_if_none: Option<Span>,
    /// `#[idem(ctx)]`: this parameter is the context, whatever its type is spelled.
    pub ctx: Option<Span>,
    /// `#[idem(flatten)]`: a struct whose fields are the tool's arguments.
    pub flatten: Option<Span>,
    /// The `///` lines, for the parameter's JSON Schema `description`.
    pub docs: Vec<syn::Expr>,
    /// A `#[cfg]` or `#[cfg_attr]` was refused here: the parameter is left out, as in a build
    /// where its condition is false, so that call sites written for one add no errors.
    pub cfg: bool,
}

/// The markers a parameter accepts, for the "unknown" message.
const PARAM_MARKERS: &str =
    "`#[idem(skip)]`, `#[idem(skip_if_none)]`, `#[idem(ctx)]` or `#[idem(flatten)]`";

impl ParamAttr {
    /// Parses and removes the parameter's `#[idem(..)]` attributes and doc comments (rustc
    /// refuses doc comments on parameters; here they describe the argument to the model).
    pub fn take(attrs: &mut Vec<syn::Attribute>, errors: &mut Errors) -> ParamAttr {
        let mut out = ParamAttr::default();
        attrs.retain(|attr| {
            if attr.path().is_ident("doc") {
                if let syn::Meta::NameValue(nv) = &attr.meta {
                    out.docs.push(nv.value.clone());
                }
                return false;
            }
            if attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr") {
                // The macro sees the parameter before rustc evaluates the condition, and the
                // arguments (their schema and their key) would differ from build to build.
                errors.at(
                    attr,
                    "`#[cfg]` and `#[cfg_attr]` cannot go on a tool's parameter: the parameters are the tool's arguments, whose schema and key must not change from build to build; put the `#[cfg]` on the whole tool, one version of the fn per configuration",
                );
                out.cfg = true;
                return false;
            }
            if let Some(derive) = ["serde", "schemars"].iter().find(|d| attr.path().is_ident(d)) {
                // Without this, rustc says only that it cannot find the attribute `serde`.
                errors.at(
                    attr,
                    format!(
                        "`#[{derive}(..)]` cannot go on a tool's parameter: the arguments' serde and schemars code is generated from each parameter's name and type. For another JSON name, name the parameter so (`#[allow(non_snake_case)] userId: String`); for renames, defaults and other field attributes, take one struct marked `#[idem(flatten)]` and put them on its fields"
                    ),
                );
                return false;
            }
            if !attr.path().is_ident("idem") {
                return true;
            }
            let parsed = attr.parse_nested_meta(|meta| {
                let span = syn::spanned::Spanned::span(&meta.path);
                let slot = if meta.path.is_ident("skip") {
                    &mut out.skip
                } else if meta.path.is_ident("skip_if_none") {
                    &mut out.skip_if_none
                } else if meta.path.is_ident("ctx") {
                    &mut out.ctx
                } else if meta.path.is_ident("flatten") {
                    &mut out.flatten
                } else {
                    errors.spanned(span, format!("unknown parameter marker: use {PARAM_MARKERS}"));
                    return skip_value(&meta);
                };
                if slot.is_some() {
                    errors.spanned(span, "this marker is given twice; keep one");
                }
                *slot = Some(span);
                Ok(())
            });
            if let Err(e) = parsed {
                errors.push(e);
            }
            false
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("30 s").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
