"""mcpcreds: a credential and rate-limit sidecar for MCP agents."""

from .calls import MalformedAnswer
from .client import AsyncClient, Client
from .config import Config, McpServerSpec, load_config
from .errors import (
    ConfigError,
    Forbidden,
    InvalidRequest,
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
from .secret import Secret
from .socket_check import UntrustedSidecar

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "Config",
    "ConfigError",
    "Forbidden",
    "InvalidRequest",
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
