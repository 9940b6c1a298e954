"""Drives the mixed_mcp example (an rmcp server of its own: a plain rmcp tool beside idem tools)
with the official Python MCP SDK (`mcp` on PyPI).

Usage: python mixed_test.py SERVER_BINARY

Checks: tools/list holds the rmcp tool and the idem tools; the rmcp tool answers as before;
create_ticket repeated in one run opens one ticket (the repeat is replayed, `_meta` says so);
another run opens another; ticket_count sees both. Exits non-zero on the first failed check.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def text_of(result):
    check(len(result.content) == 1, f"one content block expected: {result}")
    return result.content[0].text


async def main():
    params = StdioServerParameters(command=sys.argv[1], args=[])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
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
