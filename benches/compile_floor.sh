#!/usr/bin/env bash
# The floor of #[tool]'s compile cost, part by part: the 100 plain async fns of compile_cost.sh,
# then the same crate with one more of the things a tool needs each time, written by hand (no
# #[tool]), and #[tool] itself last. Each crate's full check (CARGO_INCREMENTAL=0) is counted
# in rustc instructions under `valgrind --tool=callgrind`, the proc macros included: the counts
# do not move with the machine's load. About 6 minutes for N=100.
#
# Usage: benches/compile_floor.sh [N=100]
#        COMPILE_COST_TARGET=dir benches/compile_floor.sh   (keeps the warmed dependencies)
#
# The crates, each with N tools `(customer: String, amount_cents: u64) -> Result<String, AppError>`:
#   plain        the async fns alone (the baseline of compile_cost.sh)
#   pass         each under an attribute macro that returns its input unchanged
#   sig          each under an attribute macro that parses the attributes and the signature with
#                syn (the body kept as tokens, as idem-macros does) and emits them as they were
#   boxed        plain, plus one fn per tool boxing its future as `Pin<Box<dyn Future + Send>>`
#   sig_boxed    sig and boxed together
#   types        the body renamed, plus the arguments type (`Args<(String, u64), F>`), its field
#                names (`enum F {}` and its `Fields` impl) and a tool type alias
#   merged       types, plus the body and its boxing in one fn (`Box::pin(async move {..})`),
#                held as a fn pointer by a constant of a plain struct with a shared `ToolDef`
#   closure      types, plus a constant whose body is a closure boxing the body's future (the
#                shape of today's tool constant), shared `ToolDef`
#   own_def      closure, the constant with the tool's own `ToolDef` (a timeout)
#   bounds       own_def, plus the tool types' bounds proved (`ToolArgs`, `ToolOutput`, `ToolError`)
#   value        today's tool constant (`FnTool::new`), the body a fn of its own
#   typed_call   value, plus today's typed call (`tool_n(&run, customer, amount_cents)`)
#   checks       typed_call, the constant built through today's one-error checks
#   annotated    #[idem_core::tool(retry = "keyed", timeout = "10s")] on each fn
set -euo pipefail
command -v valgrind >/dev/null || { echo "compile_floor.sh needs valgrind" >&2; exit 1; }

N=${1:-100}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export CARGO_TARGET_DIR="${COMPILE_COST_TARGET:-$WORK/target}"
# shellcheck source=benches/compile_common.sh
. "$ROOT/benches/compile_common.sh"
VARIANTS=(plain pass sig boxed sig_boxed types merged closure own_def bounds value typed_call checks annotated)

# The two attribute macros, in a proc-macro crate of their own (same syn, quote, proc-macro2).
mkdir -p "$WORK/floor_macros/src" "$WORK/floor/src"
cat > "$WORK/floor_macros/Cargo.toml" <<TOML
[package]
name = "floor_macros"
version = "0.0.0"
edition = "2024"
publish = false

[lib]
proc-macro = true

[dependencies]
$(grep -E '^(syn|quote|proc-macro2) =' "$ROOT/Cargo.toml")

[workspace]
TOML
cat > "$WORK/floor_macros/src/lib.rs" <<'RS'
use proc_macro::TokenStream;

#[proc_macro_attribute]
pub fn pass(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}

struct Head {
    attrs: Vec<syn::Attribute>,
    vis: syn::Visibility,
    sig: syn::Signature,
    body: proc_macro2::TokenTree,
}

impl syn::parse::Parse for Head {
    fn parse(input: syn::parse::ParseStream<'_>) -> syn::Result<Self> {
        Ok(Head {
            attrs: input.call(syn::Attribute::parse_outer)?,
            vis: input.parse()?,
            sig: input.parse()?,
            body: input.parse()?,
        })
    }
}

#[proc_macro_attribute]
pub fn sig(_attr: TokenStream, item: TokenStream) -> TokenStream {
    let Head { attrs, vis, sig, body } = syn::parse_macro_input!(item as Head);
    quote::quote!(#(#attrs)* #vis #sig #body).into()
}
RS
cat > "$WORK/floor/Cargo.toml" <<TOML
[package]
name = "floor"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
idem-core = { path = "$ROOT/idem-core" }
serde = { version = "1", features = ["derive"] }
floor_macros = { path = "../floor_macros" }

[workspace]
TOML
cp "$ROOT/Cargo.lock" "$WORK/floor/Cargo.lock"

types() { # types I TOOL_TYPE
  cat <<RS
pub type Tool$1Args = ::idem_core::__private::Args<(String, u64), __IdemTool$1Fields>;
pub enum __IdemTool$1Fields {}
impl ::idem_core::__private::Fields for __IdemTool$1Fields {
    const NAME: &'static ::core::primitive::str = "Tool$1Args";
    const NAMES: &'static [&'static ::core::primitive::str] = &["customer", "amount_cents"];
    const MAY_HOLD_SET: ::core::primitive::u16 = 0u16;
    const FROM_INTENT: ::core::primitive::bool = true;
}
pub type Tool$1Tool = $2<Tool$1Args, String, AppError>;
RS
}

own_def() { # own_def I
  echo "&::idem_core::ToolDef { name: \"tool_$1\", description: \"Tool number $1.\", class: ::idem_core::RetryClass::Keyed, options: ::idem_core::ToolOptions { attempt_timeout: ::core::option::Option::Some(::core::time::Duration::new(10u64, 0u32)), ..::idem_core::ToolOptions::NONE } }"
}

closure() { # closure I
  echo "|__idem_cx, __idem_args: Tool$1Args| { let _ = __idem_cx; ::idem_core::__private::checks::tool_body(__idem_tool_$1(__idem_args.0.0, __idem_args.0.1)) }"
}

tool() { # tool VARIANT I: one tool's items
  local v=$1 i=$2
  echo "/// Tool number $i."
  case $v in
    plain) tool_fn "tool_$i" "$i" ;;
    pass) echo '#[floor_macros::pass]'; tool_fn "tool_$i" "$i" ;;
    sig) echo '#[floor_macros::sig]'; tool_fn "tool_$i" "$i" ;;
    boxed | sig_boxed)
      [ "$v" = sig_boxed ] && echo '#[floor_macros::sig]'
      tool_fn "tool_$i" "$i"
      echo "pub fn tool_${i}_boxed(customer: String, amount_cents: u64) -> BoxFut<Result<String, AppError>> { Box::pin(tool_$i(customer, amount_cents)) }"
      ;;
    types) tool_fn "__idem_tool_$i" "$i"; types "$i" Held ;;
    merged)
      types "$i" Held
      cat <<RS
fn __idem_box_$i(__idem_cx: &::idem_core::Ctx, __idem_args: Tool${i}Args) -> ::idem_core::__private::BoxFuture<'_, Result<String, AppError>> {
    let _ = __idem_cx;
    let (customer, amount_cents) = __idem_args.0;
    ::idem_core::__private::checks::tool_body(async move {
        if amount_cents == 0 { return Err(AppError(customer)); }
        Ok(format!("{customer}:{amount_cents}:$i"))
    })
}
pub const Tool${i}Tool: Tool${i}Tool = Held { def: &SHARED_DEF, body: __idem_box_$i };
RS
      ;;
    closure | own_def | bounds)
      tool_fn "__idem_tool_$i" "$i"; types "$i" Held
      local def='&SHARED_DEF'
      [ "$v" != closure ] && def=$(own_def "$i")
      echo "pub const Tool${i}Tool: Tool${i}Tool = Held { def: $def, body: $(closure "$i") };"
      [ "$v" = bounds ] && echo "const _: () = bounds::<Tool${i}Args, String, AppError>();"
      ;;
    value | typed_call | checks)
      tool_fn "__idem_tool_$i" "$i"; types "$i" ::idem_core::__private::FnTool
      if [ "$v" = checks ]; then
        cat <<RS
pub const Tool${i}Tool: Tool${i}Tool = {
    let __idem_checked = ::idem_core::__private::checks::checked(|(__idem_p, __idem_o, __idem_e): ((String, u64), String, AppError)| {
        use ::idem_core::__private::checks::*;
        ((__idem_p.0, __idem_p.1), (::idem_core::__private::checks::Checking(__idem_o)).0,
         (::idem_core::__private::checks::Checking(__idem_e).__idem_error_classify().__idem_error_serialize().__idem_error_deserialize().__idem_error_display().__idem_error_send()).0)
    });
    __idem_checked.tool($(own_def "$i"), $(closure "$i"), "floor::tool_$i")
};
RS
      else
        echo "pub const Tool${i}Tool: Tool${i}Tool = ::idem_core::__private::FnTool::new($(own_def "$i"), $(closure "$i"), \"floor::tool_$i\");"
      fi
      [ "$v" = value ] && return
      cat <<RS
pub fn tool_$i<'__idem>(run: &'__idem ::idem_core::Run, customer: String, amount_cents: u64)
    -> ::idem_core::__private::BoxFuture<'__idem, ::core::result::Result<String, ::idem_core::Error<AppError>>> {
    Tool${i}Tool.call(run, Tool${i}Args::new(customer, amount_cents))
}
RS
      ;;
    annotated) echo '#[idem_core::tool(retry = "keyed", timeout = "10s")]'; tool_fn "tool_$i" "$i" ;;
  esac
}

gen() { # gen VARIANT > lib.rs
  echo '#![allow(dead_code)]'
  app_error
  cat <<'RS'

pub type BoxFut<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
/// A tool value with nothing proved: a definition and a body.
pub struct Held<A, O, E> { pub def: &'static idem_core::ToolDef, pub body: idem_core::__private::FnBody<A, O, E> }
pub const fn bounds<A: idem_core::__private::ToolArgs, O: idem_core::__private::ToolOutput, E: idem_core::__private::ToolError>() {}
pub const SHARED_DEF: idem_core::ToolDef = idem_core::ToolDef { name: "t", description: "d", class: idem_core::RetryClass::Keyed, options: idem_core::ToolOptions::NONE };
RS
  for i in $(seq 1 "$N"); do echo; tool "$1" "$i"; done
}

instructions() { # instructions VARIANT: prints the count of a full check of the crate
  gen "$1" > "$WORK/floor/src/lib.rs"
  check_instructions "$WORK/floor" floor "$WORK/cg-$1.out"
}

echo "warming dependencies..." >&2
gen plain > "$WORK/floor/src/lib.rs"
(cd "$WORK/floor" && cargo check -q)
printf 'rustc %s, %d fns, instructions of one full check (proc macros included)\n' "$(rustc --version | cut -d' ' -f2)" "$N"
base=
for v in "${VARIANTS[@]}"; do
  n=$(instructions "$v")
  base=${base:-$n}
  printf '  %-11s %6.0f M  %5.2fx plain\n' "$v" "$(echo "$n / 1000000" | bc -l)" "$(echo "$n / $base" | bc -l)"
done
if command -v callgrind_annotate >/dev/null; then
  m=$(callgrind_annotate --inclusive=yes --threshold=100 "$WORK/cg-annotated.out" 2>/dev/null |
    awk '/idem_macros::tool \[/ && !found {gsub(",", "", $1); print $1; found = 1}')
  [ -n "$m" ] && printf '  of annotated, the proc macro itself (idem_macros::tool): %.0f M\n' "$(echo "$m / 1000000" | bc -l)"
fi
