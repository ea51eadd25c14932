"""Egress policy: host and address checks (pure), and EgressTransport against real local listeners."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import re
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcpcreds.errors import Forbidden
from mcpcreds.net.egress import (
    EgressPolicy,
    Resolver,
    address_problem,
    check_address,
    host_matches,
    is_dev_loopback_url,
    is_loopback_host,
    parse_host_pattern,
    system_resolver,
)
from mcpcreds.net.egress_http import RESOLVED_TTL, EgressTransport, egress_client

# ---------------------------------------------------------------------------- host names


@pytest.mark.parametrize(("pattern", "host", "expected"), [
    ("*.example.com", "example.com", True),
    ("*.example.com", "api.example.com", True),
    ("*.example.com", "a.b.example.com", True),
    ("*.example.com", "badexample.com", False),
    ("*.example.com", "example.com.evil.test", False),
    ("*.example.com", "API.Example.COM", True),
    ("*.example.com", "api.example.com.", True),
    ("example.com", "example.com", True),
    ("example.com", "EXAMPLE.com.", True),
    ("example.com", "api.example.com", False),
    ("example.com", "badexample.com", False),
    ("10.0.0.5", "10.0.0.5", True),
    ("::1", "[::1]", True),
])
def test_host_matches(pattern: str, host: str, expected: bool) -> None:
    assert host_matches(parse_host_pattern(pattern), host) is expected


def test_patterns_are_normalised() -> None:
    assert parse_host_pattern("*.Example.COM.") == "*.example.com"
    assert parse_host_pattern("[::1]") == "::1"
    assert EgressPolicy("restricted", allow_hosts=("Auth.Example.com.",)).allow_hosts == ("auth.example.com",)


@pytest.mark.parametrize("bad", ["", "*", "*.", "a.*.com", "*foo.com", "https://a.example.com",
                                 "a.example.com/path", "bücher.de", "a..b", "has space.com"])
def test_bad_patterns(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_host_pattern(bad)


def test_bad_policy_values() -> None:
    with pytest.raises(ValueError, match="unknown net mode: expected one of"):
        EgressPolicy("open")
    with pytest.raises(ValueError):
        EgressPolicy(deny_hosts=("*",))
    with pytest.raises(ValueError):
        EgressPolicy(allow_private=("not a host",))


def test_loopback_names() -> None:
    assert is_loopback_host("localhost") and is_loopback_host("LOCALHOST.")
    assert is_loopback_host("127.0.0.1") and is_loopback_host("[::1]") and is_loopback_host("127.3.4.5")
    assert not is_loopback_host("localhost.evil.test") and not is_loopback_host("10.0.0.1")
    assert is_dev_loopback_url("http://127.0.0.1:8080/token")
    assert is_dev_loopback_url("http://localhost/x")
    assert not is_dev_loopback_url("https://127.0.0.1/x")
    assert not is_dev_loopback_url("http://idp.example.com/x")


# ---------------------------------------------------------------------------- check_host


def test_restricted_allows_only_allow_hosts() -> None:
    policy = EgressPolicy("restricted", allow_hosts=("*.example.com",))
    policy.check_host("auth.example.com")
    policy.check_host("example.com")
    with pytest.raises(Forbidden, match="not in allow_hosts") as info:
        policy.check_host("evil.test")
    assert info.value.details["host"] == "evil.test"
    with pytest.raises(Forbidden):
        EgressPolicy("restricted").check_host("auth.example.com")


@pytest.mark.parametrize("mode", ["inherit", "broad_audited", "restricted"])
def test_deny_hosts_win_in_every_mode(mode: str) -> None:
    policy = EgressPolicy(mode, allow_hosts=("*.example.com",), deny_hosts=("evil.example.com",))
    policy.check_host("auth.example.com")
    with pytest.raises(Forbidden, match="deny_hosts"):
        policy.check_host("Evil.Example.com.")


def test_broad_modes_allow_other_hosts() -> None:
    EgressPolicy().check_host("anything.test")
    EgressPolicy("broad_audited", deny_hosts=("*.bad.test",)).check_host("good.test")
    assert EgressPolicy("broad_audited").audited and not EgressPolicy().audited


def test_off_refuses_every_host() -> None:
    with pytest.raises(Forbidden, match='net = "off"'):
        EgressPolicy("off").check_host("auth.example.com")
    with pytest.raises(Forbidden, match='net = "off"'):
        check_address(EgressPolicy("off"), "auth.example.com", "93.184.215.14")


# ---------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(("ip", "problem"), [
    ("93.184.215.14", None),
    ("2606:4700::6810:84e5", None),
    ("169.254.169.254", "metadata"),
    ("fd00:ec2::254", "metadata"),
    ("100.100.100.200", "metadata"),
    ("168.63.129.16", "metadata"),
    ("169.254.10.1", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%1", "link-local"),
    ("10.0.0.5", "private"),
    ("172.16.3.4", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("100.64.0.1", "CGNAT"),
    ("100.127.255.255", "CGNAT"),
    ("127.0.0.1", "loopback"),
    ("::1", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("255.255.255.255", "reserved"),
    ("192.0.2.1", "reserved"),
    ("::ffff:169.254.169.254", "metadata"),  # IPv4-mapped
    ("::ffff:10.0.0.5", "private"),
    ("64:ff9b::a00:5", "private"),  # NAT64 of 10.0.0.5
    ("::a00:5", "private"),  # IPv4-compatible, unwrapped
])
def test_address_problem(ip: str, problem: str | None) -> None:
    assert address_problem(ip) == problem


@pytest.mark.parametrize("ip", ["169.254.169.254", "10.0.0.5", "100.64.1.1", "fd00:ec2::254", "127.0.0.1"])
def test_non_public_addresses_refused(ip: str) -> None:
    with pytest.raises(Forbidden, match=r"evil\.test refused: it resolves to") as info:
        check_address(EgressPolicy(), "evil.test", ip)
    assert info.value.details == {"host": "evil.test", "address": ip}


def test_public_address_allowed() -> None:
    check_address(EgressPolicy(), "auth.example.com", "93.184.215.14")


def test_loopback_only_with_dev_loopback_and_a_loopback_name() -> None:
    dev = EgressPolicy(dev_loopback=True)
    check_address(dev, "127.0.0.1", "127.0.0.1")
    check_address(dev, "localhost", "::1")
    with pytest.raises(Forbidden, match="loopback"):
        check_address(EgressPolicy(), "localhost", "127.0.0.1")
    with pytest.raises(Forbidden, match="loopback"):  # a public name rebound to loopback
        check_address(dev, "evil.test", "127.0.0.1")
    with pytest.raises(Forbidden, match="private"):  # dev_loopback opens loopback only
        check_address(dev, "localhost", "10.0.0.1")


def test_allow_private_by_cidr_and_by_host() -> None:
    policy = EgressPolicy(allow_private=("10.1.0.0/16", "192.168.7.7", "idp.corp.internal", "169.254.169.254"))
    check_address(policy, "anything.test", "10.1.2.3")
    check_address(policy, "anything.test", "::ffff:10.1.2.3")
    check_address(policy, "anything.test", "192.168.7.7")
    check_address(policy, "idp.corp.internal", "10.9.9.9")
    check_address(policy, "anything.test", "169.254.169.254")  # metadata, listed by IP
    with pytest.raises(Forbidden):
        check_address(policy, "anything.test", "10.2.0.1")
    with pytest.raises(Forbidden):
        check_address(policy, "anything.test", "192.168.7.8")


def test_a_host_in_allow_private_never_reaches_metadata() -> None:
    policy = EgressPolicy(allow_private=("idp.corp.internal",))
    with pytest.raises(Forbidden, match="metadata"):
        check_address(policy, "idp.corp.internal", "169.254.169.254")


# ---------------------------------------------------------------------------- the transport


@dataclass
class Listener:
    """A real HTTP/1.1 server on 127.0.0.1 that counts connections and records requests."""

    port: int = 0
    accepted: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append({"line": lines[0], "host": headers.get("host", ""),
                                      "local": writer.get_extra_info("sockname")[0], "body": body.decode()})
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
                             b'{"ok":true}')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def open_listener(host: str = "127.0.0.1", port: int = 0,
                        tls: ssl.SSLContext | None = None) -> AsyncIterator[Listener]:
    """A Listener on `host` (the address connections must reach) and `port` (0: any free one)."""
    lst = Listener()
    lst.server = await asyncio.start_server(lst.handle, host, port, ssl=tls)
    lst.port = lst.server.sockets[0].getsockname()[1]
    try:
        yield lst
    finally:
        lst.server.close()
        await lst.server.wait_closed()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    async with open_listener() as lst:
        yield lst


def fixed_resolver(table: dict[str, list[str]], calls: list[str] | None = None) -> Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise OSError(f"no such host {host}")
        return table[host]
    return resolve


async def test_off_makes_no_connection(listener: Listener) -> None:
    resolved: list[str] = []
    off = EgressPolicy("off", allow_private=("127.0.0.1",), dev_loopback=True)
    async with httpx.AsyncClient(transport=EgressTransport(off, resolver=fixed_resolver({}, resolved))) as http:
        for url in (f"http://127.0.0.1:{listener.port}/", f"http://localhost:{listener.port}/"):
            with pytest.raises(Forbidden, match='net = "off"'):
                await http.post(url, data={"grant_type": "client_credentials"})
    assert listener.accepted == 0 and resolved == []
    # the same listener does count a connection the policy allows
    on = EgressPolicy("inherit", allow_private=("127.0.0.1",), dev_loopback=True)
    async with httpx.AsyncClient(transport=EgressTransport(on)) as http:
        assert (await http.get(f"http://127.0.0.1:{listener.port}/")).json() == {"ok": True}
    assert listener.accepted == 1


@pytest.mark.parametrize("address", ["169.254.169.254", "10.0.0.5", "127.0.0.1"])
async def test_name_resolving_to_a_private_address_is_refused(listener: Listener, address: str) -> None:
    """Refused before any connection: the audit (called right before each connection) stays
    empty, and the real listener behind 127.0.0.1 never sees one (dev_loopback opens a loopback
    name, never a name that merely resolves to loopback)."""
    audit: list[tuple[str, str, int]] = []
    policy = EgressPolicy("broad_audited", dev_loopback=True)
    async with egress_client(policy, resolver=fixed_resolver({"evil.test": [address]}),
                             on_connect=lambda *a: audit.append(a), timeout=5) as http:
        with pytest.raises(Forbidden, match=rf"evil\.test refused: it resolves to {re.escape(address)}"):
            await http.get(f"http://evil.test:{listener.port}/latest/meta-data/")
    assert audit == [] and listener.accepted == 0


async def test_every_resolved_address_is_checked() -> None:
    resolver = fixed_resolver({"mixed.test": ["93.184.215.14", "10.0.0.5"]})
    async with egress_client(EgressPolicy(), resolver=resolver) as http:
        with pytest.raises(Forbidden, match=r"10\.0\.0\.5"):
            await http.get("https://mixed.test/")


async def test_ip_literal_urls_are_checked_without_resolving() -> None:
    calls: list[str] = []
    async with egress_client(EgressPolicy(), resolver=fixed_resolver({}, calls)) as http:
        with pytest.raises(Forbidden, match="metadata"):
            await http.get("http://169.254.169.254/latest/meta-data/")
        with pytest.raises(Forbidden, match="metadata"):
            await http.get("http://[fd00:ec2::254]/latest/meta-data/")
    assert calls == []


async def test_loopback_needs_dev_loopback(listener: Listener) -> None:
    url = f"http://127.0.0.1:{listener.port}/token"
    async with egress_client(EgressPolicy()) as http:
        with pytest.raises(Forbidden, match="loopback"):
            await http.get(url)
    assert listener.accepted == 0
    async with egress_client(EgressPolicy(dev_loopback=is_dev_loopback_url(url))) as http:
        assert (await http.get(url)).status_code == 200
    assert listener.accepted == 1


async def test_http_end_to_end_connects_to_the_checked_address(listener: Listener) -> None:
    calls: list[str] = []
    audit: list[tuple[str, str, int]] = []
    resolver = fixed_resolver({"idp.test": ["127.0.0.1"]}, calls)
    policy = EgressPolicy("broad_audited", allow_private=("127.0.0.1",))
    async with egress_client(policy, resolver=resolver, on_connect=lambda *a: audit.append(a)) as http:
        response = await http.post(f"http://IDP.test:{listener.port}/oauth2/token?x=1",
                                   data={"grant_type": "client_credentials"})
        again = await http.get(f"http://idp.test:{listener.port}/second")
    assert response.json() == {"ok": True} and again.status_code == 200
    # idp.test does not exist in real DNS: the connection went to the address we checked (looked
    # up once: the second request came within RESOLVED_TTL)
    assert calls == ["idp.test"]
    assert audit == [("idp.test", "127.0.0.1", listener.port)] * 2
    assert listener.accepted == 1  # keep-alive: the pooled connection was reused
    first, second = listener.requests
    assert first["line"] == "POST /oauth2/token?x=1 HTTP/1.1"
    assert first["host"] == f"idp.test:{listener.port}"  # the original name, not the IP
    assert first["body"] == "grant_type=client_credentials"
    assert second["line"] == "GET /second HTTP/1.1" and second["host"] == f"idp.test:{listener.port}"
    # the caller still sees its own URL
    assert response.request.url.host == "idp.test"


@contextlib.asynccontextmanager
async def listeners_on_one_port(*hosts: str) -> AsyncIterator[list[Listener]]:
    """A Listener on each of `hosts`, all on the same port (a name rebound to another of these
    addresses reaches that one's listener)."""
    for _ in range(20):  # the port picked on the first host may be taken on another
        async with contextlib.AsyncExitStack() as stack:
            first = await stack.enter_async_context(open_listener(hosts[0]))
            try:
                rest = [await stack.enter_async_context(open_listener(h, first.port)) for h in hosts[1:]]
            except OSError:
                continue
            yield [first, *rest]
            return
    raise RuntimeError(f"no port free on all of {hosts}")


def rebinding_resolver(answers: list[list[str]], calls: list[str]) -> Resolver:
    """A name whose every lookup gets the next answer (the last one for ever): DNS rebinding."""
    async def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return answers[min(len(calls), len(answers)) - 1]
    return resolve


class Clock:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_rebinding_never_reaches_the_address_it_rebinds_to() -> None:
    """The first lookup answers the allowed address (127.0.0.1 stands for a public one: the policy
    lets only it through), every later one a forbidden address with a real listener behind it.
    A request connects to the address it checked; once the first answer's time is up, the next
    request looks the name up again, sees the new answer and is refused."""
    calls: list[str] = []
    audit: list[tuple[str, str, int]] = []
    clock = Clock()
    async with listeners_on_one_port("127.0.0.1", "127.0.0.2") as (allowed, target):
        policy = EgressPolicy("broad_audited", allow_private=("127.0.0.1",))
        resolver = rebinding_resolver([["127.0.0.1"], ["127.0.0.2"]], calls)
        async with egress_client(policy, resolver=resolver, on_connect=lambda *a: audit.append(a),
                                 timeout=10, clock=clock) as http:
            assert (await http.get(f"http://rebind.test:{allowed.port}/first")).json() == {"ok": True}
            clock.now += RESOLVED_TTL
            with pytest.raises(Forbidden, match=r"rebind\.test refused: it resolves to 127\.0\.0\.2") as info:
                await http.get(f"http://rebind.test:{allowed.port}/second")
    assert info.value.details == {"host": "rebind.test", "address": "127.0.0.2"}
    assert target.accepted == 0 and target.requests == []
    assert [(r["line"], r["local"]) for r in allowed.requests] == [("GET /first HTTP/1.1", "127.0.0.1")]
    assert audit == [("rebind.test", "127.0.0.1", allowed.port)]
    assert calls == ["rebind.test", "rebind.test"]  # one lookup per request here, none at connect time


async def test_a_name_is_looked_up_once_a_ttl_and_again_when_none_of_its_addresses_answers(
        listener: Listener) -> None:
    """A lookup per request cost every relayed call a resolver round trip (11 % of the sidecar's
    instructions for a name in /etc/hosts; a DNS query for a remote one)."""
    calls: list[str] = []
    clock = Clock()
    table = {"api.test": ["127.0.0.1"]}
    policy = EgressPolicy("broad_audited", allow_private=("127.0.0.1",))
    audit: list[tuple[str, str, int]] = []
    async with egress_client(policy, resolver=fixed_resolver(table, calls), clock=clock, timeout=10,
                             on_connect=lambda *a: audit.append(a)) as http:
        for _ in range(3):
            assert (await http.get(f"http://api.test:{listener.port}/")).json() == {"ok": True}
        assert calls == ["api.test"] and len(audit) == 3  # still audited request by request
        clock.now += RESOLVED_TTL - 0.001
        await http.get(f"http://api.test:{listener.port}/")
        assert calls == ["api.test"]
        clock.now += 0.001
        await http.get(f"http://api.test:{listener.port}/")
        assert calls == ["api.test"] * 2
        with socket.socket() as unused:  # a port nobody listens on: the name's address stops answering
            unused.bind(("127.0.0.1", 0))
            closed = unused.getsockname()[1]
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://api.test:{closed}/")
        assert calls == ["api.test"] * 2  # the addresses were at hand ...
        await http.get(f"http://api.test:{listener.port}/")
        assert calls == ["api.test"] * 3  # ... and, none having answered, were looked up again


async def test_an_answer_with_a_refused_address_is_not_kept() -> None:
    """A name that resolved to a forbidden address a moment ago (a captive portal, a VPN coming
    up) is looked up again on the next request, not refused for the rest of a TTL."""
    calls: list[str] = []
    policy = EgressPolicy("broad_audited", allow_private=("127.0.0.1",))
    async with open_listener() as allowed:
        resolver = rebinding_resolver([["10.0.0.5"], ["127.0.0.1"]], calls)
        async with egress_client(policy, resolver=resolver, clock=Clock(), timeout=10) as http:
            with pytest.raises(Forbidden, match=r"10\.0\.0\.5"):
                await http.get(f"http://flaky.test:{allowed.port}/")
            assert (await http.get(f"http://flaky.test:{allowed.port}/")).json() == {"ok": True}
    assert calls == ["flaky.test", "flaky.test"]


class TimingOut(httpx.AsyncBaseTransport):
    """A connection pool whose every connect times out (an address that drops what it is sent)."""

    def __init__(self, **_: object) -> None:
        pass

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)


async def test_a_name_whose_address_timed_out_is_looked_up_again() -> None:
    calls: list[str] = []
    policy = EgressPolicy("broad_audited", allow_private=("127.0.0.1",))
    transport = EgressTransport(policy, resolver=fixed_resolver({"moved.test": ["127.0.0.1"]}, calls),
                                clock=Clock(), pool_class=TimingOut)
    async with httpx.AsyncClient(transport=transport) as http:
        for _ in range(2):
            with pytest.raises(httpx.ConnectTimeout):
                await http.get("http://moved.test:9/")
    assert calls == ["moved.test", "moved.test"]


def hosts_file_entries(path: Path = Path("/etc/hosts")) -> list[tuple[str, str]]:
    """(name, address) of each name the hosts file maps to a non-global address, localhost aside."""
    entries: list[tuple[str, str]] = []
    lines = path.read_text().splitlines() if path.exists() else []
    for address, *names in (fields for line in lines if (fields := line.split("#", 1)[0].split())):
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            continue
        if not ip.is_global and "%" not in address:  # a scoped address names no single host
            entries += [(name, str(ip)) for name in names if name.lower() != "localhost"]
    return list(dict.fromkeys(entries))


@pytest.mark.parametrize("host", ["localhost", "localhost.", "LocalHost."])
async def test_system_resolver_refuses_localhost_unless_dev_loopback(listener: Listener, host: str) -> None:
    """No resolver passed: the production `system_resolver` resolves the name."""
    url = f"http://{host}:{listener.port}/token"
    async with egress_client(EgressPolicy(), timeout=10) as http:
        with pytest.raises(Forbidden, match=r"localhost refused: it resolves to .*a loopback address") as info:
            await http.get(url)
    assert address_problem(info.value.details["address"]) == "loopback"
    assert listener.accepted == 0
    # the name did resolve to the machine's loopback: with dev_loopback, the listener answers
    async with egress_client(EgressPolicy(dev_loopback=True), timeout=10) as http:
        assert (await http.get(url)).json() == {"ok": True}
    assert listener.requests[0]["local"] == "127.0.0.1"
    assert listener.requests[0]["host"] == f"{host.lower()}:{listener.port}"


@pytest.mark.parametrize(("name", "address"), hosts_file_entries())
async def test_system_resolver_refuses_names_the_hosts_file_maps_to_local_addresses(name: str,
                                                                                   address: str) -> None:
    """A name from /etc/hosts (this machine's own name, say) that maps to a loopback or private
    address: refused even with dev_loopback, which opens loopback names only; listed in
    allow_private, it reaches a real listener on that address, so the system resolver did run."""
    assert address in await system_resolver(name, 80)
    async with contextlib.AsyncExitStack() as stack:
        try:
            lst: Listener | None = await stack.enter_async_context(open_listener(address))
        except OSError:  # not an address of this machine: the refusal alone is checked
            lst = None
        port = lst.port if lst is not None else 9
        async with egress_client(EgressPolicy(dev_loopback=True), timeout=10) as http:
            with pytest.raises(Forbidden, match=rf"{re.escape(name.lower())} refused: it resolves to") as info:
                await http.get(f"http://{name}:{port}/token")
        assert address_problem(info.value.details["address"]) is not None
        if lst is not None:
            assert lst.accepted == 0
            addresses = await system_resolver(name, port)
            async with egress_client(EgressPolicy(allow_private=tuple(addresses)), timeout=10) as http:
                assert (await http.get(f"http://{name}:{port}/token")).json() == {"ok": True}
            assert lst.requests[0]["local"] == address


async def test_next_address_is_tried_on_connect_error(listener: Listener) -> None:
    # nothing listens on 127.0.0.2 at this port, so the first address is refused
    resolver = fixed_resolver({"idp.test": ["127.0.0.2", "127.0.0.1"]})
    audit: list[tuple[str, str, int]] = []
    policy = EgressPolicy("broad_audited", allow_private=("127.0.0.0/8",))
    async with egress_client(policy, resolver=resolver, on_connect=lambda *a: audit.append(a)) as http:
        assert (await http.get(f"http://idp.test:{listener.port}/")).status_code == 200
    assert [a[1] for a in audit] == ["127.0.0.2", "127.0.0.1"]
    assert listener.requests[0]["local"] == "127.0.0.1"


async def test_inherit_does_not_audit_and_restricted_blocks(listener: Listener) -> None:
    audit: list[tuple[str, str, int]] = []
    resolver = fixed_resolver({"idp.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    policy = EgressPolicy(allow_private=("127.0.0.1",))
    async with egress_client(policy, resolver=resolver, on_connect=lambda *a: audit.append(a)) as http:
        assert (await http.get(f"http://idp.test:{listener.port}/")).status_code == 200
    assert audit == []
    restricted = EgressPolicy("restricted", allow_hosts=("idp.test",), allow_private=("127.0.0.1",))
    async with egress_client(restricted, resolver=resolver) as http:
        assert (await http.get(f"http://idp.test:{listener.port}/")).status_code == 200
        with pytest.raises(Forbidden, match="not in allow_hosts"):
            await http.get(f"http://other.test:{listener.port}/")
    assert listener.accepted == 2


async def test_broad_audited_honours_deny_hosts_before_auditing() -> None:
    audit: list[tuple[str, str, int]] = []
    calls: list[str] = []
    policy = EgressPolicy("broad_audited", deny_hosts=("*.evil.test",))
    async with egress_client(policy, resolver=fixed_resolver({}, calls),
                             on_connect=lambda *a: audit.append(a)) as http:
        with pytest.raises(Forbidden, match="deny_hosts"):
            await http.get("https://a.evil.test/")
    assert audit == [] and calls == []


async def test_resolution_failures_are_httpx_errors() -> None:
    async def slow(host: str, port: int) -> list[str]:
        await asyncio.sleep(5)
        return ["93.184.215.14"]

    async with egress_client(EgressPolicy(), resolver=fixed_resolver({})) as http:
        with pytest.raises(httpx.ConnectError, match=r"cannot resolve nowhere\.test"):
            await http.get("https://nowhere.test/")
    async with egress_client(EgressPolicy(), resolver=fixed_resolver({"empty.test": []})) as http:
        with pytest.raises(httpx.ConnectError, match="no address"):
            await http.get("https://empty.test/")
    async with egress_client(EgressPolicy(), resolver=slow, timeout=0.05) as http:
        with pytest.raises(httpx.ConnectTimeout):
            await http.get("https://slow.test/")


def _cert(tmp_path: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_https_request_is_pinned_to_an_ipv6_address_with_sni_and_host(tmp_path: Path) -> None:
    """A real TLS listener on [::1], for a name that resolves there only through the resolver:
    the connection goes to the bracketed IPv6 address, TLS sends and verifies the name, the
    request carries the name in Host, and the caller keeps its URL."""
    cert, key = _cert(tmp_path, "auth.example.com")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: sni.append(name)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    resolver = fixed_resolver({"auth.example.com": ["::1"]})
    policy = EgressPolicy(allow_private=("::1",))
    async with (open_listener("::1", tls=server_ctx) as lst,
                egress_client(policy, resolver=resolver, transport_kwargs={"verify": client_ctx}, timeout=10) as http):
        response = await http.get(f"https://Auth.Example.com:{lst.port}/oauth2/token")
    assert response.json() == {"ok": True}
    assert sni == ["auth.example.com"]
    assert lst.requests == [{"line": "GET /oauth2/token HTTP/1.1", "host": f"auth.example.com:{lst.port}",
                             "local": "::1", "body": ""}]
    assert str(response.request.url) == f"https://auth.example.com:{lst.port}/oauth2/token"


async def test_the_callers_timeout_holds_on_the_pinned_request() -> None:
    """A listener that accepts and never answers: the request ends with the caller's read timeout
    (the pinned request keeps the caller's timeouts; without them it would wait for ever)."""
    accepted = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # until the client gives up and closes
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with egress_client(EgressPolicy(allow_private=("127.0.0.1",)),
                                 resolver=fixed_resolver({"idp.test": ["127.0.0.1"]}),
                                 timeout=httpx.Timeout(10, read=0.2)) as http:
            with pytest.raises(httpx.ReadTimeout):
                await asyncio.wait_for(http.get(f"http://idp.test:{port}/token"), 30)
    finally:
        server.close()
        await server.wait_closed()
    assert accepted.is_set()


async def test_a_tls_connection_verified_for_one_name_never_carries_another(tmp_path: Path) -> None:
    """Two names on one address and port, a certificate for the first only: the second name gets
    its own connection, verified against it (and refused), not the first name's kept-alive one."""
    cert, key = _cert(tmp_path, "idp.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    resolver = fixed_resolver({"idp.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    policy = EgressPolicy(allow_private=("127.0.0.1",))
    async with (open_listener(tls=server_ctx) as lst,
                egress_client(policy, resolver=resolver, transport_kwargs={"verify": client_ctx}, timeout=10) as http):
        assert (await http.get(f"https://idp.test:{lst.port}/first")).json() == {"ok": True}
        with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            await http.get(f"https://other.test:{lst.port}/second")
        assert (await http.get(f"https://idp.test:{lst.port}/third")).json() == {"ok": True}
    assert [(r["line"], r["host"]) for r in lst.requests] == [("GET /first HTTP/1.1", f"idp.test:{lst.port}"),
                                                             ("GET /third HTTP/1.1", f"idp.test:{lst.port}")]


@pytest.mark.parametrize(("cert_name", "ok"), [("idp.test", True), ("other.test", False)])
async def test_https_verifies_the_certificate_against_the_name(tmp_path: Path, listener: Listener,
                                                               cert_name: str, ok: bool) -> None:
    cert, key = _cert(tmp_path, cert_name)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: sni.append(name)
    tls = await asyncio.start_server(listener.handle, "127.0.0.1", 0, ssl=server_ctx)
    port = tls.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=str(cert))
    resolver = fixed_resolver({"idp.test": ["127.0.0.1"]})
    try:
        async with egress_client(EgressPolicy(allow_private=("127.0.0.1",)), resolver=resolver,
                                 transport_kwargs={"verify": client_ctx}) as http:
            if ok:
                assert (await http.get(f"https://idp.test:{port}/token")).json() == {"ok": True}
                assert listener.requests[0]["host"] == f"idp.test:{port}"
            else:
                with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
                    await http.get(f"https://idp.test:{port}/token")
    finally:
        tls.close()
        await tls.wait_closed()
    assert sni == ["idp.test"]  # SNI carries the name although the connection went to 127.0.0.1
