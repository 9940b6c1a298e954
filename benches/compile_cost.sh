#!/usr/bin/env bash
# Compile cost of #[tool]: `cargo check` wall time of a crate with N annotated
# tools against the same crate with N plain async fns (same signatures and bodies), same deps.
# A third crate, the plain fns plus one args struct each deriving Serialize, Deserialize,
# JsonSchema and Clone, shows the floor of any tool whose arguments come from a model's JSON.
# Two more: the peer, the same fns as rmcp `#[tool]` methods (one `Parameters<ToolNArgs>`
# struct each, deriving Deserialize and JsonSchema, as rmcp documents) in one `#[tool_router]`
# impl; and the same methods as idem `#[tool]` methods in one `#[tool_set]` impl.
#
# Usage: benches/compile_cost.sh [N=100] [RUNS=5]
#        CARGO_INCREMENTAL=0 benches/compile_cost.sh ..   (full checks, see below)
# Dependencies are built once (warm-up); then each crate's own check is timed RUNS times after
# touching its source, alternating the three crates; the median is reported.
# With incremental compilation (cargo's default for these path crates) a touched but unchanged
# file re-runs the macros (expansion is never cached) and reuses the type checking; with
# CARGO_INCREMENTAL=0 every run type-checks the whole crate, as a first build or CI does.
#
# COMPILE_COST_INSTRUCTIONS=1 also counts the instructions of each crate's rustc (a full,
# non-incremental check, the proc macros included) once under `valgrind --tool=callgrind`:
# unlike the times, the counts do not change with the machine's load, so their ratios can be
# compared between runs. About 3 minutes more (rmcp's crate takes the longest).
set -euo pipefail

N=${1:-100}
RUNS=${2:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# A private target dir: the crates depend on this checkout's idem-core by path.
# Set COMPILE_COST_TARGET to keep the warmed dependencies between runs.
export CARGO_TARGET_DIR="${COMPILE_COST_TARGET:-$WORK/target}"
# shellcheck source=benches/compile_common.sh
. "$ROOT/benches/compile_common.sh"

gen() { # gen NAME annotated|plain|derived|rmcp|idem_set
  local dir="$WORK/$1"
  mkdir -p "$dir/src"
  cp "$ROOT/Cargo.lock" "$dir/Cargo.lock"
  local dep='idem-core = { path = "'"$ROOT"'/idem-core" }'
  if [ "$2" = rmcp ]; then
    dep='rmcp = { version = "3.11", default-features = false, features = ["server", "macros"] }'
  fi
  cat > "$dir/Cargo.toml" <<TOML
[package]
name = "$1"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
$dep
serde = { version = "1", features = ["derive"] }

[workspace]
TOML
  if [ "$2" = rmcp ]; then gen_rmcp > "$dir/src/lib.rs"; return; fi
  if [ "$2" = idem_set ]; then gen_idem_set > "$dir/src/lib.rs"; return; fi
  {
    app_error
    for i in $(seq 1 "$N"); do
      echo
      echo "/// Tool number $i."
      if [ "$2" = annotated ]; then
        case $((i % 3)) in
          0) echo '#[idem_core::tool(retry = "safe")]' ;;
          1) echo '#[idem_core::tool(retry = "keyed", timeout = "10s")]' ;;
          2) echo '#[idem_core::tool(retry = "never")]' ;;
        esac
      fi
      if [ "$2" = derived ]; then
        echo '#[derive(serde::Serialize, serde::Deserialize, idem_core::__private::schemars::JsonSchema, Clone)]'
        echo '#[schemars(crate = "idem_core::__private::schemars")]'
        echo "pub struct Tool${i}Args { pub customer: String, pub amount_cents: u64 }"
      fi
      tool_fn "tool_$i" "$i"
    done
  } > "$dir/src/lib.rs"
}

gen_rmcp() { # the peer: rmcp's documented shape, one Parameters struct per tool
  echo 'use rmcp::handler::server::wrapper::Parameters;'
  echo 'use rmcp::{ErrorData, tool, tool_router};'
  echo
  echo 'pub struct Server;'
  for i in $(seq 1 "$N"); do
    echo
    echo '#[derive(serde::Deserialize, rmcp::schemars::JsonSchema)]'
    echo '#[schemars(crate = "rmcp::schemars")]'
    echo "pub struct Tool${i}Args { pub customer: String, pub amount_cents: u64 }"
  done
  echo
  echo '#[tool_router]'
  echo 'impl Server {'
  for i in $(seq 1 "$N"); do
    echo "    /// Tool number $i."
    echo '    #[tool]'
    echo "    async fn tool_$i(&self, Parameters(Tool${i}Args { customer, amount_cents }): Parameters<Tool${i}Args>) -> Result<String, ErrorData> {"
    echo "        if amount_cents == 0 { return Err(ErrorData::invalid_params(customer, None)); }"
    echo "        Ok(format!(\"{customer}:{amount_cents}:$i\"))"
    echo '    }'
  done
  echo '}'
}

gen_idem_set() { # the same methods as idem tools in one #[tool_set] impl
  app_error
  echo
  echo 'pub struct Server;'
  echo
  echo '#[idem_core::tool_set]'
  echo 'impl Server {'
  for i in $(seq 1 "$N"); do
    echo "    /// Tool number $i."
    case $((i % 3)) in
      0) echo '    #[tool(retry = "safe")]' ;;
      1) echo '    #[tool(retry = "keyed", timeout = "10s")]' ;;
      2) echo '    #[tool(retry = "never")]' ;;
    esac
    echo "    async fn tool_$i(&self, customer: String, amount_cents: u64) -> Result<String, AppError> {"
    echo "        if amount_cents == 0 { return Err(AppError(customer)); }"
    echo "        Ok(format!(\"{customer}:{amount_cents}:$i\"))"
    echo '    }'
  done
  echo '}'
}

gen tools_annotated annotated
gen tools_plain plain
gen tools_derived derived
gen tools_rmcp rmcp
gen tools_idem_set idem_set

echo "warming dependencies (idem-core and its deps, built once)..." >&2
(cd "$WORK/tools_annotated" && cargo check -q)
(cd "$WORK/tools_plain" && cargo check -q)
(cd "$WORK/tools_derived" && cargo check -q)
(cd "$WORK/tools_rmcp" && cargo check -q)
(cd "$WORK/tools_idem_set" && cargo check -q)

time_check() { # prints "wall_s cpu_s" (cpu = user + sys of cargo and rustc)
  local dir="$WORK/$1"
  touch "$dir/src/lib.rs"
  (cd "$dir" && /usr/bin/time -f '%e %U %S' -o "$WORK/time.txt" cargo check -q)
  awk '{printf "%.2f %.2f\n", $1, $2 + $3}' "$WORK/time.txt"
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

a_wall=(); a_cpu=(); p_wall=(); p_cpu=(); d_wall=(); d_cpu=(); r_wall=(); r_cpu=(); s_wall=(); s_cpu=()
for _ in $(seq 1 "$RUNS"); do
  read -r w c < <(time_check tools_annotated); a_wall+=("$w"); a_cpu+=("$c")
  read -r w c < <(time_check tools_plain); p_wall+=("$w"); p_cpu+=("$c")
  read -r w c < <(time_check tools_derived); d_wall+=("$w"); d_cpu+=("$c")
  read -r w c < <(time_check tools_rmcp); r_wall+=("$w"); r_cpu+=("$c")
  read -r w c < <(time_check tools_idem_set); s_wall+=("$w"); s_cpu+=("$c")
done

m() { printf '%s\n' "$@" | median; }
aw=$(m "${a_wall[@]}"); ac=$(m "${a_cpu[@]}"); pw=$(m "${p_wall[@]}"); pc=$(m "${p_cpu[@]}")
dw=$(m "${d_wall[@]}"); dc=$(m "${d_cpu[@]}")
rw=$(m "${r_wall[@]}"); rc=$(m "${r_cpu[@]}"); sw=$(m "${s_wall[@]}"); sc=$(m "${s_cpu[@]}")
printf 'rustc %s, %s cores, load average %s\n' "$(rustc --version | cut -d' ' -f2)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf 'cargo check of one crate, %d fns, median of %d runs (dependencies warm), %s\n' "$N" "$RUNS" \
  "$([ "${CARGO_INCREMENTAL:-1}" = 0 ] && echo 'CARGO_INCREMENTAL=0: full checks' || echo 'incremental: touch, unchanged')"
printf '                              wall      cpu (user+sys)\n'
printf '  #[tool] annotated:          %5.2f s   %5.2f s   (wall runs: %s)\n' "$aw" "$ac" "${a_wall[*]}"
printf '  plain async fns:            %5.2f s   %5.2f s   (wall runs: %s)\n' "$pw" "$pc" "${p_wall[*]}"
printf '  plain + derived args:       %5.2f s   %5.2f s   (wall runs: %s)\n' "$dw" "$dc" "${d_wall[*]}"
printf '  rmcp #[tool_router] methods: %5.2f s   %5.2f s   (wall runs: %s)\n' "$rw" "$rc" "${r_wall[*]}"
printf '  idem #[tool_set] methods:   %5.2f s   %5.2f s   (wall runs: %s)\n' "$sw" "$sc" "${s_wall[*]}"
printf '  ratio annotated / plain:    %5.2fx    %5.2fx\n' "$(echo "$aw / $pw" | bc -l)" "$(echo "$ac / $pc" | bc -l)"
printf '  ratio annotated / rmcp:     %5.2fx    %5.2fx\n' "$(echo "$aw / $rw" | bc -l)" "$(echo "$ac / $rc" | bc -l)"
printf '  ratio idem set / rmcp:      %5.2fx    %5.2fx\n' "$(echo "$sw / $rw" | bc -l)" "$(echo "$sc / $rc" | bc -l)"
printf '  ratio derived / plain:      %5.2fx    %5.2fx\n' "$(echo "$dw / $pw" | bc -l)" "$(echo "$dc / $pc" | bc -l)"
printf '  ratio annotated / derived:  %5.2fx    %5.2fx\n' "$(echo "$aw / $dw" | bc -l)" "$(echo "$ac / $dc" | bc -l)"
printf '  per tool over plain:        %5.1f ms wall\n' "$(echo "($aw - $pw) * 1000 / $N" | bc -l)"

if [ "${COMPILE_COST_INSTRUCTIONS:-0}" = 1 ]; then
  command -v valgrind >/dev/null || { echo "COMPILE_COST_INSTRUCTIONS=1 needs valgrind" >&2; exit 1; }
  instructions() { check_instructions "$WORK/$1" "$1" "$WORK/cg-$1.out"; }
  ia=$(instructions tools_annotated); ip=$(instructions tools_plain)
  ir=$(instructions tools_rmcp); is=$(instructions tools_idem_set)
  printf 'instructions of one full check (rustc under callgrind, proc macros included)\n'
  printf '  #[tool] annotated:          %6.0f M\n' "$(echo "$ia / 1000000" | bc -l)"
  printf '  plain async fns:            %6.0f M\n' "$(echo "$ip / 1000000" | bc -l)"
  printf '  rmcp #[tool_router] methods: %6.0f M\n' "$(echo "$ir / 1000000" | bc -l)"
  printf '  idem #[tool_set] methods:   %6.0f M\n' "$(echo "$is / 1000000" | bc -l)"
  printf '  ratio annotated / plain:    %5.2fx\n' "$(echo "$ia / $ip" | bc -l)"
  printf '  ratio idem set / rmcp:      %5.2fx\n' "$(echo "$is / $ir" | bc -l)"
fi
