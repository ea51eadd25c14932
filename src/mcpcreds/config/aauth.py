"""`aauth` (parsed, pure): which servers the sidecar signs requests to with its AAuth agent key.

- On a server or a service, `aauth = true | false` (the seed's `aauth: Option<bool>`): `true` signs
  even if the global default is off, `false` opts out, absent inherits the global default.
  Precedence `auth` > `oauth` > `aauth`: a server with either never also signs.
- The global `[aauth]` table: `provider` (the Agent Provider's URL), `key_file` (the durable
  Ed25519 agent key; default `aauth-agent.key` in the sidecar's state folder, the socket's 0700
  folder), `enroll` (`"open"`, `{ token = "{{secret:...}}" }` or `{ assertion_file = "/path" }`)
  and `default` (sign servers that say nothing; default: when a provider is configured), `alg`
  (the agent key: `Ed25519`, the default, or `ES256`, ECDSA P-256, for platforms whose keys are).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from ..core.templates import Template
from .reader import url

if TYPE_CHECKING:
    from .reader import Collector

AAUTH_KEYS: Final = ("provider", "key_file", "enroll", "default", "alg")
ALGS: Final = ("Ed25519", "ES256")
ENROLL_KEYS: Final = ("token", "assertion_file")
KEY_FILE_NAME: Final = "aauth-agent.key"


@dataclass(frozen=True, slots=True)
class Enroll:
    """How the sidecar enrolls its key with the Agent Provider."""

    kind: Literal["open", "token", "assertion_file"]
    token: Template | None = None
    assertion_file: str | None = None


@dataclass(frozen=True, slots=True)
class AAuthConfig:
    """The global `[aauth]` table (all unset when the config has none)."""

    provider: str | None = None
    key_file: str | None = None  # None: KEY_FILE_NAME in the state folder
    enroll: Enroll | None = None
    default: bool | None = None  # None: sign when a provider is configured
    alg: str = "Ed25519"  # the agent key's algorithm: Ed25519, or ES256 (ECDSA P-256)

    @property
    def signs_by_default(self) -> bool:
        return self.default if self.default is not None else self.provider is not None

    def key_path(self, state_folder: Path) -> Path:
        return Path(self.key_file) if self.key_file else state_folder / KEY_FILE_NAME


def entry_aauth(c: Collector, path: str, t: dict[str, Any], auth_kind: str | None) -> bool | None:
    """A server's or a service's `aauth` flag, as written (None: absent). With `auth` or `oauth`
    present it is not used (a warning says so when it asks to sign)."""
    if "aauth" not in t:
        return None
    raw: object = t["aauth"]
    where = f"{path}.aauth"
    if not isinstance(raw, bool):
        c.error(where, "expected true or false (sign requests to this server with the AAuth agent key)")
        return None
    if raw and auth_kind is not None:
        c.warnings.append(f"{where}: not used, `{auth_kind}` takes precedence (a server with "
                          "`auth` or `oauth` is never also signed)")
    return raw


def parse_aauth(c: Collector, raw: Any) -> AAuthConfig:
    path = "aauth"
    t = c.table(path, raw)
    c.keys(path, t, AAUTH_KEYS)
    provider = url(c, f"{path}.provider", t.get("provider"))
    key_file = t.get("key_file")
    if key_file is not None and (not isinstance(key_file, str) or not key_file.startswith("/")
                                 or "\x00" in key_file or len(key_file) > 4096):
        c.error(f"{path}.key_file", "expected an absolute path")
        key_file = None
    default: bool | None = None
    if "default" in t:
        default = c.typed(f"{path}.default", t["default"], bool, False)
    enroll = _parse_enroll(c, f"{path}.enroll", t.get("enroll"))
    if enroll is not None and provider is None and "provider" not in t:
        c.error(f"{path}.enroll", "needs `provider` (the Agent Provider to enroll with)")
    alg = t.get("alg", "Ed25519")
    if alg not in ALGS:
        c.error(f"{path}.alg", "expected \"Ed25519\" or \"ES256\" (the agent key's algorithm)")
        alg = "Ed25519"
    return AAuthConfig(provider, key_file, enroll, default, alg)


def _parse_enroll(c: Collector, path: str, raw: Any) -> Enroll | None:
    if raw is None:
        return None
    if raw == "open":
        return Enroll("open")
    if not isinstance(raw, dict):
        c.error(path, "expected \"open\", { token = \"{{secret:NAME}}\" } or { assertion_file = \"/path\" }")
        return None
    c.keys(path, raw, ENROLL_KEYS)
    given = [k for k in ENROLL_KEYS if k in raw]
    if len(given) != 1:
        c.error(path, "expected exactly one of token, assertion_file")
        return None
    if given[0] == "token":
        token = c.template(f"{path}.token", raw["token"], credential=True)
        return Enroll("token", token=token) if token is not None else None
    value = raw["assertion_file"]
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value or len(value) > 4096:
        c.error(f"{path}.assertion_file", "expected an absolute path")
        return None
    return Enroll("assertion_file", assertion_file=value)
