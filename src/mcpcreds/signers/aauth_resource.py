"""An AAuth resource's metadata (`/.well-known/aauth-resource.json` at its origin,
draft-hardt-oauth-aauth-protocol "Resource Metadata"): the `additional_signature_components` it
asks every signature to cover (for example `content-digest`, RFC 9530, for body integrity).

- Fetched through the server's own egress client (its egress policy, the audit of connections),
  without following redirects, the answer bounded (`MAX_METADATA` bytes) and uncompressed
  (`Accept-Encoding: identity`; a compressed answer is refused, never decoded), one fetch at a time per
  origin (callers wait for it), cached per origin: `FRESH` seconds when it was read, `RETRY`
  seconds when it failed or there is none (then nothing beyond the draft's base components is
  asked). At most `MAX_ORIGINS` origins are held.
- Only components this signer can produce are taken: header field names (lower-cased tokens)
  and the derived `@method`, `@authority`, `@path`, `@query`, `@target-uri`, `@scheme`,
  `@request-target`. Others (parameters, `@query-param`, ...) are left out and logged once per
  origin, never quoted; the resource's refusal then says what it missed.
- A refusal that says it (`Signature-Error: error=invalid_input, required_input=(...)`, the
  Signature-Key draft) teaches the origin's entry those components too (`learn`), so the gateway's
  one retry covers them; bounded like the document.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import httpx

from ..core.logs import get_logger
from ..net.egress_http import UnreadableAnswer, read_answer

if TYPE_CHECKING:
    from ..config.model import Target

_log = get_logger("aauth")
RESOURCE_DWK: Final = "aauth-resource.json"
MAX_METADATA: Final = 65536
MAX_COMPONENTS: Final = 32
MAX_ORIGINS: Final = 256
FRESH: Final = 3600.0
RETRY: Final = 300.0
DERIVED: Final = frozenset({"@method", "@authority", "@path", "@query", "@target-uri", "@scheme",
                            "@request-target"})
_FIELD: Final = re.compile(r"[a-z0-9!#$%&'*+\-.^_`|~]{1,64}\Z")
_REQUIRED_INPUT: Final = re.compile(r"required_input\s*=\s*\(([^()]{0,2048})\)")
_SF_STRING: Final = re.compile(r'"([^"\\]{0,64})"')
_NEVER: Final = frozenset({"signature", "signature-input"})
_BASE: Final = frozenset({"@method", "@authority", "@path", "signature-key"})  # always covered


def origin_of(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


def parse_components(data: Any) -> tuple[tuple[str, ...], int]:
    """The components a metadata document asks for that this signer produces (in order, no
    repeats), and how many it asks for that it does not. Anything malformed asks for nothing."""
    if not isinstance(data, dict):
        return (), 0
    raw = data.get("additional_signature_components")
    if not isinstance(raw, list):
        return (), 0
    taken: list[str] = []
    skipped = 0
    for item in raw[:MAX_COMPONENTS]:
        name = item.strip().lower() if isinstance(item, str) else ""
        if (name in DERIVED or (_FIELD.match(name) and name not in _NEVER)) and name not in taken:
            taken.append(name)
        elif name not in taken:
            skipped += 1
    return tuple(taken), skipped + max(0, len(raw) - MAX_COMPONENTS)


def required_input(headers: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The components a `Signature-Error: error=invalid_input` names in `required_input` beyond
    the base ones (those this signer produces), else ()."""
    for name, value in headers:
        if name.lower() == "signature-error" and len(value) <= 4096 and "invalid_input" in value:
            found = _REQUIRED_INPUT.search(value)
            if found:
                listed = _SF_STRING.findall(found.group(1))
                named, _ = parse_components({"additional_signature_components": listed})
                return tuple(c for c in named if c not in _BASE)
    return ()


class _Refused(ValueError):
    """An answer not read (its message, our own words, says why)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    components: tuple[str, ...]
    until: float


class ResourceMetadata:
    """The components each signed server's resource asks for, cached per origin."""

    def __init__(self, clock: Callable[[], float],
                 http_for: Callable[[Target], httpx.AsyncClient] | None, timeout: float = 10.0) -> None:
        self.clock = clock
        self.http_for = http_for  # None: no metadata is fetched (the base components only)
        self.timeout = timeout
        self._cache: dict[str, _Entry] = {}
        self._pending: dict[str, asyncio.Task[tuple[str, ...]]] = {}
        self.fetches = 0

    async def components(self, target: Target) -> tuple[str, ...]:
        if self.http_for is None:
            return ()
        origin = origin_of(target.endpoint)
        held = self._cache.get(origin)
        if held is not None and self.clock() < held.until:
            return held.components
        task = self._pending.get(origin)
        if task is None:
            task = self._pending[origin] = asyncio.ensure_future(self._fetch(target, origin))
            task.add_done_callback(lambda _: self._pending.pop(origin, None))
        return await asyncio.shield(task)

    def learn(self, target: Target, components: Iterable[str]) -> bool:
        """Components a refusal named, added to the origin's entry; True when any was new."""
        if self.http_for is None:
            return False
        origin = origin_of(target.endpoint)
        held = self._cache.get(origin)
        known = held.components if held is not None else ()
        added = tuple(c for c in components if c not in known and c not in _BASE)
        if not added:
            return False
        merged = (*known, *added)[:MAX_COMPONENTS]
        until = held.until if held is not None else self.clock() + FRESH
        if held is None and len(self._cache) >= MAX_ORIGINS:
            with contextlib.suppress(StopIteration):
                del self._cache[next(iter(self._cache))]
        self._cache[origin] = _Entry(merged, until)
        _log.info("aauth: the resource asked for more signature components; covered from now on",
                  extra={"server": target.name, "added": list(added)})
        return True

    def held(self) -> dict[str, list[str]]:
        """Per origin, the components asked for (for status)."""
        return {origin: list(entry.components) for origin, entry in self._cache.items() if entry.components}

    async def _fetch(self, target: Target, origin: str) -> tuple[str, ...]:
        assert self.http_for is not None
        self.fetches += 1
        data: Any = None
        why = ""
        try:
            client = self.http_for(target)
            url = f"{origin}/.well-known/{RESOURCE_DWK}"
            async with client.stream("GET", url, timeout=self.timeout, follow_redirects=False,
                                     headers={"accept": "application/json", "accept-encoding": "identity"}
                                     ) as answer:
                if answer.status_code == 200:
                    try:
                        data = json.loads(await read_answer(answer, MAX_METADATA))
                    except UnreadableAnswer as exc:
                        raise _Refused("compressed" if exc.compressed else "larger than 64 KiB") from None
                elif answer.status_code != 404:
                    why = f"HTTP {answer.status_code}"
        except _Refused as exc:
            why = str(exc)
        except (httpx.HTTPError, ValueError, OSError) as exc:
            why = type(exc).__name__
        except Exception as exc:  # an egress refusal (McpcredsError) or another failure: no metadata
            why = type(exc).__name__
        components, skipped = parse_components(data)
        if why:
            _log.warning("aauth: the resource metadata could not be read; signing with the base components",
                         extra={"server": target.name, "reason": why})
        if skipped:
            _log.warning("aauth: the resource asks for signature components this signer does not produce",
                         extra={"server": target.name, "skipped": skipped})
        if len(self._cache) >= MAX_ORIGINS and origin not in self._cache:
            with contextlib.suppress(StopIteration):
                del self._cache[next(iter(self._cache))]
        self._cache[origin] = _Entry(components, self.clock() + (FRESH if data is not None else RETRY))
        return components
