"""A property-based fuzz of the socket API, driven by the shipped OpenAPI document (issue #13).

Hypothesis draws batches of requests from the document: every operation with path parameters
(configured names, cache keys, unknown and invalid names), request bodies built from the
document's request schemas, and deliberately malformed variants (wrong types, out-of-range and
non-finite numbers, huge strings, unknown fields, deep nesting, bad JSON, random methods and
paths, bad grants, and raw HTTP that no parser should accept). Each batch goes to one real
sidecar process over its Unix socket, whose config holds static servers, OAuth logins against the
fault IdP (one that works, one refused, one stalled, one that answers garbage), rates, a catalog
entry, a missing secret, a proxy-only and a headers-only server, and behind every server a real MCP
server (the gateway peer), so the routes, the gateway (`/mcp/{server}`: JSON-RPC messages and
batches, sessions, SSE) included, reach real code. Every answer must:

- have a status the document lists for that operation; a request the document does not describe
  gets one of the generic error statuses (400/403/404/405), and malformed HTTP, a head over 16 KiB
  or a body over 64 KiB exactly the one it calls for (400, 431, 413); never 500;
- carry a body valid against the document's schema for that status, with one of its documented
  media types (an event stream: every message event a JSON-RPC body; undocumented error answers:
  the `Error` schema, with the code that belongs to the status);
- hold no canary secret (the OAuth client secrets never; the static key only inside the `headers`
  a caller asked for, never in what the gateway relays; the proxy-only bearer never), no access
  token or grant outside the answer that hands it out, and no name the caller sent that is not a
  configured one (every unknown name carries `echo-`);

and after each batch `GET /v1/health` answers 200. CI runs a tour of every operation (an explicit
example) and a bounded, derandomized number of batches (about 290 cases, a few seconds);
`python bench/api_fuzz.py` runs the same generator and checks for 100,000 cases and more. What the
fuzz found in src is fixed, and each has a minimal reproduction here (`test_known_*`).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import string
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no stubs installed
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from mcpcreds.sidecar.wire import MAX_BODY_BYTES, MAX_HEAD_BYTES
from tests.peers.fault_idp import FaultIdp, fault_idp
from tests.peers.mcp_gateway_peer import start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

DOC: Final[dict[str, Any]] = json.loads((files("mcpcreds") / "openapi.json").read_text(encoding="utf-8"))
DOC_URI: Final = "urn:mcpcreds:openapi"
# referencing marks Resource with a pre-PEP 681 dataclass transform that mypy does not read
REGISTRY: Final = Registry().with_resource(DOC_URI, Resource(contents=DOC, specification=DRAFT202012))  # type: ignore[call-arg]
HTTP_METHODS: Final = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
MAX_HEAD: Final = MAX_HEAD_BYTES
MAX_BODY: Final = MAX_BODY_BYTES

# --------------------------------------------------------------------------- the sidecar

CANARY_STATIC: Final = "canary-static-4f1d9a0b7c2e8d35b6a1"
CANARY_CLIENT: Final = "canary-client-secret-9c3e71d0a4b25f68"
CANARY_OTHER: Final = "canary-other-secret-5e2b8f01c7d9a346"  # the client secret of the failing logins
# a static bearer of a server with `expose = "proxy"`: no answer may ever hold it (the MCP peer takes
# bearers with the prefix of the fault IdP's tokens, so a leak of it is a leak of "fault-token")
CANARY_PROXY: Final = "fault-token-proxy-canary-0d6c2a9e4b71f385"
SECRET_FILES: Final = {"FUZZ_STATIC_KEY": CANARY_STATIC, "FUZZ_CLIENT_SECRET": CANARY_CLIENT,
                       "FUZZ_OTHER_SECRET": CANARY_OTHER, "FUZZ_PROXY_TOKEN": CANARY_PROXY}
# rotated to themselves only: the MCP peer takes these values and no other
FIXED_SECRETS: Final = {"FUZZ_STATIC_KEY": CANARY_STATIC, "FUZZ_PROXY_TOKEN": CANARY_PROXY}
SERVERS: Final = ("static", "rated", "halted", "oauth", "broken", "stalled", "garbled", "nosecret", "crm-ro",
                  "proxied", "direct")
KEYS: Final = ("service:crm", "mcp:static", "mcp:rated", "mcp:oauth", "mcp:stalled", "mcp:nosecret",
               "mcp:proxied")
MISSING: Final = "FUZZ_MISSING"  # no source has it (`rotate` is sent without force: nothing can test it)
SECRETS: Final = ("FUZZ_STATIC_KEY", "FUZZ_CLIENT_SECRET", "FUZZ_OTHER_SECRET", "FUZZ_PROXY_TOKEN", MISSING)
CLIENT_SECRETS: Final = (("the OAuth client secret", CANARY_CLIENT), ("the OAuth client secret", CANARY_OTHER))
ECHO: Final = "echo-"  # every name the fuzz makes up carries this; no answer may repeat it
HALTED: Final = "halted"  # the one server a fuzz case may pause for longer than any max_wait
TOKEN_PREFIX: Final = "fault-token-"  # every access token the fault IdP hands out, and the proxy bearer

CONFIG: Final = """
[sidecar]
socket = "{socket}"
request_timeout = "10s"
idle_timeout = "120s"
token_timeout = "1s"
max_grants = 48
max_subgrants = 4
audit_log = "{root}/audit.jsonl"

[secrets]
sources = ["dir:{root}/secrets"]

[services.crm]
endpoint = "{catalog}"
rate = "50/1s"
tags = ["sensitive"]
[services.crm.oauth]
token_url = "{idp}/token"
client_id = "fuzz-crm"
client_secret = "{{{{secret:FUZZ_CLIENT_SECRET}}}}"

[[servers]]
name = "crm-ro"
service = "crm"

[[servers]]
name = "static"
endpoint = "{mcp}"
headers = {{ "X-Api-Key" = "{{{{secret:FUZZ_STATIC_KEY}}}}" }}
trust = "trusted"

[[servers]]
name = "rated"
endpoint = "{mcp}"
auth = {{ kind = "static", header = "X-Api-Key", value = "{{{{secret:FUZZ_STATIC_KEY}}}}" }}
rate = "20/1s"

[[servers]]
name = "halted"
endpoint = "{mcp}"
headers = {{ "X-Api-Key" = "{{{{secret:FUZZ_STATIC_KEY}}}}" }}
rate = "5/1s"

[[servers]]
name = "oauth"
endpoint = "{mcp}"
tags = ["egress"]
tool_allowlist = ["echo", "add", "leak"]
oauth = {{ token_url = "{idp}/token", client_id = "fuzz-oauth", client_secret = "{{{{secret:FUZZ_CLIENT_SECRET}}}}" }}

[[servers]]
name = "broken"
endpoint = "{mcp}"
oauth = {{ token_url = "{idp}/token/invalid_client", client_id = "fuzz", client_secret = "{{{{secret:FUZZ_OTHER_SECRET}}}}" }}

[[servers]]
name = "stalled"
endpoint = "{mcp}"
oauth = {{ token_url = "{idp}/token/stall", client_id = "fuzz", client_secret = "{{{{secret:FUZZ_OTHER_SECRET}}}}" }}

[[servers]]
name = "garbled"
endpoint = "{mcp}"
oauth = {{ token_url = "{idp}/token/garbage", client_id = "fuzz", client_secret = "{{{{secret:FUZZ_OTHER_SECRET}}}}" }}

[[servers]]
name = "nosecret"
endpoint = "{mcp}"
headers = {{ "X-Api-Key" = "{{{{secret:FUZZ_MISSING}}}}" }}

[[servers]]
name = "proxied"
endpoint = "{mcp}"
auth = {{ kind = "static", token = "{{{{secret:FUZZ_PROXY_TOKEN}}}}" }}
expose = "proxy"

[[servers]]
name = "direct"
endpoint = "{mcp}"
headers = {{ "X-Api-Key" = "{{{{secret:FUZZ_STATIC_KEY}}}}" }}
expose = "headers"
"""


@dataclass
class FuzzTarget:
    """The sidecar under fuzz: its socket, its process and the fault IdP it logs in at."""

    socket: Path
    sidecar: SidecarProcess
    idp: FaultIdp
    root: Path

    def logs(self) -> str:
        """Everything the sidecar wrote: its log lines and its audit log."""
        audit = self.root / "audit.jsonl"
        return self.sidecar.log + (audit.read_text(errors="replace") if audit.exists() else "")


@contextmanager
def fuzz_sidecar(root: Path) -> Iterator[FuzzTarget]:
    """A real `mcpcreds serve` on a temp socket, its secrets in a `dir:` source (so `rotate`
    has somewhere to store), its logins at a fault IdP on loopback, every server's endpoint a real
    MCP server (the MCP SDK's, behind the gateway) that takes the fault IdP's tokens and the static key."""
    secrets = root / "secrets"
    secrets.mkdir(mode=0o700)
    for name, value in SECRET_FILES.items():
        fd = os.open(secrets / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
    sock = root / "run" / "s.sock"
    config = root / "config.toml"
    with fault_idp() as idp, start_gateway_peer(TOKEN_PREFIX, CANARY_STATIC) as mcp:
        # the catalog entry's host spelt `localhost`: the stand-alone servers at the `127.0.0.1` URL
        # keep keys, logins and buckets of their own (under the entry's URL, the tag floor would hold them)
        config.write_text(CONFIG.format(socket=sock, root=root, idp=idp.base, mcp=mcp.url,
                                        catalog=mcp.url.replace("127.0.0.1", "localhost")))
        with run_sidecar(config, sock) as sidecar:
            yield FuzzTarget(sock, sidecar, idp, root)


# --------------------------------------------------------------------------- cases

GRANT_ID: Final = "{live-grant}"  # replaced, when sent, by the id of a grant minted in the batch
FINGERPRINT: Final = "{live-fingerprint}"  # ... by the fingerprint of the last login answered
SESSION: Final = "{live-session}"  # ... by the MCP session the gateway last answered with


@dataclass(frozen=True)
class Case:
    """One request. `template` is the documented path it was made from, when the request is one
    the document describes (a conforming path parameter); None for anything else."""

    method: str
    target: str
    template: str | None = None
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    grant: int | None = None  # send `Authorization: Bearer` + a grant minted in the batch
    authorization: str | None = None  # or this Authorization value, as it is
    chunked: bool = False
    raw: bytes | None = None  # the whole request, sent as is on its own connection
    expect: frozenset[int] | None = None  # the only statuses allowed, when the case decides them

    def describe(self) -> str:
        if self.raw is not None:
            return f"raw {self.raw[:300]!r}{'...' if len(self.raw) > 300 else ''} ({len(self.raw)} bytes)"
        body = f" body {self.body[:200]!r}{'...' if len(self.body) > 200 else ''} ({len(self.body)} bytes)"
        auth = f" grant#{self.grant} (if the batch holds one)" if self.grant is not None else (
            f" Authorization {self.authorization[:80]!r}" if self.authorization is not None else "")
        extra = f" headers {self.headers!r}"[:300] if self.headers else ""
        return f"{self.method} {self.target[:300]}{auth}{extra}{' chunked' if self.chunked else ''}{body}"


def _resolve(ref: str) -> Any:
    node: Any = DOC
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _deref(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = _resolve(node["$ref"])
    return node


def operations() -> list[tuple[str, str, dict[str, Any], list[dict[str, Any]]]]:
    """(method, path template, operation, path parameters) for every documented operation."""
    ops = []
    for path, item in DOC["paths"].items():
        shared = [_deref(p) for p in item.get("parameters", [])]
        for method in HTTP_METHODS:
            if method in item:
                op = item[method]
                ops.append((method.upper(), path, op, shared + [_deref(p) for p in op.get("parameters", [])]))
    return ops


OPERATIONS: Final = operations()
OPERATION_BY_KEY: Final = {(m, p): op for m, p, op, _ in OPERATIONS}


# -- values from the document's schemas


@cache
def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) \
        | st.text(max_size=20)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def from_schema(schema: dict[str, Any], overrides: dict[str, st.SearchStrategy[Any]],
                path: str = "") -> st.SearchStrategy[Any]:
    """Values valid against `schema` (the subset of JSON Schema the document's request bodies
    use). `overrides` replaces the strategy at a dotted path (`max_wait`, `servers`)."""
    if path in overrides:
        return overrides[path]
    schema = _deref(schema)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    types = schema.get("type", "object")
    if isinstance(types, str):
        types = [types]
    low, high = schema.get("minimum"), schema.get("maximum")
    options: list[st.SearchStrategy[Any]] = []
    for kind in types:
        if kind == "null":
            options.append(st.none())
        elif kind == "boolean":
            options.append(st.booleans())
        elif kind == "integer":
            options.append(st.integers(low, high))
        elif kind == "number":
            options.append(st.integers(math.ceil(low) if low is not None else None,
                                       math.floor(high) if high is not None else None)
                           | st.floats(low, high, allow_nan=False, allow_infinity=False))
        elif kind == "string":
            options.append(st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 40)))
        elif kind == "array":
            items = from_schema(schema.get("items", {}), overrides, path + "[]")
            options.append(st.lists(items, min_size=schema.get("minItems", 0),
                                    max_size=min(schema.get("maxItems", 6), 6),
                                    unique=bool(schema.get("uniqueItems"))))
        elif kind == "object":
            props = schema.get("properties", {})
            required = set(schema.get("required", ()))
            dotted = f"{path}." if path else ""
            options.append(st.fixed_dictionaries(
                {k: from_schema(v, overrides, dotted + k) for k, v in props.items() if k in required},
                optional={k: from_schema(v, overrides, dotted + k) for k, v in props.items() if k not in required}))
    return st.one_of(options)


@cache
def _names_of(kind: str) -> st.SearchStrategy[str]:
    """Path parameter values: configured ones, unknown ones (marked `echo-`), invalid ones."""
    known = st.sampled_from(SERVERS + KEYS) if kind == "server" else st.sampled_from(SECRETS)
    unknown = st.one_of(
        st.from_regex(r"echo-[A-Za-z0-9_.-]{0,40}", fullmatch=True),
        st.text(max_size=30).map(lambda t: ECHO + t),
        st.sampled_from(["service:echo-nx", "mcp:echo-nx", "echo-:", "echo-%", "echo-/..", "echo-\x00",
                         "echo-" + "x" * 200, "echo-\u202e\u200b", "echo-{{secret:FUZZ_STATIC_KEY}}"]),
        st.integers(1, 12_000).map(lambda n: ECHO + "n" * n),
    )
    return st.one_of(known, known, known, unknown)


@cache
def _grant_ids() -> st.SearchStrategy[str]:
    return st.one_of(st.just(GRANT_ID), st.just(GRANT_ID),
                     st.from_regex(r"echo-[A-Za-z0-9_-]{0,20}", fullmatch=True),
                     st.text(min_size=1, max_size=20).map(lambda t: ECHO + t))


@cache
def _body_overrides(target_name: str) -> dict[str, st.SearchStrategy[Any]]:
    """Valid values that keep a case short: no conforming request waits for minutes (the fuzz is
    about answers, not about waiting), and a long pause lands only on the `halted` server, so the
    other buckets stay in play for the rest of the run; the secrets the MCP peer checks are
    rotated to their own value (another one would make every later gateway request a 401), and the
    missing secret stays missing."""
    pause = st.floats(0, 0.05) | st.just(0)
    if target_name == HALTED:
        pause = pause | st.floats(3601, 86400) | st.just(86400)
    return {
        "max_wait": st.floats(0, 0.05) | st.just(0),
        "retry_after": pause,
        "servers": st.lists(st.sampled_from(SERVERS + KEYS) | _names_of("server"), min_size=1, max_size=4,
                            unique=True),
        "fingerprint": st.none() | st.just(FINGERPRINT) | st.text(max_size=20) | st.just("x" * 128),
        "value": st.just(FIXED_SECRETS[target_name]) if target_name in FIXED_SECRETS
        else st.text(min_size=1, max_size=40).filter(lambda v: ECHO not in v),
        "force": st.just(False) if target_name == MISSING else st.booleans(),
    }


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


_DEPTH: Final = st.sampled_from([2, 100, 900, 1000, 1100, 5000, 32_000]) | st.integers(1, 32_000)  # nesting


@cache
def _malformed_body(schema_ref: str | None) -> st.SearchStrategy[bytes]:
    """Bodies no request schema allows."""
    props = sorted(_resolve(schema_ref).get("properties", {})) if schema_ref is not None else []
    field_names = st.sampled_from(props) if props else st.just("cost")
    wrong_value = st.one_of(_json_values(), st.just(-1), st.just(0), st.just(10**400),
                            st.just(1e308), st.just(-0.0), st.just(True), st.just([]), st.just({}))
    non_finite = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1" + b"0" * 5000,
                                  b"0.0000000000000000000000000000001", b"1E400"])
    options: list[st.SearchStrategy[bytes]] = [
        st.builds(lambda k, v: _dump({k: v}), field_names, wrong_value),
        st.builds(lambda k, n: b'{"%s": %s}' % (k.encode(), n), field_names, non_finite),
        st.builds(lambda k, n: _dump({k: "y" * n}), field_names, st.integers(1_000, 60_000)),
        st.builds(lambda k, v: _dump({k: v, ECHO + "unknown": v}), field_names, _json_values()),
        st.builds(lambda k: b'{"%s": "\\ud800\\udfff\\ud800"}' % k.encode(), field_names),
        st.builds(lambda k: b'{"%s": 1, "%s": "dup"}' % (k.encode(), k.encode()), field_names),
        _DEPTH.map(lambda n: b"[" * n + b"]" * n),
        st.builds(lambda k, n: b'{"%s": ' % k.encode() + b"[" * n + b"]" * n + b"}", field_names, _DEPTH),
        _DEPTH.map(lambda n: b'{"a":' * (n // 4) + b"1" + b"}" * (n // 4)),
        _json_values().map(lambda v: _dump([v]) if isinstance(v, dict) else _dump(v)),
        st.binary(max_size=64),
        st.sampled_from([b"{", b"{}}", b'{"cost": 1,}', b"\xff\xfe{}", b"\xef\xbb\xbf{}", b"{'cost': 1}",
                         b"null", b"\x00", b'{"cost": 1}\x00', b"[1, 2", b" ", b"\t\r\n"]),
        st.integers(MAX_BODY + 1, MAX_BODY + 4096).map(lambda n: b'{"x": "' + b"z" * n + b'"}'),
    ]
    return st.one_of(options)


@cache
def _valid_body(schema_ref: str, name: str) -> st.SearchStrategy[bytes]:
    overrides = _body_overrides(name)
    return from_schema(_resolve(schema_ref), overrides).map(lambda v: json.dumps(v).encode())


def _request_schema(op: dict[str, Any]) -> tuple[str | None, bool]:
    """The `$ref` of an operation's request body schema, and whether a body is required."""
    body = op.get("requestBody")
    if body is None:
        return None, False
    return body["content"]["application/json"]["schema"]["$ref"], bool(body.get("required"))


_TOKEN_CHARS: Final = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"


@cache
def _extra_headers() -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    names = st.text(_TOKEN_CHARS, min_size=1, max_size=20).filter(
        lambda n: n.lower() not in ("content-length", "transfer-encoding", "host", "authorization", "upgrade",
                                    "connection", "expect", "te"))
    values = st.text(string.printable.strip() + " ", max_size=40)
    fixed = st.sampled_from([("Content-Type", "text/plain"), ("Content-Type", "application/json; charset=latin-1"),
                             ("Accept", "application/xml"), ("Cookie", "a=b"), ("X-Forwarded-For", "1.2.3.4")])
    return st.lists(st.tuples(names, values) | fixed, max_size=4).map(tuple)


@cache
def _authorization() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(["Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "bearer echo-nope",
                                      "Bearer echo-" + "g" * 600, "Token x", "Bearer  \t"]),
                     st.text(string.printable.strip() + " ", max_size=60).map(lambda t: "Bearer " + ECHO + t))


_OPERATION: Final = st.sampled_from([op for op in OPERATIONS if not op[1].startswith("/mcp/")])  # gateway_case
_SAFE: Final = st.sampled_from([":", ":@", ""])
_QUERY: Final = st.text(max_size=20)
_METHOD: Final = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
_STRAY_METHOD: Final = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
_GRANT_INDEX: Final = st.integers(0, 7)
_TENTHS: Final = st.integers(0, 9)
_DOCUMENTED: Final = frozenset((m.lower(), p) for m, p in OPERATION_BY_KEY)


@st.composite
def documented_case(draw: st.DrawFn) -> Case:
    """A request to a documented operation: parameters and body drawn from the document, with a
    malformed body, a random method, extra headers or a grant now and then."""
    method, template, op, params = draw(_OPERATION)
    target = template
    conforming = True
    name = ""
    for param in params:
        kind = "secret" if "secret" in template else "server"
        value = draw(_grant_ids() if param["name"] == "id" else _names_of(kind))
        name = value
        pattern = param["schema"].get("pattern")
        if len(value) < param["schema"].get("minLength", 1) or (pattern and value != GRANT_ID
                                                                and not re.search(pattern, value)):
            conforming = False
        encoded = value if value == GRANT_ID else quote(value, safe=draw(_SAFE))
        target = target.replace("{" + param["name"] + "}", encoded)
    if draw(_TENTHS) == 0:
        target += "?" + quote(draw(_QUERY), safe="=&")
    schema, required = _request_schema(op)
    choice = draw(_TENTHS)
    if schema is not None and choice < 6:
        body = draw(_valid_body(schema, name if name in (HALTED, MISSING, *FIXED_SECRETS) else ""))
    elif choice < 8 or (schema is not None and required):
        body = draw(_malformed_body(schema))
    else:
        body = b""
    if draw(_TENTHS) < 1:  # a method the document does not list for this path
        method = draw(_METHOD)
    grant = authorization = None
    auth = draw(_TENTHS)
    if auth < 3:
        grant = draw(_GRANT_INDEX)
    elif auth == 3:
        authorization = draw(_authorization())
    headers = draw(_extra_headers()) if draw(_TENTHS) < 2 else ()
    expect = None
    if len(body) > MAX_BODY:
        expect = frozenset({413})
    if len(target) + sum(len(k) + len(v) for k, v in headers) > MAX_HEAD:
        expect = frozenset({431})
    documented = conforming and (method.lower(), template) in _DOCUMENTED
    return Case(method, target, template if documented else None, body, headers, grant, authorization,
                chunked=draw(_TENTHS) == 0 and expect is None, expect=expect)


_STRAY_PATH: Final = st.one_of(
    st.text(max_size=40).map(lambda t: "/" + quote(ECHO + t)),
    st.sampled_from(["/", "/v1", "/v1/", "/v1/servers/", "/v1/servers//headers", "/v1/servers/static",
                     "/v1/servers/static/headers/x", "/v1/servers/static/echo-nope", "/v1/secrets/FUZZ_STATIC_KEY",
                     "/v1/secrets/FUZZ_STATIC_KEY/echo-x", "/v1/grants/", "/v1/grants//x", "/v1/echo-x/static/call",
                     "/metrics/", "/v1/health/", "/V1/HEALTH", "/v1/servers/static/headers/",
                     "/v1/servers/%2e%2e/headers", "/v1/grants/echo-x/y", "/v2/health", "//v1/health"]),
    st.from_regex(r"/v1/(servers|secrets|grants)/echo-[a-z]{0,8}(/[a-z]{0,10}){0,3}", fullmatch=True),
)
_STRAY_BODY: Final = st.just(b"") | _malformed_body(None) | st.just(b'{"cost": 1}')
_STRAY_AUTH: Final = st.none() | _authorization()


@st.composite
def stray_case(draw: st.DrawFn) -> Case:
    """A request to a path the document does not have."""
    path, method, body = draw(_STRAY_PATH), draw(_STRAY_METHOD), draw(_STRAY_BODY)
    return Case(method, path, None, body, (), None, draw(_STRAY_AUTH),
                expect=frozenset({413}) if len(body) > MAX_BODY else None)


def _raw(head: bytes, body: bytes = b"") -> bytes:
    return head + b"\r\n\r\n" + body


RAW_REQUESTS: Final = [
    (b"GET /v1/health HTTP/9.9\r\nHost: x", {400}),
    (b"G@T /v1/health HTTP/1.1\r\nHost: x", {400}),
    (b"GET /v1/he alth HTTP/1.1\r\nHost: x", {400}),
    (b"GET /v1/servers/\xff\xfe/headers HTTP/1.1\r\nHost: x", {400}),
    (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nNo-Colon-Here", {400}),
    (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nBad Name: y", {400}),
    (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX: a\x00b", {400}),
    (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: -1", {400}),
    (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: abc", {400}),
    (b"POST /v1/grants HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3", {400}),
    (b"POST /v1/grants HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", {400}),
    (b"POST /v1/grants HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0", {400}),
    (b"POST /v1/grants HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\n{\r\nX\r\n", {400}),
    (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket", {400}),
    (b"CONNECT mcpcreds:80 HTTP/1.1\r\nHost: mcpcreds:80", {400}),
    (b"POST /v1/servers/static/call HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999", {400, 413}),
    (b"POST /v1/servers/static/call HTTP/1.1\r\nHost: x\r\nContent-Length: 70000", {413}),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", {400}),
    (b"PRI * HTTP/2.0\r\n\r\nSM", {400}),
]


_RAW_KIND: Final = st.integers(0, 5)
_JUNK: Final = st.binary(min_size=1, max_size=200).filter(lambda b: b"\r\n\r\n" not in b)
_HEAD_SIZE: Final = st.integers(MAX_HEAD + 1, MAX_HEAD + 3 * 1024)
_HEAD_PART: Final = st.sampled_from(["url", "header", "headers"])
_BODY_SIZE: Final = st.integers(MAX_BODY + 1, MAX_BODY + 8 * 1024)
_RAW_REQUEST: Final = st.sampled_from(RAW_REQUESTS)


@st.composite
def raw_case(draw: st.DrawFn) -> Case:
    """HTTP no parser should take, or a head or body over the limit: one error answer, then a close."""
    kind = draw(_RAW_KIND)
    if kind == 0:
        return Case("RAW", "", raw=_raw(b"\x01" + draw(_JUNK)), expect=frozenset({400}))
    if kind == 1:
        size, where = draw(_HEAD_SIZE), draw(_HEAD_PART)
        if where == "url":
            head = b"GET /v1/servers/" + b"a" * size + b"/headers HTTP/1.1\r\nHost: x"
        elif where == "header":
            head = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * size
        else:
            head = b"GET /v1/health HTTP/1.1\r\nHost: x" + b"\r\nX-Many: 1234567890" * (size // 20 + 1)
        return Case("RAW", "", raw=_raw(head), expect=frozenset({431}))
    if kind == 2:
        size = draw(_BODY_SIZE)
        chunk = b"%x\r\n" % size + b"c" * size + b"\r\n0\r\n\r\n"
        head = b"POST /v1/servers/rated/acquire HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
        return Case("RAW", "", raw=_raw(head, chunk), expect=frozenset({413}))
    head, allowed = draw(_RAW_REQUEST)
    return Case("RAW", "", raw=_raw(head), expect=frozenset(allowed))


_MCP_ACCEPT: Final = ("Accept", "application/json, text/event-stream")
_PLAIN_TEXT: Final = st.text(max_size=30).filter(lambda t: ECHO not in t)
_RPC_ID: Final = st.integers(-(2**31), 2**31) | _PLAIN_TEXT | st.none()


@cache
def _mcp_bodies() -> st.SearchStrategy[bytes]:
    """JSON-RPC bodies an MCP client sends (the MCP peer's tools, and methods it lacks), and any
    message the document's `JsonRpcMessage` allows; one or a batch."""
    initialize = st.builds(lambda i: {"jsonrpc": "2.0", "id": i, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}}, _RPC_ID)
    arguments = st.fixed_dictionaries({}, optional={"text": _PLAIN_TEXT, "a": st.integers(), "b": st.integers()})
    call = st.builds(lambda i, name, args: {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                            "params": {"name": name, "arguments": args}},
                     _RPC_ID, st.sampled_from(["echo", "add", "leak", "no-such-tool"]), arguments)
    simple = st.builds(lambda i, m: {"jsonrpc": "2.0", "id": i, "method": m}, _RPC_ID,
                       st.sampled_from(["tools/list", "ping", "resources/list", "prompts/list", "no/such"]))
    notification = st.sampled_from([{"jsonrpc": "2.0", "method": "notifications/initialized"},
                                    {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                     "params": {"requestId": 1}}])
    response = st.builds(lambda i: {"jsonrpc": "2.0", "id": i, "result": {}}, _RPC_ID)
    schema = from_schema(_resolve("#/components/schemas/JsonRpcMessage"), {"method": _PLAIN_TEXT.filter(bool),
                                                                          "id": _RPC_ID})
    message = st.one_of(initialize, call, call, simple, simple, notification, response, schema)
    return (message | st.lists(message, min_size=1, max_size=4)).map(lambda v: json.dumps(v).encode())


_MCP_SESSION: Final = st.sampled_from([SESSION, SESSION, SESSION, None, "no-such-session-0"])
_MCP_VERSION: Final = st.sampled_from([None, None, "2025-06-18", "2025-03-26", "1999-01-01"])


@st.composite
def gateway_case(draw: st.DrawFn) -> Case:
    """A request to the gateway, `/mcp/{server}`, as an MCP client sends it: JSON-RPC bodies, the
    transport's headers, the session the gateway last answered with; now and then a malformed
    body, a grant or a stray Authorization."""
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "DELETE"]))
    name = draw(_names_of("server"))
    target = "/mcp/" + quote(name, safe=draw(_SAFE))
    headers: list[tuple[str, str]] = [_MCP_ACCEPT]
    body = b""
    if method == "POST":
        headers.append(("Content-Type", "application/json"))
        body = draw(_mcp_bodies()) if draw(_TENTHS) < 8 else draw(_malformed_body("#/components/schemas/JsonRpcBody"))
    session, version = draw(_MCP_SESSION), draw(_MCP_VERSION)
    if session is not None:
        headers.append(("Mcp-Session-Id", session))
    if version is not None:
        headers.append(("MCP-Protocol-Version", version))
    grant = authorization = None
    auth = draw(_TENTHS)
    if auth < 2:
        grant = draw(_GRANT_INDEX)
    elif auth == 2:
        authorization = draw(_authorization())
    return Case(method, target, "/mcp/{server}" if name else None, body, tuple(headers), grant, authorization)


def _tour_case(method: str, target: str, template: str, body: Any = None, grant: int | None = None) -> Case:
    return Case(method, target, template, b"" if body is None else json.dumps(body).encode(), grant=grant)


def _mcp_case(method: str, server: str, body: Any = None, raw: bytes | None = None) -> Case:
    headers = [_MCP_ACCEPT, ("Mcp-Session-Id", SESSION)]
    if method == "POST":
        headers.append(("Content-Type", "application/json"))
    data = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
    return Case(method, f"/mcp/{server}", "/mcp/{server}", data, tuple(headers))


def _rpc(method: str, params: dict[str, Any] | None = None, rpc_id: int | None = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if rpc_id is not None:
        message["id"] = rpc_id
    if params is not None:
        message["params"] = params
    return message


_INITIALIZE: Final = _rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                         "clientInfo": {"name": "fuzz", "version": "0"}})

# One conforming request per operation (and the error answers the config is there for): the
# explicit example the CI run starts with, so every documented answer shape is checked every time.
TOUR: Final = [
    _tour_case("GET", "/v1/health", "/v1/health"),
    _tour_case("GET", "/v1/servers", "/v1/servers"),
    _tour_case("GET", "/v1/openapi.json", "/v1/openapi.json"),
    _tour_case("GET", "/metrics", "/metrics"),
    _tour_case("GET", "/v1/servers/static/headers", "/v1/servers/{name}/headers"),
    _tour_case("GET", "/v1/servers/oauth/headers", "/v1/servers/{name}/headers"),
    _tour_case("GET", "/v1/servers/service:crm/headers", "/v1/servers/{name}/headers"),
    _tour_case("GET", "/v1/servers/broken/headers", "/v1/servers/{name}/headers"),
    _tour_case("GET", "/v1/servers/garbled/headers", "/v1/servers/{name}/headers"),
    _tour_case("GET", "/v1/servers/nosecret/headers", "/v1/servers/{name}/headers"),
    _tour_case("POST", "/v1/servers/rated/acquire", "/v1/servers/{name}/acquire", {"cost": 1, "max_wait": 0}),
    _tour_case("POST", "/v1/servers/rated/acquire", "/v1/servers/{name}/acquire", {"cost": 20, "max_wait": 0}),
    _tour_case("POST", "/v1/servers/crm-ro/call", "/v1/servers/{name}/call", {"cost": 1}),
    _tour_case("POST", "/v1/servers/static/call", "/v1/servers/{name}/call"),
    _tour_case("POST", "/v1/servers/oauth/invalidate", "/v1/servers/{name}/invalidate",
               {"reason": "401", "fingerprint": FINGERPRINT}),
    _tour_case("POST", "/v1/servers/oauth/invalidate", "/v1/servers/{name}/invalidate", {"fingerprint": 7}),
    _tour_case("POST", "/v1/servers/rated/backoff", "/v1/servers/{name}/backoff", {"retry_after": 0.01}),
    _tour_case("POST", "/v1/servers/rated/backoff", "/v1/servers/{name}/backoff", {"retry_after": -1}),
    _tour_case("POST", "/v1/secrets/FUZZ_CLIENT_SECRET/rotated", "/v1/secrets/{name}/rotated"),
    _tour_case("POST", "/v1/secrets/FUZZ_CLIENT_SECRET/rotate", "/v1/secrets/{name}/rotate",
               {"value": CANARY_CLIENT}),
    _tour_case("POST", "/v1/secrets/FUZZ_OTHER_SECRET/rotate", "/v1/secrets/{name}/rotate",
               {"value": CANARY_OTHER}),
    _tour_case("POST", "/v1/secrets/FUZZ_STATIC_KEY/rotate", "/v1/secrets/{name}/rotate",
               {"value": CANARY_STATIC, "force": True}),
    _tour_case("POST", "/v1/secrets/FUZZ_MISSING/rotated", "/v1/secrets/{name}/rotated"),
    _tour_case("POST", "/v1/grants", "/v1/grants", {"servers": ["static", "crm-ro"], "ttl": 60}),
    _tour_case("POST", "/v1/grants", "/v1/grants", {"servers": ["static", "crm-ro", "oauth"]}),
    _tour_case("GET", "/v1/servers", "/v1/servers", grant=0),
    _tour_case("GET", "/v1/servers/static/headers", "/v1/servers/{name}/headers", grant=0),
    _tour_case("GET", "/v1/servers/oauth/headers", "/v1/servers/{name}/headers", grant=0),
    _tour_case("GET", "/v1/status", "/v1/status", grant=0),
    _tour_case("GET", "/v1/status", "/v1/status"),
    _tour_case("DELETE", f"/v1/grants/{GRANT_ID}", "/v1/grants/{id}"),
    _tour_case("DELETE", "/v1/grants/echo-gone", "/v1/grants/{id}"),
    _tour_case("GET", "/v1/servers/proxied/headers", "/v1/servers/{name}/headers"),
    _mcp_case("POST", "static", _INITIALIZE),
    _mcp_case("POST", "static", _rpc("notifications/initialized", rpc_id=None)),
    _mcp_case("POST", "static", _rpc("tools/list", rpc_id=2)),
    _mcp_case("POST", "static", _rpc("tools/call", {"name": "leak", "arguments": {}}, 3)),
    _mcp_case("POST", "proxied", _rpc("tools/call", {"name": "leak", "arguments": {}}, 4)),
    _mcp_case("POST", "oauth", _rpc("tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}}, 5)),
    _mcp_case("POST", "oauth", _rpc("tools/call", {"name": "leak", "arguments": {}}, 6)),
    _mcp_case("POST", "crm-ro", [_rpc("tools/call", {"name": "echo", "arguments": {"text": "x"}}, 7),
                                 _rpc("ping", rpc_id=8)]),
    _mcp_case("GET", "static"),
    _mcp_case("POST", "direct", _rpc("ping")),
    _mcp_case("POST", "broken", _rpc("ping")),
    _mcp_case("POST", "nosecret", _rpc("ping")),
    _mcp_case("POST", "static", raw=b"{not json"),
    _mcp_case("POST", "static", {"jsonrpc": "1.0"}),
    _mcp_case("POST", "echo-nowhere", _rpc("ping")),
    _mcp_case("DELETE", "static"),
]


def cases() -> st.SearchStrategy[Case]:
    return st.one_of(documented_case(), documented_case(), documented_case(), documented_case(),
                     documented_case(), gateway_case(), gateway_case(), stray_case(), raw_case())


def batches(min_size: int = 4, max_size: int = 12) -> st.SearchStrategy[list[Case]]:
    return st.lists(cases(), min_size=min_size, max_size=max_size)


# --------------------------------------------------------------------------- sending


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    raw: bytes
    streaming: bool = False  # an event stream left open: only its head was read


class Incomplete(Exception):
    pass


def _dechunk(data: bytes, at: int) -> tuple[bytes, int]:
    """A chunked body starting at `data[at]`: the body, and where the answer ends."""
    body = bytearray()
    while True:
        eol = data.find(b"\r\n", at)
        if eol < 0:
            raise Incomplete
        size = int(data[at:eol].split(b";")[0], 16)
        at = eol + 2
        if size == 0:
            while True:  # trailers, up to an empty line
                eol = data.find(b"\r\n", at)
                if eol < 0:
                    raise Incomplete
                if eol == at:
                    return bytes(body), at + 2
                at = eol + 2
        if len(data) < at + size + 2:
            raise Incomplete
        if data[at + size:at + size + 2] != b"\r\n":
            raise ValueError("a chunk does not end with CRLF")
        body += data[at:at + size]
        at += size + 2


def parse_answer(data: bytes, head_only: bool = False, stream: bool = False) -> tuple[Answer, bytes]:
    """One HTTP/1.1 answer from the front of `data` (Content-Length or chunked) and what follows
    it; Incomplete if `data` does not hold all of it yet. With `stream`, an event stream is
    returned after its head."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        raise Incomplete
    lines = data[:end].decode("latin-1").split("\r\n")
    match = re.fullmatch(r"HTTP/1\.1 (\d{3}) [^\r\n]*", lines[0])
    if match is None:
        raise ValueError(f"bad status line {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line[:100]!r}")
        key = name.strip().lower()
        if key in headers:
            raise ValueError(f"header {key} sent twice")
        headers[key] = value.strip()
    status, start = int(match.group(1)), end + 4
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    if head_only or (stream and chunked and headers.get("content-type", "").startswith(
            ("text/event-stream", "application/x-ndjson"))):  # SSE, or the sidecar's event stream
        return Answer(status, headers, b"", data[:start], streaming=not head_only), data[start:]
    if chunked:
        body, total = _dechunk(data, start)
        return Answer(status, headers, body, data[:total]), data[total:]
    total = start + int(headers.get("content-length", "x"))
    if len(data) < total:
        raise Incomplete
    return Answer(status, headers, data[start:total], data[:total]), data[total:]


class Wire:
    """A keep-alive connection to the sidecar, opened again whenever the sidecar closed it."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buffer = b""

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self.path))
        return sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buffer = None, b""

    def exchange(self, request: bytes, stream: bool = False) -> Answer:
        """Send a request and read its answer (with `stream`, only the head of an event stream,
        and the connection is closed: it is still busy with that stream)."""
        if self.sock is None:
            self.sock = self._connect()
        with suppress(BrokenPipeError, ConnectionResetError):  # refused mid-body: its answer is read below
            self.sock.sendall(request)
        while True:
            try:
                answer, self.buffer = parse_answer(self.buffer, stream=stream)
            except Incomplete:
                chunk = self._recv()
                if not chunk:
                    self.close()
                    raise ConnectionError("the sidecar closed the connection without a (complete) answer") \
                        from None
                self.buffer += chunk
                continue
            if answer.streaming or answer.headers.get("connection", "").lower() == "close":
                self.close()
            return answer

    def _recv(self) -> bytes:
        assert self.sock is not None
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""

    def one_shot(self, request: bytes, head_only: bool = False) -> tuple[list[Answer], bytes]:
        """Send on a fresh connection and read until the sidecar closes it: the answers, and any
        bytes that are not a complete answer. A keep-alive answer ends the reading at once: the
        sidecar took the request for a good one."""
        sock = self._connect()
        answers: list[Answer] = []
        data = b""
        with sock:
            with suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(request)
            with suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    data += chunk
                    with suppress(Incomplete, ValueError):
                        answer, rest = parse_answer(data, head_only)
                        if answer.headers.get("connection", "").lower() != "close":
                            return [answer], rest
        while data:
            try:
                answer, data = parse_answer(data, head_only)
            except (Incomplete, ValueError):
                break
            answers.append(answer)
            head_only = False
        return answers, data


# --------------------------------------------------------------------------- checking


@dataclass
class Grant:
    id: str
    token: str


@dataclass
class BatchState:
    """What the batch learnt from the answers: live grants, the last login's fingerprint, the MCP
    session."""

    grants: list[Grant] = field(default_factory=list)
    fingerprint: str = "0000000000"
    session: str | None = None


def encode(case: Case, state: BatchState) -> tuple[bytes, str | None]:
    """The bytes of a case, its placeholders filled from the batch; and the grant token it sends."""
    target = case.target
    if GRANT_ID in target:
        target = target.replace(GRANT_ID, state.grants[-1].id if state.grants else "echo-no-grant-yet")
    body = case.body.replace(FINGERPRINT.encode(), state.fingerprint.encode())
    lines = [f"{case.method} {target} HTTP/1.1", "Host: mcpcreds"]
    token = None
    if case.grant is not None and state.grants:
        token = state.grants[case.grant % len(state.grants)].token
        lines.append(f"Authorization: Bearer {token}")
    elif case.authorization is not None:
        lines.append(f"Authorization: {case.authorization}")
    for name, value in case.headers:
        if value == SESSION:
            if state.session is None:
                continue
            value = state.session
        lines.append(f"{name}: {value}")
    if case.method == "HEAD":
        lines.append("Connection: close")
    if case.chunked:
        lines.append("Transfer-Encoding: chunked")
        half = len(body) // 2
        parts = [p for p in (body[:half], body[half:]) if p]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    elif body or case.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body, token


# error code of each status, from the `Error` schema's description
ERROR_CODES: Final = {400: {"invalid_request"}, 403: {"forbidden", "proxy_only", "proxy_disabled"},
                      404: {"unknown_server", "unknown_secret", "not_found"}, 405: {"method_not_allowed"},
                      408: {"request_timeout"}, 413: {"payload_too_large"},
                      429: {"rate_limited", "too_many_grants"}, 431: {"headers_too_large"}}
GENERIC: Final = frozenset(ERROR_CODES)
ERROR_SCHEMA: Final = "#/components/schemas/Error"
_VALIDATORS: dict[str, Draft202012Validator] = {}


def _validator(pointer: str) -> Draft202012Validator:
    validator = _VALIDATORS.get(pointer)
    if validator is None:
        validator = Draft202012Validator({"$ref": DOC_URI + pointer}, registry=REGISTRY)
        _VALIDATORS[pointer] = validator
    return validator


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def expected(case: Case) -> tuple[frozenset[int], dict[int, dict[str, str]]]:
    """The statuses allowed for a case, and for each documented one its media types (none: the
    document says nothing of the body) with the pointer of each one's schema."""
    op = OPERATION_BY_KEY.get((case.method, case.template)) if case.template is not None else None
    documented: dict[int, dict[str, str]] = {}
    default: dict[str, str] | None = None
    if op is not None:
        base = ("paths", case.template or "", case.method.lower(), "responses")
        for status, response in op["responses"].items():
            where = (*base, status)
            if "$ref" in response:
                where = tuple(response["$ref"].removeprefix("#/").split("/"))
                response = _resolve(response["$ref"])
            media = {m: _pointer(*where, "content", m, "schema") for m in response.get("content", {})}
            if status == "default":
                default = media
            else:
                documented[int(status)] = media
    if default is not None:  # any other status is documented by `default` (but a 500 is never right)
        documented = {status: documented.get(status, default) for status in range(100, 600) if status != 500}
    if case.expect is not None:
        return case.expect, documented
    if op is not None:
        return frozenset(documented), documented
    return GENERIC - {408, 413, 429, 431}, documented


JSON_RPC: Final = _pointer("components", "schemas", "JsonRpcBody")


def sse_messages(body: bytes) -> list[Any]:
    """The data of every `message` event of an event stream, parsed (ValueError if one is not JSON)."""
    messages = []
    for event in re.split(rb"\r?\n\r?\n", body):
        kind, data = "message", []
        for line in event.splitlines():
            field_, _, value = line.decode().partition(":")
            value = value.removeprefix(" ")
            if field_ == "event":
                kind = value
            elif field_ == "data":
                data.append(value)
        if data and kind == "message":
            messages.append(json.loads("\n".join(data)))
    return messages


def check(case: Case, answer: Answer, state: BatchState, token: str | None, head: bool = False) -> list[str]:
    """Everything wrong with one answer (an empty list: it conforms). A HEAD answer has no body."""
    problems: list[str] = []
    allowed, documented = expected(case)
    if answer.status not in allowed:
        problems.append(f"status {answer.status} is not one of {sorted(allowed)}")
    generic = answer.status not in documented
    media_types = documented.get(answer.status, {"application/json": _pointer("components", "schemas", "Error")})
    ctype = answer.headers.get("content-type", "")
    media = next((m for m in media_types if ctype.split(";")[0].strip() == m.split(";")[0].strip()), None)
    if media is None and media_types:
        problems.append(f"content-type {ctype!r}, the document says {' or '.join(media_types)}")
    data: Any = None
    if media == "application/json" and not head:
        try:
            data = json.loads(answer.body)
        except ValueError:
            problems.append("the body is not JSON")
        else:
            problems += _schema_problems(media_types[media], data)
            if generic and isinstance(data, dict) and isinstance(data.get("error"), dict):
                code = data["error"].get("code")
                if code not in ERROR_CODES.get(answer.status, {code}):
                    problems.append(f"error code {code!r} does not belong to status {answer.status}")
    elif media == "text/event-stream" and not answer.streaming:
        try:
            for message in sse_messages(answer.body):
                problems += _schema_problems(JSON_RPC, message)
        except ValueError:
            problems.append("an event of the stream is not JSON")
    if answer.status == 429 and _wire_code(data) == "rate_limited" and not answer.headers.get("retry-after",
                                                                                            "").isdigit():
        problems.append("429 rate_limited without a numeric Retry-After header")
    problems += _leaks(case, answer, data, state, token)
    return problems


def _schema_problems(pointer: str, data: Any) -> list[str]:
    errors = sorted(_validator(pointer).iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"body does not match {pointer}: {e.message[:200]} at {list(e.absolute_path)}" for e in errors[:3]]


def _wire_code(data: Any) -> Any:
    """The wire code of an error answer: `error.code`, or a gateway error's `error.data.code`."""
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    inner = error.get("data")
    return inner.get("code") if isinstance(inner, dict) else error.get("code")


def _leaks(case: Case, answer: Answer, data: Any, state: BatchState, token: str | None) -> list[str]:
    """Secrets, tokens, grants and echoed names where they have no business."""
    hands_out_headers = answer.status == 200 and case.template is not None and \
        case.template.endswith(("/headers", "/call", "/lease"))  # a lease carries the headers it is for
    visible = answer.raw
    if hands_out_headers and isinstance(data, dict) and isinstance(data.get("headers"), dict):
        visible = answer.raw[:answer.raw.find(b"\r\n\r\n")] + json.dumps(
            {k: v for k, v in data.items() if k != "headers"}).encode()
    minted = answer.status == 200 and case.template == "/v1/grants" and case.method == "POST"
    if minted and isinstance(data, dict):
        visible = visible.replace(str(data.get("grant", "")).encode(), b"")
    found = [what for what, needle in (*CLIENT_SECRETS, ("the proxy-only bearer", CANARY_PROXY))
             if needle.encode() in answer.raw]  # not even in the headers a caller asked for
    found += [what for what, needle in (("the static key", CANARY_STATIC), ("an access token", TOKEN_PREFIX),
                                        ("a made-up name", ECHO)) if needle.encode() in visible]
    found += ["a grant token" for g in state.grants if g.token.encode() in visible]
    if token is not None and token.encode() in visible:
        found.append("the grant token it was sent")
    return [f"the answer holds {what}" for what in dict.fromkeys(found)]


def learn(case: Case, answer: Answer, state: BatchState) -> None:
    if answer.status != 200 or case.template is None:
        return
    if case.template == "/mcp/{server}":
        if case.method == "POST" and answer.headers.get("mcp-session-id"):
            state.session = answer.headers["mcp-session-id"]
        elif case.method == "DELETE":
            state.session = None
        return
    with suppress(ValueError):
        data = json.loads(answer.body)
        if case.template == "/v1/grants" and isinstance(data, dict):
            state.grants.append(Grant(data["id"], data["grant"]))
        elif case.template == "/v1/grants/{id}" and state.grants:
            state.grants.pop()
        elif isinstance(data, dict) and isinstance(data.get("fingerprint"), str):
            state.fingerprint = data["fingerprint"]




def json_depth(body: bytes) -> int:
    """How deep the brackets of a JSON text nest (outside strings)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


@dataclass
class Outcome:
    case: Case
    status: int | None
    problems: list[str]
    answer: bytes = b""

    def report(self) -> str:
        return (f"{self.case.describe()}\n  -> {self.status}: {self.answer[:600]!r}\n  "
                + "\n  ".join(self.problems))


def outcome(case: Case, status: int | None, problems: list[str], answer: bytes) -> Outcome:
    return Outcome(case, status, problems, answer)


def run_case(wire: Wire, case: Case, state: BatchState) -> Outcome:
    head = case.method == "HEAD"
    rest = b""
    if case.raw is not None or head:
        request, token = (case.raw, None) if case.raw is not None else encode(case, state)
        assert request is not None
        answers, rest = wire.one_shot(request, head_only=head)
        if len(answers) != 1 or (rest and not head):
            return outcome(case, answers[0].status if answers else None,
                           [f"{len(answers)} answers and {len(rest)} more bytes before the close, not one answer"],
                           answers[0].raw if answers else rest)
        answer = answers[0]
    else:
        request, token = encode(case, state)
        try:
            # the long-lived streams (an MCP GET, the event stream): their head only
            answer = wire.exchange(request, stream=case.method == "GET" and (
                case.target.startswith("/mcp/") or case.target.split("?")[0] == "/v1/events"))
        except (OSError, ValueError) as exc:
            return outcome(case, None, [f"no answer: {exc}"], b"")
    problems = check(case, answer, state, token, head)
    if head and rest:
        problems.append(f"{len(rest)} bytes of content after the head (content after a HEAD answer)")
    learn(case, answer, state)
    return outcome(case, answer.status, problems, answer.raw)


def health(path: Path) -> list[str]:
    wire = Wire(path, timeout=15)
    try:
        answer = wire.exchange(b"GET /v1/health HTTP/1.1\r\nHost: mcpcreds\r\n\r\n")
    except OSError as exc:
        return [f"health: no answer ({exc})"]
    finally:
        wire.close()
    errors = list(_validator(_pointer("components", "schemas", "Health")).iter_errors(json.loads(answer.body)))
    return [] if answer.status == 200 and not errors else [f"health answered {answer.status}: {answer.body[:200]!r}"]


def run_batch(path: Path, batch: list[Case]) -> tuple[list[Outcome], list[str]]:
    """Every case of the batch on one keep-alive connection (raw ones on their own), then health."""
    wire = Wire(path)
    state = BatchState()
    try:
        outcomes = [run_case(wire, case, state) for case in batch]
    finally:
        wire.close()
    return outcomes, health(path)


def failures(outcomes: list[Outcome], after: list[str]) -> list[str]:
    return [o.report() for o in outcomes if o.problems] + after


def leaks_in_logs(target: FuzzTarget) -> list[str]:
    logs = target.logs()
    return [f"the sidecar's logs hold {what}" for what, needle in
            (*CLIENT_SECRETS, ("the static key", CANARY_STATIC), ("an access token", "fault-token"))
            if needle in logs]


# --------------------------------------------------------------------------- the tests

CI_BATCHES: Final = 40  # 4 to 12 cases each: about 240 cases after the tour's 46, a few seconds


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    with fuzz_sidecar(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


# No shrinking: the sidecar keeps state between batches (grants, pauses, logins), so a replay is
# not the same run; every failure is reported per request already, with the request it was.
@settings(max_examples=CI_BATCHES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(batch=batches())
@example(batch=TOUR)
def test_every_answer_conforms_to_the_document(target: FuzzTarget, batch: list[Case]) -> None:
    outcomes, after = run_batch(target.socket, batch)
    problems = failures(outcomes, after)
    assert not problems, "\n\n".join(problems)


def test_the_logs_hold_no_secret_after_the_fuzz(target: FuzzTarget) -> None:
    """Runs after the fuzz on the same sidecar: nothing it was sent made it log a secret."""
    assert target.logs(), "the sidecar logged nothing at all"
    assert leaks_in_logs(target) == []


# -- the checks themselves: each catches what it is there for


def _answer(status: int, body: bytes, ctype: str = "application/json", extra: str = "") -> Answer:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    answer, rest = parse_answer(head.encode() + body)
    assert rest == b""
    return answer


HEADERS_CASE: Final = Case("GET", "/v1/servers/static/headers", "/v1/servers/{name}/headers")
GOOD_HEADERS: Final = json.dumps({"headers": {"X-Api-Key": CANARY_STATIC}, "key": "mcp:static",
                                  "expires_at": None, "fingerprint": None}).encode()


def test_the_checks_pass_a_conforming_answer() -> None:
    assert check(HEADERS_CASE, _answer(200, GOOD_HEADERS), BatchState(), None) == []
    assert check(Case("GET", "/v1/echo-x"), _answer(404, b'{"error":{"code":"not_found","message":"no"}}'),
                 BatchState(), None) == []


@pytest.mark.parametrize(("answer", "problem"), [
    (_answer(500, b'{"error":{"code":"internal_error","message":"internal error"}}'), "status 500 is not one of"),
    (_answer(405, b'{"error":{"code":"method_not_allowed","message":"no"}}'), "status 405 is not one of"),
    (_answer(200, GOOD_HEADERS.replace(b'"key"', b'"kee"')), "'key' is a required property"),
    (_answer(200, GOOD_HEADERS, "text/plain"), "content-type 'text/plain'"),
    (_answer(200, b"{not json"), "the body is not JSON"),
    (_answer(404, b'{"error":{"code":"not_found","message":"no"}}'), "'not_found' is not one of ['unknown_server']"),
    (_answer(400, b'{"error":{"code":"forbidden","message":"no"}}'), "'forbidden' is not one of ['invalid_request']"),
    (_answer(400, b'{"error":{"code":"invalid_request","message":"no ' + CANARY_CLIENT.encode() + b'"}}'),
     "holds the OAuth client secret"),
    (_answer(404, b'{"error":{"code":"unknown_server","message":"' + CANARY_STATIC.encode() + b'"}}'),
     "holds the static key"),
    (_answer(404, b'{"error":{"code":"unknown_server","message":"no echo-made-up"}}'), "holds a made-up name"),
    (_answer(200, GOOD_HEADERS.replace(b'"mcp:static"', b'"fault-token-1"')), "holds an access token"),
    (_answer(200, GOOD_HEADERS.replace(CANARY_STATIC.encode(), CANARY_PROXY.encode())),
     "holds the proxy-only bearer"),
])
def test_the_checks_catch_a_nonconforming_answer(answer: Answer, problem: str) -> None:
    problems = check(HEADERS_CASE, answer, BatchState(), None)
    assert any(problem in p for p in problems), problems


def test_the_checks_catch_a_rate_limited_answer_without_retry_after() -> None:
    case = Case("POST", "/v1/servers/rated/acquire", "/v1/servers/{name}/acquire")
    body = b'{"error":{"code":"rate_limited","message":"wait","retry_after":0.5}}'
    assert check(case, _answer(429, body, extra="Retry-After: 1\r\n"), BatchState(), None) == []
    assert any("Retry-After" in p for p in check(case, _answer(429, body), BatchState(), None))


def test_the_checks_catch_a_grant_token_outside_its_minting() -> None:
    state = BatchState(grants=[Grant("g1", "grant-token-secret-value")])
    leak = b'{"error":{"code":"forbidden","message":"grant-token-secret-value"}}'
    assert any("a grant token" in p for p in check(Case("GET", "/v1/status", "/v1/status"), _answer(403, leak),
                                                   state, None))


# -- minimal reproductions of what the fuzz found in src (all fixed): each fails if its bug comes back


def _one(target: FuzzTarget, request: bytes) -> Answer:
    wire = Wire(target.socket)
    try:
        return wire.exchange(request)
    finally:
        wire.close()


def test_known_a_deeply_nested_body_is_a_400(target: FuzzTarget) -> None:
    body = b"[" * 1000 + b"]" * 1000
    answer = _one(target, b"POST /v1/servers/static/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
    assert answer.status == 400, answer.raw


def test_known_a_head_answer_has_no_content(target: FuzzTarget) -> None:
    answers, rest = Wire(target.socket).one_shot(b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                                 head_only=True)
    assert [a.status for a in answers] == [405]
    assert rest == b""


def test_known_status_buckets_match_the_document(target: FuzzTarget) -> None:
    answer = _one(target, b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
    assert check(Case("GET", "/v1/status", "/v1/status"), answer, BatchState(), None) == []


def test_known_the_gateway_refuses_a_stale_grant_with_a_json_rpc_error(target: FuzzTarget) -> None:
    case = Case("POST", "/mcp/static", "/mcp/{server}", json.dumps(_rpc("ping")).encode(),
                (_MCP_ACCEPT, ("Content-Type", "application/json")), authorization="Bearer revoked")
    answer = _one(target, encode(case, BatchState())[0])
    assert check(case, answer, BatchState(), None) == []


def test_known_the_gateway_get_answers_as_documented_without_a_session(target: FuzzTarget) -> None:
    case = Case("GET", "/mcp/static", "/mcp/{server}", b"", (_MCP_ACCEPT,))
    wire = Wire(target.socket)
    try:
        answer = wire.exchange(encode(case, BatchState())[0], stream=True)
    finally:
        wire.close()
    assert check(case, answer, BatchState(), None) == []


def test_known_a_credential_that_is_no_header_value_is_no_500(target: FuzzTarget) -> None:
    def rotate(value: str) -> Answer:
        body = json.dumps({"value": value, "force": True}).encode()
        return _one(target, b"POST /v1/secrets/FUZZ_PROXY_TOKEN/rotate HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    assert rotate(TOKEN_PREFIX + "caf\u00e9").status == 200
    try:
        case = _mcp_case("POST", "proxied", _rpc("ping"))
        answer = _one(target, encode(case, BatchState())[0])
    finally:
        assert rotate(CANARY_PROXY).status == 200
    assert answer.status != 500, answer.raw


def test_known_health_answers_as_documented_with_a_stale_grant(target: FuzzTarget) -> None:
    answer = _one(target, b"GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer revoked\r\n\r\n")
    assert check(Case("GET", "/v1/health", "/v1/health", authorization="Bearer revoked"), answer,
                 BatchState(), None) == []
