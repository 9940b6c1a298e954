"""Drives `payments_mcp --http` with the official Python MCP SDK (`mcp` on PyPI) over streamable
HTTP, as two users with their own bearer tokens.

Usage: python http_test.py SERVER_BINARY WORK_DIR

Checks: a request without a token, or with an unknown one, gets HTTP 401 and nothing runs; a
request with a repeated argument member or a number beyond f64 is answered with its id; user
B who sends user A's run id, caller key and arguments gets a charge of its own, never A's; A's
repeats replay A's charge, also concurrently, in a new session, and after a server restart on
SQLite; a server without a principal configured refuses keyed calls over HTTP. Exits non-zero on
the first failed check.
"""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOKENS = "tok-alice=alice,tok-bob=bob"
A, B = "tok-alice", "tok-bob"
CHARGE = {"customer": "cus_1", "amount_cents": 4900}
META = {"idem/run": "conversation-A", "idem/idempotencyKey": "order-1"}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def text_of(result):
    check(len(result.content) == 1, f"one content block expected: {result}")
    return result.content[0].text


def charge_id(result):
    check(result.is_error is not True, f"charge_card failed: {text_of(result)}")
    return json.loads(text_of(result))["charge_id"]


def ledger(work):
    return json.loads((work / "idem.db.ledger.json").read_text())


def start(binary, work, extra_env=None):
    env = {**os.environ, "PAYMENTS_TOKENS": TOKENS, **(extra_env or {})}
    proc = subprocess.Popen(
        [str(binary), "--sqlite", str(work / "idem.db"), "--http", "127.0.0.1:0"],
        env=env, stderr=subprocess.PIPE, text=True,
    )
    line = proc.stderr.readline()
    check("listening on " in line, f"the server did not start: {line}")
    return proc, line.split("listening on ", 1)[1].strip()


def stop(proc):
    proc.terminate()
    proc.wait()


async def call(url, token, name, args, meta=None):
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                return await session.call_tool(name, args, meta=meta)


async def many(url, token, name, args, meta, n):
    """`n` concurrent calls in one session."""
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                return await asyncio.gather(*[session.call_tool(name, args, meta=meta) for _ in range(n)])


async def unauthorized(url):
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient() as client:
        for auth in ({}, {"Authorization": "Bearer tok-mallory"}):
            r = await client.post(url, json=init, headers={**headers, **auth})
            check(r.status_code == 401, f"{auth}: HTTP {r.status_code}, not 401")


async def raw_bad_requests(url):
    """Requests no SDK would send, in a live session, are answered with their id, and nothing
    runs. (Outside a session they get rmcp's 400 or 404 first, as any request does.)"""
    headers = {"accept": "application/json, text/event-stream", "Authorization": f"Bearer {A}",
               "content-type": "application/json"}
    dup = ('{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"charge_card",'
           '"arguments":{"customer":"cus_dup","amount_cents":5,"customer":"cus_other"}}}')
    big = '{"jsonrpc":"2.0","id":"p-42","method":"ping","params":{"x":1e400}}'
    init = {"jsonrpc": "2.0", "id": 40, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with httpx2.AsyncClient() as client:
        r = await client.post(url, json=init, headers=headers)
        check(r.status_code == 200 and r.headers.get("mcp-session-id"), f"initialize: {r.status_code}")
        headers["Mcp-Session-Id"] = r.headers["mcp-session-id"]
        r = await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                              headers=headers)
        check(r.status_code == 202, f"initialized: {r.status_code}")
        r = await client.post(url, content=dup, headers=headers)
        body = r.json()
        check(r.status_code == 200 and body["id"] == 41, f"duplicate member: {r.status_code} {body}")
        text = body["result"]["content"][0]["text"]
        check(body["result"]["isError"] is True and "appears twice" in text, f"duplicate member: {body}")
        r = await client.post(url, content=big, headers=headers)
        body = r.json()
        check(body["id"] == "p-42" and body["error"]["code"] == -32602, f"1e400: {body}")


async def main():
    binary, work = Path(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    for f in ("idem.db", "idem.db-wal", "idem.db-shm", "idem.db.ledger.json"):
        (work / f).unlink(missing_ok=True)

    proc, url = start(binary, work)
    try:
        await unauthorized(url)
        await raw_bad_requests(url)
        a1 = await call(url, A, "charge_card", CHARGE, META)
        check(a1.meta["idem/outcome"] == "executed", f"A first: {a1.meta}")
        a_charge = charge_id(a1)
        # B replays A's run id, caller key and arguments: B's own execution, never A's result.
        b1 = await call(url, B, "charge_card", CHARGE, META)
        check(charge_id(b1) != a_charge, "B received A's charge")
        check(b1.meta["idem/outcome"] == "executed", f"B first: {b1.meta}")
        b_charge = charge_id(b1)
        # Each user's repeats replay their own charge, concurrently too, in new sessions.
        a_again = await many(url, A, "charge_card", CHARGE, META, 3)
        b_again = await many(url, B, "charge_card", CHARGE, META, 3)
        check([charge_id(r) for r in a_again] == [a_charge] * 3, "A's repeats")
        check([charge_id(r) for r in b_again] == [b_charge] * 3, "B's repeats")
        check({r.meta["idem/outcome"] for r in a_again + b_again} <= {"replayed", "joined"}, "a repeat ran")
        # A new intent from both users at once: one charge each.
        new = {"customer": "cus_9", "amount_cents": 100}
        run = {"idem/run": "conversation-X"}
        both = await asyncio.gather(many(url, A, "charge_card", new, run, 3), many(url, B, "charge_card", new, run, 3))
        a_new, b_new = {charge_id(r) for r in both[0]}, {charge_id(r) for r in both[1]}
        check(len(a_new) == 1 and len(b_new) == 1 and a_new != b_new, f"concurrent: {a_new} {b_new}")
    finally:
        stop(proc)

    # After a restart on SQLite, A's repeat is replayed from the store; the provider is not asked.
    requests = ledger(work)["charge_requests"]
    proc, url = start(binary, work)
    try:
        again = await call(url, A, "charge_card", CHARGE, META)
        check(charge_id(again) == a_charge and again.meta["idem/outcome"] == "replayed", f"restart: {again.meta}")
        check(ledger(work)["charge_requests"] == requests, "the provider was asked again")
    finally:
        stop(proc)
    book = ledger(work)
    check(len(book["charges"]) == 4, f"charges: {book['charges']}")

    # A server that serves HTTP without a principal function refuses keyed calls.
    proc, url = start(binary, work, {"PAYMENTS_NO_PRINCIPAL": "1"})
    try:
        r = await call(url, A, "charge_card", {"customer": "cus_5", "amount_cents": 5}, {"idem/run": "c"})
        check(r.is_error is True and "no principal configured" in text_of(r), f"unbound: {text_of(r)}")
        balance = await call(url, A, "get_balance", {"customer": "cus_1"})
        check(balance.is_error is not True, f"a safe call is still served: {text_of(balance)}")
    finally:
        stop(proc)
    check(len(ledger(work)["charges"]) == 4, "the refused call charged")
    print(f"ok: two principals over HTTP, charges {a_charge} (A) and {b_charge} (B), 401 without a known token")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
