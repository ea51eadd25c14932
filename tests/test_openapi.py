"""The OpenAPI document shipped in the package: valid OpenAPI 3.1, and it covers the whole contract table."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import pytest
from openapi_spec_validator import validate

# CONTRACT.md §3, "The socket API": every route of the table, plus the document itself.
CONTRACT_ROUTES: list[tuple[str, str]] = [
    ("get", "/v1/health"),
    ("get", "/v1/servers"),
    ("get", "/v1/servers/{name}/headers"),
    ("post", "/v1/servers/{name}/acquire"),
    ("post", "/v1/servers/{name}/call"),
    ("post", "/v1/servers/{name}/invalidate"),
    ("post", "/v1/servers/{name}/backoff"),
    ("post", "/v1/secrets/{name}/rotated"),
    ("post", "/v1/grants"),
    ("delete", "/v1/grants/{id}"),
    ("get", "/v1/status"),
    ("get", "/v1/openapi.json"),
    ("get", "/metrics"),
]
# routes mcpcreds adds beyond the contract's table (documented in docs/reference/socket-api.md)
EXTENSIONS = [("post", "/v1/secrets/{name}/rotate"),
              ("post", "/mcp/{server}"), ("get", "/mcp/{server}"), ("delete", "/mcp/{server}"),
              ("post", "/v1/exec/{name}/session"), ("post", "/v1/servers/{name}/sign"),
              ("post", "/v1/aauth/rotate-key"), ("post", "/v1/servers/{name}/lease"), ("get", "/v1/events"),
              ("post", "/v1/servers/{name}/step-up"), ("get", "/v1/tools/{server}"),
              ("post", "/v1/tools/{server}/approve"), ("post", "/v1/exec/{name}/events"),
              ("get", "/v1/secrets/{name}/origin"), ("post", "/v1/exec/{name}/pins"),
              ("post", "/v1/reload")]
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    resource = files("mcpcreds") / "openapi.json"
    loaded: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return loaded


def _schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["components"]["schemas"][name]
    return schema


def _json_schema_of(doc: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in response:
        response = doc["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return schema


def test_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_contract_route_is_present_with_its_method(doc: dict[str, Any]) -> None:
    paths = doc["paths"]
    for method, path in CONTRACT_ROUTES:
        assert path in paths, f"missing path {path}"
        assert method in paths[path], f"{path} lacks {method.upper()}"


def test_no_route_beyond_the_contract_and_its_documented_extensions(doc: dict[str, Any]) -> None:
    documented = {(m, p) for p, item in doc["paths"].items() for m in item if m in HTTP_METHODS}
    assert documented == set(CONTRACT_ROUTES) | set(EXTENSIONS)


async def _ask(api: Any, method: str, path: str) -> tuple[int, str]:
    """The status and error code the API answers a bodiless request with (Api.handle, its seam)."""
    import os

    from mcpcreds.core.http import Request, Response, StreamingResponse

    result = api.handle(Request(method, path, "", b"", None, os.getuid(), os.getpid()))
    response = result if isinstance(result, Response | StreamingResponse) else await result
    if isinstance(response, StreamingResponse):  # the event stream: opened, so served
        await response.body.aclose()
        return response.status, ""
    code = json.loads(response.body)["error"]["code"] if response.status >= 400 else ""
    return response.status, code


async def test_the_document_matches_the_routes_the_sidecar_serves(doc: dict[str, Any]) -> None:
    """Every documented route is served (answered with anything but "no route"), every other
    method on a documented path is a 405, and every action the document names is "no route" under
    the prefixes it is not documented for."""
    import tomllib

    from mcpcreds.broker.broker import Broker
    from mcpcreds.config.load import parse_config
    from mcpcreds.core.clock import FakeClock
    from mcpcreds.core.metrics import Metrics
    from mcpcreds.credentials.sources import SecretResolver
    from mcpcreds.sidecar.api import Api

    broker = Broker(parse_config(tomllib.loads("")), SecretResolver([]), FakeClock(), Metrics())
    api = Api(broker, Metrics())
    documented = {(m, p) for p, item in doc["paths"].items() for m in item if m in HTTP_METHODS}
    try:
        for path in doc["paths"]:
            concrete = path.replace("{name}", "nx").replace("{server}", "nx").replace("{id}", "!")  # unknown; bad id
            for method in ("get", "post", "put", "delete", "patch"):
                status, code = await _ask(api, method.upper(), concrete)
                if (method, path) in documented:
                    assert status != 405 and (status, code) != (404, "not_found"), (method, path, status, code)
                else:
                    assert (status, code) == (405, "method_not_allowed"), (method, path, status, code)
        actions = {p.rsplit("/", 1)[1] for p in doc["paths"] if p.count("/") == 4} | {"token", "login", "x"}
        for prefix in ("/v1/servers/{name}", "/v1/secrets/{name}", "/v1/grants/{id}"):
            for action in sorted(actions):
                path = f"{prefix}/{action}"
                if any(p == path for _, p in documented):
                    continue
                for method in ("GET", "POST", "DELETE"):
                    answer = await _ask(api, method, path.replace("{name}", "nx").replace("{id}", "x"))
                    assert answer == (404, "not_found"), (method, path, answer)
    finally:
        await broker.aclose()


def test_server_is_the_unix_socket_placeholder(doc: dict[str, Any]) -> None:
    (server,) = doc["servers"]
    assert server["url"] == "http://mcpcreds"
    assert "Unix socket" in server["description"]


def test_grant_bearer_is_optional(doc: dict[str, Any]) -> None:
    scheme = doc["components"]["securitySchemes"]["grant"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert {} in doc["security"], "the bearer must be optional: an allowed peer may call without a grant"
    assert {"grant": []} in doc["security"]


def test_name_parameter_takes_a_cache_key(doc: dict[str, Any]) -> None:
    description = doc["components"]["parameters"]["ServerName"]["description"]
    assert "service:crm" in description and "mcp:docs" in description


def test_request_defaults(doc: dict[str, Any]) -> None:
    acquire = _schema(doc, "AcquireRequest")["properties"]
    assert acquire["cost"] == {**acquire["cost"], "type": "integer", "minimum": 1, "default": 1}
    assert acquire["max_wait"] == {**acquire["max_wait"], "type": "number", "minimum": 0, "default": 0}
    assert set(_schema(doc, "InvalidateRequest")["properties"]) == {"reason", "fingerprint"}
    assert _schema(doc, "BackoffRequest")["properties"]["retry_after"]["type"] == "number"
    assert {"servers", "ttl"} <= set(_schema(doc, "GrantRequest")["properties"])


def test_response_shapes(doc: dict[str, Any]) -> None:
    spec = _schema(doc, "McpServerSpec")["properties"]
    assert set(spec) == {"name", "endpoint", "headers", "tags", "aauth", "oauth", "auth", "service", "rate",
                         "trust", "limits"}
    assert set(spec["limits"]["properties"]) == {"allow", "exclude", "timeout"}
    assert spec["tags"]["items"]["enum"] == ["untrusted_input", "sensitive", "egress"]
    headers = _schema(doc, "HeadersResponse")
    assert set(headers["required"]) == {"headers", "key", "expires_at", "fingerprint"}
    assert headers["properties"]["expires_at"]["type"] == ["number", "null"]
    assert headers["properties"]["fingerprint"]["type"] == ["string", "null"]
    assert set(_schema(doc, "AcquireResponse")["required"]) == {"granted", "waited"}
    status = _schema(doc, "Status")
    assert status["additionalProperties"] is True
    assert {"version", "logins", "buckets", "servers"} <= set(status["properties"])
    assert _schema(doc, "LoginStatus")["properties"]["state"]["enum"] == [
        "valid", "renewing", "stale", "failing", "none"]


@pytest.mark.parametrize(
    ("path", "method", "status", "codes"),
    [
        ("/v1/servers/{name}/acquire", "post", "400", {"invalid_request"}),
        ("/v1/servers/{name}/headers", "get", "403", {"forbidden", "proxy_only"}),
        ("/v1/servers/{name}/call", "post", "403", {"forbidden", "proxy_only"}),
        ("/v1/servers/{name}/headers", "get", "404", {"unknown_server"}),
        ("/v1/secrets/{name}/rotated", "post", "404", {"unknown_secret"}),
        ("/v1/grants/{id}", "delete", "404", {"not_found"}),
        ("/v1/servers/{name}/call", "post", "413", {"payload_too_large"}),
        ("/v1/servers/{name}/call", "post", "429", {"rate_limited"}),
        ("/v1/servers/{name}/call", "post", "431", {"headers_too_large"}),
        ("/v1/servers/{name}/call", "post", "502", {"token_endpoint_error"}),
        ("/v1/servers/{name}/call", "post", "503", {"secret_unavailable", "state_unavailable"}),
        ("/v1/servers/{name}/call", "post", "504", {"token_endpoint_timeout"}),
    ],
)
def test_error_codes(doc: dict[str, Any], path: str, method: str, status: str, codes: set[str]) -> None:
    response = doc["paths"][path][method]["responses"][status]
    schema = _json_schema_of(doc, response)
    assert schema["allOf"][0] == {"$ref": "#/components/schemas/Error"}
    assert set(schema["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"]) == codes


def test_every_wire_code_is_documented(doc: dict[str, Any]) -> None:
    from mcpcreds.errors import ERRORS_BY_CODE

    described = _schema(doc, "Error")["properties"]["error"]["properties"]["code"]["description"]
    for code in ERRORS_BY_CODE:
        if code not in ("config_error", "sidecar_unavailable"):  # the CLI's and the client's own
            assert code in described, code


def _gateway_codes(doc: dict[str, Any], method: str, status: str) -> set[str]:
    schema = _json_schema_of(doc, doc["paths"]["/mcp/{server}"][method]["responses"][status])
    assert schema["allOf"][0] == {"$ref": "#/components/schemas/GatewayError"}
    return set(schema["allOf"][1]["properties"]["error"]["properties"]["data"]["properties"]["code"]["enum"])


def test_the_gateway_route(doc: dict[str, Any]) -> None:
    """`/mcp/{server}`: JSON-RPC in, JSON or SSE out, its errors JSON-RPC errors with the wire code."""
    post = doc["paths"]["/mcp/{server}"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/JsonRpcBody"}
    assert set(post["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert "202" in post["responses"] and "-32602" in post["description"]
    assert _gateway_codes(doc, "post", "403") == {"forbidden", "proxy_disabled"}
    assert _gateway_codes(doc, "post", "429") == {"rate_limited"}
    assert "Retry-After" in post["responses"]["429"]["headers"]
    assert _gateway_codes(doc, "post", "502") == {"upstream_error", "token_endpoint_error"}
    assert _gateway_codes(doc, "get", "504") == {"upstream_timeout", "token_endpoint_timeout"}
    assert set(doc["paths"]["/mcp/{server}"]["get"]["responses"]["200"]["content"]) == {"text/event-stream"}
    assert set(_schema(doc, "GatewayError")["required"]) == {"jsonrpc", "id", "error"}


def test_rate_limited_carries_retry_after(doc: dict[str, Any]) -> None:
    response = doc["components"]["responses"]["RateLimited"]
    assert "Retry-After" in response["headers"]
    error = response["content"]["application/json"]["schema"]["allOf"][1]["properties"]["error"]
    assert "retry_after" in error["required"]
