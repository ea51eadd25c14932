"""`creds.auth(name)`: an httpx (and httpx2) Auth that gets a permit and headers per request.

The flow is written once, as a generator that does no I/O: it yields `Sidecar(call)` steps
(answered by the driver through the sidecar client) and `Upstream(request)` steps (sent by
httpx). Two thin drivers run it, sync and async. No lock is held across any request.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import httpx

from ..core.aauth_requirement import access_token, refusal
from ..core.rates import parse_retry_after
from ..core.scopes import insufficient_scope
from ..errors import RateLimited
from .calls import Call, Calls
from .lease_terms import Trigger, called_often

if TYPE_CHECKING:
    from .calls import AsyncSidecarClient, SidecarClient
    from .leaser import AsyncLeaser
    from .leaser_sync import SyncLeaser

On429 = Literal["raise", "wait", "return"]


@dataclass(frozen=True, slots=True)
class Sidecar:
    call: Call[Any]


@dataclass(frozen=True, slots=True)
class Upstream:
    request: Any  # httpx.Request or httpx2.Request: the flow only touches .headers


Step = Sidecar | Upstream


def _apply(request: Any, answer: dict[str, Any]) -> str | None:
    for name, value in answer["headers"].items():
        request.headers[name] = value
    fingerprint: str | None = answer.get("fingerprint")
    return fingerprint


def _credentials(name: str, request: Any, cost: int, max_wait: float, session: dict[str, str] | None = None,
                 required: tuple[str, ...] = ()) -> Generator[Step, Any, str | None]:
    """Permit and headers; for an AAuth server (the answer says `aauth`) or an AWS SigV4 one
    (`sigv4`), the signature too: the sidecar signs with its agent key or AWS credentials, which
    never leave it; the body only as its RFC 9530 digest. An AAuth server's session token (its
    `AAuth-Access`, kept in `session`) goes in `Authorization: AAuth`, covered by the signature."""
    answer = yield Sidecar(Calls.call(name, cost, max_wait))
    fingerprint = _apply(request, answer)
    sigv4 = answer.get("sigv4") is True  # an AWS SigV4 server: the sidecar signs with the AWS key
    aauth = answer.get("aauth") is True
    if aauth and session is not None:
        held = request.headers.get("authorization", "")
        if name in session and (not held or held.startswith("AAuth ")):
            request.headers["authorization"] = f"AAuth {session[name]}"
        elif held.startswith("AAuth "):  # ours, from an attempt the resource refused
            del request.headers["authorization"]
    if aauth or sigv4:
        body = request.content
        # AAuth: the digest of every request, the empty body's too (a resource may ask for it)
        digest = (f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode('ascii')}:"
                  if body or aauth else None)
        covered = ("content-type",) if sigv4 else ("authorization", "content-type")
        cover = {k: v for k, v in request.headers.items() if k.lower() in covered}
        signed = yield Sidecar(Calls.sign(name, request.method, str(request.url), cover, digest, required))
        _apply(request, signed)
    return fingerprint


def _aauth_answered(name: str, request: Any, response: Any, session: dict[str, str] | None) -> None:
    """A signed server's answer: its `AAuth-Access` session token kept (a new one replaces it); a
    401 drops it, and when it names an AAuth requirement the sidecar cannot meet, that is raised
    as an error naming what is missing."""
    if session is None or "signature-key" not in request.headers:
        return
    lines = list(response.headers.multi_items())
    given = access_token(lines)
    if given is not None:
        session[name] = given
    elif response.status_code == 401:
        session.pop(name, None)
        error = refusal(name, response.status_code, lines)
        if error is not None:
            raise error


def _step_up(name: str, request: Any, fingerprint: str | None, scope: str,
             again: Callable[[], Generator[Step, Any, str | None]]) -> Generator[Step, Any, Any]:
    """A `403 insufficient_scope` naming `scope`: tell the sidecar, which raises login_required
    when a login with the wider scope is due (step_up.py). When the login named was renewed
    meanwhile (a step-up already done), send once more with the current one and return that
    answer (its own 403 reported too); else None: the 403 goes back to the caller."""
    answer = yield Sidecar(Calls.step_up(name, fingerprint, scope))
    if not answer["renewed"]:
        return None
    fingerprint = yield from again()
    response = yield Upstream(request)
    scope_again = insufficient_scope(response.status_code, response.headers.get("www-authenticate"))
    if scope_again is not None:
        yield Sidecar(Calls.step_up(name, fingerprint, scope_again))
    return response


def _required_input(request: Any, response: Any) -> tuple[str, ...]:
    """What a signed server's `Signature-Error: error=invalid_input` asks to be covered (the retry
    asks the sidecar to cover it, and the sidecar keeps it for that server's origin)."""
    if "signature-key" not in request.headers or "signature-error" not in response.headers:
        return ()
    from ..signers.aauth_resource import required_input  # only for such a refusal

    return required_input(response.headers.multi_items())


def credential_flow(name: str, request: Any, *, cost: int = 1, max_wait: float = 30.0, on_429: On429 = "wait",
                    session: dict[str, str] | None = None) -> Generator[Step, Any, Any]:
    """Permit + headers, send; on a 401 drop that login and retry once; on a 403
    insufficient_scope tell the sidecar (login_required when a wider login is due, see _step_up);
    on a 429 pause the shared bucket and raise, wait and retry once, or return the answer (per
    `on_429`).
    `session` holds AAuth servers' session tokens (in memory, for this auth's life)."""
    fingerprint = yield from _credentials(name, request, cost, max_wait, session)
    response = yield Upstream(request)
    if response.status_code == 401:
        _aauth_answered(name, request, response, session)  # a requirement we cannot meet: raised now
        required = _required_input(request, response)
        renewed = yield Sidecar(Calls.refused(name, fingerprint))
        if not renewed:  # the same login again would be refused again: hand the 401 back
            return response
        yield from _credentials(name, request, cost, max_wait, session, required)
        response = yield Upstream(request)
    _aauth_answered(name, request, response, session)
    scope = insufficient_scope(response.status_code, response.headers.get("www-authenticate"))
    if scope is not None:
        retried = yield from _step_up(name, request, fingerprint, scope,
                                      lambda: _credentials(name, request, cost, max_wait, session))
        response = response if retried is None else retried
    if response.status_code == 429:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        yield Sidecar(Calls.backoff(name, retry_after))
        if on_429 == "raise":
            raise RateLimited(f"{name}: the upstream answered 429; its bucket is paused for "
                              f"{retry_after:g}s", retry_after)
        if on_429 == "wait" and retry_after <= max_wait:
            yield from _credentials(name, request, cost, max_wait)  # waits out the shared pause
            response = yield Upstream(request)
            if response.status_code == 429:  # tell the others again, then hand it to the caller
                yield Sidecar(Calls.backoff(name, parse_retry_after(response.headers.get("retry-after"))))
    return response


class CredentialsAuth(httpx.Auth):
    """An `httpx.Auth` bound to one server of the sidecar."""

    requires_request_body = True  # a retry after a 401 sends the body again
    # "auto": lease a share where it pays (called fast, for a share worth holding: lease_terms.py);
    # True: whenever called often; False: a round trip per request
    lease: bool | Literal["auto"] = "auto"
    _leaser: AsyncLeaser | None = None
    _sync_leaser: SyncLeaser | None = None

    def __init__(self, client: SidecarClient | None, async_client: AsyncSidecarClient | None, name: str, *,
                 cost: int = 1, max_wait: float = 30.0, on_429: On429 = "wait") -> None:
        self._client = client
        self._async_client = async_client
        self.name = name
        self.cost = cost
        self.max_wait = max_wait
        self.on_429: On429 = on_429
        self._session: dict[str, str] = {}  # an AAuth server's session token (AAuth-Access), memory only
        self._recent: deque[float] = deque(maxlen=1)  # the last calls' times, until a lease holder

    def _flow(self, request: Any) -> Generator[Step, Any, Any]:
        return credential_flow(self.name, request, cost=self.cost, max_wait=self.max_wait,
                               on_429=self.on_429, session=self._session)

    def sync_auth_flow(self, request: Any) -> Generator[Any, Any, None]:
        if self._client is None:
            raise RuntimeError("this auth belongs to an AsyncClient: use it with an async HTTP client")
        flow = self._flow(request)
        step = next(flow)
        try:
            while True:
                if isinstance(step, Sidecar):
                    leased = self._leased_sync(step.call) if self.lease else None
                    step = flow.send(leased if leased is not None else self._client.run(step.call))
                else:
                    response = yield step.request
                    step = flow.send(response)
        except StopIteration:
            return

    async def async_auth_flow(self, request: Any) -> AsyncGenerator[Any, Any]:
        if self._async_client is None:
            raise RuntimeError("this auth belongs to a Client: use it with a sync HTTP client")
        flow = self._flow(request)
        step = next(flow)
        try:
            while True:
                if isinstance(step, Sidecar):
                    leased = await self._leased(step.call) if self.lease else None
                    answer = leased if leased is not None else await self._async_client.run(step.call)
                    step = flow.send(answer)
                else:
                    response = yield step.request
                    step = flow.send(response)
        except StopIteration:
            return


    async def _leased(self, call: Call[Any]) -> dict[str, Any] | None:
        """Permit and headers from this auth's lease, if it holds one. A refusal or a 429 seen by
        the flow drops the leased headers here at once (the sidecar's event follows): a retry
        renews the lease (one renewal for every waiting retry) and gets the new login with it."""
        action = call.path.rpartition("/")[2]
        leaser = self._leaser
        if action != "call":
            if leaser is not None and action in ("invalidate", "backoff"):
                leaser.drop()
            return None
        if leaser is None or leaser.loop is not asyncio.get_running_loop():
            if leaser is None and not self._triggered():
                return None
            from .leaser import AsyncLeaser

            assert self._async_client is not None
            leaser = self._leaser = AsyncLeaser(self._async_client, self.name, trigger=Trigger.of(self.lease))
            leaser.recent.extend(self._recent)
            self._async_client._leasers.append(leaser)
        return await leaser.take(self.cost)

    def _leased_sync(self, call: Call[Any]) -> dict[str, Any] | None:
        """`_leased` for the sync driver (leaser_sync.py)."""
        action = call.path.rpartition("/")[2]
        leaser = self._sync_leaser
        if action != "call":
            if leaser is not None and action in ("invalidate", "backoff"):
                leaser.drop()
            return None
        if leaser is None:
            if not self._triggered():
                return None
            from .leaser_sync import SyncLeaser

            assert self._client is not None
            with self._client._leasers_lock:
                leaser = self._sync_leaser
                if leaser is None:
                    leaser = SyncLeaser(self._client, self.name, trigger=Trigger.of(self.lease))
                    leaser.recent.extend(self._recent)
                    self._sync_leaser = leaser
                    self._client._leasers.append(leaser)
        return leaser.take(self.cost)

    def _triggered(self) -> bool:
        """Note this call: whether this auth is now called often enough to ask for a lease. Until
        then no lease holder is made (nor its module imported): an auth that never leases pays
        nothing for leases. The calls noted go on into the holder's own count."""
        trigger = Trigger.of(self.lease)
        if self._recent.maxlen != trigger.calls:  # (`lease` is set after __init__)
            self._recent = deque(self._recent, maxlen=trigger.calls)
        return called_often(self._recent, time.monotonic(), trigger.seconds)

    async def aclose(self) -> None:
        """Give the lease up now (closing the client does it too)."""
        if self._leaser is not None:
            await self._leaser.aclose()


def _with_httpx2(base: type[CredentialsAuth]) -> type[CredentialsAuth]:
    """The same class, also an `httpx2.Auth` when httpx2 (the MCP SDK 2.x client) is installed."""
    try:
        import httpx2
    except ImportError:
        return base
    return type("CredentialsAuth", (base, httpx2.Auth), {"__module__": __name__, "__doc__": base.__doc__})


if TYPE_CHECKING:
    import httpx2

    class HttpxAuth(CredentialsAuth, httpx2.Auth):  # type: ignore[misc]
        """What `creds.auth()` returns: usable with httpx and with httpx2 (the MCP SDK 2.x)."""
else:
    HttpxAuth = CredentialsAuth

AUTH_CLASS: Final = _with_httpx2(CredentialsAuth)
