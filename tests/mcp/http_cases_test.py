"""The cases held over stdio, held over streamable HTTP too: `payments_mcp --http` driven by the
official Python MCP SDK (`mcp` on PyPI), one case per run, each with its own server and store.

Usage: python http_cases_test.py CASE SERVER_BINARY WORK_DIR

Cases:
- expiry: a charge that takes longer than the session's idle limit (PAYMENTS_SESSION_IDLE_MS)
  keeps its session and its client gets the result; then the server closes the idle session, and
  the client's next request in it gets HTTP 404; a new session with the same token and run id replays the charge (the
  provider is not asked again); one with another token and the same run id and arguments is a
  charge of its own.
- joins: duplicates sent while the first charge is in flight (the provider takes 3 s), from two
  sessions of one user, join it: one executes, the rest are joined (and hear progress while they
  wait), one charge; a call the client gave up on is joined or replayed by its repeat.
- cancel: a joiner cancelled by the client (`notifications/cancelled`, sent by the SDK when the
  caller abandons the request) leaves the shared run alone: the first call still executes once,
  and a repeat replays it.
- restart: after the server restarts on the same SQLite store, a charge is replayed and a refund
  whose outcome was unknown stays unknown, neither asked of the provider again; another user's
  identical call is their own.
- sessions: a message the server answers before rmcp reads it (bad arguments, a repeated
  member, a bad notification) gets rmcp's answer for its session first: 404 for an unknown
  `Mcp-Session-Id`, 400 for none; in a live session its JSON-RPC answer.
- big_body: a body longer than the server's limit (rmcp's `max_request_body_bytes`, 4 MiB) is
  HTTP 413 whatever it holds, also when its arguments are bad (which the server answers itself
  for a small body), and the session goes on.
- lifecycle: a session DELETEd while its charge is in flight: the charge finishes once, a request
  in the deleted session gets 404, and the same call in a new session is replayed; a client whose
  connection drops mid-call resumes the response stream with GET and `Last-Event-ID`.
- sigterm: SIGTERM while a charge is in flight (a container stop): the server closes its
  listener, lets the charge finish and store its outcome, sends the client its result, ends the
  session's open `GET` stream and exits 0; the repeat on a restarted server is replayed, and the
  provider was asked once.
- numbers: integers beyond 64 bits (a `u128` argument) and beyond 2^53 (a `u64` argument) reach
  the tool and the key exactly: two integers that are one double are two charges.

Every HTTP request and response is recorded (httpx event hooks) so that a check can name what
went over the wire. Exits non-zero with a message on the first failed check.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TOKENS = "tok-alice=alice,tok-bob=bob"
A, B = "tok-alice", "tok-bob"
HANG_GUARD = 120


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def text_of(result):
    check(len(result.content) == 1, f"one content block expected: {result}")
    return result.content[0].text


def charge_id(result):
    check(result.is_error is not True, f"charge_card failed: {text_of(result)}")
    return result.structured_content["charge_id"]


def outcome(result):
    return (result.meta or {}).get("idem/outcome")


def ledger(work):
    return json.loads((work / "idem.db.ledger.json").read_text())


def charges_of(work, customer):
    return [c for c in ledger(work)["charges"] if c["customer"] == customer]


def start(binary, work, env=None):
    full_env = {**os.environ, "PAYMENTS_TOKENS": TOKENS, **(env or {})}
    # The server's stderr goes to a file, read whole when a case fails (a pipe read only for
    # its first line would hide a panic, and would stop the server once it filled).
    log = work / "server.log"
    # An earlier server of the case (a restart) wrote before: only what this one writes counts.
    offset = log.stat().st_size if log.exists() else 0
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [str(binary), "--sqlite", str(work / "idem.db"), "--http", "127.0.0.1:0"],
            env=full_env, stderr=out, text=True,
        )
    for _ in range(3000):
        text = log.read_bytes()[offset:].decode(errors="replace")
        # Whole lines only: the server may be writing the line being read.
        said = [ln for ln in text.split("\n")[:-1] if "listening on " in ln]
        if said or proc.poll() is not None:
            break
        time.sleep(0.01)
    check(said, f"the server did not start: {text[-2000:]}")
    return proc, said[0].split("listening on ", 1)[1].strip()


def stop(proc):
    proc.terminate()
    proc.wait()


class Wire:
    """What went over HTTP: (method, JSON-RPC body or None) per request, and per response the
    request's method, status and JSON-RPC method."""

    def __init__(self):
        self.requests, self.responses = [], []

    @staticmethod
    def body(request):
        try:
            return json.loads(request.content) if request.content else None
        except (ValueError, httpx2.RequestNotRead):
            return None

    async def on_request(self, request):
        self.requests.append((request.method, self.body(request)))

    async def on_response(self, response):
        body = self.body(response.request)
        self.responses.append((response.request.method, response.status_code, (body or {}).get("method")))

    def posted(self, method):
        return [b for m, b in self.requests if m == "POST" and b and b.get("method") == method]


@asynccontextmanager
async def session(url, token, wire=None):
    """An initialized SDK session of the user with `token`."""
    wire = wire or Wire()
    client = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"request": [wire.on_request], "response": [wire.on_response]},
    )
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s


async def expiry(binary, work):
    # Each charge takes 2.5 s, longer than the 1 s idle limit: a running call is not idleness
    # (rmcp alone closed the session under the call, and the client never got its result).
    env = {"PAYMENTS_SESSION_IDLE_MS": "1000", "PAYMENTS_DELAY_MS": "2500"}
    proc, url = start(binary, work, env)
    args, run = {"customer": "cus_e", "amount_cents": 700}, {"idem/run": "conversation-E"}
    try:
        wire = Wire()
        async with session(url, A, wire) as s:
            first = await s.call_tool("charge_card", args, meta=run)
            check(outcome(first) == "executed", f"first: {first.meta}")
            check(ledger(work)["charge_requests"] == 1, f"ledger: {ledger(work)}")
            # Silence, five times the idle limit: the server closes the session.
            await asyncio.sleep(5)
            try:
                await s.call_tool("charge_card", args, meta=run)
                raise AssertionError("a call in the closed session was answered")
            except MCPError as e:
                check("Session terminated" in e.error.message, f"the SDK's error: {e.error}")
        calls = [(m, status) for m, status, rpc in wire.responses if rpc == "tools/call"]
        check(calls == [("POST", 200), ("POST", 404)], f"tools/call statuses: {calls}")
        requests = ledger(work)["charge_requests"]

        # The client re-initializes with the same token and run id: the charge is replayed.
        async with session(url, A) as s:
            again = await s.call_tool("charge_card", args, meta=run)
        check(charge_id(again) == charge_id(first), f"a new charge after expiry: {text_of(again)}")
        check(outcome(again) == "replayed", f"after expiry: {again.meta}")
        check(ledger(work)["charge_requests"] == requests, "the provider was asked again")
        check(len(charges_of(work, "cus_e")) == 1, f"charges: {charges_of(work, 'cus_e')}")

        # Another token, the same run id and arguments: that user's own charge.
        async with session(url, B) as s:
            other = await s.call_tool("charge_card", args, meta=run)
        check(outcome(other) == "executed", f"another token: {other.meta}")
        check(charge_id(other) != charge_id(first), "another token received the first charge")
        check(len(charges_of(work, "cus_e")) == 2, f"charges: {charges_of(work, 'cus_e')}")
    finally:
        stop(proc)
    return f"session expired with HTTP 404, {charge_id(first)} replayed, {charge_id(other)} for the other token"


def progress_log():
    heard = {}

    def callback(i):
        async def on_progress(progress, total, message):
            heard.setdefault(i, []).append(message or "")
        return on_progress

    return heard, callback


async def joins(binary, work):
    proc, url = start(binary, work, {"PAYMENTS_DELAY_MS": "3000"})
    run = {"idem/run": "conversation-J"}
    try:
        heard, callback = progress_log()
        args = {"customer": "cus_j", "amount_cents": 300}
        async with session(url, A) as s1, session(url, A) as s2:
            calls = [(s1 if i < 3 else s2).call_tool("charge_card", args, progress_callback=callback(i), meta=run)
                     for i in range(5)]
            results = await asyncio.gather(*calls)
            ids = {charge_id(r) for r in results}
            outcomes = sorted(outcome(r) for r in results)
            check(len(ids) == 1, f"duplicates returned other charges: {ids}")
            check(outcomes.count("executed") == 1, f"outcomes: {outcomes}")
            check("joined" in outcomes and set(outcomes) <= {"executed", "joined", "replayed"}, f"outcomes: {outcomes}")
            for i, r in enumerate(results):
                if outcome(r) == "joined":
                    check(heard.get(i), f"joiner {i} heard no progress while it waited")
                    check(all("same idempotency key" in m for m in heard[i]), f"progress: {heard[i]}")
                if outcome(r) == "executed":
                    check(i not in heard, f"the executing call heard progress: {heard.get(i)}")

            # The client gives up on a slow charge; its repeat joins or replays it.
            slow = {"customer": "cus_j2", "amount_cents": 301}
            try:
                await s1.call_tool("charge_card", slow, read_timeout_seconds=0.3, meta=run)
                raise AssertionError("the slow charge did not time out in the client")
            except MCPError as e:
                check("timed out" in e.error.message, f"timeout error: {e.error}")
            again = await s2.call_tool("charge_card", slow, meta=run)
            check(outcome(again) in ("joined", "replayed"), f"the repeat of a timed-out call: {again.meta}")
        check(len(charges_of(work, "cus_j")) == 1, f"charges: {charges_of(work, 'cus_j')}")
        check(len(charges_of(work, "cus_j2")) == 1, f"charges: {charges_of(work, 'cus_j2')}")
        check(ledger(work)["charge_requests"] == 2, f"provider requests: {ledger(work)['charge_requests']}")
    finally:
        stop(proc)
    return f"5 duplicates over HTTP: {outcomes}, one charge {ids.pop()}"


async def cancel(binary, work):
    proc, url = start(binary, work, {"PAYMENTS_DELAY_MS": "3000"})
    run = {"idem/run": "conversation-C"}
    args = {"customer": "cus_c", "amount_cents": 12}
    try:
        wire = Wire()
        heard, callback = progress_log()
        async with session(url, A, wire) as s:
            tasks = [asyncio.create_task(s.call_tool("charge_card", args, progress_callback=callback(i), meta=run))
                     for i in range(2)]
            # The joiner is the one that hears progress while it waits.
            async with asyncio.timeout(HANG_GUARD):
                while not heard:
                    await asyncio.sleep(0.02)
            (waiter,) = heard
            leader = 1 - waiter
            tasks[waiter].cancel()
            try:
                await tasks[waiter]
            except asyncio.CancelledError:
                pass
            led = await tasks[leader]
            check(outcome(led) == "executed", f"the shared run: {led.meta}")
            cancels = wire.posted("notifications/cancelled")
            call_ids = [b["id"] for b in wire.posted("tools/call")]
            check(len(cancels) == 1 and cancels[0]["params"]["requestId"] in call_ids,
                  f"the SDK sent no notifications/cancelled for the joiner: {cancels} {call_ids}")
            repeat = await s.call_tool("charge_card", args, meta=run)
            check(charge_id(repeat) == charge_id(led) and outcome(repeat) == "replayed", f"repeat: {repeat.meta}")
        check(len(charges_of(work, "cus_c")) == 1, f"charges: {charges_of(work, 'cus_c')}")
        check(ledger(work)["charge_requests"] == 1, f"provider requests: {ledger(work)['charge_requests']}")
    finally:
        stop(proc)
    return f"cancelled joiner {waiter}, one charge {charge_id(led)} replayed"


async def restart(binary, work):
    args, run = {"customer": "cus_r", "amount_cents": 4900}, {"idem/run": "conversation-R"}
    # The provider's list of refunds cannot be read: the ambiguous refund cannot be reconciled
    # and stays unknown.
    env = {"PAYMENTS_REFUND_LOOKUP": "down"}
    proc, url = start(binary, work, env)
    try:
        async with session(url, A) as s:
            first = await s.call_tool("charge_card", args, meta=run)
            check(outcome(first) == "executed", f"first: {first.meta}")
            refund_args = {"charge_id": charge_id(first), "amount_cents": 13}
            refund = await s.call_tool("refund", refund_args, meta=run)
            check(refund.is_error is True and "may have taken effect" in text_of(refund), f"refund: {text_of(refund)}")
    finally:
        stop(proc)
    before = ledger(work)
    proc, url = start(binary, work, env)
    try:
        async with session(url, A) as s:
            again = await s.call_tool("charge_card", args, meta=run)
            check(charge_id(again) == charge_id(first) and outcome(again) == "replayed", f"after restart: {again.meta}")
            refund = await s.call_tool("refund", refund_args, meta=run)
            check(refund.is_error is True and "may have taken effect" in text_of(refund),
                  f"refund after restart: {text_of(refund)}")
        after = ledger(work)
        check(after["charge_requests"] == before["charge_requests"] == 1, f"charge requests: {after}")
        check(after["refund_requests"] == before["refund_requests"] == 1, f"refund requests: {after}")
        async with session(url, B) as s:
            other = await s.call_tool("charge_card", args, meta=run)
            check(outcome(other) == "executed" and charge_id(other) != charge_id(first), f"B: {other.meta}")
    finally:
        stop(proc)
    return f"{charge_id(first)} replayed and its refund still unknown after a restart"


async def numbers(binary, work):
    # 2^64 + 1 and 2^64 + 2 are one double (18446744073709551616.0); 2^53 + 1 and 2^53 + 2 are
    # exact in a u64 but not in a double.
    wide, twin, top = 2**64 + 1, 2**64 + 2, 2**128 - 1
    run = {"idem/run": "conversation-N"}
    proc, url = start(binary, work)
    try:
        wire = Wire()
        async with session(url, A, wire) as s:
            async def charge(amount, reference=None):
                args = {"customer": "cus_n", "amount_cents": amount}
                if reference is not None:
                    args["reference"] = reference
                r = await s.call_tool("charge_card", args, meta=run)
                check(r.is_error is not True, f"{args}: {text_of(r)}")
                return r

            first = await charge(5, wide)
            check(first.structured_content["reference"] == str(wide), f"reference: {first.structured_content}")
            check(outcome(first) == "executed", f"{first.meta}")
            again = await charge(5, wide)
            check(outcome(again) == "replayed" and charge_id(again) == charge_id(first), f"{again.meta}")
            other = await charge(5, twin)
            check(outcome(other) == "executed" and charge_id(other) != charge_id(first), f"2^64+2: {other.meta}")
            check(other.structured_content["reference"] == str(twin), f"reference: {other.structured_content}")
            check(other.meta["idem/key"] != first.meta["idem/key"], "one key for two integers")
            biggest = await charge(5, top)
            check(biggest.structured_content["reference"] == str(top), f"u128::MAX: {biggest.structured_content}")
            a = await charge(2**53 + 1)
            b = await charge(2**53 + 2)
            check(outcome(b) == "executed" and charge_id(a) != charge_id(b), f"2^53+2: {b.meta}")
            check(b.structured_content["amount_cents"] == 2**53 + 2, f"amount: {b.structured_content}")
        sent = [json.dumps(b) for b in wire.posted("tools/call")]
        check(any(str(wide) in t for t in sent), f"the SDK did not send {wide} exactly: {sent}")
        refs = sorted(c.get("reference", 0) for c in charges_of(work, "cus_n"))
        check(refs == [0, 0, wide, twin, top], f"the provider's references: {refs}")
    finally:
        stop(proc)
    return f"references {wide} and {twin} charged apart, {top} exact"


async def not_utf8(binary, work):
    # JSON text is UTF-8: a body that is not is a JSON-RPC parse error, as a line over stdio is,
    # not HTTP 415 with the decoder's text; with the request's id, read around the bytes that
    # are not UTF-8.
    proc, url = start(binary, work)
    try:
        headers = {
            "Authorization": f"Bearer {A}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        async with httpx2.AsyncClient(headers=headers) as c:
            r = await c.post(url, content=b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":"\xff\xfe"}}')
            check(r.status_code == 400, f"status {r.status_code}: {r.text}")
            body = r.json()
            check(body.get("error", {}).get("code") == -32700, f"{body}")
            check(body.get("id") == 7, f"{body}")
            # An id that is not UTF-8 itself is not named.
            r = await c.post(url, content=b'{"jsonrpc":"2.0","id":"\xe9","method":"ping"}')
            check(r.status_code == 400 and r.json().get("id", 0) is None, f"{r.status_code}: {r.text}")
    finally:
        stop(proc)
    return "a body that is not UTF-8 is a parse error"


async def sessions(binary, work):
    # A message the server answers before rmcp reads it (bad arguments, a repeated member, a bad
    # notification) still gets rmcp's answer for its session first: 404 for one the server does
    # not know (MCP: the client must then start a new session), 400 for none; in a live session
    # the same messages get their JSON-RPC answers.
    proc, url = start(binary, work)
    bad_args = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "charge_card", "arguments": [1, 2],
                           "_meta": {"idem/run": "conv-s"}}}
    repeated = '{"jsonrpc":"2.0","id":4,"method":"ping","method":"ping"}'
    bad_note = '{"jsonrpc":"2.0","method":"notifications/progress","params":[1]}'
    try:
        headers = {
            "Authorization": f"Bearer {A}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        async with httpx2.AsyncClient(headers=headers, timeout=30) as c:
            init = await c.post(url, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "raw", "version": "1"}}})
            check(init.status_code == 200, f"initialize: {init.status_code} {init.text}")
            live = init.headers.get("mcp-session-id")
            check(live, f"no session id: {init.headers}")
            done = await c.post(url, headers={"Mcp-Session-Id": live},
                                json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            check(done.status_code == 202, f"initialized: {done.status_code}")
            for name, body, want in [
                ("bad arguments", json.dumps(bad_args), None),
                ("a repeated member", repeated, None),
                ("a bad notification", bad_note, None),
            ]:
                r = await c.post(url, headers={"Mcp-Session-Id": "no-such-session"}, content=body)
                check(r.status_code == 404, f"{name}, unknown session: {r.status_code} {r.text}")
                if name != "a bad notification":
                    r = await c.post(url, content=body)
                    check(r.status_code == 400, f"{name}, no session: {r.status_code} {r.text}")
            # In the live session: the answers the body deserves.
            r = await c.post(url, headers={"Mcp-Session-Id": live}, content=json.dumps(bad_args))
            check(r.status_code == 200, f"bad arguments, live: {r.status_code} {r.text}")
            result = r.json().get("result", {})
            check(result.get("isError") is True, f"bad arguments, live: {r.text}")
            check("invalid_arguments" in result["content"][0]["text"], r.text)
            r = await c.post(url, headers={"Mcp-Session-Id": live}, content=repeated)
            check(r.status_code == 400 and r.json()["error"]["code"] == -32600, r.text)
            # Input the server cannot accept is an HTTP error with its JSON-RPC error (MCP
            # "Transports"; the Python and TypeScript SDKs answer the same): not JSON, a batch.
            for body, code in [("charge the card please", -32700), ('{"jsonrpc":"2.0","id":9,', -32700),
                               ('[{"jsonrpc":"2.0","id":9,"method":"ping"}]', -32600)]:
                r = await c.post(url, headers={"Mcp-Session-Id": live}, content=body)
                check(r.status_code == 400, f"{body!r}: {r.status_code} {r.text}")
                check(r.headers.get("content-type", "").startswith("application/json"), f"{r.headers}")
                check(r.json()["error"]["code"] == code, f"{body!r}: {r.text}")
            # A notification the server cannot accept is an HTTP error (MCP "Transports"), and
            # so is an empty body; 202 is for what it accepts.
            for body in [bad_note, ""]:
                r = await c.post(url, headers={"Mcp-Session-Id": live}, content=body)
                check(r.status_code == 400, f"{body!r}: {r.status_code} {r.text}")
                check(r.json()["error"]["code"] == -32600, f"{body!r}: {r.text}")
            # What the server answers itself is refused first for a forbidden Host or Origin,
            # as rmcp refuses anything there.
            for name, head in [("host", {"Host": "evil.example"}),
                               ("origin", {"Origin": "http://evil.example"})]:
                for body in [json.dumps(bad_args), "", "[1]"]:
                    r = await c.post(url, headers={"Mcp-Session-Id": live, **head}, content=body)
                    check(r.status_code == 403, f"{name} {body[:20]!r}: {r.status_code} {r.text}")
    finally:
        stop(proc)
    return "unknown session 404, none 400, live session answered, bad Host or Origin 403"


async def owners(binary, work):
    # A session belongs to the user who opened it: another user's token with its id is answered
    # as an unknown session (404) for a call, its event stream and its DELETE; nothing runs and
    # the session goes on for its owner. A browser page of another origin is refused (403).
    proc, url = start(binary, work)
    try:
        async with httpx2.AsyncClient(headers=RAW, timeout=30) as c:
            head = await raw_session(c, url)
            bob = {**head, "Authorization": f"Bearer {B}"}
            call = raw_call(2, {"customer": "cus_o", "amount_cents": 5}, "conv-o")
            r = await c.post(url, headers=bob, json=call)
            check(r.status_code == 404, f"bob's call in alice's session: {r.status_code} {r.text}")
            r = await c.get(url, headers={**bob, "Accept": "text/event-stream"})
            check(r.status_code == 404, f"bob's GET: {r.status_code} {r.text}")
            r = await c.delete(url, headers=bob)
            check(r.status_code == 404, f"bob's DELETE: {r.status_code} {r.text}")
            ran = (work / "idem.db.ledger.json").exists() and ledger(work)["charge_requests"]
            check(not ran, f"nothing ran: {ran}")
            r = await c.post(url, headers=head, json=call)
            (answer,) = [m for m in sse_messages(r.text) if m.get("id") == 2]
            check(answer["result"]["_meta"]["idem/outcome"] == "executed", f"alice: {answer}")
            r = await c.post(url, headers={**head, "Origin": "http://evil.example"},
                             json=raw_call(3, {"customer": "cus_o", "amount_cents": 6}, "conv-o"))
            check(r.status_code == 403, f"another origin: {r.status_code} {r.text}")
            # Any case of the scheme's name; a 401 names the scheme.
            r = await c.post(url, headers={**head, "Authorization": f"bearer {A}"},
                             json={"jsonrpc": "2.0", "id": 4, "method": "ping"})
            check(r.status_code == 200, f"lower-case bearer: {r.status_code} {r.text}")
            r = await c.post(url, headers={**head, "Authorization": "Bearer nope"},
                             json={"jsonrpc": "2.0", "id": 5, "method": "ping"})
            check(r.status_code == 401, f"unknown token: {r.status_code}")
            check(r.headers.get("www-authenticate", "").startswith("Bearer"), f"{r.headers}")
            r = await c.delete(url, headers=head)
            check(r.status_code in (200, 202, 204), f"alice's DELETE: {r.status_code} {r.text}")
        check(ledger(work)["charge_requests"] == 1, f"one charge: {ledger(work)}")
    finally:
        stop(proc)
    return "another user's token is 404 in a session, another origin 403"


RAW = {
    "Authorization": f"Bearer {A}",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


async def raw_session(c, url):
    """A session opened with raw requests: its `Mcp-Session-Id` header."""
    init = await c.post(url, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}})
    check(init.status_code == 200, f"initialize: {init.status_code} {init.text}")
    head = {"Mcp-Session-Id": init.headers["mcp-session-id"]}
    done = await c.post(url, headers=head, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    check(done.status_code == 202, f"initialized: {done.status_code}")
    return head


def sse_messages(text):
    """The JSON-RPC messages of an SSE body (priming events have no data)."""
    out = []
    for event in text.split("\n\n"):
        data = "".join(line[5:].strip() for line in event.split("\n") if line.startswith("data:"))
        if data:
            out.append(json.loads(data))
    return out


def raw_call(id, args, run):
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "charge_card", "arguments": args, "_meta": {"idem/run": run}}}


async def big_body(binary, work):
    proc, url = start(binary, work)
    limit = 4 * 1024 * 1024
    try:
        async with httpx2.AsyncClient(headers=RAW, timeout=60) as c:
            head = await raw_session(c, url)
            # Bad arguments: a small body of them is answered with an isError result.
            bad = json.dumps(raw_call(2, [0] * (limit // 2), "conv-big"))
            good = json.dumps(raw_call(3, {"customer": "x" * limit, "amount_cents": 1}, "conv-big"))
            for name, body in [("bad arguments", bad), ("a long customer", good)]:
                check(len(body) > limit, f"{name}: {len(body)} bytes")
                r = await c.post(url, headers=head, content=body)
                check(r.status_code == 413, f"{name}: {r.status_code} {r.text[:200]}")
                check(str(limit) in r.text, f"{name}: the limit is named: {r.text[:200]}")
            r = await c.post(url, headers=head, json=raw_call(4, {"customer": "cus_big", "amount_cents": 1}, "conv-big"))
            (answer,) = [m for m in sse_messages(r.text) if m.get("id") == 4]
            check(answer["result"]["_meta"]["idem/outcome"] == "executed", f"after: {answer}")
        check(ledger(work)["charge_requests"] == 1, f"provider requests: {ledger(work)['charge_requests']}")
    finally:
        stop(proc)
    return f"bodies over {limit} bytes are 413, the session goes on"


async def first_event_id(c, url, head, call):
    """POSTs `call` and reads its stream up to its first event id; then the connection drops."""
    async with c.stream("POST", url, headers=head, json=call) as s:
        async for line in s.aiter_lines():
            if line.startswith("id:"):
                return line[3:].strip()
    check(False, "the response stream has no event id to resume from")


async def lifecycle(binary, work):
    proc, url = start(binary, work, {"PAYMENTS_DELAY_MS": "2000"})
    args = {"customer": "cus_l", "amount_cents": 21}
    try:
        async with httpx2.AsyncClient(headers=RAW, timeout=60) as c:
            head = await raw_session(c, url)
            in_flight = asyncio.create_task(c.post(url, headers=head, json=raw_call(2, args, "conv-L")))
            await asyncio.sleep(0.5)
            gone = await c.delete(url, headers=head)
            check(gone.status_code in (200, 202, 204), f"DELETE: {gone.status_code} {gone.text}")
            await in_flight  # its stream ends with the session, answered or not
            after = await c.post(url, headers=head, json={"jsonrpc": "2.0", "id": 3, "method": "ping"})
            check(after.status_code == 404, f"a request after DELETE: {after.status_code} {after.text}")
            await asyncio.sleep(2.5)
            check(ledger(work)["charge_requests"] == 1, f"the deleted session's charge: {ledger(work)}")
            head = await raw_session(c, url)
            r = await c.post(url, headers=head, json=raw_call(4, args, "conv-L"))
            (again,) = [m for m in sse_messages(r.text) if m.get("id") == 4]
            check(again["result"]["_meta"]["idem/outcome"] == "replayed", f"resend: {again}")

            # The connection drops after the stream's first event; GET with Last-Event-ID resumes it.
            slow = {"customer": "cus_l2", "amount_cents": 22}
            event_id = await first_event_id(c, url, head, raw_call(5, slow, "conv-L"))
            resumed = []
            async with c.stream("GET", url, headers={**head, "Last-Event-ID": event_id}) as s:
                check(s.status_code == 200, f"GET with Last-Event-ID: {s.status_code}")
                async with asyncio.timeout(HANG_GUARD):
                    async for line in s.aiter_lines():
                        if line.startswith("data:") and line[5:].strip():
                            resumed.append(json.loads(line[5:]))
                            if resumed[-1].get("id") == 5:
                                break
            check(resumed and resumed[-1]["result"]["_meta"]["idem/outcome"] == "executed", f"resumed: {resumed}")

            # The same, resumed only once the charge has ended: its result is still sent (rmcp
            # alone had dropped it by then and sent an empty stream, on which the SDK reconnects
            # for ever).
            late = {"customer": "cus_l3", "amount_cents": 23}
            event_id = await first_event_id(c, url, head, raw_call(6, late, "conv-L"))
            async with asyncio.timeout(HANG_GUARD):
                while ledger(work)["charge_requests"] < 3:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            r = await c.get(url, headers={**head, "Last-Event-ID": event_id})
            check(r.status_code == 200, f"a late GET with Last-Event-ID: {r.status_code}")
            late_answer = [m for m in sse_messages(r.text) if m.get("id") == 6]
            check(late_answer and late_answer[0]["result"]["_meta"]["idem/outcome"] == "executed",
                  f"resumed after the charge: {r.text!r}")
            # Nothing more to send after the result, or on a stream the server never had: 410,
            # not an empty 200 (on which the SDKs resume again with the same id, for ever).
            result_id = [line[3:].strip() for line in r.text.splitlines() if line.startswith("id:")][-1]
            for last in (result_id, "0/9999"):
                r = await c.get(url, headers={**head, "Last-Event-ID": last})
                check(r.status_code == 410, f"a resume with nothing to send ({last}): {r.status_code} {r.text!r}")
        check(ledger(work)["charge_requests"] == 3, f"provider requests: {ledger(work)['charge_requests']}")
    finally:
        stop(proc)
    return ("DELETE mid-call stored once and replayed, 404 after, the stream resumed by Last-Event-ID, "
            "also after the call, 410 once nothing is left")


async def duplicate_ids(binary, work):
    # A request whose id is that of a request still in flight in the same session is refused at
    # once (-32600, nothing runs): rmcp would run it and send one response for the two, leaving
    # the other POST's stream open with nothing to come. Once the first is answered, its id is
    # free again; another session may use the same id at any time.
    proc, url = start(binary, work, {"PAYMENTS_DELAY_MS": "1500"})
    try:
        async with httpx2.AsyncClient(headers=RAW, timeout=60) as c:
            head = await raw_session(c, url)
            first = asyncio.create_task(
                c.post(url, headers=head, json=raw_call(7, {"customer": "cus_d", "amount_cents": 5}, "conv-D")))
            await asyncio.sleep(0.4)
            async with asyncio.timeout(HANG_GUARD):
                again = await c.post(url, headers=head,
                                     json=raw_call(7, {"customer": "cus_e", "amount_cents": 6}, "conv-D"))
            check(again.status_code == 400, f"reused id: {again.status_code} {again.text}")
            refusal = again.json()
            check(refusal["id"] == 7 and refusal["error"]["code"] == -32600, f"reused id: {again.text}")
            check("already used" in refusal["error"]["message"], again.text)
            other = await raw_session(c, url)
            r = await c.post(url, headers=other, json={"jsonrpc": "2.0", "id": 7, "method": "ping"})
            check(r.status_code == 200 and [m for m in sse_messages(r.text) if m.get("id") == 7],
                  f"the same id in another session: {r.status_code} {r.text}")
            async with asyncio.timeout(HANG_GUARD):
                done = await first
            (answer,) = [m for m in sse_messages(done.text) if m.get("id") == 7]
            check(answer["result"]["_meta"]["idem/outcome"] == "executed", f"first: {answer}")
            r = await c.post(url, headers=head, json={"jsonrpc": "2.0", "id": 7, "method": "ping"})
            check([m for m in sse_messages(r.text) if m.get("id") == 7], f"id 7 after its answer: {r.text}")
        charges = ledger(work)["charges"]
        check([c["customer"] for c in charges] == ["cus_d"], f"only the first ran: {charges}")
    finally:
        stop(proc)
    return "a reused id in flight is -32600 and runs nothing; free again once answered"


async def sigterm(binary, work):
    # The provider takes 3 s: SIGTERM comes while the charge is in flight, as a container stop
    # (docker, Kubernetes, systemd) sends it.
    args, run = {"customer": "cus_t", "amount_cents": 700}, {"idem/run": "conversation-T"}
    env = {"PAYMENTS_DELAY_MS": "3000"}
    proc, url = start(binary, work, env)
    terminated, first, refused = False, None, None
    try:
        async with session(url, A) as s:
            # The SDK lists the tools to check a result's `structuredContent` against its
            # schema: listed now, not after SIGTERM, when the server takes no new connection.
            await s.list_tools()
            call = asyncio.create_task(s.call_tool("charge_card", args, meta=run))
            await asyncio.sleep(0.5)
            proc.terminate()
            terminated = True
            await asyncio.sleep(0.5)
            # Draining: the listener is closed, so a new connection is refused.
            try:
                async with httpx2.AsyncClient() as fresh:
                    await fresh.post(url, json={})
            except httpx2.ConnectError as e:
                refused = e
            first = await asyncio.wait_for(call, HANG_GUARD)
    except* Exception:
        # Leaving the session (its DELETE, a reconnecting GET) fails once the server is gone.
        pass
    check(terminated, "the call was not sent")
    check(refused is not None, "a new connection was accepted after SIGTERM")
    check(first is not None, "the call in flight at SIGTERM got no result")
    check(outcome(first) == "executed", f"the call in flight at SIGTERM: {first}")
    first_id = charge_id(first)
    try:
        code = proc.wait(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        code = "still running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check(code == 0, f"the server exits cleanly after SIGTERM: {code}")
    check(ledger(work)["charge_requests"] == 1, f"the charge in flight finished before the exit: {ledger(work)}")
    proc, url = start(binary, work, env)
    try:
        async with session(url, A) as s:
            again = await s.call_tool("charge_card", args, meta=run)
            check(outcome(again) == "replayed", f"after SIGTERM and a restart: {again.meta}")
            check(charge_id(again) == first_id, f"{charge_id(again)} replayed for {first_id}")
        check(ledger(work)["charge_requests"] == 1, f"the provider was asked again: {ledger(work)}")
    finally:
        stop(proc)
    return f"{first_id} answered after SIGTERM and replayed after a restart"


async def bound(binary, work):
    # Sessions a client opens and never closes are bounded per user (100 by default): the 101st
    # closes the user's least recently used idle one, whose next request gets 404 (MCP: start a
    # new session); the others, and another user's, stay.
    proc, url = start(binary, work)
    ping = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
    try:
        async with httpx2.AsyncClient(headers=RAW, timeout=60) as c:
            alices = [await raw_session(c, url) for _ in range(100)]
            async with httpx2.AsyncClient(headers={**RAW, "Authorization": f"Bearer {B}"}, timeout=60) as b:
                bobs = await raw_session(b, url)
            r = await c.post(url, headers=alices[0], json=ping)  # the oldest, used: not the one to go
            check(r.status_code == 200, f"alice's first session: {r.status_code}")
            newest = await raw_session(c, url)
            for name, head, want in [("the least recently used", alices[1], 404),
                                     ("the first, used since", alices[0], 200),
                                     ("the newest", newest, 200), ("the 100th", alices[99], 200)]:
                r = await c.post(url, headers=head, json=ping)
                check(r.status_code == want, f"alice's {name} session: {r.status_code} {r.text}")
            r = await c.post(url, headers={**bobs, "Authorization": f"Bearer {B}"}, json=ping)
            check(r.status_code == 200, f"bob's session: {r.status_code} {r.text}")
    finally:
        stop(proc)
    # The bound as the example's operator sets it (`SessionLimits`): 3 a user.
    proc, url = start(binary, work, {"PAYMENTS_SESSIONS_PER_USER": "3"})
    try:
        async with httpx2.AsyncClient(headers=RAW, timeout=60) as c:
            heads = [await raw_session(c, url) for _ in range(4)]
            for i, want in [(0, 404), (1, 200), (3, 200)]:
                r = await c.post(url, headers=heads[i], json=ping)
                check(r.status_code == want, f"session {i} of 4 at a bound of 3: {r.status_code}")
    finally:
        stop(proc)
    return ("the 101st session of a user closed the user's least recently used one, and no other; "
            "PAYMENTS_SESSIONS_PER_USER=3 made it the 4th")


CASES = {
    "duplicate_ids": duplicate_ids,
    "big_body": big_body, "lifecycle": lifecycle,
    "expiry": expiry, "joins": joins, "cancel": cancel, "restart": restart, "numbers": numbers,
    "not_utf8": not_utf8, "sessions": sessions, "owners": owners, "sigterm": sigterm,
    "bound": bound,
}


async def main():
    case, binary, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    for f in ("idem.db", "idem.db-wal", "idem.db-shm", "idem.db.ledger.json", "server.log"):
        (work / f).unlink(missing_ok=True)
    try:
        said = await CASES[case](binary, work)
    except BaseException:
        # What the server said (a panic, a warning) beside the client's failure.
        log = work / "server.log"
        text = log.read_text()[-4000:] if log.exists() else "(no log)"
        print(f"the server's stderr ({log}):\n{text}", file=sys.stderr)
        raise
    print(f"ok: {case}: {said}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except* AssertionError as group:
        # A failed check inside a session arrives wrapped by the SDK's task groups.
        while isinstance(group, BaseExceptionGroup):
            group = group.exceptions[0]
        print(f"FAILED: {group}", file=sys.stderr)
        sys.exit(1)
