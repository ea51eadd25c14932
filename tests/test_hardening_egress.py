"""Egress hardening (issue #12): deny entries hold however a URL spells the address, and IPv6
forms that carry a private IPv4 address are unwrapped."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from mcpcreds.errors import Forbidden
from mcpcreds.net.egress import (
    EgressPolicy,
    address_problem,
    check_address,
    normalize_host,
    parse_host_pattern,
)
from mcpcreds.net.egress_http import egress_client
from tests.test_egress import Listener, fixed_resolver, listener

__all__ = ["listener"]  # the fixture, imported to be used here


@pytest.mark.parametrize(("host", "canonical"), [
    ("167772165", "10.0.0.5"),
    ("10.0.5", "10.0.0.5"),
    ("10.5", "10.0.0.5"),
    ("0xa.0.0.5", "10.0.0.5"),
    ("0XA.0.0.5", "10.0.0.5"),
    ("012.0.0.5", "10.0.0.5"),
    ("0x7f.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("10.0.0.5.", "10.0.0.5"),
    ("[::FFFF:10.0.0.5]", "::ffff:a00:5"),
    ("1e100.net", "1e100.net"),  # a name: its last label is no number
    ("Auth.Example.COM.", "auth.example.com"),
])
def test_numeric_hosts_are_read_as_the_resolver_reads_them(host: str, canonical: str) -> None:
    assert normalize_host(host) == canonical


@pytest.mark.parametrize("host", ["1.2.3.256", "256.1.1.1", "1.2.3.4.5", "4294967296", "09.1.1.1",
                                  "0x1g.1", "a.1", "1..2"])
def test_invalid_numeric_hosts_are_refused(host: str) -> None:
    with pytest.raises(ValueError):
        normalize_host(host)
    with pytest.raises(Forbidden, match="invalid IPv4 address"):
        EgressPolicy().check_host(host)


def test_ip_patterns_are_canonical() -> None:
    assert parse_host_pattern("10.0.5") == "10.0.0.5"
    assert parse_host_pattern("0x0a.0.0.5") == "10.0.0.5"
    with pytest.raises(ValueError):
        parse_host_pattern("*.0.0.5")


@pytest.mark.parametrize("host", ["167772165", "10.0.5", "0xa.0.0.5", "012.0.0.5", "[::ffff:10.0.0.5]",
                                  "[::ffff:a00:5]", "[64:ff9b::a00:5]", "[2002:a00:5::]"])
def test_deny_holds_for_every_spelling_of_a_denied_address(host: str) -> None:
    policy = EgressPolicy(deny_hosts=("10.0.0.5",), allow_private=("10.0.0.0/8", "::/0"))
    with pytest.raises(Forbidden, match="deny_hosts"):
        policy.check_host(host)
    policy.check_host("10.0.0.6")


def test_restricted_allow_hosts_match_an_address_however_it_is_spelt() -> None:
    policy = EgressPolicy("restricted", allow_hosts=("10.0.0.5",))
    for host in ("10.0.0.5", "167772165", "[::ffff:10.0.0.5]"):
        policy.check_host(host)
    with pytest.raises(Forbidden, match="not in allow_hosts"):
        policy.check_host("167772166")


@pytest.mark.parametrize("resolved", ["10.0.0.5", "::ffff:10.0.0.5", "64:ff9b::a00:5", "2002:a00:5::"])
def test_deny_holds_for_a_name_that_resolves_to_a_denied_address(resolved: str) -> None:
    policy = EgressPolicy(deny_hosts=("10.0.0.5",), allow_private=("10.0.0.0/8",))
    policy.check_host("innocent.test")
    with pytest.raises(Forbidden, match=r"which a deny_hosts entry matches") as info:
        check_address(policy, "innocent.test", resolved)
    assert "'10.0.0.5'" not in str(info.value)  # the configured entry is never quoted
    assert info.value.details["address"] == str(ip_address(resolved))
    check_address(policy, "innocent.test", "10.0.0.6")  # allow_private still opens the rest


async def test_no_spelling_of_a_denied_address_reaches_it(listener: Listener) -> None:
    """A real listener on 127.0.0.1, denied; every numeric spelling of it (never resolved) and a
    name a resolver maps to it are refused before a connection."""
    port = listener.port
    policy = EgressPolicy(deny_hosts=("127.0.0.1",), allow_private=("127.0.0.0/8",))
    resolver = fixed_resolver({"idp.test": ["127.0.0.1"]})
    async with egress_client(policy) as http:
        for host in ("2130706433", "127.1", "0x7f.1", "0x7f.0.0.1", "127.0.0.1.", "[::ffff:127.0.0.1]"):
            with pytest.raises(Forbidden, match="deny_hosts"):
                await http.get(f"http://{host}:{port}/token")
    async with egress_client(policy, resolver=resolver) as http:
        with pytest.raises(Forbidden, match="deny_hosts"):
            await http.get(f"http://idp.test:{port}/token")
    assert listener.accepted == 0
    # the same listener, not denied: a numeric spelling connects to the address it means
    async with egress_client(EgressPolicy(allow_private=("127.0.0.0/8",))) as http:
        assert (await http.get(f"http://0x7f.1:{port}/token")).status_code == 200
    assert listener.accepted == 1 and listener.requests[0]["host"] == f"0x7f.1:{port}"


@pytest.mark.parametrize(("ip", "problem"), [
    ("2002:a00:5::", "private"),  # 6to4 of 10.0.0.5
    ("2002:a9fe:a9fe::1", "metadata"),
    ("2002:7f00:1::", "loopback"),
    ("2002:5db8:d70e::1", None),  # 6to4 of a public address
    ("64:ff9b:1::a00:5", "private"),  # local-use NAT64, /96 layout
    ("64:ff9b:1:a:0:5::", "private"),  # /56 layout
    ("64:ff9b:1:a00:0:5::", "private"),  # /48 layout
    ("64:ff9b:1::a9fe:a9fe", "metadata"),
    ("64:ff9b:1:a9fe:a9:fe00::", "metadata"),  # /48 layout of 169.254.169.254
    ("64:ff9b:1::5db8:d70e", "reserved"),  # local use: never globally reachable (RFC 8215)
    ("64:ff9b::a9fe:a9fe", "metadata"),  # well-known NAT64
    ("::ffff:0:a00:5", "private"),  # SIIT IPv4-translated
    ("::a9fe:a9fe", "metadata"),  # IPv4-compatible
    ("2001:0:4136:e378:8000:63bf:f5ff:fffa", "private"),  # Teredo, client 10.0.0.5
])
def test_ipv6_forms_carrying_an_ipv4_address_are_unwrapped(ip: str, problem: str | None) -> None:
    assert address_problem(ip) == problem


def test_unwrapped_private_addresses_are_refused_and_allow_private_applies_to_them() -> None:
    for ip in ("2002:a00:5::", "64:ff9b:1::a00:5"):
        with pytest.raises(Forbidden, match="a private address"):
            check_address(EgressPolicy(), "evil.test", ip)
    check_address(EgressPolicy(allow_private=("10.0.0.0/8",)), "idp.test", "2002:a00:5::")
    check_address(EgressPolicy(allow_private=("64:ff9b:1::/48",)), "idp.test", "64:ff9b:1::a00:5")
    with pytest.raises(Forbidden, match="metadata"):  # a host pattern never opens metadata
        check_address(EgressPolicy(allow_private=("idp.test",)), "idp.test", "64:ff9b:1:a9fe:a9:fe00::")
