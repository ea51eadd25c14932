"""What the gateway records of what it relays: each `tools/call`'s audit line (server, tool,
caller, status, duration; never arguments or results) and its metrics, each request's metrics,
each tool policy warning (logged once per server), and one WARNING line for each exchange with an
MCP server that fails, naming the server and what failed, and nothing of the request (no URL, no
header, no body, no credential):

    gateway: upstream "docs" failed: connect error (connection refused)
    gateway: upstream "docs" failed: TLS error (CERTIFICATE_VERIFY_FAILED)
    gateway: upstream "docs" failed: answered HTTP 502
    gateway: upstream "docs" failed: timed out after 30s (no answer)

As JSON, that line's fields are `server`, `failure` (connect_error, tls_error, http_error,
timeout, cut, refused_answer) and, for an HTTP answer, `status`. A failure is logged where it is
met (the relay, the reading of an answer, an SSE stream), once; what the client gets is the
gateway's error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import httpx

from ..config.model import Target
from ..core.audit import AuditLog
from ..core.logs import get_logger
from ..core.metrics import Metrics
from ..errors import ERRORS_BY_CODE
from ..net.egress_http import ConnectError

_log = get_logger("gateway")

MAX_AUDITED_NAME: Final = 128
MAX_WARNINGS: Final = 4096  # policy warnings remembered as logged (server, warning)
_STATUS_GROUPS: Final = frozenset({"ok", "tool_error", "error", "refused", "rate_limited", "upstream_error",
                                   "no_response", "dropped", "cancelled", "withheld", "input_required",
                                   "task"})


class Caller(Protocol):
    """Who called (the broker's `Actor`), as an audit line names them."""

    def to_dict(self) -> dict[str, Any]: ...


def metric_status(status: str) -> str:
    """An audit status as a metric label: its group, from a bounded set."""
    head = status.split(":", 1)[0]
    if head in _STATUS_GROUPS or head in ERRORS_BY_CODE:
        return head
    if head.startswith("http_") and head[5:].isdigit():
        return f"http_{head[5]}xx"
    return "other"


class GatewayRecords:
    def __init__(self, audit: Callable[[], AuditLog], metrics: Metrics) -> None:
        self.audit = audit  # the broker's audit log of now (a reload may open another)
        self.metrics = metrics
        self._warned: set[tuple[str, str]] = set()

    def tool_call_done(self, target: Target, tool: str, actor: Caller, status: str, seconds: float) -> None:
        self.audit().write("tool_call", server=target.name, key=target.key, tool=tool[:MAX_AUDITED_NAME],
                           status=status, duration=round(seconds, 6), **actor.to_dict())
        shown = "_refused" if status == "refused" else tool[:MAX_AUDITED_NAME]
        labels = self.metrics.bounded("mcpcreds_tool_calls_total",
                                      (("server", target.name), ("tool", shown)), "tool")
        self.metrics.inc("mcpcreds_tool_calls_total", (*labels, ("status", metric_status(status))),
                         help_text="tools/call requests through the gateway, by server, tool and outcome.")
        self.metrics.observe("mcpcreds_tool_call_seconds", labels, seconds,
                             help_text="Time from a tools/call request to its answer, by server and tool.")

    def request(self, target: Target, method: str, status: int, started: float) -> None:
        """A request relayed (or answered here) with `status`, `started` at that perf_counter."""
        labels = (("server", target.name),)
        self.metrics.inc("mcpcreds_gateway_requests_total",
                         (*labels, ("method", method), ("status", str(status))),
                         help_text="Requests relayed by the gateway, by server, HTTP method and status.")
        self.metrics.observe("mcpcreds_gateway_request_seconds", labels, time.perf_counter() - started,
                             help_text="Time from a gateway request to the head of its answer, by server.")

    def policy_warnings(self, target: Target, warnings: list[str]) -> None:
        for warning in warnings:
            if (target.name, warning) not in self._warned and len(self._warned) < MAX_WARNINGS:
                self._warned.add((target.name, warning))
                _log.warning("tool policy", extra={"server": target.name, "warning": warning})


# -- upstream failures

# an httpx timeout: which of the request's timeouts ran out, and while doing what
_PHASES: Final = ((httpx.ConnectTimeout, "connect", "connecting"),
                  (httpx.WriteTimeout, "write", "sending the request"),
                  (httpx.PoolTimeout, "pool", "waiting for a free connection"),
                  (httpx.ReadTimeout, "read", "reading the answer"))


def failed(server: str, failure: str, what: str, **fields: Any) -> None:
    _log.warning('upstream "%s" failed: %s', server, what, extra={"server": server, "failure": failure,
                                                                  **fields})


def answered(server: str, status: int) -> None:
    """The server answered with an HTTP status of 500 or more."""
    failed(server, "http_error", f"answered HTTP {status}", status=status)


def timed_out(server: str, seconds: float | None, doing: str) -> None:
    after = f" after {seconds:g}s" if seconds is not None else ""
    failed(server, "timeout", f"timed out{after} ({doing})")


def not_answered(server: str, exc: BaseException, timeout: float, timeouts: Mapping[str, Any]) -> None:
    """A request that got no answer: `exc` from the transport, `timeout` the gateway's own wait for
    the answer's head, `timeouts` the transport's (connect, write, pool)."""
    if isinstance(exc, TimeoutError):
        timed_out(server, timeout, "no answer")
    elif isinstance(exc, httpx.TimeoutException):
        phase, doing = next(((p, d) for kind, p, d in _PHASES if isinstance(exc, kind)), ("", "waiting"))
        seconds = timeouts.get(phase)
        timed_out(server, seconds if isinstance(seconds, int | float) else None, doing)
    elif isinstance(exc, ConnectError) and exc.tls:
        failed(server, "tls_error", f"TLS error ({exc.reason})")
    elif isinstance(exc, ConnectError):
        failed(server, "connect_error", f"connect error ({exc.reason})")
    elif isinstance(exc, httpx.ConnectError):
        failed(server, "connect_error", f"connect error ({type(exc).__name__})")
    else:
        failed(server, "cut", f"no answer ({type(exc).__name__})")
