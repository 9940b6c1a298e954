#!/usr/bin/env bash
# Runs the durable-store benchmarks: idem on SQLite, PostgreSQL and Redis
# against raw round trips of the same servers, throughput with 32 callers, and the AWS Powertools
# peer on the same Redis, all in one run (idem-core/benches/stores.rs prints the table).
#
# Starts nothing: PostgreSQL and Redis must already be running (.ci/run starts them), at
# IDEM_PG_URL (default "host=127.0.0.1 port=5432 user=postgres dbname=test") and IDEM_REDIS_URL
# (default redis://127.0.0.1:6379/). Creates a Python venv with aws-lambda-powertools and redis
# under $CARGO_TARGET_DIR/bench-venv (target/bench-venv by default) the first time.
#
# Knobs (environment): IDEM_BENCH_ROUNDS (9), IDEM_BENCH_CALLS (200), IDEM_BENCH_TPUT_SECS (2),
# IDEM_BENCH_STORES (sqlite,postgres,redis). The output is also saved to
# $CARGO_TARGET_DIR/idem-bench/stores-<time>.txt.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
export IDEM_PG_URL="${IDEM_PG_URL:-host=127.0.0.1 port=5432 user=postgres dbname=test}"
export IDEM_REDIS_URL="${IDEM_REDIS_URL:-redis://127.0.0.1:6379/}"

venv="$target/bench-venv"
if ! "$venv/bin/python" -c 'import aws_lambda_powertools, redis, boto3' 2>/dev/null; then
    echo "creating $venv (aws-lambda-powertools, redis; boto3 because the idempotency package imports it)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet aws-lambda-powertools redis boto3
fi
export IDEM_BENCH_PYTHON="$venv/bin/python"

mkdir -p "$target/idem-bench"
log="$target/idem-bench/stores-$(date -u +%Y%m%dT%H%M%SZ).txt"
# --release is what `cargo bench` uses anyway; the bench binary prints medians and ratios.
cargo bench -p idem-core --features sqlite,postgres,redis --bench stores 2>&1 | tee "$log"
echo "saved to $log" >&2
