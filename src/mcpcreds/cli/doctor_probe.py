"""`doctor`'s questions to a running sidecar, by hand on its socket (no client library, so a
broken install still gets an answer): the socket's listener checked first (`check_peer`)."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

from ..core.socket_check import UntrustedSidecar, check_peer

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
MAX_ANSWER = 65536


def ask(path: Path, uid: int, timeout: float, target: str, enough: bytes = b"") -> tuple[bytes, int]:
    """A GET of `target` on the sidecar at `path` (listener checked to be `uid`'s): the answer's
    bytes (read until `enough` is in them, the end, `timeout` or MAX_ANSWER) and the sidecar's pid.
    OSError, TimeoutError or UntrustedSidecar when it cannot be asked."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        check_peer(sock, str(path), uid)
        peer_pid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: mcpcreds\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        deadline = time.monotonic() + timeout
        while not (enough and enough in answer) and time.monotonic() < deadline and len(answer) < MAX_ANSWER:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer, peer_pid
    finally:
        sock.close()


def secret_origin(path: Path, uid: int, timeout: float, name: str) -> str | None:
    """The source the sidecar resolves secret `name` from (`GET /v1/secrets/NAME/origin`: its own
    environment, not doctor's), None if it does not or cannot say."""
    try:
        answer, _ = ask(path, uid, timeout, f"/v1/secrets/{name}/origin")
    except (UntrustedSidecar, OSError, TimeoutError):
        return None
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    source = data.get("source") if isinstance(data, dict) and data.get("found") is True else None
    return source if isinstance(source, str) else None
