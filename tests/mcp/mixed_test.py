"""Drives the mixed_mcp example (an rmcp server of its own: a plain rmcp tool beside idem tools)
with the official Python MCP SDK (`mcp` on PyPI).

Usage: python mixed_test.py SERVER_BINARY [--http]

Checks: tools/list holds the rmcp tool and the idem tools; the rmcp tool answers as before;
create_ticket repeated in one run opens one ticket (the repeat is replayed, `_meta` says so);
another run opens another; ticket_count sees both. With `--http` the same over streamable HTTP
(`mixed_mcp --http`, a bearer token's user as the principal), and another user's identical call
is a ticket of its own. Exits non-zero on the first failed check.
"""

import asyncio
import json
import os
import subprocess
import sys
from contextlib import asynccontextmanager

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def text_of(result):
    check(len(result.content) == 1, f"one content block expected: {result}")
    return result.content[0].text


@asynccontextmanager
async def stdio_session(binary):
    params = StdioServerParameters(command=binary, args=[])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            yield session


@asynccontextmanager
async def http_session(url, token):
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                yield session


def start_http(binary):
    env = {**os.environ, "MIXED_TOKENS": "tok-alice=alice,tok-bob=bob"}
    proc = subprocess.Popen([binary, "--http", "127.0.0.1:0"], env=env, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    check("listening on " in line, f"the server did not start: {line!r}")
    return proc, line.split("listening on ", 1)[1].strip()


async def main():
    if sys.argv[2:] == ["--http"]:
        proc, url = start_http(sys.argv[1])
        try:
            async with http_session(url, "tok-alice") as session:
                await drive(session)
            # Another user, the same run and title: a ticket of their own (3), not alice's.
            async with http_session(url, "tok-bob") as session:
                await session.initialize()
                theirs = await session.call_tool("create_ticket", {"title": "printer"},
                                                 meta={"idem/run": "conversation-7"})
                check(theirs.meta["idem/outcome"] == "executed", f"bob: {theirs.meta}")
                check(json.loads(text_of(theirs))["ticket"] == 3, f"bob: {text_of(theirs)}")
        finally:
            proc.terminate()
            proc.wait()
        print("ok: over HTTP too, each user in a scope of their own")
    else:
        async with stdio_session(sys.argv[1]) as session:
            await drive(session)


async def drive(session):
    init = await session.initialize()
    check('"idem/run"' in (init.instructions or ""), f"instructions: {init.instructions}")
    tools = {t.name: t for t in (await session.list_tools()).tools}
    check(sorted(tools) == ["create_ticket", "echo", "ticket_count"], f"tools: {sorted(tools)}")
    check(tools["create_ticket"].annotations.idempotent_hint is True, "create_ticket idempotentHint")

    echo = await session.call_tool("echo", {"text": "hello"})
    check(text_of(echo) == "hello" and echo.is_error is not True, f"echo: {echo}")

    run = {"idem/run": "conversation-7"}
    first = await session.call_tool("create_ticket", {"title": "printer"}, meta=run)
    again = await session.call_tool("create_ticket", {"title": "printer"}, meta=run)
    check(first.is_error is not True, f"create_ticket: {text_of(first)}")
    check(json.loads(text_of(first)) == json.loads(text_of(again)), "the repeat opened another ticket")
    check(first.meta["idem/outcome"] == "executed", f"first: {first.meta}")
    check(again.meta["idem/outcome"] == "replayed", f"again: {again.meta}")
    check(first.meta["idem/run"] == "conversation-7", f"run: {first.meta}")

    other = await session.call_tool("create_ticket", {"title": "printer"}, meta={"idem/run": "conversation-8"})
    check(json.loads(text_of(other))["ticket"] == 2, f"another run: {text_of(other)}")
    count = await session.call_tool("ticket_count", {})
    check(text_of(count) == "2", f"ticket_count: {text_of(count)}")
    print("ok: rmcp tool and idem tools in one server, one ticket per run")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
