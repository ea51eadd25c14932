"""HTTP/1.1 to the sidecar over its Unix socket, by hand: requests as fixed bytes, answers read
with no HTTP library, so that a bench's load costs the client as little as can be."""

from __future__ import annotations

import asyncio
import socket

from bench.harness import BenchError


class ResponseError(BenchError):
    """An answer that is not the HTTP/1.1 this module reads, or none."""


def request_bytes(method: str, target: str, body: bytes | None = None) -> bytes:
    """One HTTP/1.1 request to the sidecar, as the bytes on the wire (a JSON body if given)."""
    head = f"{method} {target} HTTP/1.1\r\nHost: mcpcreds\r\nAccept: application/json\r\n"
    if body is None:
        return (head + "\r\n").encode()
    return (head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def parse_response(buf: bytearray | bytes) -> tuple[int, int] | None:
    """`(length, status)` of the first complete response in `buf`, or None if it is incomplete."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = bytes(buf[:head_end]).lower()
    if not head.startswith(b"http/1.1 "):
        raise ResponseError(f"not an HTTP/1.1 response: {bytes(buf[:40])!r}")
    length = 0
    start = head.find(b"\r\ncontent-length:")
    if start >= 0:
        stop = head.find(b"\r\n", start + 2)
        length = int(head[start + 17 : stop if stop >= 0 else None])
    elif b"\r\ntransfer-encoding:" in head:
        raise ResponseError("chunked responses are not supported here")
    total = head_end + 4 + length
    if len(buf) < total:
        return None
    return total, int(head[9:12])


def roundtrip(conn: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send `request` on a blocking keep-alive connection; `(status, body)` of the answer."""
    conn.sendall(request)
    buf = bytearray()
    while (parsed := parse_response(buf)) is None:
        chunk = conn.recv(65536)
        if not chunk:
            raise ResponseError(f"connection closed after {len(buf)} bytes")
        buf += chunk
    total, code = parsed
    return code, bytes(buf[buf.find(b"\r\n\r\n") + 4 : total])


def roundtrip_ok(conn: socket.socket, request: bytes) -> bytes:
    """`roundtrip`, the body of a 200 answer; any other status is a BenchError."""
    code, body = roundtrip(conn, request)
    if code != 200:
        raise BenchError(f"{request.split(b' HTTP/')[0].decode()} answered {code}: {body[:200]!r}")
    return body


def http_get(path: str, target: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on a new connection to the Unix socket at `path`: `(status, body)`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        return roundtrip(conn, request_bytes("GET", target))


async def aroundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     request: bytes) -> tuple[int, bytes]:
    """`roundtrip` on an asyncio keep-alive connection."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    parsed = parse_response(head)
    if parsed is None:  # a body follows
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        return int(head[9:12]), await reader.readexactly(length)
    return parsed[1], b""
