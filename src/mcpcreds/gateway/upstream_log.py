"""One WARNING line for each exchange with an MCP server that fails, naming the server and what
failed, and nothing of the request (no URL, no header, no body, no credential):

    gateway: upstream "docs" failed: connect error (connection refused)
    gateway: upstream "docs" failed: TLS error (CERTIFICATE_VERIFY_FAILED)
    gateway: upstream "docs" failed: answered HTTP 502
    gateway: upstream "docs" failed: timed out after 30s (no answer)

As JSON, the line's fields are `server`, `failure` (connect_error, tls_error, http_error, timeout,
cut, refused_answer) and, for an HTTP answer, `status`. A failure is logged where it is met (the
relay, the reading of an answer, an SSE stream), once; what the client gets is the gateway's error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import httpx

from ..core.logs import get_logger
from ..net.egress_http import ConnectError

_log = get_logger("gateway")

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
