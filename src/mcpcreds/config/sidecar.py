"""The sidecar's own tables: `[sidecar]`, `[secrets]` and `[gateway]` (its loopback TCP listener,
and the defaults of every server's content keys, config/content.py)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Final

from ..core.rates import parse_duration
from .content import GATEWAY_CONTENT_KEYS, ContentPolicy, parse_content
from .model import CREDENTIALS_SOURCE, SOURCE_KINDS, ListenConfig, SecretsConfig, SidecarConfig
from .reader import Collector, count, join, kind_of, uid_list


def parse_sidecar(c: Collector, raw: Any) -> SidecarConfig:
    path = "sidecar"
    t = c.table(path, raw)
    c.keys(path, t, ("socket", "allow_uids", "state", "state_key", "on_state_loss",
                     "local_share", "refresh_ahead", "audit_log", "allow_trifecta",
                     "request_timeout", "idle_timeout", "token_timeout", "state_password",
                     "state_ca", "grant_only_uids", "sidecar_uid", "invalidate_cooldown", "max_grants",
                     "max_subgrants", "grant_pause_budget", "grant_pause_window", "drain_timeout", "egress",
                     "event_loop"))
    uids = uid_list(c, path, "allow_uids", t.get("allow_uids", []))
    grant_only = uid_list(c, path, "grant_only_uids", t.get("grant_only_uids", []))
    state = c.typed(join(path, "state"), t.get("state"), str, "memory")
    if state != "memory" and not state.startswith(("redis://", "rediss://", "unix://")):
        c.error(join(path, "state"),
                "expected 'memory', 'redis://...', 'rediss://...' or 'unix:///path'")
    state_key = None
    if "state_key" in t:
        state_key = c.template(join(path, "state_key"), t["state_key"], credential=True)
    state_password = None
    if "state_password" in t:
        state_password = c.template(join(path, "state_password"), t["state_password"], credential=True)
    shared = state.startswith(("redis://", "rediss://", "unix://"))
    if shared and state_key is None:
        c.error(join(path, "state_key"), "required with a shared state: logins are stored encrypted "
                "with it (e.g. \"{{secret:MCPCREDS_STATE_KEY}}\")")
    if shared and "@" in state.split("//", 1)[-1].split("/", 1)[0]:
        c.error(join(path, "state"), "must not carry a password; use sidecar.state_password")
    on_loss = c.typed(join(path, "on_state_loss"), t.get("on_state_loss"), str, "closed")
    if on_loss not in ("closed", "local"):
        c.error(join(path, "on_state_loss"), "expected 'closed' or 'local'")
        on_loss = "closed"
    share = c.typed(join(path, "local_share"), t.get("local_share"), float, 1.0)
    if not 0 < share <= 1:
        c.error(join(path, "local_share"), "expected a fraction in (0, 1]")
    refresh = c.parsed(join(path, "refresh_ahead"), t.get("refresh_ahead", "60s"), parse_duration)
    socket = c.typed(join(path, "socket"), t.get("socket"), str, "") or None
    audit = c.typed(join(path, "audit_log"), t.get("audit_log"), str, "") or None
    request_timeout = c.parsed(join(path, "request_timeout"), t.get("request_timeout", 10.0),
                               parse_duration)
    idle_timeout = c.parsed(join(path, "idle_timeout"), t.get("idle_timeout", 120.0), parse_duration)
    token_timeout = c.parsed(join(path, "token_timeout"), t.get("token_timeout", 10.0), parse_duration)
    sidecar_uid = t.get("sidecar_uid")
    if sidecar_uid is not None and (isinstance(sidecar_uid, bool) or not isinstance(sidecar_uid, int)
                                    or not 0 <= sidecar_uid < 2**32):
        c.error(join(path, "sidecar_uid"), "expected a non-negative integer uid")
        sidecar_uid = None
    cooldown = c.parsed(join(path, "invalidate_cooldown"), t.get("invalidate_cooldown", 5.0), parse_duration)
    pause_budget = c.parsed(join(path, "grant_pause_budget"), t.get("grant_pause_budget", 300.0),
                            parse_duration)
    pause_window = c.parsed(join(path, "grant_pause_window"), t.get("grant_pause_window", 900.0),
                            parse_duration)
    egress = c.typed(join(path, "egress"), t.get("egress"), str, "open")
    if egress not in ("open", "closed"):
        c.error(join(path, "egress"), "expected 'open' or 'closed' (closed: every server's endpoint must be "
                                      "under a [services] entry's)")
        egress = "open"
    event_loop = c.typed(join(path, "event_loop"), t.get("event_loop"), str, "uvloop")
    if event_loop not in ("uvloop", "asyncio"):
        c.error(join(path, "event_loop"), "expected 'uvloop' or 'asyncio'")
        event_loop = "uvloop"
    drain = c.parsed(join(path, "drain_timeout"), t.get("drain_timeout", 10.0), parse_duration)
    if drain is not None and drain > 300:
        c.error(join(path, "drain_timeout"), "expected at most 5m")
    return SidecarConfig(
        event_loop=event_loop,  # type: ignore[arg-type]  # checked above
        drain_timeout=drain if drain is not None and drain <= 300 else 10.0,
        sidecar_uid=sidecar_uid,
        invalidate_cooldown=cooldown if cooldown is not None else 5.0,
        max_grants=count(c, join(path, "max_grants"), t.get("max_grants"), 10_000, 1_000_000),
        max_subgrants=count(c, join(path, "max_subgrants"), t.get("max_subgrants"), 64, 10_000),
        grant_pause_budget=pause_budget if pause_budget is not None else 300.0,
        grant_pause_window=pause_window or 900.0,
        token_timeout=token_timeout or 10.0,
        request_timeout=request_timeout or 10.0,
        idle_timeout=idle_timeout or 120.0,
        socket=socket,
        allow_uids=tuple(uids),
        grant_only_uids=tuple(grant_only),
        state=state,
        state_key=state_key,
        state_password=state_password,
        state_ca=c.typed(join(path, "state_ca"), t.get("state_ca"), str, "") or None,
        on_state_loss=on_loss,  # type: ignore[arg-type]
        local_share=share,
        refresh_ahead=refresh if refresh is not None else 60.0,
        audit_log=audit,
        allow_trifecta=c.typed(join(path, "allow_trifecta"), t.get("allow_trifecta"), bool, False),
        egress=egress,  # type: ignore[arg-type]
    )


def parse_secrets(c: Collector, raw: Any) -> SecretsConfig:
    path = "secrets"
    t = c.table(path, raw)
    c.keys(path, t, ("sources", "keyring_service", "keyring_backend", "allow_plaintext_keyring",
                     "keyring_timeout", "cache_ttl"))
    sources_raw = t.get("sources", ["env", "keyring"])
    sources: list[str] = []
    if not isinstance(sources_raw, list) or not sources_raw:
        c.error(join(path, "sources"), "expected a non-empty array of sources")
    else:
        for i, src in enumerate(sources_raw):
            spath = f"{path}.sources[{i}]"
            if not isinstance(src, str):
                c.error(spath, f"expected a string, got {kind_of(src)}")
            elif src in (*SOURCE_KINDS, CREDENTIALS_SOURCE) or (src.startswith("dir:/") and len(src) > 5):
                sources.append(src)
            else:
                c.error(spath, "unknown source: expected 'env', 'keyring', 'dir:/abs/path' or "
                        f"'{CREDENTIALS_SOURCE}'")
    timeout = c.parsed(join(path, "keyring_timeout"), t.get("keyring_timeout", 3.0), parse_duration)
    cache_ttl = c.parsed(join(path, "cache_ttl"), t.get("cache_ttl", 2.0), parse_duration)
    return SecretsConfig(
        cache_ttl=cache_ttl if cache_ttl is not None else 2.0,
        sources=tuple(sources) or ("env", "keyring"),
        keyring_service=c.typed(join(path, "keyring_service"), t.get("keyring_service"), str,
                                "mcpcreds"),
        keyring_backend=c.typed(join(path, "keyring_backend"), t.get("keyring_backend"), str,
                                "") or None,
        allow_plaintext_keyring=c.typed(join(path, "allow_plaintext_keyring"),
                                        t.get("allow_plaintext_keyring"), bool, False),
        keyring_timeout=timeout or 3.0,
    )


_LISTEN: Final = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]|(?P<v4>[0-9.]{7,15}))"
                            r":(?P<port>[0-9]{1,5})\Z")


def parse_listen(value: str) -> tuple[str, int]:
    """`127.0.0.1:PORT` or `[::1]:PORT` (a loopback address literal, a port from 0 to 65535; 0:
    one the kernel picks) as (host, port). Raises ValueError, never quoting `value`."""
    match = _LISTEN.match(value) if len(value) <= 64 else None
    if match is None:
        raise ValueError("expected \"127.0.0.1:PORT\" or \"[::1]:PORT\"")
    host = match["v6"] or match["v4"]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError("expected \"127.0.0.1:PORT\" or \"[::1]:PORT\" (not an IP address)") from None
    mapped = getattr(address, "ipv4_mapped", None)
    if not address.is_loopback or mapped is not None:
        raise ValueError("the gateway listens on a loopback address only (127.0.0.0/8 or ::1): "
                         "its callers are identified by the kernel's table of local sockets")
    port = int(match["port"])
    if port > 65535:
        raise ValueError("the port must be from 0 to 65535 (0: one the kernel picks, logged at start)")
    return str(address), port


GATEWAY_KEYS: Final = ("listen", *GATEWAY_CONTENT_KEYS)


def parse_gateway_table(c: Collector, raw: Any) -> tuple[ListenConfig, ContentPolicy]:
    """`[gateway]`: its listener, and the content keys every server inherits unless it sets its own."""
    path = "gateway"
    t = c.table(path, raw)
    c.keys(path, t, GATEWAY_KEYS)
    defaults = parse_content(c, path, t, ContentPolicy(), GATEWAY_CONTENT_KEYS)
    return _listen(c, path, t.get("listen")), defaults


def _listen(c: Collector, path: str, listen: Any) -> ListenConfig:
    if listen is None:
        return ListenConfig()
    if not isinstance(listen, str):
        c.error(join(path, "listen"), f"expected a string, got {kind_of(listen)}")
        return ListenConfig()
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        c.error(join(path, "listen"), str(exc))
        return ListenConfig()
    return ListenConfig(host, port)
