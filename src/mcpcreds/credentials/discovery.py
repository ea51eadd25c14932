"""Where is the token endpoint? RFC 8414 / OpenID discovery from an issuer, or RFC 9728
protected-resource metadata from the MCP endpoint. Results are cached and the issuer pinned."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Final, TypeGuard
from urllib.parse import urlsplit, urlunsplit

import httpx

from ..config.model import LOGIN_GRANTS, LoginSpec
from ..config.reader import check_url
from ..core.logs import get_logger
from ..core.scopes import SCOPE_TOKEN, challenge_scope, scope_of
from ..errors import Forbidden, McpcredsError, TokenEndpointError, TokenEndpointTimeout

MAX_METADATA_BYTES: Final = 256 * 1024
MAX_URL_CHARS: Final = 2048  # a URL taken from a document or a header
_VISIBLE_ASCII: Final = re.compile(r"[\x21-\x7e]+")  # urlsplit drops CR, LF and tab silently
_IDENTITY: Final = {"Accept": "application/json", "Accept-Encoding": "identity"}
DISCOVERY_TIMEOUT: Final = 10.0
MAX_LISTED_SCOPES: Final = 1024  # of a metadata's scopes_supported, the ones read
_RESOURCE_METADATA: Final = re.compile(r'resource_metadata\s*=\s*"([^"]+)"')
_log = get_logger("discovery")


def _well_known(url: str, name: str, *, insert: bool) -> str:
    """RFC 8414 inserts `/.well-known/NAME` before the path; OpenID appends it."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    new_path = f"/.well-known/{name}{path}" if insert else f"{path}/.well-known/{name}"
    return urlunsplit((parts.scheme, parts.netloc, new_path, "", ""))


def _covers(resource: str, endpoint: str) -> bool:
    """Whether metadata for `resource` speaks for `endpoint`: the same URL, or a path above it
    on the same origin (a root document of the server)."""
    resource, endpoint = resource.rstrip("/"), endpoint.rstrip("/")
    return endpoint == resource or endpoint.startswith(resource + "/")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def metadata_urls(issuer: str) -> list[str]:
    """Where the issuer's metadata may be, in the MCP authorization spec's order (2025-11-25):
    RFC 8414 with path insertion, OpenID Connect Discovery with path insertion, then OpenID
    Connect's own path appending; for an issuer without a path, the RFC 8414 then the OpenID
    document at the root."""
    urls = [_well_known(issuer, "oauth-authorization-server", insert=True),
            _well_known(issuer, "openid-configuration", insert=True),
            _well_known(issuer, "openid-configuration", insert=False)]
    return list(dict.fromkeys(urls))


def resource_metadata_url(endpoint: str) -> str:
    return _well_known(endpoint, "oauth-protected-resource", insert=True)


def parse_resource_metadata_header(value: str) -> str | None:
    match = _RESOURCE_METADATA.search(value)
    return match.group(1) if match else None


def usable_url(value: object) -> TypeGuard[str]:
    """A URL from a server's answer: a bounded, visible-ASCII string that check_url accepts."""
    return (isinstance(value, str) and len(value) <= MAX_URL_CHARS
            and _VISIBLE_ASCII.fullmatch(value) is not None and check_url(value) is None)


def token_endpoint_from(metadata: Any, issuer: str) -> str:
    """Validate AS metadata (RFC 8414 §3.3: the issuer must match) and return its token endpoint."""
    if not isinstance(metadata, dict):
        raise TokenEndpointError("authorization server metadata is not a JSON object", "invalid_metadata")
    named = metadata.get("issuer")
    if not isinstance(named, str) or named.rstrip("/") != issuer.rstrip("/"):
        raise TokenEndpointError(f"authorization server metadata names another issuer than {issuer}",
                                 "invalid_metadata")
    endpoint = metadata.get("token_endpoint")
    if not usable_url(endpoint):
        raise TokenEndpointError("authorization server metadata has no usable https token_endpoint",
                                 "invalid_metadata")
    return endpoint


def choose_scope(configured: str | None, challenge: str | None, resource_metadata: Any) -> str | None:
    """The scope a person's login asks for (the MCP authorization spec's order): the configured
    one, else the `scope` of the resource's 401 challenge, else the resource's `scopes_supported`
    (RFC 9728), else none (no scope parameter)."""
    if configured:
        return configured
    if challenge:
        return challenge
    supported = resource_metadata.get("scopes_supported") if isinstance(resource_metadata, dict) else None
    if isinstance(supported, list) and all(isinstance(s, str) for s in supported):
        return scope_of(supported)
    return None


def _issuer_in(data: Any, endpoint: str, *, at_root: bool) -> str:
    """The authorization server that protected-resource metadata for `endpoint` names. RFC 9728
    §3.3: metadata for another resource must not be used; a root document may speak for a path
    above the endpoint, any other must name the endpoint itself."""
    resource = data.get("resource") if isinstance(data, dict) else None
    if not isinstance(resource, str) or not (
            _covers(resource, endpoint) if at_root else resource.rstrip("/") == endpoint.rstrip("/")):
        raise TokenEndpointError(f"protected-resource metadata of {endpoint} is for another resource",
                                 "discovery_failed")
    servers = data.get("authorization_servers")
    if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
        raise TokenEndpointError(f"protected-resource metadata of {endpoint} names no "
                                 "authorization server", "discovery_failed")
    issuer = servers[0]
    if not usable_url(issuer):
        raise TokenEndpointError("protected-resource metadata names an unusable issuer URL",
                                 "discovery_failed")
    return issuer


class NoResourceMetadata(TokenEndpointError):
    """The MCP server publishes no protected-resource metadata (RFC 9728) at all."""


@dataclass(frozen=True, slots=True)
class ServerEndpoints:
    """What a login needs of the authorization server (RFC 8414 / OpenID metadata)."""

    issuer: str
    token: str
    device_authorization: str | None
    authorization: str | None
    revocation: str | None
    registration: str | None = None  # RFC 7591
    auth_methods: tuple[str, ...] = ("client_secret_basic",)  # RFC 8414's default when unnamed
    cimd: bool = False  # client_id_metadata_document_supported (Client ID Metadata Documents)
    iss_supported: bool = False  # authorization_response_iss_parameter_supported (RFC 9207)
    scopes: tuple[str, ...] = ()  # the metadata's scopes_supported (valid scope-tokens only)


DEFAULT_AUTH_METHODS: Final = ("client_secret_basic",)


def endpoints_from(metadata: Any, issuer: str) -> ServerEndpoints:
    """The endpoints of validated metadata; an optional endpoint that is not a usable URL is absent.
    The issuer is the one the metadata names (what RFC 9207's `iss` is compared with, and what a
    login and its registration are kept under)."""
    token = token_endpoint_from(metadata, issuer)

    def optional(name: str) -> str | None:
        value = metadata.get(name)
        return value if usable_url(value) else None

    methods = metadata.get("token_endpoint_auth_methods_supported")
    if isinstance(methods, list) and 0 < len(methods) <= 32 and all(isinstance(m, str) for m in methods):
        auth_methods = tuple(m for m in methods if len(m) <= 64)
    else:
        auth_methods = DEFAULT_AUTH_METHODS
    listed = metadata.get("scopes_supported")
    scopes = tuple(x for x in listed[:MAX_LISTED_SCOPES] if isinstance(x, str) and len(x) <= 256
                   and SCOPE_TOKEN.fullmatch(x)) if isinstance(listed, list) else ()
    return ServerEndpoints(metadata["issuer"], token, optional("device_authorization_endpoint"),
                           optional("authorization_endpoint"), optional("revocation_endpoint"),
                           optional("registration_endpoint"), auth_methods,
                           metadata.get("client_id_metadata_document_supported") is True,
                           metadata.get("authorization_response_iss_parameter_supported") is True,
                           scopes)


class Discovery:
    def __init__(self) -> None:
        self._token_urls: dict[tuple[str, str | None, str], str] = {}
        self._issuer_token_urls: dict[str, str] = {}  # an enterprise IdP's, by its issuer
        self.issuers: dict[str, str] = {}  # pinned per resource endpoint

    async def token_url(self, login: LoginSpec, endpoint: str, http: httpx.AsyncClient) -> str:
        if login.token_url:
            return login.token_url
        cache_key = (login.client_id, login.issuer, endpoint)
        if (known := self._token_urls.get(cache_key)) is not None:
            return known
        try:
            issuer = login.issuer or self.issuers.get(endpoint) or await self.issuer_for(endpoint, http)
        except NoResourceMetadata:
            if login.grant not in LOGIN_GRANTS:  # a client secret goes only where metadata points
                raise
            url = (await self.legacy_endpoints(endpoint, http)).token
            self._token_urls[cache_key] = url
            return url
        found = endpoints_from(await self.metadata(issuer, http), issuer)
        url = found.token
        self.issuers.setdefault(endpoint, found.issuer)
        self._token_urls[cache_key] = url
        _log.info("token endpoint discovered", extra={"issuer": issuer, "token_url": url})
        return url

    def forget(self) -> None:
        self._token_urls.clear()
        self._issuer_token_urls.clear()

    def forget_endpoint(self, endpoint: str) -> None:
        """Discover the authorization server of `endpoint` anew (a new login was made with the
        one its metadata names now)."""
        self.issuers.pop(endpoint, None)
        for key in [k for k in self._token_urls if k[2] == endpoint]:
            del self._token_urls[key]

    async def from_issuer(self, issuer: str, http: httpx.AsyncClient) -> str:
        """The token endpoint named by the issuer's metadata (RFC 8414, then OpenID)."""
        return token_endpoint_from(await self.metadata(issuer, http), issuer)

    async def issuer_token_url(self, issuer: str, http: httpx.AsyncClient) -> str:
        """from_issuer, kept until forget() (an enterprise IdP's token endpoint)."""
        if (known := self._issuer_token_urls.get(issuer)) is None:
            known = self._issuer_token_urls[issuer] = await self.from_issuer(issuer, http)
        return known

    async def metadata(self, issuer: str, http: httpx.AsyncClient) -> Any:
        """The issuer's metadata document (RFC 8414, then OpenID), not yet validated."""
        for url in metadata_urls(issuer):
            status, data = await self._get_json(url, http)
            if status == 200:
                return data
        raise TokenEndpointError(f"no authorization server metadata found for issuer {issuer}",
                                 "discovery_failed")

    async def endpoints(self, login: LoginSpec, endpoint: str, http: httpx.AsyncClient) -> ServerEndpoints:
        """Every endpoint a person's login uses: from the configured issuer, else the one the
        resource's metadata names, else (a server without protected-resource metadata, as the
        2025-03-26 MCP spec allowed) the MCP server's origin; a configured token_url wins over
        the metadata's."""
        try:
            issuer = login.issuer or self.issuers.get(endpoint) or await self.issuer_for(endpoint, http)
        except NoResourceMetadata:
            found = await self.legacy_endpoints(endpoint, http)
        else:
            found = endpoints_from(await self.metadata(issuer, http), issuer)
            self.issuers.setdefault(endpoint, found.issuer)
        if login.token_url:
            found = dataclasses.replace(found, token=login.token_url)
        return found

    async def legacy_endpoints(self, endpoint: str, http: httpx.AsyncClient) -> ServerEndpoints:
        """The 2025-03-26 MCP spec's fallback for a server that publishes no protected-resource
        metadata: the authorization server is at the MCP server's origin, found by its metadata
        (RFC 8414, then OpenID), else at the default paths /authorize and /token."""
        origin = _origin(endpoint)
        for url in metadata_urls(origin):
            status, data = await self._get_json(url, http)
            if status == 200:
                found = endpoints_from(data, origin)
                self.issuers.setdefault(endpoint, found.issuer)
                break
        else:
            found = ServerEndpoints(origin, origin + "/token", None, origin + "/authorize", None,
                                    origin + "/register")
        _log.info("no protected-resource metadata: the authorization server is the MCP server's origin",
                  extra={"issuer": origin, "token_url": found.token})
        return found

    async def issuer_for(self, endpoint: str, http: httpx.AsyncClient) -> str:
        """RFC 9728: the resource's metadata names its authorization server. The document is, in
        the MCP authorization spec's order (2025-11-25), the one the endpoint's 401 names
        (`resource_metadata` of its WWW-Authenticate), otherwise the path-based well-known one,
        then the server's root one (which may speak for the whole origin: its `resource` may be
        a path above the endpoint)."""
        header = await self._challenge(endpoint, http)
        named = parse_resource_metadata_header(header) if header else None
        unusable: McpcredsError | None = None
        if named is not None and usable_url(named):
            try:
                status, data = await self._get_json(named, http)
                if status == 200:
                    return _issuer_in(data, endpoint, at_root=False)
                unusable = TokenEndpointError(f"protected-resource metadata of {endpoint} is not where "
                                              "its 401 says", "discovery_failed")
            except (TokenEndpointError, TokenEndpointTimeout, Forbidden) as exc:
                unusable = exc
            # The spec falls back to the well-known URIs when the header names no document; we
            # fall back too when the named one cannot be used (not found, unreachable, refused by
            # the egress policy, too large, for another resource...): the well-known documents
            # are checked the same way, so nothing unchecked is used. Found nowhere, the named
            # document's own failure is the answer.
            _log.info("the protected-resource metadata a 401 names cannot be used: trying the "
                      "well-known URIs", extra={"endpoint": endpoint, "error": type(unusable).__name__})
        urls = {resource_metadata_url(endpoint): False}  # path-based first, then the root
        urls.setdefault(_well_known(_origin(endpoint), "oauth-protected-resource", insert=True), True)
        for url, at_root in urls.items():
            if url == named and unusable is not None:
                continue  # the 401 named it, and it was tried
            try:
                status, data = await self._get_json(url, http)
            except (TokenEndpointError, TokenEndpointTimeout, Forbidden) as exc:
                unusable = unusable or exc  # the first failure is the answer if none is found
                continue
            if status == 200:
                return _issuer_in(data, endpoint, at_root=at_root)
        if unusable is not None:
            raise unusable
        raise NoResourceMetadata(f"{endpoint} publishes no protected-resource metadata; set oauth.token_url "
                                 "or oauth.issuer", "discovery_failed")

    async def login_scope(self, endpoint: str, http: httpx.AsyncClient) -> str | None:
        """The scope the resource asks for, when the config names none (best effort: a resource
        that says nothing, or cannot be reached, means no scope parameter)."""
        try:
            header = await self._challenge(endpoint, http)
            if (scope := challenge_scope(header)) is not None:
                return scope
            named = parse_resource_metadata_header(header) if header else None
            urls = [named] if named is not None and usable_url(named) else []
            root = _well_known(_origin(endpoint), "oauth-protected-resource", insert=True)
            urls += [resource_metadata_url(endpoint), root]  # path-based first, then the root
            for url in dict.fromkeys(urls):
                status, data = await self._get_json(url, http)
                resource = data.get("resource") if isinstance(data, dict) else None
                if status == 200 and isinstance(resource, str) and _covers(resource, endpoint):
                    return choose_scope(None, None, data)
        except (TokenEndpointError, TokenEndpointTimeout):
            pass
        return None

    async def needs_authorization(self, endpoint: str, http: httpx.AsyncClient) -> bool:
        """Whether the MCP server at `endpoint` asks for an OAuth login: an unauthenticated request
        answered 401, or (an answer that is neither 401 nor a success) protected-resource metadata
        (RFC 9728) for it, path-based or at the root, naming an authorization server. A server that
        cannot be reached raises TokenEndpointError: nothing can be said of it."""
        status, _ = await self._probe(endpoint, http)
        if status is None:
            raise TokenEndpointError(f"{endpoint} could not be reached", "temporarily_unavailable")
        if status == 401:
            return True
        if 200 <= status < 300:
            return False
        urls = {resource_metadata_url(endpoint): False}
        urls.setdefault(_well_known(_origin(endpoint), "oauth-protected-resource", insert=True), True)
        for url, at_root in urls.items():
            try:
                found, data = await self._get_json(url, http)
                if found == 200 and _issuer_in(data, endpoint, at_root=at_root):
                    return True
            except (TokenEndpointError, TokenEndpointTimeout, Forbidden):
                continue
        return False

    async def _challenge(self, endpoint: str, http: httpx.AsyncClient) -> str | None:
        """The WWW-Authenticate header of an unauthenticated request to the MCP endpoint."""
        status, header = await self._probe(endpoint, http)
        return header if status == 401 else None

    async def _probe(self, endpoint: str, http: httpx.AsyncClient) -> tuple[int | None, str | None]:
        """The status and WWW-Authenticate header of an unauthenticated `ping` to the MCP
        endpoint; (None, None) when no answer came."""
        try:  # only the head is read: the body of a hostile server could be endless
            async with asyncio.timeout(DISCOVERY_TIMEOUT), \
                    http.stream("POST", endpoint, json={"jsonrpc": "2.0", "id": 0, "method": "ping"},
                                headers={"Accept": "application/json, text/event-stream"},
                                follow_redirects=False, timeout=DISCOVERY_TIMEOUT) as response:
                return response.status_code, response.headers.get("www-authenticate")
        except (httpx.HTTPError, httpx.InvalidURL, TimeoutError):
            return None, None

    async def _get_json(self, url: str, http: httpx.AsyncClient) -> tuple[int, Any]:
        # httpx's timeout bounds each read; the whole fetch is bounded too (a byte every few
        # seconds would otherwise hold every caller of this login for as long as it likes)
        try:
            async with asyncio.timeout(DISCOVERY_TIMEOUT):
                return await self._read_json(url, http)
        except TimeoutError:
            raise TokenEndpointTimeout(f"metadata at {url} did not arrive in time") from None

    async def _read_json(self, url: str, http: httpx.AsyncClient) -> tuple[int, Any]:
        try:
            async with http.stream("GET", url, headers=_IDENTITY, follow_redirects=False,
                                   timeout=DISCOVERY_TIMEOUT) as response:
                if response.status_code != 200:
                    return response.status_code, None
                if response.headers.get("content-encoding", "identity").lower() != "identity":
                    # decoding is not bounded per chunk: a small gzip body can expand a thousandfold
                    raise TokenEndpointError(f"metadata at {url} is compressed", "invalid_metadata")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_METADATA_BYTES:
                        raise TokenEndpointError(f"metadata at {url} is too large", "invalid_metadata")
                    chunks.append(chunk)
                try:
                    return 200, json.loads(b"".join(chunks))
                except (ValueError, RecursionError):  # RecursionError: nested too deep
                    raise TokenEndpointError(f"metadata at {url} is not JSON", "invalid_metadata") from None
        except httpx.TimeoutException:
            raise TokenEndpointTimeout(f"metadata at {url} did not arrive in time") from None
        except httpx.HTTPError as exc:
            raise TokenEndpointError(f"metadata at {url} unreachable ({type(exc).__name__})",
                                     "temporarily_unavailable") from None
        except httpx.InvalidURL:
            raise TokenEndpointError(f"metadata at {url} cannot be requested (InvalidURL)",
                                     "discovery_failed") from None
