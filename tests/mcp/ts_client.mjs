// Drives `payments_mcp --http` with the official TypeScript MCP SDK (@modelcontextprotocol/sdk)
// over streamable HTTP: list, call, repeat and replay, and a second user's own execution.
// Usage: node ts_client.mjs URL   (run from a directory whose node_modules holds the SDK)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2]);

function check(cond, what) {
  if (!cond) {
    console.error(`FAILED: ${what}`);
    process.exit(1);
  }
}

async function session(token) {
  const client = new Client({ name: "idem-ts-test", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(url, {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return client;
}

const charge = (result) => {
  check(result.isError !== true, `charge_card failed: ${JSON.stringify(result)}`);
  return JSON.parse(result.content[0].text).charge_id;
};

const args = { customer: "cus_ts", amount_cents: 250 };
const meta = { "idem/run": "ts-conversation" };

const alice = await session("tok-alice");
const names = (await alice.listTools()).tools.map((t) => t.name).sort();
check(JSON.stringify(names) === '["charge_card","get_balance","refund"]', `tools: ${names}`);
const first = await alice.callTool({ name: "charge_card", arguments: args, _meta: meta });
const again = await alice.callTool({ name: "charge_card", arguments: args, _meta: meta });
check(charge(first) === charge(again), "the repeat charged again");
check(first._meta?.["idem/outcome"] === "executed", `first: ${JSON.stringify(first._meta)}`);
check(again._meta?.["idem/outcome"] === "replayed", `again: ${JSON.stringify(again._meta)}`);
await alice.close();

// A new session of the same user replays; another user's identical call is their own.
const alice2 = await session("tok-alice");
const third = await alice2.callTool({ name: "charge_card", arguments: args, _meta: meta });
check(charge(third) === charge(first), "a new session of the same user charged again");
await alice2.close();
const bob = await session("tok-bob");
const bobs = await bob.callTool({ name: "charge_card", arguments: args, _meta: meta });
check(charge(bobs) !== charge(first), "bob received alice's charge");
await bob.close();
console.log(`ok: typescript client, charge ${charge(first)} replayed, bob's own ${charge(bobs)}`);
