"""A lean HTTP/1.1 client for the sidecar's Unix socket (blocking sockets), and what it shares
with the asyncio twin in `uds_async` (which parses with httptools).

httpx costs about 1.7 ms a request here; this costs a tenth of that, and the client's calls are
on every upstream request's path. Kept connections are reused; a connection that fails before
any answer byte is reported retryable. Each new connection is checked before its first byte
(`socket_check`): the folder, then the peer's uid.

No asyncio here: `mcpcreds token|headers|acquire|status` go through `SyncUdsHttp` only, and
importing asyncio would cost each of them tens of ms (tests/test_cli_imports.py). Nor httptools:
it imports `typing`, ~3 ms for a command that reads one small answer, which `Answer` reads.
"""

from __future__ import annotations

from _json import make_scanner  # json.loads' own C scanner: `json` imports `re` (~3 ms) besides
from _socket import AF_UNIX, MSG_PEEK, SOCK_STREAM, socket  # `socket`'s base class: its module costs ~1 ms
from _thread import allocate_lock  # threading.Lock itself, without importing threading

from ..core.socket_check import check_folder, check_peer

TYPE_CHECKING = False  # not `typing`'s: importing typing costs each CLI command ~2 ms
if TYPE_CHECKING:
    from typing import Any, Final

MAX_RESPONSE: Final = 1024 * 1024
MAX_HEAD: Final = 64 * 1024
MAX_INTERIM: Final = 8  # 1xx answers before the final one (a sidecar sends none)
_NO_BODY: Final = frozenset({204, 304})
_SP: Final = 0x20  # a space as an integer: `in` finds it in bytes without making and dropping a TypeError


class Retryable(ConnectionError):
    """The request may not have reached the sidecar (refused, missing socket, stale connection)."""


class Answer:
    """One HTTP/1.1 answer, read from its bytes as they come: the status line, the head (at most
    MAX_HEAD bytes), then a Content-Length or chunked body (at most MAX_RESPONSE bytes). Anything
    else is a ValueError; an answer framed by the end of the connection never becomes `done`."""

    def __init__(self) -> None:
        self.buffer = b""
        self.head = True  # still reading the head
        self.chunked = False
        self.left = -1  # body bytes still due (Content-Length, or the current chunk); -1: until the end
        self.body: list[bytes] = []
        self.size = 0
        self.done = False
        self.keep_alive = False
        self.status = 0
        self.interim = 0  # 1xx answers read so far

    def feed_data(self, data: bytes) -> None:
        self.buffer += data
        while self.head:
            if not self.buffer.startswith(b"HTTP/1."[:len(self.buffer)]):
                raise ValueError("not an HTTP/1.x answer")
            end = self.buffer.find(b"\r\n\r\n")
            if end > MAX_HEAD or (end < 0 and len(self.buffer) > MAX_HEAD):
                raise ValueError("sidecar answer head too large")
            if end < 0:
                return
            self._read_head(self.buffer[:end].split(b"\r\n"))
            self.buffer = self.buffer[end + 4:]
            self.head = 100 <= self.status < 200  # an interim answer: the final one follows
            self.interim += self.head
            if self.interim > MAX_INTERIM:
                raise ValueError("too many interim answers")
        while not self.done and self._read_body():
            pass
        if self.done and self.buffer:  # bytes past the answer: this connection is not trusted again
            self.keep_alive = False

    def _read_head(self, lines: list[bytes]) -> None:
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or not (
                len(code) == 3 and code.isdigit() and rest[3:4] in (b"", b" ")):
            raise ValueError("not an HTTP/1.x status line")
        self.status = int(code)
        self.chunked, self.left = False, -1
        tokens: set[bytes] = set()
        length = None
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip() or _SP in name:
                raise ValueError("malformed header line")
            name, value = name.lower(), value.strip()
            if name == b"content-length":
                if not value.isdigit() or length is not None:
                    raise ValueError("malformed Content-Length")
                length = int(value)
            elif name == b"transfer-encoding":
                if value.lower() != b"chunked":
                    raise ValueError("unsupported Transfer-Encoding")
                self.chunked = True
            elif name == b"connection":
                tokens.update(token.strip().lower() for token in value.split(b","))
        if self.chunked and length is not None:
            raise ValueError("both Content-Length and chunked")
        self.keep_alive = b"close" not in tokens and (version == b"HTTP/1.1" or b"keep-alive" in tokens)
        if self.status in _NO_BODY:
            self.left, self.chunked = 0, False
        elif length is not None:
            self.left = length
        elif not self.chunked:
            self.keep_alive = False  # the body ends with the connection
        if self.left > MAX_RESPONSE:
            raise ValueError("sidecar answer too large")
        if self.left == 0 and not self.chunked and not 100 <= self.status < 200:
            self.done = True

    def _take(self, count: int) -> None:
        self.size += count
        if self.size > MAX_RESPONSE:
            raise ValueError("sidecar answer too large")
        self.body.append(self.buffer[:count])
        self.buffer = self.buffer[count:]

    def _read_body(self) -> bool:
        """Reads what the buffer holds of the body; True if there may be more to read now."""
        if not self.chunked:
            count = len(self.buffer) if self.left < 0 else min(self.left, len(self.buffer))
            self._take(count)
            if self.left >= 0:
                self.left -= count
                self.done = self.left == 0
            return False
        if self.left < 0:  # a chunk-size line is due
            end = self.buffer.find(b"\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    raise ValueError("malformed chunk size")
                return False
            size = self.buffer[:end].partition(b";")[0].strip()
            if not size or len(size) > 8 or size.strip(b"0123456789abcdefABCDEF"):
                raise ValueError("malformed chunk size")
            self.buffer = self.buffer[end + 2:]
            self.left = int(size, 16)
            if self.size + self.left > MAX_RESPONSE:
                raise ValueError("sidecar answer too large")
            return True
        if self.left == 0:  # the last chunk: then trailer lines, up to an empty one
            end = self.buffer.find(b"\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    raise ValueError("trailers too large")
                return False
            self.buffer = self.buffer[end + 2:]
            self.done = end == 0
            return not self.done
        if len(self.buffer) < self.left + 2:
            return False
        if self.buffer[self.left:self.left + 2] != b"\r\n":
            raise ValueError("malformed chunk")
        self._take(self.left)
        self.buffer = self.buffer[2:]
        self.left = -1
        return True


def encode(head: bytes, method: str, path: str, body: dict[str, Any] | None) -> bytes:
    payload = b""
    if body is not None:
        import json

        payload = json.dumps(body, separators=(",", ":")).encode()
    lines = f"{method} {path} HTTP/1.1\r\nHost: mcpcreds\r\n".encode() + head
    if body is not None:
        lines += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(payload)
    return lines + b"\r\n" + payload


class _Settings:
    """What `json.loads` scans with (json.JSONDecoder's defaults)."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan = make_scanner(_Settings())  # type: ignore[arg-type]  # it reads the attributes above
_JSON_SPACE: Final = " \t\n\r"


def decode_json(raw: bytes) -> Any:
    """`json.loads(raw)`, None if `raw` is empty or not JSON. A UTF-8 answer is scanned as
    json.loads scans it, without importing `json`; anything else is left to json.loads."""
    if not raw:
        return None
    try:
        text = raw.decode("utf-8")
        value, end = _scan(text, len(text) - len(text.lstrip(_JSON_SPACE)))
        if not text[end:].strip(_JSON_SPACE):
            return value
    except (ValueError, StopIteration, RecursionError):  # RecursionError: nested too deep
        pass
    import json  # another encoding (json.loads detects it), or not JSON: json.loads decides

    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _idle_and_open(sock: socket) -> bool:
    """A kept connection with nothing to read: not closed by the sidecar (its idle timeout), and
    no bytes that no request asked for, which would be read as the next request's answer."""
    sock.setblocking(False)
    try:
        sock.recv(1, MSG_PEEK)  # a byte nobody asked for, or b"": closed
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


class SyncUdsHttp:
    """The blocking twin of `UdsHttp`, for `Client`; kept connections are shared by threads."""

    def __init__(self, path: str, headers: dict[str, str], sidecar_uid: int) -> None:
        self.path = path
        self.sidecar_uid = sidecar_uid
        self._head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        self._idle: list[socket] = []
        self._lock = allocate_lock()

    def _connection(self, timeout: float) -> socket:
        with self._lock:
            while self._idle:
                sock = self._idle.pop()
                if _idle_and_open(sock):
                    sock.settimeout(timeout)
                    return sock
                sock.close()
        try:
            check_folder(self.path, self.sidecar_uid)
        except FileNotFoundError as exc:
            raise Retryable(str(exc)) from None
        sock = socket(AF_UNIX, SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
            check_peer(sock, self.path, self.sidecar_uid)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise Retryable(str(exc)) from None
        except BaseException:
            sock.close()
            raise
        return sock

    def request(self, method: str, path: str, body: dict[str, Any] | None,
                timeout: float) -> tuple[int, Any]:
        sock = self._connection(timeout)
        try:
            parsed = Answer()
            received = False
            try:
                sock.sendall(encode(self._head, method, path, body))
            except OSError as exc:  # a kept connection to a sidecar that went away
                raise Retryable(str(exc)) from None
            while not parsed.done:
                try:
                    chunk = sock.recv(65536)
                except (ConnectionResetError, BrokenPipeError) as exc:
                    if received:
                        raise
                    raise Retryable(str(exc)) from None
                if not chunk:
                    if received:
                        raise ConnectionResetError("the sidecar closed the connection mid-answer")
                    raise Retryable("the sidecar closed the connection")
                received = True
                parsed.feed_data(chunk)
        except BaseException:
            sock.close()
            raise
        if parsed.keep_alive:
            with self._lock:
                self._idle.append(sock)
        else:
            sock.close()
        return parsed.status, decode_json(b"".join(parsed.body))

    def close(self) -> None:
        with self._lock:
            for sock in self._idle:
                sock.close()
            self._idle.clear()
