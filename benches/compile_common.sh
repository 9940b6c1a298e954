# Sourced by compile_cost.sh and compile_floor.sh: the text their generated crates share, and
# the instruction count of one crate's full check.

app_error() { # the imports and the error type every generated tool returns
  cat <<'RS'
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub struct AppError(pub String);
impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(&self.0) }
}
impl idem_core::Classify for AppError {
    fn classify(&self) -> idem_core::Failure { idem_core::Failure::permanent() }
}
RS
}

tool_fn() { # tool_fn NAME I: the async fn of tool I, the same body in every crate
  echo "pub async fn $1(customer: String, amount_cents: u64) -> Result<String, AppError> {"
  echo "    if amount_cents == 0 { return Err(AppError(customer)); }"
  echo "    Ok(format!(\"{customer}:{amount_cents}:$2\"))"
  echo "}"
}

check_instructions() { # check_instructions DIR CRATE OUT: the instructions of a full check of
  # crate CRATE in DIR (its rustc command, proc macros included, under callgrind; the profile
  # is written to OUT, the log beside it)
  local cmd
  touch "$1/src/lib.rs"
  cmd=$(cd "$1" && CARGO_INCREMENTAL=0 cargo check -v 2>&1 | sed -n 's/^ *Running `\(.*--crate-name '"$2"' .*\)`$/\1/p' | tail -n1)
  [ -n "$cmd" ] || { (cd "$1" && cargo check) >&2; echo "crate $2 does not build" >&2; exit 1; }
  cmd=${cmd/--error-format=json --json=diagnostic-rendered-ansi,artifacts,future-incompat/}
  (cd "$1" && eval "valgrind --tool=callgrind --callgrind-out-file=$3 $cmd" >"$3.log" 2>&1)
  sed -n 's/^summary: //p' "$3"
}
