"""Who is at the other end of a loopback TCP connection: the kernel, asked for the one socket.

A TCP peer has no SO_PEERCRED; on one host, though, both ends of a loopback connection are
sockets of this network namespace, and the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`,
`inet_diag`) name the uid that created a socket. The peer's socket is the one whose local end is
the connection's remote end and whose remote end is ours. A request without `NLM_F_DUMP` is an
exact lookup in the kernel's hash tables: its cost does not grow with the sockets of the host
(thousands in TIME_WAIT are not walked), and only that socket is answered, within the send, so
that the listener asks on the event loop, a few microseconds (linux/inet_diag.h):

    nlmsghdr           len u32, type u16 (SOCK_DIAG_BY_FAMILY), flags u16, seq u32, pid u32
    inet_diag_req_v2   family u8, protocol u8, ext u8, pad u8, states u32, inet_diag_sockid
    inet_diag_sockid   sport be16, dport be16, src 16 bytes, dst 16 bytes, if u32, cookie 8 bytes
    inet_diag_msg      family u8, state u8, timer u8, retrans u8, inet_diag_sockid,
                       expires u32, rqueue u32, wqueue u32, uid u32, inode u32

The fallback, for a kernel without sock_diag (some sandboxes), reads the whole socket table,
`/proc/net/tcp` for IPv4 and `/proc/net/tcp6` for IPv6 and IPv4-mapped sockets, each line with
the uid that created the socket: linear in the sockets of the host, which is why it is only the
fallback (and never run on the event loop: tcp_listener.py). Its format
(net/ipv4/tcp_ipv4.c, net/ipv6/tcp_ipv6.c):

    sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
     0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 12345 ...

An address is the kernel's in-memory 32-bit words (one for IPv4, four for IPv6), each printed
as a host-order integer in hex: on a little-endian machine 127.0.0.1 is `0100007F`. A port is
printed in host order (`1F90` is 8080).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[IPAddress, int]
ByteOrder = Literal["little", "big"]
UidLookup = Callable[[tuple[object, ...], tuple[object, ...]], "int | None"]

TCP_ESTABLISHED: Final = 0x01
TCP_LISTEN: Final = 0x0A
NETLINK_SOCK_DIAG: Final = 4  # linux/netlink.h (not in Python's socket module)
SOCK_DIAG_BY_FAMILY: Final = 20  # linux/sock_diag.h
NLM_F_REQUEST: Final = 0x01
NLMSG_ERROR: Final = 0x02
DIAG_TIMEOUT: Final = 1.0  # the kernel answers within the send; this only bounds a broken one
_NLMSGHDR: Final = struct.Struct("=IHHII")
_REQUEST: Final = struct.Struct("=BBBBI")  # inet_diag_req_v2 before its id
_MESSAGE: Final = struct.Struct("=BBBB")  # inet_diag_msg before its id
_SOCKID: Final = struct.Struct(">HH16s16s")  # ports and addresses in network order
_SOCKID_TAIL: Final = struct.Struct("=I8s")  # interface, cookie
_AFTER_ID: Final = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_NO_COOKIE: Final = b"\xff" * 8  # INET_DIAG_NOCOOKIE: any socket with this 4-tuple
_REPLY_BYTES: Final = 8192
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


@dataclass(frozen=True, slots=True)
class DiagSocket:
    """The kernel's answer for one socket."""
    local: Endpoint
    remote: Endpoint
    state: int
    uid: int


def diag_request(local: Endpoint, remote: Endpoint, seq: int) -> bytes:
    """The netlink request for the one TCP socket whose local end is `local` and remote end
    `remote` (both of one family)."""
    family = socket.AF_INET if isinstance(local[0], ipaddress.IPv4Address) else socket.AF_INET6
    body = (_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
            + _SOCKID.pack(local[1], remote[1], local[0].packed.ljust(16, b"\0"),
                           remote[0].packed.ljust(16, b"\0"))
            + _SOCKID_TAIL.pack(0, _NO_COOKIE))
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0) + body


def parse_diag_reply(data: bytes, seq: int) -> DiagSocket | None:
    """The socket of the one answer to request `seq`; None for an error (ENOENT: no such socket)
    or an answer of another shape."""
    if len(data) < _NLMSGHDR.size:
        return None
    length, kind, _, got_seq, _ = _NLMSGHDR.unpack_from(data)
    if got_seq != seq or kind != SOCK_DIAG_BY_FAMILY or not _NLMSGHDR.size <= length <= len(data):
        return None
    offset = _NLMSGHDR.size
    if length < offset + _MESSAGE.size + _SOCKID.size + _SOCKID_TAIL.size + _AFTER_ID.size:
        return None
    family, state, _, _ = _MESSAGE.unpack_from(data, offset)
    sport, dport, src, dst = _SOCKID.unpack_from(data, offset + _MESSAGE.size)
    uid = _AFTER_ID.unpack_from(data, offset + _MESSAGE.size + _SOCKID.size + _SOCKID_TAIL.size)[3]
    size = {socket.AF_INET: 4, socket.AF_INET6: 16}.get(family)
    if size is None:
        return None
    local = _plain((ipaddress.ip_address(src[:size]), sport))
    remote = _plain((ipaddress.ip_address(dst[:size]), dport))
    return DiagSocket(local, remote, state, uid)


def diag_query(local: Endpoint, remote: Endpoint, seq: int = 1, *, wait: bool = True) -> DiagSocket | None:
    """Ask the kernel for the one TCP socket `local` -> `remote` (an exact lookup, not a walk of
    the table); None if there is none. OSError when netlink or sock_diag is not there. With `wait`
    False the answer is only taken if it is there at once (the kernel answers within the send):
    BlockingIOError if it is not."""
    local, remote = _plain(local), _plain(remote)
    if isinstance(local[0], ipaddress.IPv4Address) != isinstance(remote[0], ipaddress.IPv4Address):
        return None
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(DIAG_TIMEOUT if wait else 0.0)
        sock.sendto(diag_request(local, remote, seq), (0, 0))
        data, sender = sock.recvfrom(_REPLY_BYTES)
    return diag_answer(data, sender, seq, local, remote)


def diag_answer(data: bytes, sender: tuple[int, int], seq: int, local: Endpoint,
                remote: Endpoint) -> DiagSocket | None:
    """The socket `local` -> `remote` from the datagram `data` received from `sender`; None when it
    is not the kernel's answer to request `seq` about that very socket."""
    if sender[0] != 0:  # not the kernel
        return None
    found = parse_diag_reply(data, seq)
    if found is None or found.local != _plain(local) or found.remote != _plain(remote):
        return None
    return found


def lookup_uid(peer: tuple[object, ...], ours: tuple[object, ...], *, wait: bool = True) -> int | None:
    """The uid behind the peer of a loopback TCP connection, from the kernel's socket diagnostics;
    None when it cannot be found (the connection must then be refused). A socket closing or in
    TIME_WAIT (which shows uid 0) is not an answer. With `wait` False (on the event loop),
    BlockingIOError when the kernel's answer is not there at once: ask again off the loop."""
    try:
        found = diag_query(endpoint(peer), endpoint(ours), wait=wait)
    except BlockingIOError:
        raise
    except (OSError, ValueError):
        return None
    return found.uid if found is not None and found.state == TCP_ESTABLISHED else None


def proc_lookup_uid(peer: tuple[object, ...], ours: tuple[object, ...],
                    tables: Iterable[str] = TABLES) -> int | None:
    """`lookup_uid` from the whole socket table, for a kernel without sock_diag."""
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


def choose_lookup(listening: tuple[object, ...],
                  query: Callable[[Endpoint, Endpoint], DiagSocket | None] = diag_query) -> UidLookup | None:
    """`lookup_uid` if the kernel's socket diagnostics find our own listening socket, else None
    (the caller falls back to `proc_lookup_uid`)."""
    try:
        ours = endpoint(listening)
        anywhere: IPAddress = ipaddress.IPv4Address(0)
        if isinstance(ours[0], ipaddress.IPv6Address):
            anywhere = ipaddress.IPv6Address(0)
        found = query(ours, (anywhere, 0))
    except (OSError, ValueError):
        return None
    return lookup_uid if found is not None and found.state == TCP_LISTEN else None


def _plain(ep: Endpoint) -> Endpoint:
    address, port = ep
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped, port
    return address, port
