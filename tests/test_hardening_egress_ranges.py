"""The SSRF guard's address ranges (issue 28, finding 16): deprecated site-local IPv6, the
documentation, benchmarking and protocol-assignment ranges, and IPv6 outside global unicast
(2000::/3) are refused whatever Python's `ipaddress.is_global` says in the running version
(its lists differ between versions: on 3.11 `fec0::1`, `3fff::1` and `5f00::1` are "global");
`allow_private` still opens them; public addresses stay allowed.
"""

from __future__ import annotations

import pytest

from mcpcreds.errors import Forbidden
from mcpcreds.net.egress import EgressPolicy, address_problem, check_address


@pytest.mark.parametrize(("ip", "problem"), [
    ("fec0::1", "site-local"),  # deprecated site-local (RFC 3879)
    ("feff:ffff::1", "site-local"),
    ("192.0.0.8", "reserved"),  # IPv4 dummy address
    ("192.0.0.200", "reserved"),  # IETF protocol assignments
    ("192.88.99.1", "reserved"),  # 6to4 relay anycast (deprecated)
    ("198.18.0.1", "reserved"),  # benchmarking
    ("198.51.100.7", "reserved"),  # documentation
    ("203.0.113.7", "reserved"),  # documentation
    ("240.0.0.1", "reserved"),
    ("2001:db8::1", "reserved"),  # documentation
    ("3fff::1", "reserved"),  # documentation (RFC 9637)
    ("2001:2::1", "reserved"),  # benchmarking
    ("2001:10::1", "reserved"),  # ORCHID
    ("100::1", "reserved"),  # discard-only
    ("100:0:0:1::1", "reserved"),  # dummy IPv6 prefix
    ("5f00::1", "reserved"),  # SRv6 segment identifiers
    ("4000::1", "reserved"),  # unassigned: outside 2000::/3
    ("e000::1", "reserved"),
    ("1::1", "reserved"),
    ("::1:0:0:1", "reserved"),  # ::/8, neither mapped nor compatible
])
def test_special_ranges_are_not_public(ip: str, problem: str) -> None:
    assert address_problem(ip) == problem
    with pytest.raises(Forbidden, match=f"a {problem} address"):
        check_address(EgressPolicy(), "evil.test", ip)


@pytest.mark.parametrize("ip", ["93.184.215.14", "2606:4700::6810:84e5", "2a00:1450:4001::200e",
                                "2002:5db8:d70e::1", "192.0.1.1", "192.88.98.1", "198.20.0.1"])
def test_public_addresses_beside_them_stay_allowed(ip: str) -> None:
    assert address_problem(ip) is None
    check_address(EgressPolicy(), "public.test", ip)


def test_allow_private_opens_a_site_local_network() -> None:
    check_address(EgressPolicy(allow_private=("fec0::/10",)), "lab.test", "fec0::5")
    check_address(EgressPolicy(allow_private=("lab.test",)), "lab.test", "fec0::5")
    with pytest.raises(Forbidden):
        check_address(EgressPolicy(allow_private=("fec0::/16",)), "lab.test", "fec1::5")
