"""The error tree. Each subclass is one wire error code of the socket API."""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`'s: every command imports this module, and typing costs it ~3 ms
if TYPE_CHECKING:
    from typing import Any, ClassVar

_INFINITY = float("inf")


class McpcredsError(Exception):
    """Root of every mcpcreds error. `code` is the wire code, `status` the HTTP status."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        body.update(self.details)
        return {"error": body}


class ConfigError(McpcredsError):
    """The configuration is invalid; `errors` lists every problem with its TOML path."""

    code = "config_error"
    status = 500

    def __init__(self, errors: list[str], path: str | None = None) -> None:
        self.errors = list(errors)
        self.path = path
        count = len(self.errors)
        summary = f"{count} configuration error{'s' if count != 1 else ''}"
        super().__init__(summary + ":\n" + "\n".join(f"  {e}" for e in self.errors))


class InvalidRequest(McpcredsError):
    code = "invalid_request"
    status = 400


class Forbidden(McpcredsError):
    code = "forbidden"
    status = 403


class ProxyOnly(Forbidden):
    """The server's credential is used by the gateway only (`expose = "proxy"`): not handed out."""

    code = "proxy_only"


class ProxyDisabled(Forbidden):
    """The server is not served through the gateway (`expose = "headers"`)."""

    code = "proxy_disabled"


class UnknownServer(McpcredsError):
    code = "unknown_server"
    status = 404


class UnknownSecret(McpcredsError):
    code = "unknown_secret"
    status = 404


class NotFound(McpcredsError):
    code = "not_found"
    status = 404


class MethodNotAllowed(McpcredsError):
    code = "method_not_allowed"
    status = 405


class PayloadTooLarge(McpcredsError):
    code = "payload_too_large"
    status = 413


class HeadersTooLarge(McpcredsError):
    code = "headers_too_large"
    status = 431


class RateLimited(McpcredsError):
    code = "rate_limited"
    status = 429

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message, retry_after=round(retry_after, 3))
        self.retry_after = retry_after


class TooManyGrants(McpcredsError):
    """A grant holder (or the sidecar as a whole) holds as many live grants as it may."""

    code = "too_many_grants"
    status = 429


class LoginRequired(McpcredsError):
    """A person's login (grant = "device" or "authorization_code") has no usable refresh token:
    none stored, or the authorization server refused it. `command` names what to run."""

    code = "login_required"
    status = 401


class TokenEndpointError(McpcredsError):
    """The token endpoint refused or failed. `error` is the IdP's OAuth error code."""

    code = "token_endpoint_error"
    status = 502

    def __init__(self, message: str, error: str = "server_error") -> None:
        super().__init__(message, error=error)
        self.error = error


class UpstreamError(McpcredsError):
    """The gateway could not reach the MCP server, or its answer could not be relayed."""

    code = "upstream_error"
    status = 502


class UpstreamTimeout(McpcredsError):
    code = "upstream_timeout"
    status = 504


class SecretUnavailable(McpcredsError):
    code = "secret_unavailable"
    status = 503


class StateUnavailable(McpcredsError):
    code = "state_unavailable"
    status = 503


class TokenEndpointTimeout(McpcredsError):
    code = "token_endpoint_timeout"
    status = 504


class SidecarUnavailable(McpcredsError):
    """Raised by the client when no sidecar answers on the socket."""

    code = "sidecar_unavailable"
    status = 503


class ExecSessionsFull(McpcredsError):
    """The egress proxy holds as many exec sessions as it may (every caller's): try again later."""

    code = "exec_sessions_full"
    status = 503


class TooManySubscribers(McpcredsError):
    """The sidecar (or this uid) has as many event streams open as it may."""

    code = "too_many_subscribers"
    status = 429


class LeasesRefused(McpcredsError):
    """This server's permits are not leased (`leases = false`, a signed or shared-state server):
    ask per request (`call`)."""

    code = "leases_refused"
    status = 409


ERRORS_BY_CODE: dict[str, type[McpcredsError]] = {
    cls.code: cls
    for cls in (
        McpcredsError,
        ConfigError,
        InvalidRequest,
        Forbidden,
        ProxyOnly,
        ProxyDisabled,
        UnknownServer,
        UnknownSecret,
        NotFound,
        MethodNotAllowed,
        PayloadTooLarge,
        HeadersTooLarge,
        RateLimited,
        TooManyGrants,
        TokenEndpointError,
        LoginRequired,
        UpstreamError,
        UpstreamTimeout,
        SecretUnavailable,
        StateUnavailable,
        TokenEndpointTimeout,
        SidecarUnavailable,
        ExecSessionsFull,
        TooManySubscribers,
        LeasesRefused,
    )
}


def error_from_wire(status: int, body: dict[str, Any]) -> McpcredsError:
    """Rebuild the exception a server answer describes (used by the client)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return McpcredsError(f"sidecar answered HTTP {status} without an error body")
    code = str(err.get("code", "internal_error"))
    message = str(err.get("message", ""))
    cls = ERRORS_BY_CODE.get(code, McpcredsError)
    exc: McpcredsError
    if cls is RateLimited:
        exc = RateLimited(message, _seconds(err.get("retry_after")))
    elif cls is TokenEndpointError:
        exc = TokenEndpointError(message, str(err.get("error", "server_error")))
    elif cls is ConfigError:
        exc = ConfigError([message])
    else:
        extra = {k: v for k, v in err.items() if k not in ("code", "message")}
        exc = cls(message, **extra)
    return exc


def _seconds(value: Any) -> float:
    """A finite, non-negative number of seconds from an answer; 0 for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        return 0.0
    return seconds if 0.0 < seconds < _INFINITY else 0.0  # NaN is neither
