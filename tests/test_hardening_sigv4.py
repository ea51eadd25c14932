"""SigV4's refetch on a stale-credential refusal (issue 28, finding 8): at most one forced refetch
per cache key per `invalidate_cooldown`, on a fake clock. An upstream that refuses every
credential used to cost a credential fetch (STS, IMDS, the SSO portal) per gateway request.

The end-to-end half (the real sidecar, the SigV4 verifier peer and a fake IMDS) is in
tests/test_sigv4.py, `test_an_aws_refusal_of_stale_credentials_fetches_them_again_and_retries_once`.
"""

from __future__ import annotations

from typing import Any

import httpx

from mcpcreds.config.load import parse_config
from mcpcreds.core.templates import Template
from mcpcreds.signers.aws_credentials import CredentialCache
from mcpcreds.signers.sigv4 import SigV4Signer

KEY_IDS = [f"AKIAROTATING{n:08d}" for n in range(100)]
EXPIRED = b'{"message":"The security token included in the request is expired"}'


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


class Static:
    """The static source's secrets: a new key id at each fetch (counted)."""

    def __init__(self) -> None:
        self.fetches = 0

    def render(self, template: Template) -> str:
        if template.source == "{{secret:K}}":
            self.fetches += 1
            return KEY_IDS[self.fetches]
        return "secret-of-" + KEY_IDS[self.fetches]


def signer(clock: FakeClock, source: Static, cooldown: str = "30s") -> tuple[SigV4Signer, Any]:
    config = parse_config({
        "sidecar": {"invalidate_cooldown": cooldown}, "secrets": {"cache_ttl": "1h"},  # no renewal meanwhile
        "servers": [{"name": "s", "endpoint": "https://api.example.com/mcp", "auth": {
            "kind": "aws", "region": "us-east-1", "service": "execute-api", "source": "static",
            "access_key_id": "{{secret:K}}", "secret_access_key": "{{secret:S}}"}}]})
    return SigV4Signer(config, clock, source.render, lambda _target: httpx.AsyncClient()), config.servers["s"]


async def refusal(sig: SigV4Signer, target: Any) -> httpx.Response:
    """The server's 403 ExpiredToken to a request signed with the credentials held now."""
    headers = await sig.gateway_headers(target, "POST", target.endpoint, [(b"content-type", b"application/json")],
                                        b"{}")
    request = httpx.Request("POST", target.endpoint, headers=headers)
    return httpx.Response(403, headers={"content-length": str(len(EXPIRED))}, content=EXPIRED, request=request)


async def test_an_upstream_refusing_every_credential_costs_one_fetch_per_cooldown() -> None:
    clock, source = FakeClock(), Static()
    sig, target = signer(clock, source)
    assert (await sig.credentials(target)).access_key_id == KEY_IDS[1] and source.fetches == 1
    assert await sig.refused(target, await refusal(sig, target))  # the first: dropped, retried
    assert (await sig.credentials(target)).access_key_id == KEY_IDS[2] and source.fetches == 2
    for _ in range(20):  # 20 more requests, each refused, within the cooldown: no retry, no fetch
        assert not await sig.refused(target, await refusal(sig, target))
    assert source.fetches == 2
    clock.now += 29.9
    assert not await sig.refused(target, await refusal(sig, target)) and source.fetches == 2
    clock.now += 0.1  # the cooldown is over: one more forced refetch
    assert await sig.refused(target, await refusal(sig, target))
    assert (await sig.credentials(target)).access_key_id == KEY_IDS[3] and source.fetches == 3
    assert not await sig.refused(target, await refusal(sig, target)) and source.fetches == 3


async def test_a_refusal_of_credentials_already_replaced_retries_without_a_fetch() -> None:
    clock, source = FakeClock(), Static()
    sig, target = signer(clock, source)
    stale = await refusal(sig, target)  # signed with the first credentials
    concurrent = await refusal(sig, target)  # a second request, signed with them too
    assert await sig.refused(target, stale) and source.fetches == 1
    await sig.credentials(target)  # the retry fetches the second ones
    assert source.fetches == 2
    # the concurrent request's refusal names credentials no longer held: its retry uses the new ones
    assert await sig.refused(target, concurrent) and source.fetches == 2
    assert (await sig.credentials(target)).access_key_id == KEY_IDS[2]


def test_a_clock_gone_back_ends_the_cooldown_and_the_memory_is_bounded() -> None:
    clock = FakeClock()
    cache = CredentialCache(clock)
    assert cache.force_refetch("a", 30.0) and not cache.force_refetch("a", 30.0)
    clock.now -= 3600  # the wall clock stepped back: not a cooldown of an hour
    assert cache.force_refetch("a", 30.0)
    for n in range(1000):
        clock.now += 31
        assert cache.force_refetch(f"key-{n}", 30.0)
    assert len(cache._forced_at) == 1  # only those within their cooldown are remembered
