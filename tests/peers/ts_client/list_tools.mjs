// The MCP TypeScript SDK's client, through the gateway's loopback listener: connect to the URL
// given, list the tools, print one JSON line ({"tools": [names]} or {"error": message}).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const client = new Client({ name: "mcpcreds-ts-peer", version: "0" });
const transport = new StreamableHTTPClientTransport(new URL(process.argv[2]));
try {
  await client.connect(transport);
  const listed = await client.listTools();
  console.log(JSON.stringify({ tools: listed.tools.map((tool) => tool.name) }));
} catch (error) {
  console.log(JSON.stringify({ error: String(error?.message ?? error).slice(0, 500) }));
} finally {
  await client.close().catch(() => {});
}
