#!/usr/bin/env bash
# Runs the durable-store benchmarks: idem on SQLite, PostgreSQL and Redis
# against raw round trips of the same servers, throughput with 32 callers, the same over TLS (on a
# private PostgreSQL and Redis the bench starts itself), and the AWS Powertools peer on the same
# Redis, all in one run (idem-core/benches/stores.rs prints the table).
#
# Otherwise starts nothing: PostgreSQL and Redis must already be running (.ci/run starts them), at
# IDEM_PG_URL (default "host=127.0.0.1 port=5432 user=postgres dbname=test") and IDEM_REDIS_URL
# (default redis://127.0.0.1:6379/). Creates a Python venv with aws-lambda-powertools and redis
# under $CARGO_TARGET_DIR/bench-venv (target/bench-venv by default) the first time.
#
# Knobs (environment): IDEM_BENCH_ROUNDS (9), IDEM_BENCH_CALLS (200), IDEM_BENCH_TPUT_SECS (2),
# IDEM_BENCH_STORES (sqlite,postgres,redis). The output is also saved to
# $CARGO_TARGET_DIR/idem-bench/stores-<time>.txt.
#
# IDEM_BENCH_AWAKE=1 runs a busy loop beside the bench (one core's worth, killed on exit). On an
# otherwise idle VM a loopback round trip between two processes on different idle vCPUs costs
# 60-80 µs of wake-up instead of about 15 µs (pgbench `select 1`, 2026-12-01), and which
# connections land that way differs between the raw baselines and the store, so quiet runs
# can swing a ratio by 5x either way. With the loop both sides stay awake, as on a loaded host.
# It takes a core from the 32-caller throughput runs (both sides alike: compare ratios only).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
export IDEM_PG_URL="${IDEM_PG_URL:-host=127.0.0.1 port=5432 user=postgres dbname=test}"
export IDEM_REDIS_URL="${IDEM_REDIS_URL:-redis://127.0.0.1:6379/}"
# postgres-tls, redis-tls: the stores bench's TLS rounds, on a private PostgreSQL and Redis it
# starts itself (initdb, openssl, redis-server with TLS; skipped with a note when one is missing).
features=sqlite,postgres,redis,postgres-tls,redis-tls

# `run_store_benches.sh pgbouncer`: the PostgreSQL store through a private PgBouncer in transaction
# mode (started here on a free loopback port in front of IDEM_PG_URL's server, in the keyword
# form; as the postgres user when run as root) against raw round trips through it
# (idem-core/benches/pgbouncer.rs). IDEM_BENCH_PGBOUNCER_URL instead uses a running PgBouncer.
if [ "${1:-}" = pgbouncer ]; then
    mkdir -p "$target/idem-bench"
    log="$target/idem-bench/pgbouncer-$(date -u +%Y%m%dT%H%M%SZ).txt"
    if [ -z "${IDEM_BENCH_PGBOUNCER_URL:-}" ]; then
        conf() { # the value of keyword $1 in IDEM_PG_URL, else $2
            local v
            v=$(printf '%s\n' $IDEM_PG_URL | sed -n "s/^$1=//p" | head -n1)
            echo "${v:-$2}"
        }
        bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
        dir=$(mktemp -d)
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        db=$(conf dbname test)
        user=$(conf user postgres)
        printf '"%s" ""\n' "$user" > "$dir/users.txt"
        printf '%s\n' "[databases]" \
            "$db = host=$(conf host 127.0.0.1) port=$(conf port 5432) dbname=$db user=$user" \
            "[pgbouncer]" "listen_addr = 127.0.0.1" "listen_port = $port" "unix_socket_dir =" \
            "auth_type = trust" "auth_file = $dir/users.txt" "pool_mode = transaction" \
            "default_pool_size = 10" "logfile = $dir/pgbouncer.log" "pidfile = $dir/pgbouncer.pid" \
            > "$dir/pgbouncer.ini"
        if [ "$(id -u)" -eq 0 ]; then
            chown -R postgres "$dir"
            runuser -u postgres -- "$bin" -d "$dir/pgbouncer.ini"
        else
            "$bin" -d "$dir/pgbouncer.ini"
        fi
        trap 'kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null; rm -rf "$dir"' EXIT
        sleep 0.5
        export IDEM_BENCH_PGBOUNCER_URL="host=127.0.0.1 port=$port user=$user dbname=$db sslmode=disable"
    fi
    # The stores bench's features, so that one release build of idem-core serves both.
    cargo bench -p idem-core --features "$features" --bench pgbouncer 2>&1 | tee "$log"
    echo "saved to $log" >&2
    exit 0
fi

venv="$target/bench-venv"
if ! "$venv/bin/python" -c 'import aws_lambda_powertools, redis, boto3' 2>/dev/null; then
    echo "creating $venv (aws-lambda-powertools, redis; boto3 because the idempotency package imports it)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet aws-lambda-powertools redis boto3
fi
export IDEM_BENCH_PYTHON="$venv/bin/python"

if [ "${IDEM_BENCH_AWAKE:-}" = 1 ]; then
    # Built first, so that the loop does not slow the build.
    cargo bench -p idem-core --features "$features" --bench stores --no-run
    (while :; do :; done) &
    awake=$!
    trap 'kill "$awake" 2>/dev/null' EXIT
    echo "IDEM_BENCH_AWAKE=1: a busy loop keeps one core awake (pid $awake)" >&2
fi

mkdir -p "$target/idem-bench"
log="$target/idem-bench/stores-$(date -u +%Y%m%dT%H%M%SZ).txt"
# --release is what `cargo bench` uses anyway; the bench binary prints medians and ratios.
cargo bench -p idem-core --features "$features" --bench stores 2>&1 | tee "$log"
echo "saved to $log" >&2
