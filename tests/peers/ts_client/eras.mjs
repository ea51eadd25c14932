// The MCP TypeScript SDK's client (2025-11-25, tasks as its core feature) at the URL given: list the
// tools, call `echo`, call the tool named in argv[3] (refused by the gateway's policy), and run
// `simulate-research-query` as a task, following its status to the result. Prints one JSON line.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const client = new Client({ name: "mcpcreds-ts-eras", version: "0" }, { capabilities: { tasks: {} } });
const transport = new StreamableHTTPClientTransport(new URL(process.argv[2]));
const out = {};
try {
  await client.connect(transport);
  out.protocol = transport.protocolVersion ?? null;
  out.tools = (await client.listTools()).tools.map((tool) => tool.name);
  out.echo = (await client.callTool({ name: "echo", arguments: { message: "héllo" } })).content[0].text;
  try {
    await client.callTool({ name: process.argv[3], arguments: {} });
    out.refused = null;
  } catch (error) {
    out.refused = { code: error.code, message: String(error.message).slice(0, 300) };
  }
  out.task = [];
  const stream = client.experimental.tasks.callToolStream(
    { name: "simulate-research-query", arguments: { topic: "gateways" } }, undefined, { task: { ttl: 60000 } });
  for await (const message of stream) {
    if (message.type === "taskCreated") out.task.push(`created:${message.task.status}`);
    else if (message.type === "taskStatus") out.task.push(`status:${message.task.status}`);
    else if (message.type === "result") out.task.push(`result:${message.result.content[0].text.slice(0, 40)}`);
    else if (message.type === "error") out.task.push(`error:${String(message.error.message).slice(0, 200)}`);
  }
} catch (error) {
  out.error = String(error?.message ?? error).slice(0, 500);
} finally {
  await client.close().catch(() => {});
}
console.log(JSON.stringify(out));
