"""What the egress proxy checks beyond an exec entry's `EgressPolicy`: the ports of its
`host:port` entries (allow_hosts, allow_private), and the sidecar's own listeners.

A `host:port` entry allows that host (or private address) on that port only; an entry without a
port, on any. The sidecar's own TCP listeners (the gateway's loopback listener) are never a
destination, whatever the entry allows: a connection from the proxy comes from the sidecar's uid,
which that listener lets in.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field

from ..errors import Forbidden
from ..net.egress import EgressPolicy, IPAddress, address_problem, host_matches

PortRule = tuple[str, int | None]  # (host pattern or allow_private entry, port; None: any port)


@dataclass(frozen=True, slots=True)
class PortRules:
    """The `host:port` restrictions of one exec entry."""

    hosts: tuple[PortRule, ...] = ()  # allow_hosts: normalised pattern, port
    private: tuple[PortRule, ...] = ()  # allow_private: the entry as written (no port), port
    _private: tuple[tuple[EgressPolicy, int | None], ...] = field(default=(), init=False, repr=False,
                                                                  compare=False)

    def __post_init__(self) -> None:
        if any(port is not None for _, port in self.private):
            rules = tuple((EgressPolicy("broad_audited", allow_private=(entry,)), port)
                          for entry, port in self.private)
            object.__setattr__(self, "_private", rules)

    def refusal(self, policy: EgressPolicy, name: str, addresses: list[str], port: int) -> str | None:
        """Why connecting to `name` (resolved to `addresses`) on `port` is refused; None if not."""
        if policy.mode == "restricted" and any(p is not None for _, p in self.hosts):
            ports = {p for pattern, p in self.hosts if host_matches(pattern, name)}
            if None not in ports and port not in ports:
                return "refused: not in allow_hosts on this port"
        if self._private:
            for address in addresses:
                if address_problem(address) is None:
                    continue
                ports = {p for rule, p in self._private if _admits(rule, name, address)}
                if None not in ports and port not in ports:
                    return "refused: a private address allow_private does not open on this port"
        return None


def _admits(rule: EgressPolicy, name: str, address: str) -> bool:
    try:
        rule.check_address(name, address)
    except Forbidden:
        return False
    return True


def _plain(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _is_local(ip: IPAddress) -> bool:
    """An address of this host: loopback, unspecified (which reaches loopback), or one it can bind."""
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if isinstance(ip, ipaddress.IPv6Address) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(ip), 0))
        except OSError:
            return False
    return True


def own_listeners() -> set[tuple[IPAddress, int]]:
    """(address, port) of every TCP socket this process listens on, from its descriptors."""
    found: set[tuple[IPAddress, int]] = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):  # closed meanwhile, or not a socket any more
            continue
        try:
            if (sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                host, port = sock.getsockname()[:2]
                found.add((_plain(ipaddress.ip_address(host.split("%", 1)[0])), port))
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor is the listener's, never closed here
    return found


def reaches_own_listener(addresses: list[str], port: int) -> bool:
    """Whether connecting to one of `addresses` on `port` may reach a listener of this process."""
    local = [ip for address in addresses if _is_local(ip := _plain(ipaddress.ip_address(address)))]
    if not local:
        return False
    for listen_ip, listen_port in own_listeners():
        if listen_port == port and any(listen_ip.is_unspecified or ip.is_unspecified or ip == listen_ip
                                       for ip in local):
            return True
    return False
