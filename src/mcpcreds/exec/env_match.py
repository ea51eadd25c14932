"""Which of the caller's variables `mcpcreds exec` drops with `env_isolation = false`: those whose
value (by the SHA-256 the caller sent) is a secret the caller could be handed anyway, so the
answer tells it nothing it could not read: the `env` of the exec entries it may start (its
grant's, or all without a grant), and the header values (and the secrets they name, and the
access tokens behind them) of the servers whose credential it may read (its grant's, `expose`
not `proxy`, tools not narrowed). A secret that stays in the sidecar (`expose = "proxy"`, a
client secret, an AWS key, a server outside the grant) is never compared: the drop list would be
a membership oracle for it, one guess per variable sent."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..config.exec import EXEC_PREFIX, ExecEntry
from ..config.model import Config, Target
from ..core.templates import FileRef, SecretRef, Template
from ..credentials.sources import SecretResolver
from ..errors import McpcredsError

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..state.grants import Grant


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def readable_targets(config: Config, grant: Grant | None,
                     serves_headers: Callable[[Target], bool]) -> list[Target]:
    """The servers whose credential this caller may be handed (as `GET /v1/servers/{name}/headers`
    judges it): its grant's, or every one without a grant; not `expose = "proxy"`; not one whose
    tools the grant narrows (that credential is used through the gateway only)."""
    if grant is None:
        candidates: Iterable[Target | None] = config.targets_by_key.values()
        narrowed: set[str] = set()
    else:
        candidates = (config.target(name) for name in grant.servers if not name.startswith(EXEC_PREFIX))
        narrowed = {t.key for name in grant.tools if (t := config.target(name)) is not None}
    return [t for t in candidates if t is not None and serves_headers(t) and t.key not in narrowed]


def secret_digests(templates: Iterable[Template], resolver: SecretResolver,
                   tokens: Iterable[str]) -> set[str]:
    """SHA-256 of each template rendered, of each secret it names, and of each token (each also
    with surrounding whitespace stripped). A secret that cannot be read now is skipped. Blocking."""
    values: set[str] = set(tokens)
    refs: set[SecretRef | FileRef] = set()
    for template in templates:
        if template.is_literal:
            continue
        refs.update(template.refs)
        with contextlib.suppress(McpcredsError):
            values.add(resolver.render(template))
    for ref in refs:
        with contextlib.suppress(McpcredsError):
            values.add(resolver.lookup(ref))
    return {_digest(v) for value in values if value for v in (value, value.strip())}


def startable_entries(config: Config, grant: Grant | None) -> list[ExecEntry]:
    """The exec entries whose environment this caller may be handed (`POST /v1/exec/{name}/session`)."""
    if grant is None:
        return list(config.execs.values())
    return [e for e in config.execs.values() if e.grant_name in grant.servers]


async def readable_secret_digests(broker: Broker, entry: ExecEntry, grant: Grant | None) -> set[str]:
    """The digests the caller's variables are compared with (see the module doc); `entry` is the
    one being started (the caller's grant names it)."""
    targets = readable_targets(broker.config, grant, broker.serves_headers)
    entries = {e.name: e for e in (entry, *startable_entries(broker.config, grant))}.values()
    templates = [*(t for e in entries for t in e.env.values()),
                 *(t for target in targets for t in target.headers.values())]
    tokens = [token.access_token for key in {t.key for t in targets}
              if (token := broker.logins.peek(key)) is not None]
    return await asyncio.to_thread(secret_digests, templates, broker.resolver, tokens)
