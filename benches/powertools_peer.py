"""The peer of idem's Redis store: AWS Powertools' `idempotent_function` with its Redis
persistence layer (`RedisCachePersistenceLayer`), on the same ~200 bytes of arguments as
`idem-core/benches/stores.rs`, timed in-process with `time.perf_counter_ns`.

Run by the Rust bench (`IDEM_BENCH_PYTHON`) so that it is measured in the same run, on the same
Redis. Prints progress on stderr and one JSON line on stdout (medians in ns). Removes every key it
created (all start with `--prefix`).

What Powertools does per call (aws_lambda_powertools/utilities/idempotency/persistence/redis.py):
first call = `SET key in-progress EX ttl NX` + the function + `SET key completed EX ttl`
(2 round trips); replay = `SET .. NX` (refused) + `GET key` (2 round trips). No local cache
(`use_local_cache=False`, the default), so every replay reads Redis, as idem's does.
"""

import argparse
import json
import platform
import statistics
import sys
import time
from importlib.metadata import version
from urllib.parse import urlparse

import redis
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer


def charge_args(n):
    # The same fields and values as `charge_args` in idem-core/benches/stores.rs.
    return {
        "customer": "cus_Q4tL9mX2aB7cD1",
        "amount_cents": 4900 + n,
        "currency": "eur",
        "description": "Annual subscription, team plan (5 seats), invoice INV-2026-0042",
        "metadata": {"order_id": "ord_7781", "agent_run": "run_2026_11_29_a"},
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/")
    p.add_argument("--prefix", required=True)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=200)
    a = p.parse_args()

    url = urlparse(a.redis_url)
    host, port = url.hostname or "127.0.0.1", url.port or 6379
    db = int(url.path.strip("/") or 0)
    layer = RedisCachePersistenceLayer(host=host, port=port, db_index=db, ssl=False)
    config = IdempotencyConfig()

    @idempotent_function(
        data_keyword_argument="args",
        persistence_store=layer,
        config=config,
        key_prefix=a.prefix,
    )
    def charge_card(args: dict) -> dict:
        return {"id": "ch_3PqR7s", "amount_cents": args["amount_cents"]}

    raw = redis.Redis(host=host, port=port, db=db)
    raw_value = '{"id":"ch_3PqR7s","amount_cents":4900,"fp":"9f86d081884c7d659a2feaa0c55ad015"}'
    counter = [1]

    def first():
        counter[0] += 1
        charge_card(args=charge_args(counter[0]))

    def replay():
        out = charge_card(args=charge_args(0))
        assert out["amount_cents"] == 4900

    def raw_set_nx_2():
        counter[0] += 1
        raw.set(f"{a.prefix}:raw:{counter[0]}:a", raw_value, nx=True)
        raw.set(f"{a.prefix}:raw:{counter[0]}:b", raw_value, nx=True)

    def raw_get():
        assert raw.get(f"{a.prefix}:raw:0:a") is not None

    charge_card(args=charge_args(0))
    raw.set(f"{a.prefix}:raw:0:a", raw_value)
    ops = {"first_call_ns": first, "replay_ns": replay, "raw_set_nx_2_ns": raw_set_nx_2,
           "raw_get_ns": raw_get}
    for f in ops.values():
        for _ in range(max(a.calls // 4, 10)):
            f()
    samples = {k: [] for k in ops}
    names = list(ops)
    try:
        for r in range(a.rounds):
            for k in names if r % 2 == 0 else reversed(names):
                f, out = ops[k], samples[k]
                for _ in range(a.calls):
                    t = time.perf_counter_ns()
                    f()
                    out.append(time.perf_counter_ns() - t)
            print(f"powertools peer: round {r + 1}/{a.rounds}", file=sys.stderr)
    finally:
        removed = 0
        for key in raw.scan_iter(match=f"{a.prefix}*", count=1000):
            removed += raw.delete(key)
        print(f"powertools peer: removed {removed} keys", file=sys.stderr)

    result = {k: statistics.median(v) for k, v in samples.items()}
    result.update(
        iterations=a.rounds * a.calls,
        powertools_version=version("aws-lambda-powertools"),
        redis_py_version=version("redis"),
        python=f"Python {platform.python_version()}",
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
