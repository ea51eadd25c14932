"""Who is at the other end of a loopback TCP connection: the kernel's socket table.

A TCP peer has no SO_PEERCRED; on one host, though, both ends of a loopback connection are in
the table of the network namespace (`/proc/net/tcp` for IPv4, `/proc/net/tcp6` for IPv6 and
IPv4-mapped sockets), each line with the uid that created the socket. The peer's socket is the
line whose local address is the connection's remote address and whose remote address is ours.

The parsing is pure (canned text in, entries out); `lookup_uid` is the only I/O.

The table's format (net/ipv4/tcp_ipv4.c, net/ipv6/tcp_ipv6.c):

    sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
     0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 12345 ...

An address is the kernel's in-memory 32-bit words (one for IPv4, four for IPv6), each printed
as a host-order integer in hex: on a little-endian machine 127.0.0.1 is `0100007F`. A port is
printed in host order (`1F90` is 8080).
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[IPAddress, int]
ByteOrder = Literal["little", "big"]

TCP_ESTABLISHED: Final = 0x01
TABLES: Final = ("/proc/net/tcp", "/proc/net/tcp6")
MAX_TABLE_BYTES: Final = 64 * 1024 * 1024  # ~430,000 sockets: past that, refuse rather than read on
_ADDRESS: Final = re.compile(r"(?P<addr>[0-9A-Fa-f]{8}|[0-9A-Fa-f]{32}):(?P<port>[0-9A-Fa-f]{4})\Z")
_HEX: Final = re.compile(r"[0-9A-Fa-f]{2}\Z")
_DECIMAL: Final = re.compile(r"[0-9]{1,10}\Z")


@dataclass(frozen=True, slots=True)
class SocketEntry:
    local: Endpoint
    remote: Endpoint
    state: int
    uid: int


def parse_endpoint(text: str, byteorder: ByteOrder = sys.byteorder) -> Endpoint:
    """`0100007F:1F90` -> (127.0.0.1, 8080) on a little-endian host. An IPv4-mapped IPv6 address
    (an AF_INET6 socket connected to an IPv4 one) is returned as the IPv4 address."""
    match = _ADDRESS.match(text)
    if match is None:
        raise ValueError("not a /proc/net/tcp address")
    hexaddr = match["addr"]
    raw = b"".join(int(hexaddr[i:i + 8], 16).to_bytes(4, byteorder) for i in range(0, len(hexaddr), 8))
    address: IPAddress = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address, int(match["port"], 16)


def parse_line(line: str, byteorder: ByteOrder = sys.byteorder) -> SocketEntry | None:
    """One line of the table, or None for the header or a line of another shape."""
    fields = line.split()
    if len(fields) < 8 or not fields[0].endswith(":") or not _HEX.match(fields[3]) \
            or not _DECIMAL.match(fields[7]):
        return None
    try:
        local = parse_endpoint(fields[1], byteorder)
        remote = parse_endpoint(fields[2], byteorder)
    except ValueError:
        return None
    return SocketEntry(local, remote, int(fields[3], 16), int(fields[7]))


def parse_table(text: str, byteorder: ByteOrder = sys.byteorder) -> Iterator[SocketEntry]:
    for line in text.splitlines():
        entry = parse_line(line, byteorder)
        if entry is not None:
            yield entry


def find_peer_uid(entries: Iterable[SocketEntry], peer: Endpoint, ours: Endpoint) -> int | None:
    """The uid of the established socket whose local end is `peer` and remote end `ours`; None
    if there is none (gone, or closing: a socket in TIME_WAIT shows uid 0) or the table is
    ambiguous (two uids for one connection)."""
    peer, ours = _plain(peer), _plain(ours)
    uids = {e.uid for e in entries if e.state == TCP_ESTABLISHED and e.local == peer and e.remote == ours}
    return uids.pop() if len(uids) == 1 else None


def endpoint(sockaddr: tuple[object, ...]) -> Endpoint:
    """An asyncio `peername`/`sockname` (`(host, port)` or `(host, port, flow, scope)`)."""
    host, port = sockaddr[0], sockaddr[1]
    if not isinstance(host, str) or not isinstance(port, int):
        raise ValueError("not an IP socket address")
    return _plain((ipaddress.ip_address(host.partition("%")[0]), port))


def lookup_uid(peer: tuple[object, ...], ours: tuple[object, ...],
               tables: Iterable[str] = TABLES) -> int | None:
    """The uid behind the peer of a loopback TCP connection, from the kernel's tables; None when it
    cannot be found (the connection must then be refused)."""
    try:
        want_peer, want_ours = endpoint(peer), endpoint(ours)
    except ValueError:
        return None
    uids: set[int] = set()
    for path in tables:
        try:
            with open(path, "rb") as table:
                data = table.read(MAX_TABLE_BYTES + 1)
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        except OSError:
            return None
        if len(data) > MAX_TABLE_BYTES:
            return None
        found = find_peer_uid(parse_table(data.decode("ascii", "replace")), want_peer, want_ours)
        if found is not None:
            uids.add(found)
    return uids.pop() if len(uids) == 1 else None


def _plain(ep: Endpoint) -> Endpoint:
    address, port = ep
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped, port
    return address, port
