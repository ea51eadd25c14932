"""`POST /v1/exec/{name}/session`: what `mcpcreds exec NAME -- CMD` needs to start a child.

The answer holds the resolved environment of the `[exec.NAME]` entry (secret values: built as
bytes here, never passed through the redactor, never logged), the names of the caller's
variables to drop (with `env_isolation = false`: every variable whose value is a secret the
caller could be handed anyway (env_match.py), judged by the SHA-256 the caller sent, so the
caller's values never travel), and
for `restricted` / `broad_audited` a session of the egress proxy (`egress_proxy.py`), and, for an
entry that sets trust or content keys, the policy its stdio relay applies (`policy`; None: not
relayed) with the entry's tool pins when it pins (`pins`: the store's view of `exec:NAME`, a name
no server can have). `POST /v1/exec/{name}/events` takes back what the relay decided
(`stdio_events.py`), `POST /v1/exec/{name}/pins` the definitions it pinned or saw changed
(`stdio_pins.py`; the store pins only where no pin is, so a caller cannot replace one).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..config.exec import CONSENTED, EXEC_PREFIX, Authorization, ExecEntry
from ..config.load import default_socket_path
from ..config.model import Config
from ..core.http import Request, Response
from ..core.logs import get_logger
from ..core.policy import check_rule_of_two
from ..errors import Forbidden, InvalidRequest, UnknownServer
from .egress_proxy import EgressProxy
from .egress_rules import PortRules
from .env_match import readable_secret_digests
from .stdio_events import checked_events, write_events
from .stdio_pins import checked_pins, view_dict

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..broker.broker import Broker
    from ..core.audit import AuditLog
    from ..core.metrics import Metrics

PROXIED: Final = ("restricted", "broad_audited")
MAX_ENV_HASHES: Final = 4096
_HEX64: Final = re.compile(r"[0-9a-f]{64}\Z")
_VAR: Final = re.compile(r"[^=\0]{1,256}\Z")
_EXEC_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}\Z")
_log = get_logger("exec")


def exec_entry(config: Config, name: str) -> ExecEntry:
    """The entry `name` names; an unconfigured name is never echoed."""
    entry = config.execs.get(name)
    if entry is None:
        if not _EXEC_NAME.match(name):
            raise InvalidRequest("invalid exec name: letters, digits, '_', '.', '-' (at most 128)")
        raise UnknownServer("unknown exec entry: no [exec.NAME] table has that name")
    return entry


def grant_entries(config: Config, names: Iterable[str], request: Request) -> list[ExecEntry]:
    """The `exec:NAME` entries a new grant names, within the caller's grant (if any)."""
    entries = []
    for name in names:
        if not name.startswith(EXEC_PREFIX):
            continue
        entry = exec_entry(config, name[len(EXEC_PREFIX):])
        if request.grant is not None and entry.grant_name not in request.grant.servers:
            raise Forbidden(f"exec entry {entry.name!r} is not in this grant")
        entries.append(entry)
    return entries


def _env_hashes(body: dict[str, Any]) -> dict[str, str]:
    raw = body.get("env_hashes", {})
    if not isinstance(raw, dict) or len(raw) > MAX_ENV_HASHES or not all(
            isinstance(k, str) and _VAR.match(k) and isinstance(v, str) and _HEX64.match(v)
            for k, v in raw.items()):
        raise InvalidRequest(f"env_hashes must map at most {MAX_ENV_HASHES} variable names to "
                             "SHA-256 hex digests")
    return raw


class ExecRoutes:
    """`POST /v1/exec/{name}/session` and the egress proxy it starts. `audit` gives the audit log
    in force (a reload may replace it)."""

    def __init__(self, broker: Broker, audit: Callable[[], AuditLog], metrics: Metrics | None = None) -> None:
        self.broker = broker
        self.audit = audit
        self.metrics = metrics
        self.proxy: EgressProxy | None = None
        # entry name -> the authorization last written to the audit log (once per entry per run,
        # again when a reload changes it)
        self._consents: dict[str, Authorization] = {}

    def _proxy_path(self) -> Path:
        return default_socket_path(self.broker.config.sidecar.socket).with_name("egress.sock")

    def _allow_uids(self) -> frozenset[int]:
        return frozenset(self.broker.config.sidecar.allow_uids or (os.getuid(),))

    async def _started_proxy(self) -> EgressProxy:
        if self.proxy is None:
            path = self._proxy_path()
            proxy = EgressProxy(str(path), self._allow_uids, self.audit,
                                clock=self.broker.clock)
            try:  # as open as the sidecar's own socket
                mode = os.stat(default_socket_path(self.broker.config.sidecar.socket)).st_mode & 0o777
            except OSError:
                mode = 0o600
            await proxy.start(mode)
            self.proxy = proxy
        return self.proxy

    def _consent(self, entry: ExecEntry) -> None:
        """The operator's consent to `broad_audited`, audited as the sidecar first applies it."""
        consent = entry.authorization
        if entry.net != CONSENTED or consent is None or self._consents.get(entry.name) == consent:
            return
        self.audit().write("consent", name=entry.name, net=entry.net, by=consent.by, reason=consent.reason)
        self._consents[entry.name] = consent

    def close(self) -> None:
        """At the sidecar's shutdown: end every proxy connection, unlink `egress.sock` (if it
        is still the socket the proxy bound)."""
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None

    async def session(self, request: Request) -> Response:
        from ..core.http import parse_json_body

        broker = self.broker
        config = broker.config
        entry = exec_entry(config, request.name)
        if request.grant is not None and entry.grant_name not in request.grant.servers:
            raise Forbidden(f"exec entry {entry.name!r} is not in this grant")
        check_rule_of_two({entry.grant_name: entry.tags}, allow_trifecta=config.sidecar.allow_trifecta)
        body = parse_json_body(request)
        hashes = _env_hashes(body)
        want_proxy = body.get("proxy", True)
        if not isinstance(want_proxy, bool):
            raise InvalidRequest("proxy must be true or false")
        resolver = broker.resolver
        env = await asyncio.to_thread(resolver.render_all, list(entry.env.items()))
        drop: list[str] = []
        if not entry.env_isolation and hashes:
            known = await readable_secret_digests(broker, entry, request.grant)
            drop = sorted(name for name, digest in hashes.items() if digest in known)
        proxy: dict[str, str] | None = None
        session_id = None
        if entry.net in PROXIED and want_proxy:
            egress = await self._started_proxy()
            self._consent(entry)
            ports = PortRules(entry.host_ports, entry.private_ports)
            token, session = egress.new_session(entry.name, entry.egress, request.peer_uid, request.peer_pid,
                                                ports)
            proxy, session_id = {"socket": egress.path, "token": token}, session.id
        grant = request.grant.id if request.grant is not None else None
        self.audit().write("exec", name=entry.name, net=entry.net, env_isolation=entry.env_isolation,
                             env=sorted(env), dropped=drop, session=session_id, grant=grant,
                             uid=request.peer_uid, pid=request.peer_pid)
        _log.info("exec session", extra={"exec": entry.name, "net": entry.net, "session": session_id,
                                         "uid": request.peer_uid, "pid": request.peer_pid})
        # secret values: encoded here, not through `answer` (whose redactor would mask them)
        pins = None
        if entry.policed and entry.content.effective_pin_tools(entry.trust.trust):
            pins = view_dict(await broker.pins.view(entry.grant_name))
        data = {"name": entry.name, "env": env, "drop": drop, "env_isolation": entry.env_isolation,
                "net": entry.net, "proxy": proxy, "policy": entry.policy_dict() if entry.policed else None,
                "pins": pins}
        return Response(200, json.dumps(data, separators=(",", ":")).encode())

    async def events(self, request: Request) -> Response:
        """What the entry's stdio relay decided: audit lines and metrics (see `stdio_events`)."""
        from ..core.http import parse_json_body

        entry = exec_entry(self.broker.config, request.name)
        if request.grant is not None and entry.grant_name not in request.grant.servers:
            raise Forbidden(f"exec entry {entry.name!r} is not in this grant")
        events = checked_events(parse_json_body(request))
        grant = request.grant.id if request.grant is not None else None
        write_events(self.audit, self.metrics, entry.name, events,
                     {"grant": grant, "uid": request.peer_uid, "pid": request.peer_pid})
        return Response(200, b'{"written":' + str(len(events)).encode() + b"}")

    async def pins(self, request: Request) -> Response:
        """What the entry's stdio relay pinned, saw changed or saw back to its pin (see `stdio_pins`)."""
        from ..core.http import parse_json_body

        entry = exec_entry(self.broker.config, request.name)
        if request.grant is not None and entry.grant_name not in request.grant.servers:
            raise Forbidden(f"exec entry {entry.name!r} is not in this grant")
        if not (entry.policed and entry.content.effective_pin_tools(entry.trust.trust)):
            raise InvalidRequest("this exec entry does not pin its tools")
        pin, changed, cleared = checked_pins(parse_json_body(request))
        await self.broker.pins.record(entry.grant_name, pin, changed, cleared)
        if changed:
            self.audit().write("tools_changed", exec=entry.name, tools=sorted(changed),
                               uid=request.peer_uid, pid=request.peer_pid)
        return Response(200, b'{"recorded":' + str(len(pin) + len(changed) + len(cleared)).encode() + b"}")
