"""The pins of tool definitions (rug pulls, protocol/pins.py decides), per server: tool name ->
the pinned digest and definition, and for a tool whose definition changed, the one last seen (so
`mcpcreds tools approve` shows the difference).

- Memory state: one JSON file in the sidecar's state folder (the socket's 0700 folder, as the AAuth
  key), `tool-pins.json`, read at start and rewritten whole on each change: atomically (a 0600
  temp file, fsync, rename, fsync of the folder). A file that cannot be read as pins stops the
  start (a reason naming the file): starting without the pins would pin a changed tool afresh.
- Redis state: three hashes per server, shared by every sidecar (`pin`: tool -> digest, `def`:
  tool -> pinned definition, `new`: tool -> the changed definition last seen), each value sealed
  with an HMAC bound to its hash and field (`RedisState.seal`), so one written by hand or moved is
  ignored. A first pin is set only if absent (two sidecars listing at once: the first wins), and
  an approval replaces a changed record only if it is still the one read.
- Bounded: MAX_PINNED_TOOLS per server, MAX_DEFINITION bytes per definition (the digest alone past
  it), names of 1 to MAX_TOOL_NAME printable characters; the memory state holds MAX_SERVERS
  servers and MAX_KEPT_DEFINITIONS bytes of definitions in all (digests alone past it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..core.logs import get_logger
from ..errors import ConfigError

if TYPE_CHECKING:  # the Redis state only: a sidecar on the memory state imports no redis
    from .redis_state import RedisState

MAX_PINNED_TOOLS: Final = 1024  # pins of one server
MAX_TOOL_NAME: Final = 128  # characters (the MCP spec's bound on a tool name)
MAX_DEFINITION: Final = 32 * 1024  # bytes of a definition kept to show a difference
MAX_SERVERS: Final = 1024  # servers the memory state keeps pins of
MAX_KEPT_DEFINITIONS: Final = 32 * 1024 * 1024  # bytes of definitions the memory state keeps in all
MAX_FILE: Final = 128 * 1024 * 1024
FILE_NAME: Final = "tool-pins.json"
_DIGEST: Final = re.compile(r"[0-9a-f]{64}\Z")
_log = get_logger("pins")


def valid_name(name: Any) -> bool:
    """Whether `name` can be pinned (a tool name, or a server's)."""
    return isinstance(name, str) and 0 < len(name) <= MAX_TOOL_NAME and name.isprintable()


def digest_of(text: str) -> str:
    """The digest of a canonical definition (protocol/screen.py's `tool_digest` of its tool)."""
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@dataclass(frozen=True, slots=True)
class Definition:
    """A tool's definition: its digest and its canonical JSON (None when not kept: past
    MAX_DEFINITION, or not known)."""

    digest: str
    text: str | None = None

    @classmethod
    def read(cls, raw: Any) -> Definition | None:
        """From its JSON form, checked; None if malformed. A text that is not the digest's is dropped."""
        digest = raw.get("digest") if isinstance(raw, dict) else None
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            return None
        text = raw.get("definition")
        if not isinstance(text, str) or len(text) > MAX_DEFINITION or not text.isascii() \
                or digest_of(text) != digest:
            text = None
        return cls(digest, text)

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "definition": self.text}


@dataclass(frozen=True, slots=True)
class PinView:
    """What the store holds of a server's tools (those asked for): `pins` tool -> pinned digest,
    `changed` tool -> the digest of the changed definition last recorded, `total` the server's
    pins in all (for MAX_PINNED_TOOLS)."""

    pins: Mapping[str, str] = field(default_factory=dict)
    changed: Mapping[str, str] = field(default_factory=dict)
    total: int = 0

    def is_changed(self, name: str) -> bool:
        pinned, seen = self.pins.get(name), self.changed.get(name)
        return pinned is not None and seen is not None and seen != pinned


@dataclass(frozen=True, slots=True)
class ToolPin:
    """A pinned tool as the API shows it: `new` is the changed definition last seen, if any."""

    name: str
    pinned: Definition
    new: Definition | None = None

    @property
    def state(self) -> str:
        return "changed" if self.new is not None and self.new.digest != self.pinned.digest else "pinned"


class PinStore(Protocol):
    async def lookup(self, server: str, names: Iterable[str]) -> PinView:
        """The pins and changed digests of these tools of `server` (the relay, before it decides)."""
        ...

    async def view(self, server: str) -> PinView:
        """Every pin and changed digest of `server` (before a listing's names are known)."""
        ...

    async def record(self, server: str, pin: Mapping[str, Definition], changed: Mapping[str, Definition],
                     cleared: Sequence[str] = ()) -> None:
        """Pin first definitions (only where none is), record changed ones (the last seen), drop the
        changed records of `cleared` tools."""
        ...

    async def tools(self, server: str) -> list[ToolPin]:
        """Every pinned tool of `server`, by name."""
        ...

    async def approve(self, server: str, names: Sequence[str] | None,
                      expect: Mapping[str, str] | None = None) -> list[str]:
        """Make the changed definitions of `names` (None: every changed tool) the pins, each only if
        its changed digest is `expect`'s (when given). Returns the names approved."""
        ...

    async def aclose(self) -> None: ...


def _bounded(pin: Mapping[str, Definition], changed: Mapping[str, Definition],
             cleared: Sequence[str]) -> tuple[dict[str, Definition], dict[str, Definition], list[str]]:
    def ok(d: Definition) -> Definition:
        return d if d.text is None or len(d.text) <= MAX_DEFINITION else Definition(d.digest)

    return ({n: ok(d) for n, d in pin.items() if valid_name(n) and _DIGEST.match(d.digest)},
            {n: ok(d) for n, d in changed.items() if valid_name(n) and _DIGEST.match(d.digest)},
            [n for n in cleared if valid_name(n)])


# ------------------------------------------------------------------------------ memory state

@dataclass(slots=True)
class _Entry:
    pinned: Definition
    new: Definition | None = None


class MemoryPins:
    """Pins in this sidecar, persisted to `path` (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._servers: dict[str, dict[str, _Entry]] = {}
        self._kept = 0  # bytes of definition text held
        self._lock = asyncio.Lock()
        self._load()

    def _refuse(self, why: str) -> ConfigError:
        return ConfigError([f"{self.path}: {why}; move it away to pin every tool afresh (each will be "
                            "pinned at its next listing)"])

    def _load(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._refuse(f"cannot read the tool pins ({exc.strerror})") from None
        try:
            info = os.fstat(fd)
            if info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise self._refuse("the tool pins file must be the sidecar's own and mode 0600")
            if info.st_size > MAX_FILE:
                raise self._refuse(f"the tool pins file is larger than {MAX_FILE} bytes")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
        try:
            data = json.loads(b"".join(chunks))
        except ValueError:
            raise self._refuse("the tool pins file is not JSON") from None
        servers = data.get("servers") if isinstance(data, dict) and data.get("version") == 1 else None
        if not isinstance(servers, dict):
            raise self._refuse("not a tool pins file (version 1)")
        for server, tools in list(servers.items())[:MAX_SERVERS]:
            if not valid_name(server) or not isinstance(tools, dict):
                continue
            entries = self._servers.setdefault(server, {})
            for name, raw in list(tools.items())[:MAX_PINNED_TOOLS]:
                pinned = Definition.read(raw.get("pinned")) if isinstance(raw, dict) else None
                if not valid_name(name) or pinned is None:
                    continue
                new = Definition.read(raw.get("new")) if raw.get("new") is not None else None
                entries[name] = _Entry(self._keep(pinned), self._keep(new) if new is not None else None)

    def _keep(self, d: Definition) -> Definition:
        """`d`, with its text if the memory state's budget allows it."""
        if d.text is None:
            return d
        if self._kept + len(d.text) > MAX_KEPT_DEFINITIONS:
            return Definition(d.digest)
        self._kept += len(d.text)
        return d

    def _forget(self, d: Definition | None) -> None:
        if d is not None and d.text is not None:
            self._kept -= len(d.text)

    async def lookup(self, server: str, names: Iterable[str]) -> PinView:
        entries = self._servers.get(server, {})
        pins, changed = {}, {}
        for name in names:
            entry = entries.get(name)
            if entry is not None:
                pins[name] = entry.pinned.digest
                if entry.new is not None:
                    changed[name] = entry.new.digest
        return PinView(pins, changed, len(entries))

    async def view(self, server: str) -> PinView:
        return await self.lookup(server, list(self._servers.get(server, {})))

    async def record(self, server: str, pin: Mapping[str, Definition], changed: Mapping[str, Definition],
                     cleared: Sequence[str] = ()) -> None:
        pin, changed, cleared = _bounded(pin, changed, cleared)
        async with self._lock:
            entries = self._servers.get(server)
            if entries is None:
                if not valid_name(server) or len(self._servers) >= MAX_SERVERS:
                    _log.warning("tool pins: no room for another server's pins", extra={"server": server})
                    return
                entries = self._servers[server] = {}
            dirty = False
            for name, d in pin.items():
                if name not in entries and len(entries) < MAX_PINNED_TOOLS:
                    entries[name] = _Entry(self._keep(d))
                    dirty = True
            for name, d in changed.items():
                entry = entries.get(name)
                if entry is not None and (entry.new is None or entry.new.digest != d.digest):
                    self._forget(entry.new)
                    entry.new = self._keep(d)
                    dirty = True
            for name in cleared:
                entry = entries.get(name)
                if entry is not None and entry.new is not None:
                    self._forget(entry.new)
                    entry.new = None
                    dirty = True
            if dirty:
                await self._save()

    async def tools(self, server: str) -> list[ToolPin]:
        return [ToolPin(name, e.pinned, e.new) for name, e in sorted(self._servers.get(server, {}).items())]

    async def approve(self, server: str, names: Sequence[str] | None,
                      expect: Mapping[str, str] | None = None) -> list[str]:
        async with self._lock:
            entries = self._servers.get(server, {})
            approved = []
            for name in (sorted(entries) if names is None else dict.fromkeys(names)):
                entry = entries.get(name)
                if entry is None or entry.new is None:
                    continue
                if expect is not None and expect.get(name) != entry.new.digest:
                    continue
                self._forget(entry.pinned)
                entry.pinned, entry.new = entry.new, None
                approved.append(name)
            if approved:
                await self._save()
            return approved

    def _document(self) -> bytes:
        return json.dumps({"version": 1, "servers": {
            server: {name: {"pinned": e.pinned.to_json(), "new": e.new.to_json() if e.new else None}
                     for name, e in entries.items()}
            for server, entries in self._servers.items()}}, separators=(",", ":")).encode()

    async def _save(self) -> None:
        await asyncio.to_thread(write_atomically, self.path, self._document())

    async def aclose(self) -> None:
        """Every change was written when it was made."""


def write_atomically(path: Path, data: bytes) -> None:
    """`data` as the whole of `path`: a 0600 temp file beside it, fsync'd, renamed over it, and the
    folder (made 0700 if absent) fsync'd, so a crash leaves the old file or the new one."""
    folder = path.parent
    old_umask = os.umask(0o077)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        temp = folder / f".{path.name}.{os.urandom(6).hex()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    finally:
        os.umask(old_umask)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ------------------------------------------------------------------------------- Redis state

# First pins, only where none is and while the server has room. KEYS: pin, def. ARGV: the most
# pins, then (field, sealed digest, sealed definition or '') triples.
PIN_SCRIPT: Final = """
local n = redis.call('HLEN', KEYS[1])
local max = tonumber(ARGV[1])
for i = 2, #ARGV, 3 do
  if n >= max then break end
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    n = n + 1
    if ARGV[i + 2] ~= '' then redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
    else redis.call('HDEL', KEYS[2], ARGV[i]) end
  end
end
return n
"""

# An approval: the changed record becomes the pin, only if it is still the one read. KEYS: pin,
# def, new. ARGV: (field, the sealed changed record read, sealed digest, sealed definition or '')
# quadruples. Returns the fields approved.
APPROVE_SCRIPT: Final = """
local done = {}
for i = 1, #ARGV, 4 do
  if redis.call('HGET', KEYS[3], ARGV[i]) == ARGV[i + 1] and redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    if ARGV[i + 3] ~= '' then redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 3])
    else redis.call('HDEL', KEYS[2], ARGV[i]) end
    redis.call('HDEL', KEYS[3], ARGV[i])
    done[#done + 1] = ARGV[i]
  end
end
return done
"""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisPins:
    """Pins in the shared state (see the module doc)."""

    def __init__(self, state: RedisState) -> None:
        self.state = state
        self._pin = state.redis.register_script(PIN_SCRIPT)
        self._approve = state.redis.register_script(APPROVE_SCRIPT)

    @staticmethod
    def _keys(server: str) -> tuple[str, str, str]:
        base = "mcpcreds:{pins}:" + json.dumps(server)  # quoted: no server name reads as another's key
        return base + ":pin", base + ":def", base + ":new"

    @staticmethod
    def _bound(key: str, name: str) -> str:
        return json.dumps([key, name])

    async def _seal(self, kind: str, key: str, name: str, payload: bytes) -> bytes:
        return await self.state.seal(kind, self._bound(key, name), payload)

    async def _open(self, kind: str, key: str, name: str, sealed: Any) -> bytes | None:
        if not isinstance(sealed, bytes):
            return None
        return await self.state.unseal(kind, self._bound(key, name), sealed)

    async def _digest(self, key: str, name: str, sealed: Any) -> str | None:
        payload = await self._open("tool-pin", key, name, sealed)
        text = payload.decode("ascii", "replace") if payload is not None else None
        return text if text is not None and _DIGEST.match(text) else None

    async def _changed(self, key: str, name: str, sealed: Any) -> Definition | None:
        payload = await self._open("tool-new", key, name, sealed)
        if payload is None:
            return None
        try:
            return Definition.read(json.loads(payload))
        except ValueError:
            return None

    async def lookup(self, server: str, names: Iterable[str]) -> PinView:
        asked = [n for n in dict.fromkeys(names) if valid_name(n)][:MAX_PINNED_TOOLS]
        pin_key, _, new_key = self._keys(server)
        pipe = self.state.redis.pipeline(transaction=False)
        pipe.hlen(pin_key)
        if asked:
            pipe.hmget(pin_key, asked)
            pipe.hmget(new_key, asked)
        replies = await self.state.call("read tool pins", pipe.execute())
        total = int(replies[0])
        pins, changed = {}, {}
        if asked:
            for name, sealed_pin, sealed_new in zip(asked, replies[1], replies[2], strict=True):
                digest = await self._digest(pin_key, name, sealed_pin) if sealed_pin is not None else None
                if digest is None:
                    continue
                pins[name] = digest
                new = await self._changed(new_key, name, sealed_new) if sealed_new is not None else None
                if new is not None:
                    changed[name] = new.digest
        return PinView(pins, changed, total)

    async def record(self, server: str, pin: Mapping[str, Definition], changed: Mapping[str, Definition],
                     cleared: Sequence[str] = ()) -> None:
        pin, changed, cleared = _bounded(pin, changed, cleared)
        pin_key, def_key, new_key = self._keys(server)
        if pin:
            args: list[Any] = [MAX_PINNED_TOOLS]
            for name, d in pin.items():
                args += [name, await self._seal("tool-pin", pin_key, name, d.digest.encode()),
                         await self._seal("tool-def", def_key, name, d.text.encode()) if d.text else b""]
            await self.state.call("store tool pins", self._pin(keys=[pin_key, def_key], args=args))
        if changed or cleared:
            pipe = self.state.redis.pipeline(transaction=True)
            if changed:
                pipe.hset(new_key, mapping={
                    name: await self._seal("tool-new", new_key, name, json.dumps(d.to_json()).encode())
                    for name, d in changed.items()})
            if cleared:
                pipe.hdel(new_key, *cleared)
            await self.state.call("store tool pins", pipe.execute())

    async def _read_all(self, server: str) -> tuple[dict[str, Definition],
                                                    dict[str, tuple[Definition, bytes]]]:
        pin_key, def_key, new_key = self._keys(server)
        pipe = self.state.redis.pipeline(transaction=True)
        pipe.hgetall(pin_key)
        pipe.hgetall(def_key)
        pipe.hgetall(new_key)
        pins_raw, defs_raw, new_raw = await self.state.call("read tool pins", pipe.execute())
        pinned: dict[str, Definition] = {}
        for field_, sealed in pins_raw.items():
            name = _text(field_)
            digest = await self._digest(pin_key, name, sealed) if valid_name(name) else None
            if digest is None:
                continue
            text_raw = defs_raw.get(field_)
            payload = await self._open("tool-def", def_key, name, text_raw) if text_raw is not None else None
            text = payload.decode("ascii", "replace") if payload is not None else None
            matches = text is not None and digest_of(text) == digest
            pinned[name] = Definition(digest, text if matches else None)
        new: dict[str, tuple[Definition, bytes]] = {}
        for field_, sealed in new_raw.items():
            name = _text(field_)
            d = await self._changed(new_key, name, sealed) if name in pinned else None
            if d is not None:
                new[name] = (d, sealed)
        return pinned, new

    async def view(self, server: str) -> PinView:
        pin_key, _, new_key = self._keys(server)
        pipe = self.state.redis.pipeline(transaction=True)
        pipe.hgetall(pin_key)
        pipe.hgetall(new_key)
        pins_raw, new_raw = await self.state.call("read tool pins", pipe.execute())
        pins, changed = {}, {}
        for field_, sealed in list(pins_raw.items())[:MAX_PINNED_TOOLS]:
            name = _text(field_)
            digest = await self._digest(pin_key, name, sealed) if valid_name(name) else None
            if digest is not None:
                pins[name] = digest
        for field_, sealed in new_raw.items():
            name = _text(field_)
            new = await self._changed(new_key, name, sealed) if name in pins else None
            if new is not None:
                changed[name] = new.digest
        return PinView(pins, changed, len(pins_raw))

    async def tools(self, server: str) -> list[ToolPin]:
        pinned, new = await self._read_all(server)
        return [ToolPin(name, d, new[name][0] if name in new else None) for name, d in sorted(pinned.items())]

    async def approve(self, server: str, names: Sequence[str] | None,
                      expect: Mapping[str, str] | None = None) -> list[str]:
        _, new = await self._read_all(server)
        pin_key, def_key, new_key = self._keys(server)
        args: list[Any] = []
        for name in (sorted(new) if names is None else dict.fromkeys(names)):
            if name not in new or (expect is not None and expect.get(name) != new[name][0].digest):
                continue
            d, sealed = new[name]
            args += [name, sealed, await self._seal("tool-pin", pin_key, name, d.digest.encode()),
                     await self._seal("tool-def", def_key, name, d.text.encode()) if d.text else b""]
        if not args:
            return []
        done = await self.state.call("approve tool pins",
                                     self._approve(keys=[pin_key, def_key, new_key], args=args))
        return [_text(n) for n in done or ()]

    async def aclose(self) -> None:
        """The state is closed by its owner (the broker's login sharing)."""


def pins_path(state_folder: Path) -> Path:
    return state_folder / FILE_NAME
