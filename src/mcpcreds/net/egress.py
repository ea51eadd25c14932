"""Egress policy for the sidecar's own outbound calls (token endpoint, discovery, metadata).

Pure core: `EgressPolicy.check_host` (which names may be called) and `check_address` (which
resolved addresses may be connected to). The thin shell, `egress_http.EgressTransport`, is an
httpx transport that enforces it: this module imports no httpx, so the config parser and the exec
proxy use the policy without it.

Modes (`net` of a service):

- `inherit`: the sidecar default: any host but `deny_hosts`, no audit.
- `restricted`: only `allow_hosts` (minus `deny_hosts`).
- `broad_audited`: any host but `deny_hosts`; every request is reported to `on_connect`.
- `off`: no outbound call at all.

In every mode the resolved address must be public: private, link-local, site-local,
cloud-metadata, CGNAT, loopback, unspecified, multicast, documentation, benchmarking, IPv6 outside
2000::/3 and other non-global addresses are refused, unless the host is a loopback name or
literal and `dev_loopback` is set, or `allow_private` lists the address (an IP or CIDR) or the
host (a host pattern; a metadata address needs its IP or CIDR).
An IPv6 address carrying an IPv4 one (mapped, NAT64, 6to4, Teredo, ...) is judged by the IPv4.

Host spellings are canonical before any comparison (`167772165` and `0xa.0.0.5` are `10.0.0.5`),
and an address in `deny_hosts` is also compared with every resolved address.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from ..errors import Forbidden

NET_MODES: Final = ("inherit", "restricted", "broad_audited", "off")
DEFAULT_NET: Final = "inherit"
CHECK_CACHE: Final = 1024  # hosts and (host, address) pairs a transport remembers as allowed

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]
OnConnect = Callable[[str, str, int], None]

# Instance-metadata and host-agent endpoints of the big clouds. Some are public addresses
# (Azure's wireserver), so they are listed rather than caught by a range.
METADATA_ADDRESSES: Final = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OCI, DigitalOcean, OpenStack
    "169.254.170.2",    # AWS ECS task credentials
    "169.254.170.23",   # AWS EKS pod identity
    "fd00:ec2::254",    # AWS IMDS over IPv6
    "fd00:ec2::23",     # AWS EKS pod identity over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "168.63.129.16",    # Azure wireserver
))

_RANGES: Final[tuple[tuple[IPNetwork, str], ...]] = tuple(
    (ipaddress.ip_network(net), label) for net, label in (
        ("0.0.0.0/8", "unspecified"),
        ("::/128", "unspecified"),
        ("127.0.0.0/8", "loopback"),
        ("::1/128", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("fe80::/10", "link-local"),
        ("100.64.0.0/10", "CGNAT"),
        ("10.0.0.0/8", "private"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("fc00::/7", "private"),
        ("224.0.0.0/4", "multicast"),
        ("ff00::/8", "multicast"),
        ("::/96", "reserved"),  # IPv4-compatible IPv6 (deprecated)
        ("64:ff9b:1::/48", "reserved"),  # local-use NAT64: not globally reachable (RFC 8215)
        ("fec0::/10", "site-local"),  # deprecated (RFC 3879), still routed inside some networks
        # not globally reachable (IANA special-purpose registries), listed rather than left to
        # `ipaddress.is_global`, whose lists differ between Python versions and lag the registry
        ("192.0.0.0/24", "reserved"),  # IETF protocol assignments (DS-Lite, NAT64 discovery, ...)
        ("192.0.2.0/24", "reserved"),  # documentation
        ("192.88.99.0/24", "reserved"),  # 6to4 relay anycast (deprecated, RFC 7526)
        ("198.18.0.0/15", "reserved"),  # benchmarking
        ("198.51.100.0/24", "reserved"),  # documentation
        ("203.0.113.0/24", "reserved"),  # documentation
        ("240.0.0.0/4", "reserved"),  # reserved, and the limited broadcast address
        ("2001:2::/48", "reserved"),  # benchmarking
        ("2001:10::/28", "reserved"),  # ORCHID (deprecated)
        ("2001:db8::/32", "reserved"),  # documentation
        ("3fff::/20", "reserved"),  # documentation (RFC 9637)
    )
)
# Global unicast IPv6 is 2000::/3 only; what is left outside it (::/8 beyond the cases above,
# 100::/64 discard-only, 5f00::/16 SRv6 segment IDs, unassigned space) is reached only inside
# some network
_GLOBAL_UNICAST: Final = ipaddress.ip_network("2000::/3")
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL: Final = ipaddress.ip_network("64:ff9b:1::/48")
_SIIT: Final = ipaddress.ip_network("::ffff:0:0:0/96")  # IPv4-translated (RFC 2765)
_COMPAT: Final = ipaddress.ip_network("::/96")  # IPv4-compatible (deprecated)


# ---------------------------------------------------------------------------- host names


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets, an IP address in its canonical form.

    A host that ends in a number is an IPv4 address, read as the resolver (`inet_aton`) and the
    WHATWG URL parser read it: `167772165`, `10.0.5`, `0xa.0.0.5` and `012.0.0.5` are all
    `10.0.0.5`. ValueError if it is not a valid one (`1.2.3.256`, `a.1`).
    """
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        ip = ip_literal(host)
        return host if ip is None else str(ip)
    ipv4 = _numeric_ipv4(host)
    return host if ipv4 is None else str(ipv4)


def _numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host ending in a number spells (1 to 4 decimal, 0x-hex or 0-octal
    parts, the last filling the remaining bytes), None for a host name; ValueError if invalid."""
    parts = host.split(".")
    if not _is_number(parts[-1]):
        return None
    if len(parts) > 4:
        raise ValueError("invalid IPv4 address: more than 4 parts")
    numbers = []
    for part in parts:
        try:
            numbers.append(_number(part))
        except ValueError:
            raise ValueError("invalid IPv4 address: a part is not a number") from None
    *first, last = numbers
    if any(n > 255 for n in first) or last >= 256 ** (5 - len(numbers)):
        raise ValueError("invalid IPv4 address: a part is out of range")
    value = last
    for i, n in enumerate(first):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def _is_number(part: str) -> bool:
    if part[:2] == "0x":
        return all(ch in "0123456789abcdef" for ch in part[2:])
    return part.isascii() and part.isdigit()


def _number(part: str) -> int:
    """One part: 0x-hex, 0-octal or decimal; ValueError otherwise (`08` is no octal number)."""
    if not _is_number(part):
        raise ValueError(part)
    if part[:2] == "0x":
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part[0] == "0":
        return int(part[1:], 8)
    return int(part)


def parse_host_pattern(pattern: str) -> str:
    """Validate and normalise one `allow_hosts`/`deny_hosts` entry; ValueError says why not.

    `*.example.com` matches `example.com` and every subdomain; a plain name matches exactly.
    An IP matches that address however a URL spells it, and every name that resolves to it
    (see `check_address`). Names are ASCII (write an internationalised name in its xn-- form).
    """
    if not isinstance(pattern, str):
        raise ValueError(f"expected a host name string, got {type(pattern).__name__}")
    if "://" in pattern or "/" in pattern:
        raise ValueError("expected a host name, not a URL")
    host = normalize_host(pattern)
    if not host.isascii():
        raise ValueError("host name must be ASCII (use the xn-- form)")
    if (ip := ip_literal(host)) is not None:
        return str(ip)
    rest = host[2:] if host.startswith("*.") else host
    labels = rest.split(".")
    if not rest or "*" in rest or any(not _label_ok(label) for label in labels):
        raise ValueError("invalid host pattern: expected 'name.example' or '*.example.com'")
    return host


def parse_private_entry(entry: str) -> IPNetwork | str:
    """One `allow_private` entry: an address or CIDR, else a host pattern; ValueError says why."""
    try:
        return ipaddress.ip_network(normalize_host(entry), strict=False)
    except ValueError:
        return parse_host_pattern(entry)


def _label_ok(label: str) -> bool:
    return 0 < len(label) <= 63 and all(ch.isalnum() or ch in "-_" for ch in label)


def host_matches(pattern: str, host: str) -> bool:
    """Whether normalised `pattern` (see `parse_host_pattern`) matches `host`.

    An IP pattern matches an IP host that reaches the same address (`::ffff:10.0.0.5` is
    `10.0.0.5`). ValueError if `host` is an invalid numeric host (see `normalize_host`).
    """
    host = normalize_host(host)
    if (ip := ip_literal(host)) is not None:
        return (wanted := ip_literal(pattern)) is not None and bool(_reached(wanted) & _reached(ip))
    if pattern.startswith("*."):
        base = pattern[2:]
        return host == base or host.endswith("." + base)
    return host == pattern


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback IP literal (a name that merely resolves to 127.0.0.1 is not)."""
    try:
        host = normalize_host(host)
    except ValueError:
        return False
    if host == "localhost":
        return True
    ip = ip_literal(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and ip.is_loopback


def is_dev_loopback_url(url: str) -> bool:
    """An `http://` URL whose host is loopback: the case where `dev_loopback` should be set."""
    if url[:1] > " " and url.isprintable() and url[:7].lower() != "http://":
        return False  # what urlsplit would find (it strips leading spaces, tabs and line breaks)
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme == "http" and host is not None and is_loopback_host(host)


def ip_literal(host: str) -> IPAddress | None:
    """The address `host` spells as an IP literal, else None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


# ---------------------------------------------------------------------------- addresses


def _unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries and reaches: IPv4-mapped, IPv4-compatible,
    SIIT-translated, NAT64 (64:ff9b::/96), 6to4 (2002::/16) or Teredo (its client); else `ip`."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64 or ip in _SIIT or (ip in _COMPAT and int(ip) > 1):  # ::1 is loopback
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
    return ip


def _nat64_local(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a local-use NAT64 address (64:ff9b:1::/48, RFC 8215) may carry. The
    operator picks the prefix length, so: every RFC 6052 layout that fits in the /48."""
    if not isinstance(ip, ipaddress.IPv6Address) or ip not in _NAT64_LOCAL:
        return []
    value = int(ip)
    without_u = (value >> 64 << 56) | (value & (1 << 56) - 1)  # bits 64-71 (the "u" octet) dropped
    # prefixes /96 (the last 32 bits, the usual one), then /64, /56 and /48 (around the u octet)
    return [ipaddress.IPv4Address(without_u >> shift & 0xFFFFFFFF) for shift in (0, 24, 32, 40)]


def _reached(ip: IPAddress) -> set[IPAddress]:
    """`ip` and every IPv4 address it may reach through a translation or a tunnel."""
    return {ip, _unwrap(ip), *_nat64_local(ip)}


def address_problem(ip: IPAddress | str) -> str | None:
    """What kind of non-public address `ip` is ("private", "metadata", ...), or None if public."""
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id:
        addr = ipaddress.IPv6Address(str(addr).split("%", 1)[0])
    # every local-use NAT64 address is refused; its candidates only name the problem, "metadata"
    # first (no host pattern in allow_private may open it), 0.0.0.0/8 being mere zero padding
    problems = [p for p in map(_problem, _nat64_local(addr)) if p not in (None, "unspecified")]
    if problems:
        return "metadata" if "metadata" in problems else problems[0]
    return _problem(_unwrap(addr))


def _problem(addr: IPAddress) -> str | None:
    if addr in METADATA_ADDRESSES:
        return "metadata"
    for net, label in _RANGES:
        if addr.version == net.version and addr in net:
            return label
    if isinstance(addr, ipaddress.IPv6Address) and addr not in _GLOBAL_UNICAST:
        return "reserved"
    if not addr.is_global:
        return "reserved"
    return None


# ---------------------------------------------------------------------------- the policy


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Where one service's outbound calls may go. Validates and normalises on construction."""

    mode: str = DEFAULT_NET
    allow_hosts: tuple[str, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    allow_private: tuple[str, ...] = ()
    dev_loopback: bool = False
    _private_nets: tuple[IPNetwork, ...] = field(default=(), init=False, repr=False, compare=False)
    _private_hosts: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in NET_MODES:
            raise ValueError(f"unknown net mode: expected one of {', '.join(NET_MODES)}")
        object.__setattr__(self, "allow_hosts", tuple(parse_host_pattern(p) for p in self.allow_hosts))
        object.__setattr__(self, "deny_hosts", tuple(parse_host_pattern(p) for p in self.deny_hosts))
        entries = [parse_private_entry(entry) for entry in self.allow_private]
        nets = [e for e in entries if not isinstance(e, str)]
        hosts = [e for e in entries if isinstance(e, str)]
        object.__setattr__(self, "allow_private", tuple(self.allow_private))
        object.__setattr__(self, "_private_nets", tuple(nets))
        object.__setattr__(self, "_private_hosts", tuple(hosts))

    @property
    def audited(self) -> bool:
        return self.mode == "broad_audited"

    def check_host(self, host: str) -> str:
        """Raise Forbidden unless this policy lets the sidecar call `host` (before any DNS);
        return the host in its canonical form (see `normalize_host`)."""
        name = _checked_name(host)
        if self.mode == "off":
            raise Forbidden(f"egress to {name} refused: net = \"off\" allows no outbound call", host=name)
        for pattern in self.deny_hosts:
            if host_matches(pattern, name):
                raise Forbidden(f"egress to {name} refused: a deny_hosts entry matches it", host=name)
        if self.mode == "restricted" and not any(host_matches(p, name) for p in self.allow_hosts):
            raise Forbidden(
                f"egress to {name} refused: net = \"restricted\" and it is not in allow_hosts", host=name)
        return name

    def check_address(self, host: str, ip: IPAddress | str) -> None:
        check_address(self, host, ip)


def _checked_name(host: str) -> str:
    try:
        return normalize_host(host)
    except ValueError as exc:
        raise Forbidden(f"egress refused: {exc}", host=host) from None


def check_address(policy: EgressPolicy, host: str, ip: IPAddress | str) -> None:
    """Raise Forbidden unless the sidecar may connect to `ip`, an address `host` resolved to."""
    name = _checked_name(host)
    if policy.mode == "off":
        raise Forbidden(f"egress to {name} refused: net = \"off\" allows no outbound call", host=name)
    addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    for pattern in policy.deny_hosts:
        if host_matches(pattern, str(addr)):  # an address in deny_hosts, whatever name reaches it
            raise Forbidden(f"egress to {name} refused: it resolves to {addr}, which a deny_hosts entry "
                            "matches", host=name, address=str(addr))
    problem = address_problem(addr)
    if problem is None:
        return
    if problem == "loopback" and policy.dev_loopback and is_loopback_host(name):
        return
    plain = _unwrap(addr)
    if any(a.version == net.version and a in net for net in policy._private_nets for a in (addr, plain)):
        return
    if problem != "metadata" and any(host_matches(p, name) for p in policy._private_hosts):
        return
    hint = ("dev_loopback is only for a loopback URL" if problem == "loopback"
            else "list it in allow_private to allow it")
    raise Forbidden(f"egress to {name} refused: it resolves to {addr}, a {problem} address ({hint})",
                    host=name, address=str(addr))


# ---------------------------------------------------------------------------- for the I/O shell


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context for every pool: loading the CA bundle takes ~0.3 s, and it
    would otherwise be paid on the event loop by the first login of each token endpoint."""
    return ssl.create_default_context()


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host`, in its order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
