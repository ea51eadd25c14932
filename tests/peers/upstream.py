"""A small local upstream (the "MCP server" behind `auth=creds.auth(...)`) for tests and benches.

It answers every request at once with a small JSON body, and can be told to misbehave::

    with start_upstream(accept=lambda token: token == "t-1") as up:
        httpx.get(up.url + "/mcp", headers={"Authorization": "Bearer t-1"})   # 200
        up.revoke("t-1")             # from now on that token gets a 401
        up.reject_next(1, retry_after=2)   # the next request gets 429 + `Retry-After: 2`
        up.hold_401s(50)             # hold 401 answers until 50 of them are waiting, then send all
        up.counts()                  # {200: 1, 401: 1, 429: 1}
        up.paths()                   # {"/mcp": 1}: how often each path was served (200)

`accept=None` asks for no credentials. With a predicate, a request needs
`Authorization: Bearer <token>` with a token that was not revoked and that the predicate accepts;
anything else is a 401 with `WWW-Authenticate: Bearer error="invalid_token"`. A pending 429 is
answered before authentication is checked.

`start_upstream` runs it on threads of this process (a threaded `http.server`; the test calls
`revoke` etc. on the object it yields). `start_upstream_process` runs it in a child process, for
benches: uvicorn (httptools) on one event loop, no GIL shared with the client, the same answers;
`python -m tests.peers.upstream [--token T]` prints `READY <url>` and serves until its stdin
closes.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Predicate = Callable[[str], bool]
READY_TIMEOUT = 60.0


def is_jwt(token: str) -> bool:
    """Three base64url parts whose first is a JSON header with an `alg` (no signature check)."""
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (ValueError, binascii.Error):
        return False
    return isinstance(header, dict) and "alg" in header


def one_of(*tokens: str) -> Predicate:
    allowed = frozenset(tokens)
    return allowed.__contains__


class _Gate:
    """Holds the first `count` callers until all of them have arrived (or `timeout` passes)."""

    def __init__(self, count: int, timeout: float) -> None:
        self.count = count
        self.timeout = timeout
        self.arrived = 0
        self._cond = threading.Condition()

    def arrive(self) -> None:
        with self._cond:
            self.arrived += 1
            if self.arrived >= self.count:
                self._cond.notify_all()
                return
            self._cond.wait_for(lambda: self.arrived >= self.count, self.timeout)


class Upstream:
    """State shared by the handler threads. Every method is thread-safe."""

    def __init__(self, accept: Predicate | None = None) -> None:
        self.accept = accept
        self.url = ""
        self._lock = threading.Lock()
        self._revoked: set[str] = set()
        self._pending_429: list[str] = []
        self._gate: _Gate | None = None
        self._counts: Counter[int] = Counter()
        self._tokens: Counter[str] = Counter()
        self._arrivals: list[str | None] = []  # the bearer token of each request, in arrival order
        self._paths: Counter[tuple[int, str]] = Counter()
        self._changed = threading.Condition(self._lock)

    # -- control

    def revoke(self, token: str) -> None:
        """Refuse this token from now on (401), whatever the predicate says."""
        with self._lock:
            self._revoked.add(token)

    def reject_next(self, count: int = 1, retry_after: float | str = 1) -> None:
        """Answer the next `count` requests with 429 and this `Retry-After` (seconds or a date)."""
        value = f"{retry_after:g}" if isinstance(retry_after, int | float) else retry_after
        with self._lock:
            self._pending_429.extend([value] * count)

    def hold_401s(self, count: int, timeout: float = 15.0) -> None:
        """Hold the next 401 answers until `count` of them wait, then send them all."""
        with self._lock:
            self._gate = _Gate(count, timeout)

    # -- observation

    def counts(self) -> dict[int, int]:
        """Requests answered so far, by status."""
        with self._lock:
            return dict(self._counts)

    def count(self, status: int) -> int:
        with self._lock:
            return self._counts[status]

    def tokens(self) -> dict[str, int]:
        """Bearer tokens presented so far (accepted or not), with how often."""
        with self._lock:
            return dict(self._tokens)

    def arrivals(self) -> list[str | None]:
        """The bearer token of every request so far (None: none), in the order they arrived."""
        with self._lock:
            return list(self._arrivals)

    def paths(self, status: int = 200) -> dict[str, int]:
        """How often each path (with its query) got `status` (default: how often it was served)."""
        with self._lock:
            return {path: n for (code, path), n in self._paths.items() if code == status}

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()
            self._tokens.clear()
            self._paths.clear()

    def wait_for_count(self, status: int, at_least: int, timeout: float = 10.0) -> int:
        """Block until `at_least` requests got `status`; returns the count (raises on timeout)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._counts[status] >= at_least, timeout):
                raise TimeoutError(f"upstream: {self._counts[status]} answers {status}, "
                                   f"wanted {at_least}; all: {dict(self._counts)}")
            return self._counts[status]

    # -- the decision, per request

    def decide(self, authorization: str | None) -> tuple[int, dict[str, str]]:
        gate: _Gate | None = None
        token = authorization[7:] if authorization and authorization[:7].lower() == "bearer " else None
        with self._lock:
            self._arrivals.append(token)
            if token is not None:
                self._tokens[token] += 1
            if self._pending_429:
                return 429, {"Retry-After": self._pending_429.pop(0)}
            ok = self.accept is None or (token is not None and token not in self._revoked)
        if ok and self.accept is not None:
            assert token is not None
            ok = self.accept(token)
        if ok:
            return 200, {}
        with self._lock:
            gate = self._gate
        if gate is not None:
            gate.arrive()
        return 401, {"WWW-Authenticate": 'Bearer error="invalid_token"'}

    def record(self, status: int, path: str) -> None:
        with self._changed:
            self._counts[status] += 1
            self._paths[status, path] += 1
            self._changed.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real upstream
    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        state = self.server.state
        status, extra = state.decide(self.headers.get("Authorization"))
        body = json.dumps({"status": status, "path": self.path}).encode()
        head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
                "Content-Type: application/json", f"Content-Length: {len(body)}",
                *(f"{k}: {v}" for k, v in extra.items())]
        # counted before the answer leaves: a client that has its answer finds it counted
        state.record(status, self.path)
        # one write: head and body in the same segment (no Nagle / delayed-ACK stall)
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, state: Upstream) -> None:
        self.state = state
        super().__init__(("127.0.0.1", 0), _Handler)


@contextlib.contextmanager
def start_upstream(accept: Predicate | None = None) -> Iterator[Upstream]:
    """Serve on 127.0.0.1 (a free port) on a thread for the with-block; yields the `Upstream`."""
    state = Upstream(accept)
    server = _Server(state)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="upstream", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def start_upstream_process(token: str | None = None) -> Iterator[str]:
    """Serve in a child process (`python -m tests.peers.upstream`); yields its base URL."""
    cmd = [sys.executable, "-m", "tests.peers.upstream", *(["--token", token] if token else [])]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    stdout = proc.stdout
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT)
        line = lines[0] if lines else ""
        if not line.startswith("READY "):
            raise RuntimeError(f"upstream process did not start (exit {proc.poll()}): {line!r}")
        yield line.split(" ", 1)[1].strip()
    finally:
        proc.stdin.close()  # its cue to stop
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stdout.close()


def _asgi_app(state: Upstream) -> Callable[..., Any]:
    async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # drain the request body
            more = (await receive()).get("more_body", False)
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
        status, extra = state.decide(authorization)
        body = json.dumps({"status": status, "path": scope["path"]}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   *((k.lower().encode(), v.encode()) for k, v in extra.items())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        query = scope.get("query_string", b"").decode("latin-1")
        state.record(status, scope["path"] + (f"?{query}" if query else ""))

    return app


def serve_process(token: str | None) -> None:
    """The child process: uvicorn (httptools) on one event loop, until stdin closes."""
    import socket

    import uvicorn

    state = Upstream(one_of(token) if token else None)
    # proto=IPPROTO_TCP, so asyncio sets TCP_NODELAY on accepted connections (with proto 0 it
    # does not, and each answer's body waits ~40 ms behind its headers: Nagle + delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)  # accepting before READY is printed
    config = uvicorn.Config(_asgi_app(state), log_level="warning", access_log=False, lifespan="off",
                            http="httptools", loop="asyncio", backlog=256)
    server = uvicorn.Server(config)

    def stop_on_eof() -> None:
        sys.stdin.read()
        server.should_exit = True

    threading.Thread(target=stop_on_eof, daemon=True).start()
    print(f"READY http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A local upstream for tests and benches.")
    parser.add_argument("--token", help="require `Authorization: Bearer TOKEN`")
    args = parser.parse_args(argv)
    serve_process(args.token)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
