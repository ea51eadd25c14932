// @modelcontextprotocol/server-everything over Streamable HTTP on a free loopback port: its
// launcher listens on $PORT on every interface; here the listen is held to 127.0.0.1, port 0, and
// the port it got is printed as `READY http://127.0.0.1:PORT` (tests/peers/process.py).
import http from "node:http";

const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function (port, ...rest) {
  const done = rest.find((arg) => typeof arg === "function");
  this.once("listening", () => console.log(`READY http://127.0.0.1:${this.address().port}`));
  return listen.call(this, 0, "127.0.0.1", done);
};
process.argv[2] = "streamableHttp";
console.log = ((log) => (...args) => (String(args[0]).startsWith("READY ") ? log(...args) : console.error(...args)))(console.log);
await import("@modelcontextprotocol/server-everything/dist/index.js");
