"""`mcpcreds login NAME` and `mcpcreds logout NAME`: the I/O around the pure flows
(device_flow.py, authcode_flow.py): discovery, the requests, the poll loop, the one-shot
loopback listener, the keyring, and the notice to a running sidecar.

Everything a person must read goes to stderr; no token (access, refresh, device code, code,
verifier) is ever printed or logged."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import sys
import time
import webbrowser
from collections.abc import Awaitable, Callable
from typing import Any, Final, TextIO
from urllib.parse import urlsplit

import httpx

from ..config.model import LOGIN_GRANTS, Config, LoginSpec, Target
from ..core.logs import get_logger
from ..core.scopes import MAX_STEP_UPS, union, with_offline_access
from ..credentials.authcode_flow import (
    CALLBACK_PATH,
    AuthRequest,
    authorization_request,
    code_from_redirect,
    is_metadata_document_url,
    loopback_port,
    may_register,
    parse_registration,
    redirect_uri_for,
    registration_body,
    registration_method,
    uses_metadata_document,
)
from ..credentials.device_flow import (
    DEVICE_GRANT,
    DeviceAuthorization,
    PollSchedule,
    parse_device_authorization,
)
from ..credentials.discovery import Discovery, ServerEndpoints
from ..credentials.login_store import LoginStore, Registration, StoredLogin, entry_name, login_store
from ..credentials.oauth import (
    MAX_RESPONSE_BYTES,
    TOKEN_TIMEOUT,
    authenticated_request,
    build_token_request,
    send_token_request,
)
from ..credentials.sources import SecretResolver
from ..credentials.tokens import Token
from ..errors import InvalidRequest, McpcredsError, TokenEndpointError, TokenEndpointTimeout
from ..net.egress_http import egress_client
from .common import tell_sidecar
from .sso import cmd_sso_login, cmd_sso_logout, sso_target

MAX_WAIT: Final = 3600.0  # --timeout: at most an hour
DEFAULT_WAIT: Final = 300.0
MAX_REQUEST_HEAD: Final = 16 * 1024
_PAGE_OK: Final = b"<!doctype html><title>mcpcreds</title><p>Login received. You may close this window."
_PAGE_FAILED: Final = b"<!doctype html><title>mcpcreds</title><p>Login failed: see the terminal."

Sleep = Callable[[float], Awaitable[None]]
# a person's client for a redirect URI: the LoginSpec (client id, method) and its credential
ClientFor = Callable[[str], Awaitable[tuple[LoginSpec, str | None]]]
_log = get_logger("login")


def login_target(config: Config, name: str) -> Target:
    target = config.target(name)
    if target is None:
        raise InvalidRequest("unknown server: no configured server or cache key has that name")
    if target.login is None or target.login.grant not in LOGIN_GRANTS:
        raise InvalidRequest(f"{target.name} has no person's login (auth kind = 'oauth2' with grant = "
                             "'device' or 'authorization_code'); nothing to log in to")
    return target


def _credential(config: Config, target: Target) -> str | None:
    login = target.login
    assert login is not None
    if not login.client_id:  # no client configured: the registered one's, if any
        return None
    template = login.private_key or login.client_secret
    if template is None:
        return None
    return SecretResolver.from_config(config.secrets).render(template)


async def _post_form(http: httpx.AsyncClient, url: str, headers: dict[str, str],
                     body: str) -> tuple[int, bytes]:
    """A bounded form POST, no redirects; errors never quote what was sent."""
    try:
        async with http.stream("POST", url, headers=headers, content=body.encode(), follow_redirects=False,
                               timeout=TOKEN_TIMEOUT) as response:
            if response.headers.get("content-encoding", "identity").lower() != "identity":
                raise TokenEndpointError(f"{url} answered with a compressed body", "invalid_response")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise TokenEndpointError("answer too large", "response_too_large")
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)
    except httpx.TimeoutException:
        raise TokenEndpointError(f"{url} did not answer in time", "temporarily_unavailable") from None
    except httpx.HTTPError as exc:
        raise TokenEndpointError(f"{url} unreachable ({type(exc).__name__})",
                                 "temporarily_unavailable") from None


# ---------------------------------------------------------------------------- device flow


async def device_login(http: httpx.AsyncClient, target: Target, ends: ServerEndpoints,
                       credential: str | None, out: TextIO, sleep: Sleep = asyncio.sleep,
                       clock: Callable[[], float] = time.monotonic) -> tuple[Token, dict[str, str]]:
    """RFC 8628: ask for a user code, show it, poll until approved. Returns (the token, extras
    with the refresh token, if one was issued)."""
    login = target.login
    assert login is not None
    if ends.device_authorization is None:
        raise TokenEndpointError(f"the authorization server {ends.issuer} advertises no "
                                 "device_authorization_endpoint", "unsupported_grant_type")
    form = {k: v for k, v in (("scope", login.scope), ("resource", login.resource),
                              ("audience", login.audience)) if v}
    request = authenticated_request(login, ends.device_authorization, credential, form, issuer=ends.issuer)
    status, body = await _post_form(http, request.url, request.headers, request.body)
    auth: DeviceAuthorization = parse_device_authorization(status, body)
    out.write(f"To log in to {target.name}, open {auth.verification_uri} and enter the code "
              f"{auth.user_code}\n")
    if auth.verification_uri_complete:
        out.write(f"(or open {auth.verification_uri_complete})\n")
    out.write(f"Waiting for the approval (the code expires in {auth.expires_in:.0f}s)...\n")
    out.flush()
    schedule = PollSchedule(clock(), auth)
    at = schedule.first()
    while True:
        await sleep(max(0.0, at - clock()))
        token_request = build_token_request(login, ends.token, credential, issuer=ends.issuer,
                                            grant_type=DEVICE_GRANT, params={"device_code": auth.device_code})
        extras: dict[str, str] = {}
        try:
            token = await send_token_request(http, token_request, time.time(), login.expires_in_default,
                                             extras=extras)
        except TokenEndpointError as exc:
            at = schedule.after(exc.error, clock())
            continue
        except TokenEndpointTimeout:
            at = schedule.after("temporarily_unavailable", clock())
            continue
        return token, extras


# ---------------------------------------------------------------------------- authorization code


class LoopbackListener:
    """One redirect on 127.0.0.1 (an ephemeral port): requests to other paths get 404 and are not
    counted; the first request to the callback path settles the login (its state checked
    exactly), is answered, and the listener closes."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self.port = 0
        self._check: Callable[[str], str] | None = None
        self.result: asyncio.Future[str] | None = None

    async def start(self, port: int = 0) -> int:
        """Listen on `port` (0: one the kernel picks); OSError when it is taken."""
        self.result = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port, limit=MAX_REQUEST_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def expect(self, check: Callable[[str], str]) -> None:
        self._check = check

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            parts = urlsplit(target)
            if method != "GET" or parts.path != CALLBACK_PATH or self.result is None or self.result.done():
                await self._answer(writer, 404, b"not found")
                return
            assert self._check is not None
            try:
                code = self._check(parts.query)
            except McpcredsError as exc:
                self.result.set_exception(exc)
                await self._answer(writer, 400, _PAGE_FAILED)
            else:
                self.result.set_result(code)
                await self._answer(writer, 200, _PAGE_OK)
            self.close()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def code_login(http: httpx.AsyncClient, target: Target, ends: ServerEndpoints,
                     credential: str | None, out: TextIO, open_browser: bool,
                     wait: float, client_for: ClientFor | None = None,
                     port: int = 0) -> tuple[Token, dict[str, str]]:
    """Authorization code + PKCE S256 with a loopback redirect (RFC 8252) on `port` (0: any);
    `client_for` (a registered client) gives the client for the redirect URI once it is known."""
    login = target.login
    assert login is not None
    if ends.authorization is None:
        raise TokenEndpointError(f"the authorization server {ends.issuer} advertises no "
                                 "authorization_endpoint", "unsupported_grant_type")
    listener = LoopbackListener()
    try:
        port = await listener.start(port)
    except OSError:
        if not port:
            raise
        port = await listener.start()
    try:
        if client_for is not None:
            login, credential = await client_for(redirect_uri_for(port))
        request: AuthRequest = authorization_request(ends.authorization, login.client_id,
                                                     redirect_uri_for(port), login.scope, login.resource,
                                                     issuer=ends.issuer, iss_required=ends.iss_supported)
        listener.expect(lambda query: code_from_redirect(query, request))
        out.write(f"To log in to {target.name}, open this URL in a browser:\n{request.url}\n")
        out.write(f"Waiting for the redirect to {request.redirect_uri} ...\n")
        out.flush()
        if open_browser:
            with contextlib.suppress(Exception):
                webbrowser.open(request.url)
        assert listener.result is not None
        try:
            code = await asyncio.wait_for(asyncio.shield(listener.result), wait)
        except TimeoutError:
            raise TokenEndpointError(f"no redirect arrived within {wait:g}s; run the login again",
                                     "login_timeout") from None
    finally:
        listener.close()
    token_request = build_token_request(login, ends.token, credential, issuer=ends.issuer,
                                        grant_type="authorization_code",
                                        params={"code": code, "redirect_uri": request.redirect_uri,
                                                "code_verifier": request.verifier})
    extras: dict[str, str] = {}
    token = await send_token_request(http, token_request, time.time(), login.expires_in_default,
                                     extras=extras)
    return token, extras


# ---------------------------------------------------------------------------- dynamic client registration


async def register_client(http: httpx.AsyncClient, ends: ServerEndpoints, redirect_uri: str) -> Registration:
    """RFC 7591: register mcpcreds as a native client for `redirect_uri` (the loopback listener's
    actual one: a server need not accept any port)."""
    if ends.registration is None:
        raise TokenEndpointError(f"no client_id is configured and the authorization server {ends.issuer} "
                                 "offers no registration_endpoint: configure the client_id registered "
                                 "there", "registration_unavailable")
    method = registration_method(ends.auth_methods)
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               "Accept-Encoding": "identity"}
    status, body = await _post_form(http, ends.registration, headers, registration_body(redirect_uri, method))
    registration = parse_registration(status, body, method, ends.issuer, redirect_uri)
    _log.info("client registered", extra={"issuer": ends.issuer, "client_id": registration.client_id,
                                          "auth_method": registration.auth_method})
    return registration


def registered_login(login: LoginSpec, registration: Registration) -> LoginSpec:
    return dataclasses.replace(login, client_id=registration.client_id, auth_method=registration.auth_method)


# ---------------------------------------------------------------------------- login, logout


async def run_login(config: Config, target: Target, out: TextIO, open_browser: bool, wait: float,
                    store: LoginStore | None = None, client: httpx.AsyncClient | None = None) -> StoredLogin:
    """The whole login: discovery, the scope, the client (configured, or registered: RFC 7591),
    the flow, and the login into `store` (the configured keyring): its refresh token, else its
    access token and expiry; `client` (tests) replaces the egress-checked HTTP client."""
    login = target.login
    assert login is not None
    store = store or login_store(config.secrets)
    # a keyring that fails, fails before the login; a registration stored there is reused
    previous = await asyncio.to_thread(store.get, target.key)
    registration: Registration | None = None
    credential = await asyncio.to_thread(_credential, config, target)
    async with client or egress_client(target.egress) as http:
        discovery = Discovery()
        ends = await discovery.endpoints(login, target.endpoint, http)
        step_up = previous.step_up if previous is not None else None
        if step_up is not None:  # a resource answered 403 insufficient_scope (the sidecar recorded it)
            login = dataclasses.replace(login, scope=union(login.scope, step_up) or step_up)
            target = dataclasses.replace(target, login=login)
            out.write(f"scope (a step-up: {target.endpoint} asked for more): {login.scope}\n")
        elif login.scope is None and (scope := await discovery.login_scope(target.endpoint, http)):
            out.write(f"scope (asked for by {target.endpoint}): {scope}\n")
            login = dataclasses.replace(login, scope=scope)
            target = dataclasses.replace(target, login=login)
        if (wider := with_offline_access(login.scope, ends.scopes)) != login.scope:
            out.write(f"scope: {wider} ({ends.issuer} lists offline_access: asked for a refresh token)\n")
            login = dataclasses.replace(login, scope=wider)
            target = dataclasses.replace(target, login=login)
        if login.grant == "device":
            token, extras = await asyncio.wait_for(device_login(http, target, ends, credential, out),
                                                   MAX_WAIT)
        elif uses_metadata_document(login.client_id, ends.cimd, ends.registration is not None):
            if is_metadata_document_url(login.client_id) and ends.cimd:
                out.write(f"client: the metadata document {login.client_id} ({ends.issuer} supports "
                          "Client ID Metadata Documents)\n")
            token, extras = await code_login(http, target, ends, credential, out, open_browser, wait)
        else:
            reuse = previous.registration if previous is not None else None
            if reuse is not None and reuse.issuer != ends.issuer:
                # registrations are per authorization server: the server's changed, so a new one
                out.write(f"{target.endpoint} names another authorization server ({ends.issuer}) than "
                          "the one this login registered at: registering anew\n")
                reuse = None
            registration = reuse

            async def client_for(redirect_uri: str) -> tuple[LoginSpec, str | None]:
                nonlocal registration
                if registration is None or registration.redirect_uri != redirect_uri:
                    registration = await register_client(http, ends, redirect_uri)
                    out.write(f"registered as client {registration.client_id} at {ends.issuer}\n")
                return registered_login(login, registration), registration.client_secret

            port = loopback_port(reuse.redirect_uri) if reuse is not None else None
            token, extras = await code_login(http, target, ends, None, out, open_browser, wait,
                                             client_for=client_for, port=port or 0)
            assert registration is not None
    client_id = registration.client_id if registration is not None else login.client_id
    refresh = extras.get("refresh_token")
    step_ups = min(previous.step_ups + 1, MAX_STEP_UPS) if previous is not None and step_up else 0
    if refresh is not None:
        stored = StoredLogin(refresh, client_id, registration=registration, scope=login.scope,
                             step_ups=step_ups, issuer=ends.issuer)
    else:  # the login lasts as long as its access token
        stored = StoredLogin(None, client_id, token.access_token, token.expires_at, registration,
                             scope=login.scope, step_ups=step_ups, issuer=ends.issuer)
    # the first secret of a desktop without a login keyring: the keyring may ask the person to make
    # one (or to unlock it) now, after the browser step: the write waits for them
    await asyncio.to_thread(functools.partial(store.put, target.key, stored, person=True))
    return stored


async def run_logout(config: Config, target: Target, out: TextIO) -> bool:
    """Revoke the refresh token (RFC 7009, when the server advertises revocation) and delete it.
    Returns whether a login was stored."""
    login = target.login
    assert login is not None
    store = login_store(config.secrets)
    stored = await asyncio.to_thread(store.get, target.key)
    if stored is None:
        return False
    try:
        credential = await asyncio.to_thread(_credential, config, target)
        if may_register(login.client_id) and stored.registration is not None \
                and stored.registration.client_id == stored.client_id:
            credential = stored.registration.client_secret
            login = registered_login(login, stored.registration)
        kind = "refresh_token" if stored.refresh_token is not None else "access_token"
        async with egress_client(target.egress) as http:
            ends = await Discovery().endpoints(login, target.endpoint, http)
            if ends.revocation is not None:
                request = authenticated_request(
                    login, ends.revocation, credential,
                    {"token": stored.refresh_token or stored.access_token or "", "token_type_hint": kind},
                    issuer=ends.issuer)
                status, _ = await _post_form(http, request.url, request.headers, request.body)
                out.write(f"{kind.replace('_', ' ')} revoked\n" if status == 200 else
                          f"the revocation endpoint answered HTTP {status}; deleting the login anyway\n")
            else:
                out.write("the authorization server advertises no revocation endpoint; deleting the "
                          "login only\n")
    except McpcredsError as exc:
        out.write(f"could not revoke ({exc.code}); deleting the login anyway\n")
    await asyncio.to_thread(store.delete, target.key)
    return True


# ---------------------------------------------------------------------------- command line


def cmd_login(args: argparse.Namespace) -> int:
    from .common import config_of

    config = config_of(args)
    if (sso := sso_target(config, args.name)) is not None:  # auth kind "aws", source "sso" (aws_sso.py)
        return cmd_sso_login(args, config, sso)
    target = login_target(config, args.name)
    wait = args.timeout
    if not 0 < wait <= MAX_WAIT:
        raise InvalidRequest(f"--timeout: from 1 to {MAX_WAIT:g} seconds")
    stored = asyncio.run(run_login(config, target, sys.stderr, open_browser=not args.no_browser, wait=wait))
    if stored.refresh_token is not None:
        print(f"logged in: {target.name} ({target.key}); the refresh token is in the keyring as "
              f"{entry_name(target.key)}", file=sys.stderr)
    else:
        left = max(0, round((stored.expires_at or 0) - time.time()))
        print(f"logged in: {target.name} ({target.key}); the authorization server issued no refresh "
              f"token, so the login lasts as long as its access token ({left}s; then run "
              f"`mcpcreds login {target.name}` again); it is in the keyring as {entry_name(target.key)}",
              file=sys.stderr)
    tell_sidecar(args, target, logout=False)
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    from .common import config_of

    config = config_of(args)
    if (sso := sso_target(config, args.name)) is not None:
        return cmd_sso_logout(args, config, sso)
    target = login_target(config, args.name)
    if not asyncio.run(run_logout(config, target, sys.stderr)):
        print(f"{target.name}: no login stored", file=sys.stderr)
        return 1
    print(f"logged out: {target.name} ({target.key})", file=sys.stderr)
    tell_sidecar(args, target, logout=True)
    return 0


def add_parsers(add_client: Callable[..., Any]) -> None:
    p = add_client("login", cmd_login,
                   "log in as a person (grant = 'device' or 'authorization_code'); the refresh token goes "
                   "to the keyring and the sidecar renews the login from it")
    p.add_argument("name", metavar="NAME", help="server name or cache key")
    p.add_argument("--no-browser", action="store_true",
                   help="authorization code: print the URL and wait on the loopback redirect; never open "
                        "a browser")
    p.add_argument("--timeout", type=float, default=DEFAULT_WAIT, metavar="S",
                   help=f"seconds to wait for the redirect (default {DEFAULT_WAIT:g})")
    p = add_client("logout", cmd_logout, "revoke (RFC 7009, when offered) and delete a person's login")
    p.add_argument("name", metavar="NAME", help="server name or cache key")


