// The MCP TypeScript SDK's client (2025-11-25, tasks as its core feature) as argv[2] (JSON) says:
// {"url": ...} over Streamable HTTP, or {"command", "args", "env", "cwd"} over stdio (the SDK's
// StdioClientTransport spawning the command); "call": {"name", "arguments"} is called, "refuse":
// a tool name the gateway's policy refuses is called, and with "task": true
// `simulate-research-query` runs as a task, its status followed to the result. It lists the tools
// first. Prints one JSON line: {protocol, tools, called, refused, task} or {error}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const plan = JSON.parse(process.argv[2]);
const client = new Client({ name: "mcpcreds-ts-eras", version: "0" }, { capabilities: { tasks: {} } });
const transport = plan.url
  ? new StreamableHTTPClientTransport(new URL(plan.url))
  : new StdioClientTransport({ command: plan.command, args: plan.args, env: plan.env, cwd: plan.cwd });
const out = { protocol: null };
const setProtocolVersion = transport.setProtocolVersion?.bind(transport);
transport.setProtocolVersion = (version) => {  // what the handshake agreed, on either transport
  out.protocol = version;
  setProtocolVersion?.(version);
};
try {
  await client.connect(transport);
  out.tools = (await client.listTools()).tools.map((tool) => tool.name);
  out.called = (await client.callTool(plan.call)).content[0].text;
  try {
    await client.callTool({ name: plan.refuse, arguments: {} });
    out.refused = null;
  } catch (error) {
    out.refused = { code: error.code, message: String(error.message).slice(0, 300) };
  }
  if (plan.task) {
    out.task = [];
    const stream = client.experimental.tasks.callToolStream(
      { name: "simulate-research-query", arguments: { topic: "gateways" } }, undefined, { task: { ttl: 60000 } });
    for await (const message of stream) {
      if (message.type === "taskCreated") out.task.push(`created:${message.task.status}`);
      else if (message.type === "taskStatus") out.task.push(`status:${message.task.status}`);
      else if (message.type === "result") out.task.push(`result:${message.result.content[0].text.slice(0, 40)}`);
      else if (message.type === "error") out.task.push(`error:${String(message.error.message).slice(0, 200)}`);
    }
  }
} catch (error) {
  out.error = String(error?.message ?? error).slice(0, 500);
} finally {
  await client.close().catch(() => {});
}
console.log(JSON.stringify(out));
