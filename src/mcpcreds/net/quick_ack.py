"""Acknowledging an answer as it arrives, on an outgoing TCP connection that has just sent.

Linux delays the ACK of what arrives on a connection that has just sent (it hopes to carry the ACK
on its next write), and a server that writes an answer's head and then its body in two sends may
hold the body until the head is acknowledged: uvicorn on asyncio's own loop does, and its streamed
(SSE) answers came 40-45 ms late on every kept connection, against under 1 ms on a new one.
`TCP_QUICKACK` leaves that mode until the next write and sends an ACK that is due at once: set
after a write (the exec proxy's tunnels), or when an answer's first piece came and more is to come
(the gateway's upstream connections), what arrives is acknowledged without the wait. Linux only;
elsewhere `tcp_socket` gives None and nothing is done.
"""

from __future__ import annotations

import socket
from typing import Any, Final

QUICKACK: Final = getattr(socket, "TCP_QUICKACK", None)


def tcp_socket(transport: Any) -> Any:
    """The transport's socket if it is TCP and the platform can quick-ACK on it, else None."""
    if QUICKACK is None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock


def ack_at_once(sock: Any) -> bool:
    """What arrives next on `sock` is acknowledged at once; False if the socket refused (gone)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
    except (OSError, ValueError):  # ValueError: uvloop's socket of a closed transport
        return False
    return True
