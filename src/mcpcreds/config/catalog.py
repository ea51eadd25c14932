"""What the `[services]` catalog holds over every server (pure): the tag floor and closed egress.

- A server's endpoint is *under* a catalog entry's when both have the same scheme, host and port
  and the server's path is the entry's or extends it at a `/` (`https://crm.example.com/mcp` covers
  `.../mcp` and `.../mcp/v2`, not `.../mcpx`). Paths are compared decoded, without empty or `.`
  segments and case-insensitively: the floor errs on the side of matching.
- The tag floor: a server under one or more entries carries their tags and is held to their tool
  lists (a ceiling), whether it names one with `service` or restates a URL inline; a stand-alone
  server takes the cache key and bucket of the most specific entry over it, so restating an
  entry's URL never launders its tags nor escapes its bucket. Such a server may not bring a login
  or signing credentials of its own (held by cache key: the entry's), only static headers, nor a
  rate other than the entry's.
- Closed egress (`[sidecar] egress = "closed"`): a server under no entry is a config error, and
  the gateway refuses to send to an endpoint under none (`refuse_uncovered`), whatever made it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from ..core.policy import TrustPolicy
from ..errors import Forbidden
from ..net.egress import normalize_host
from .model import Target
from .reader import Collector, join

EGRESS_MODES: Final = ("open", "closed")
CLOSED: Final = "closed"
_PORTS: Final = {"https": 443, "http": 80}

Place = tuple[str, str, int, tuple[str, ...]]  # scheme, host, port, path segments


@functools.lru_cache(maxsize=4096)
def place(url: str) -> Place | None:
    """Where `url` points, normalised for comparison; None if it is not an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
        scheme = parts.scheme.lower()
        if not host or scheme not in _PORTS:
            return None
        host = normalize_host(host)
    except ValueError:
        return None
    segments: list[str] = []
    for segment in unquote(parts.path).split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment.lower())
    return scheme, host, port or _PORTS[scheme], tuple(segments)


def under(entry: Place, url: Place) -> bool:
    """Whether `url` is the entry's URL or extends its path at a segment boundary."""
    return entry[:3] == url[:3] and url[3][:len(entry[3])] == entry[3]


def covering(services: Mapping[str, Target], endpoint: str) -> list[Target]:
    """The catalog entries whose URL covers `endpoint`, the most specific (longest path) first."""
    at = place(endpoint)
    if at is None:
        return []
    found = [(p, t) for t in services.values() if (p := place(t.endpoint)) is not None and under(p, at)]
    return [t for p, t in sorted(found, key=lambda pt: (-len(pt[0][3]), pt[1].key))]


def ceiling(entries: Iterable[Target]) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """The tool lists of these catalog entries, as a ceiling: (allowlists a tool must each match,
    patterns that hide a tool)."""
    allow: list[tuple[str, ...]] = []
    exclude: list[str] = []
    for entry in entries:
        policy = entry.trust
        allow.extend(policy.ceiling_allow)
        if policy.tool_allowlist is not None:
            allow.append(policy.tool_allowlist)
        exclude.extend((*policy.ceiling_exclude, *policy.tool_exclude))
    return tuple(dict.fromkeys(allow)), tuple(dict.fromkeys(exclude))


def held_by(policy: TrustPolicy, entries: Iterable[Target]) -> TrustPolicy:
    """`policy` under the ceiling of these catalog entries."""
    allow, exclude = ceiling(entries)
    if not allow and not exclude:
        return policy
    return dataclasses.replace(policy, ceiling_allow=tuple(dict.fromkeys((*policy.ceiling_allow, *allow))),
                               ceiling_exclude=tuple(dict.fromkeys((*policy.ceiling_exclude, *exclude))))


def floor(c: Collector, path: str, t: Mapping[str, Any], target: Target, over: list[Target]) -> Target:
    """A server's target under the catalog entries `over` it (most specific first): their tags and
    ceiling; for a stand-alone server also the cache key and rate of the most specific one."""
    if not over:
        return target
    tags = target.tags.union(*(e.tags for e in over))
    trust = held_by(target.trust, over)
    if target.spec.service is not None:  # names its entry: key, login and rate are already the entry's
        return dataclasses.replace(target, tags=tags, trust=trust,
                                   spec=dataclasses.replace(target.spec, tags=tuple(sorted(tags))))
    entry = over[0]
    name = entry.key.partition(":")[2]
    why = (f"its endpoint is under [services.{name}]'s, so it is served under that entry's cache key "
           f"({entry.key})")
    auth = t.get("auth")
    for key in ("auth", "oauth"):  # logins and signing credentials are held by cache key
        if key in t and not (key == "auth" and isinstance(auth, Mapping) and auth.get("kind") == "static"):
            c.error(join(path, key), f"{why}, whose credentials are the entry's: name the entry (service = "
                                     f"\"{name}\") instead of restating its endpoint with credentials of its "
                                     "own")
    if "rate" in t and target.rate != entry.rate:
        c.error(join(path, "rate"), f"{why} and bucket: its rate is the entry's; remove this one")
    c.warnings.append(f"{path}: {why}: it carries that entry's tags and tool lists and takes from its bucket")
    spec = dataclasses.replace(target.spec, service=name, tags=tuple(sorted(tags)), rate=entry.spec.rate)
    return dataclasses.replace(target, key=entry.key, rate=entry.rate, tags=tags, trust=trust, spec=spec)


def closed_egress_check(c: Collector, path: str, target: Target, over: list[Target]) -> None:
    if not over:
        c.error(join(path, "endpoint"), "not under any [services] entry's endpoint, and sidecar.egress = "
                                        "\"closed\" refuses such a server: add a catalog entry for it")


def refuse_uncovered(services: Mapping[str, Target], egress: str, target: Target) -> None:
    """Raise Forbidden when egress is closed and `target`'s endpoint is under no catalog entry's."""
    if egress == CLOSED and not covering(services, target.endpoint):
        raise Forbidden(f"server {target.name!r}: its endpoint is under no [services] entry's, and "
                        "sidecar.egress is \"closed\"", server=target.name)
