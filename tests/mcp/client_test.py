"""Drives the payments_mcp example with the official Python MCP SDK (`mcp` on PyPI).

Usage: python client_test.py SERVER_BINARY WORK_DIR

Starts the server twice over stdio on the same SQLite store (WORK_DIR/idem.db) and provider
ledger (WORK_DIR/idem.db.ledger.json), and checks what a client would see:
- tools/list: the three tools with annotations derived from their retry class;
- charge_card: a call that times out in the client (the provider is slow), the same call again,
  five concurrent duplicates, and the same call after a server restart: exactly one charge in the
  provider's ledger, and every call returns the first charge id;
- refund whose outcome is unknown: isError true with the honest text, executed once, also after
  the restart;
- an unknown tool is a JSON-RPC error (-32602); bad arguments are an isError result;
- a client-supplied idempotency key in _meta, reused with other arguments, is refused;
- without _meta["idem/run"] the scope is the session;
- the instructions tell the host to send _meta["idem/run"] and never call charge_card safe to
  repeat; every result's _meta names the run, the key and the outcome (executed, replayed,
  joined).
Exits non-zero with a message on the first failed check.
"""

import asyncio
import json
import os
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

RUN = {"idem/run": "conversation-42"}
CHARGE = {"customer": "cus_1", "amount_cents": 4900}
DELAY_MS = 1500
INVALID_PARAMS = -32602


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def text_of(result):
    check(len(result.content) == 1, f"one content block expected: {result}")
    return result.content[0].text


def charge_id(result):
    check(result.is_error is not True, f"charge_card failed: {text_of(result)}")
    return json.loads(text_of(result))["charge_id"]


def outcome(result, run=None):
    """The result's _meta["idem/outcome"], after checking its run and key."""
    meta = result.meta or {}
    check(len(meta.get("idem/key", "")) == 64, f"_meta has no key: {meta}")
    if run is not None:
        check(meta.get("idem/run") == run, f"_meta run: {meta}")
    return meta.get("idem/outcome")


def ledger(work):
    return json.loads((work / "idem.db.ledger.json").read_text())


def server(binary, work):
    return StdioServerParameters(
        command=str(binary),
        args=["--sqlite", str(work / "idem.db")],
        # The list of refunds cannot be read: the ambiguous refund cannot be reconciled and
        # stays unknown.
        env={
            "PAYMENTS_DELAY_MS": str(DELAY_MS),
            "PAYMENTS_AMBIGUOUS_REFUND_CENTS": "13",
            "PAYMENTS_REFUND_LOOKUP": "down",
        },
    )


async def first_session(binary, work):
    async with stdio_client(server(binary, work)) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check('"idem/run"' in (init.instructions or ""), f"instructions: {init.instructions}")
            check("safe to repeat" not in init.instructions, f"instructions: {init.instructions}")

            tools = {t.name: t for t in (await session.list_tools()).tools}
            check(sorted(tools) == ["charge_card", "get_balance", "refund"], f"tools: {sorted(tools)}")
            charge, balance, refund = tools["charge_card"], tools["get_balance"], tools["refund"]
            check(charge.annotations.read_only_hint is False, "charge_card readOnlyHint")
            check(charge.annotations.idempotent_hint is True, "charge_card idempotentHint")
            check(balance.annotations.read_only_hint is True, "get_balance readOnlyHint")
            check(refund.annotations.read_only_hint is False, "refund readOnlyHint")
            check(refund.annotations.destructive_hint is True, "refund destructiveHint")
            check(refund.annotations.idempotent_hint is False, "refund idempotentHint")
            check(charge.input_schema["type"] == "object", "inputSchema type")
            check(sorted(charge.input_schema["required"]) == ["amount_cents", "customer"], "required")

            # The provider answers after 1.5 s: the client gives up after 0.3 s.
            try:
                await session.call_tool("charge_card", CHARGE, read_timeout_seconds=0.3, meta=RUN)
                raise AssertionError("the slow charge did not time out in the client")
            except MCPError as e:
                check("timed out" in e.error.message, f"timeout error: {e.error}")

            # The same call again: joins the charge still in flight, or replays it.
            joined = await session.call_tool("charge_card", CHARGE, meta=RUN)
            first = charge_id(joined)
            check(outcome(joined, "conversation-42") in ("joined", "replayed"), f"{joined.meta}")

            # Five concurrent duplicates, keys in another order.
            swapped = {"amount_cents": 4900, "customer": "cus_1"}
            dups = await asyncio.gather(
                *[session.call_tool("charge_card", swapped, meta=RUN) for _ in range(5)]
            )
            check([charge_id(r) for r in dups] == [first] * 5, "duplicates returned another charge")
            check({outcome(r) for r in dups} <= {"joined", "replayed"}, "a duplicate executed")

            # A refund whose answer is lost: outcome unknown, honestly, and never run twice.
            refund_args = {"charge_id": first, "amount_cents": 13}
            for attempt in range(2):
                r = await session.call_tool("refund", refund_args, meta=RUN)
                check(r.is_error is True, f"refund {attempt}: isError expected")
                text = text_of(r)
                check("may have taken effect" in text, f"refund text: {text}")
                check("Do NOT call `refund` again" in text, f"refund text: {text}")
                check("get_balance" in text, f"refund text names what to check: {text}")
            check(ledger(work)["refund_requests"] == 1, "the refund reached the provider twice")

            b = await session.call_tool("get_balance", {"customer": "cus_1"}, meta=RUN)
            check(json.loads(text_of(b))["balance_cents"] == 4900 - 13, f"balance: {text_of(b)}")

            # Unknown tool: a protocol error. Bad arguments: a result the model can read.
            try:
                await session.call_tool("charge_credit_card", CHARGE, meta=RUN)
                raise AssertionError("an unknown tool was not a protocol error")
            except MCPError as e:
                check(e.error.code == INVALID_PARAMS, f"unknown tool code: {e.error}")
            bad = await session.call_tool("charge_card", {"customer": "cus_1", "amount_cents": "49.00"}, meta=RUN)
            check(bad.is_error is True and "field `amount_cents`" in text_of(bad), f"bad args: {text_of(bad)}")

            # A caller-supplied key: the same key with other arguments is refused.
            keyed = {**RUN, "idem/idempotencyKey": "order-1017"}
            a = charge_id(await session.call_tool("charge_card", {"customer": "cus_2", "amount_cents": 100}, meta=keyed))
            again = charge_id(await session.call_tool("charge_card", {"customer": "cus_2", "amount_cents": 100}, meta=keyed))
            check(a == again, "the caller key did not replay")
            other = await session.call_tool("charge_card", {"customer": "cus_2", "amount_cents": 999}, meta=keyed)
            check(other.is_error is True and "key_reuse_mismatch" in text_of(other), f"reuse: {text_of(other)}")

            # No run in _meta: the session is the scope.
            r1 = await session.call_tool("charge_card", {"customer": "cus_3", "amount_cents": 7})
            r1b = await session.call_tool("charge_card", {"customer": "cus_3", "amount_cents": 7})
            s1, s1b = charge_id(r1), charge_id(r1b)
            check(s1 == s1b, "a repeat in one session charged again")
            check((outcome(r1), outcome(r1b)) == ("executed", "replayed"), f"{r1.meta} {r1b.meta}")
            check(r1.meta["idem/run"].startswith("mcp-session-"), f"session run: {r1.meta}")
            return first, refund_args


async def second_session(binary, work, first, refund_args):
    async with stdio_client(server(binary, work)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            # After the restart the SQLite store replays the charge; the provider is not asked.
            again = charge_id(await session.call_tool("charge_card", CHARGE, meta=RUN))
            check(again == first, f"after restart: {again} != {first}")
            r = await session.call_tool("refund", refund_args, meta=RUN)
            check(r.is_error is True and "may have taken effect" in text_of(r), f"refund after restart: {text_of(r)}")
            # Another session without a run id is another scope.
            s2 = charge_id(await session.call_tool("charge_card", {"customer": "cus_3", "amount_cents": 7}))
            return s2


async def main():
    binary, work = Path(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    for f in ("idem.db", "idem.db-wal", "idem.db-shm", "idem.db.ledger.json"):
        (work / f).unlink(missing_ok=True)

    first, refund_args = await first_session(binary, work)
    s2 = await second_session(binary, work, first, refund_args)

    book = ledger(work)
    cus_1 = [c for c in book["charges"] if c["customer"] == "cus_1"]
    check(len(cus_1) == 1, f"cus_1 charged {len(cus_1)} times: {cus_1}")
    check(cus_1[0]["id"] == first, "the ledger's charge is not the one every call returned")
    check(len([c for c in book["charges"] if c["customer"] == "cus_2"]) == 1, "cus_2 charges")
    cus_3 = [c for c in book["charges"] if c["customer"] == "cus_3"]
    check(len(cus_3) == 2 and s2 in [c["id"] for c in cus_3], f"one cus_3 charge per session: {cus_3}")
    check(len(book["refunds"]) == 1 and book["refund_requests"] == 1, f"refunds: {book['refunds']}")
    # cus_1 (once, the timed-out call joined), cus_2 (once), cus_3 (once per session).
    check(book["charge_requests"] == 4, f"provider charge requests: {book['charge_requests']}")
    print(f"ok: one charge {first} for cus_1, refund executed once, {book['charge_requests']} provider charge requests")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
