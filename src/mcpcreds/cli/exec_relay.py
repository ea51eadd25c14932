"""`mcpcreds exec`'s stdio relay: for an entry with a policy, the child runs with pipes for its
stdin and stdout, and this process relays newline-delimited JSON-RPC between them and its own
stdio through `exec.stdio_relay.StdioPolicy` (the gateway's policy core).

The child is forked first, and isolated exactly as an unrelayed one (its namespaces, its proxy,
then `execve`); this process stays outside them and made undumpable holds what it held before (the
session answer), nothing more. stderr passes through untouched (the child's own). SIGINT and
SIGTERM are forwarded to the child; the exit status is the child's. Lines are bounded as in
`mcpcreds stdio` (`LineSplitter`): an overlong client line is answered with an error, an overlong
server line is dropped. The policy's timers (`timeout`, `elicitation_timeout_secs`) are
`threading.Timer`s that act under the relay's lock, as a line does. What the relay decided goes
to the sidecar (`POST /v1/exec/NAME/events`) from a thread of its own, so that a slow sidecar
never holds up the traffic.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Final

from ..client.stdio_bridge import LineSplitter, LineTooLong
from ..errors import McpcredsError
from ..exec.stdio_pins import pins_body
from ..exec.stdio_relay import Relayed, StdioPolicy
from ..protocol import jsonrpc
from ..protocol.elicitations import Handle
from .common import exit_code_for

READ_CHUNK: Final = 64 * 1024
PR_SET_DUMPABLE: Final = 4
QUEUED: Final = 1024  # lines waiting to be written to one side
EXIT_SETUP: Final = 1

Post = Callable[[list[dict[str, Any]]], None]


def undumpable() -> None:
    """No core dump, no ptrace by other processes of the same uid (this process holds the session)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Writer(threading.Thread):
    """Writes queued lines to one fd in order; None closes it. A peer gone ends it quietly."""

    def __init__(self, fd: int, close: bool) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.close_fd = close
        self.lines: queue.Queue[bytes | None] = queue.Queue(QUEUED)

    def run(self) -> None:
        broken = False
        while (line := self.lines.get()) is not None:
            if broken:
                continue
            try:
                _write_all(self.fd, line + b"\n")
            except OSError:
                broken = True
        if self.close_fd:
            with contextlib.suppress(OSError):
                os.close(self.fd)


class _Events(threading.Thread):
    """Sends the relay's events to the sidecar as they come (batched while a send is under way)."""

    def __init__(self, post: Post, what: str = "audit events") -> None:
        super().__init__(daemon=True)
        self.post = post
        self.what = what
        self.cond = threading.Condition()
        self.pending: list[dict[str, Any]] = []
        self.done = False
        self.failed = False

    def add(self, events: list[dict[str, Any]]) -> None:
        if events:
            with self.cond:
                self.pending += events
                self.cond.notify()

    def finish(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.done:
                    self.cond.wait()
                batch, self.pending = self.pending, []
                last = self.done
            for i in range(0, len(batch), 64):
                self._send(batch[i:i + 64])
            if last and not self.pending:
                return

    def _send(self, events: list[dict[str, Any]]) -> None:
        if self.failed:
            return
        try:
            self.post(events)
        except Exception:  # the sidecar gone or refusing: said once, the traffic goes on
            self.failed = True
            print(f"mcpcreds exec: warning: the sidecar did not take the relay's {self.what}; "
                  "the rest of this run's are not sent", file=sys.stderr)


class Relay:
    def __init__(self, policy: StdioPolicy, to_client: _Writer, to_server: _Writer, events: _Events,
                 pins: _Events) -> None:
        self.policy = policy
        self.pins = pins
        self.lock = threading.Lock()  # the policy's state is shared by both directions
        self.to_client = to_client
        self.to_server = to_server
        self.events = events

    def _route(self, relayed: Relayed) -> None:
        for line in relayed.to_client:
            self.to_client.lines.put(line)
        for line in relayed.to_server:
            self.to_server.lines.put(line)

    def schedule(self, seconds: float, then: Callable[[], None]) -> Handle:
        timer = threading.Timer(seconds, self._fire, args=(then,))
        timer.daemon = True
        timer.start()
        return timer

    def _fire(self, then: Callable[[], None]) -> None:
        with self.lock:
            then()
            relayed = self.policy.take_late()
            events = self.policy.take_events()
        self._route(relayed)
        self.events.add(events)

    def pump(self, fd: int, judge: Callable[[bytes], Relayed], too_long: Callable[[], Relayed],
             at_end: Callable[[], None]) -> None:
        splitter = LineSplitter()
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except OSError:
                data = b""
            items = splitter.feed(data) if data else splitter.end()
            for item in items:
                with self.lock:
                    relayed = too_long() if isinstance(item, LineTooLong) else judge(item)
                    events = self.policy.take_events()
                    writes = self.policy.take_pin_writes()
                self.pins.add([pins_body(d.pin, d.changed, d.cleared) for d in writes])  # before the listing
                self._route(relayed)
                self.events.add(events)
            if not data:
                at_end()
                return


def _too_long_client() -> Relayed:
    return Relayed([jsonrpc.dumps(jsonrpc.error(None, jsonrpc.INVALID_REQUEST,
                                                "Invalid Request: a message over the relay's line limit"))])


def _too_long_server() -> Relayed:
    print("mcpcreds exec: warning: a message of the server's over the relay's line limit was dropped",
          file=sys.stderr)
    return Relayed()


def _child(stdin: int, stdout: int, start: Callable[[], None]) -> None:
    """In the forked child: its stdio the pipes, then `start` (isolate and execve); never returns."""
    code = EXIT_SETUP
    try:
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        start()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_SETUP
    except McpcredsError as exc:  # as `mcpcreds` says it unrelayed
        print(f"mcpcreds: {exc.code}: {exc.message}", file=sys.stderr)
        code = exit_code_for(exc)
    except BaseException as exc:  # nothing of the parent's code may run on in the child
        print(f"mcpcreds exec: the child did not start ({type(exc).__name__})", file=sys.stderr)
    finally:
        os._exit(code)


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def run_relayed(policy: StdioPolicy, start: Callable[[], None], post: Post, post_pins: Post) -> int:
    """Fork the child (`start` isolates and execs it, in the child), relay, return its exit code."""
    child_in, relay_out = os.pipe()
    relay_in, child_out = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(relay_out)
        os.close(relay_in)
        _child(child_in, child_out, start)
    os.close(child_in)
    os.close(child_out)
    undumpable()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    to_client, to_server, events = _Writer(1, False), _Writer(relay_out, True), _Events(post)
    pin_writes = _Events(post_pins, "tool pins")
    relay = Relay(policy, to_client, to_server, events, pin_writes)
    policy.schedule = relay.schedule
    for thread in (to_client, to_server, events, pin_writes):
        thread.start()
    from_client = threading.Thread(target=relay.pump, daemon=True,
                                   args=(0, policy.from_client, _too_long_client,
                                         lambda: to_server.lines.put(None)))
    from_client.start()
    from_server = threading.Thread(target=relay.pump, args=(relay_in, policy.from_server, _too_long_server,
                                                                 lambda: None))
    from_server.start()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    from_server.join()  # the child's stdout at its end: every line it wrote is judged
    to_server.lines.put(None)
    to_client.lines.put(None)
    to_client.join()
    for sender in (events, pin_writes):
        sender.finish()
    for sender in (events, pin_writes):
        sender.join(timeout=30)
    os.close(relay_in)
    return exit_code(status)
