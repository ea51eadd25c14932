"""mcpcreds: a credential and rate-limit sidecar for MCP agents.

The errors are imported here; every other public name on first use (`__getattr__`), so that
`import mcpcreds` (which every `mcpcreds` command does) costs no httpx, asyncio or config parser.
`from mcpcreds import AsyncClient, Client, Forbidden, ...` works as before.
"""

from __future__ import annotations

from .errors import (
    ConfigError,
    Forbidden,
    InvalidRequest,
    LoginRequired,
    McpcredsError,
    RateLimited,
    SecretUnavailable,
    SidecarUnavailable,
    StateUnavailable,
    TokenEndpointError,
    TokenEndpointTimeout,
    UnknownSecret,
    UnknownServer,
)

TYPE_CHECKING = False  # not `typing`'s: importing typing costs each command ~2 ms
if TYPE_CHECKING:
    from typing import Any

    from .client.calls import MalformedAnswer
    from .client.client import AsyncClient, Client
    from .config.load import load_config
    from .config.model import Config, McpServerSpec
    from .core.secret import Secret
    from .core.socket_check import UntrustedSidecar

_LAZY: dict[str, str] = {
    "AsyncClient": ".client.client",
    "Client": ".client.client",
    "Config": ".config.model",
    "MalformedAnswer": ".client.calls",
    "McpServerSpec": ".config.model",
    "Secret": ".core.secret",
    "UntrustedSidecar": ".core.socket_check",
    "load_config": ".config.load",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from .core.version import installed_version

        globals()[name] = value = installed_version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "__version__"})


__all__ = [
    "AsyncClient",
    "Client",
    "Config",
    "ConfigError",
    "Forbidden",
    "InvalidRequest",
    "LoginRequired",
    "MalformedAnswer",
    "McpServerSpec",
    "McpcredsError",
    "RateLimited",
    "Secret",
    "SecretUnavailable",
    "SidecarUnavailable",
    "StateUnavailable",
    "TokenEndpointError",
    "TokenEndpointTimeout",
    "UnknownSecret",
    "UnknownServer",
    "UntrustedSidecar",
    "__version__",
    "load_config",
]
