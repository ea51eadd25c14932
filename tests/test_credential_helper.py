"""`mcpcreds credential-helper`: git's and docker's credential helper protocols against a real
sidecar. Which server a host means, what credential its headers carry, `expose = "proxy"` refused."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpcreds.cli.credential_helper import NoMatch, credential_of, match_server, read_git_request
from mcpcreds.errors import InvalidRequest
from tests.conftest import CliResult, run_cli
from tests.sidecar_proc import SidecarProcess, run_sidecar

ORG_TOKEN = "org-token-7d1c0b"
TEAM_TOKEN = "team-token-2e9a44"
API_KEY = "api-key-51b0f3"
HIDDEN = "hidden-token-aa83c1-never-out"
REGISTRY_USER, REGISTRY_PASSWORD = "robot$ci", "registry-pass-0c7e:x"

CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]

[[servers]]
name = "org"
endpoint = "https://git.example.com/org"
headers = {{ "Authorization" = "Bearer {{{{secret:ORG_TOKEN}}}}" }}

[[servers]]
name = "team"
endpoint = "https://git.example.com/org/team/"
headers = {{ "Authorization" = "Bearer {{{{secret:TEAM_TOKEN}}}}" }}

[[servers]]
name = "api"
endpoint = "https://api.example.com:8443/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:API_KEY}}}}" }}

[[servers]]
name = "registry"
endpoint = "https://registry.example.com:5000/v2"
headers = {{ "Authorization" = "Basic {{{{secret:REGISTRY_BASIC}}}}" }}

[[servers]]
name = "hidden"
endpoint = "https://hidden.example.com/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:HIDDEN_TOKEN}}}}" }}
expose = "proxy"
"""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    folder = tmp_path_factory.mktemp("credential-helper")
    folder.chmod(0o700)
    socket = folder / "s.sock"
    config = folder / "config.toml"
    config.write_text(CONFIG.format(socket=socket))
    basic = base64.b64encode(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}".encode()).decode()
    env = {"ORG_TOKEN": ORG_TOKEN, "TEAM_TOKEN": TEAM_TOKEN, "API_KEY": API_KEY, "REGISTRY_BASIC": basic,
           "HIDDEN_TOKEN": HIDDEN}
    with run_sidecar(config, socket, env) as proc:
        yield proc


def git(sidecar: SidecarProcess, request: str, *options: str, action: str = "get") -> CliResult:
    return run_cli("credential-helper", action, *options, "--config", str(sidecar.config), stdin=request)


def docker(sidecar: SidecarProcess, stdin: str, action: str = "get") -> CliResult:
    return run_cli("credential-helper", "--docker", action, "--config", str(sidecar.config), stdin=stdin)


def answer(result: CliResult) -> dict[str, str]:
    assert result.code == 0, result.output
    return dict(line.split("=", 1) for line in result.stdout.splitlines())


# ------------------------------------------------------------------------------------------- git


def test_git_get_answers_the_server_whose_endpoint_is_the_longest_prefix(sidecar: SidecarProcess) -> None:
    org = git(sidecar, "protocol=https\nhost=git.example.com\npath=org/tools.git\n\n")
    assert answer(org) == {"username": "mcpcreds", "password": ORG_TOKEN}
    team = git(sidecar, "protocol=https\nhost=git.example.com\npath=org/team/app.git\n\n")
    assert answer(team) == {"username": "mcpcreds", "password": TEAM_TOKEN}
    # a segment boundary: org/teamwork is not under org/team
    assert answer(git(sidecar, "protocol=https\nhost=GIT.example.com:443\npath=org/teamwork.git\n\n")) == {
        "username": "mcpcreds", "password": ORG_TOKEN}


def test_git_get_without_a_path_is_ambiguous_when_two_servers_share_the_host(sidecar: SidecarProcess) -> None:
    result = git(sidecar, "protocol=https\nhost=git.example.com\n\n")
    assert result.code == 2 and result.stdout == ""
    assert "org, team" in result.stderr and "--server" in result.stderr
    named = git(sidecar, "protocol=https\nhost=git.example.com\n\n", "--server", "team")
    assert answer(named)["password"] == TEAM_TOKEN


def test_git_username_is_the_one_asked_for_or_given(sidecar: SidecarProcess) -> None:
    request = "protocol=https\nhost=git.example.com\npath=org/x.git\nusername=alice\n\n"
    assert answer(git(sidecar, request))["username"] == "alice"
    assert answer(git(sidecar, request, "--username", "x-access-token"))["username"] == "x-access-token"


def test_git_get_for_a_host_no_server_has_answers_nothing(sidecar: SidecarProcess) -> None:
    for request in ("protocol=https\nhost=elsewhere.example.com\n\n",
                    "protocol=http\nhost=git.example.com\npath=org/x.git\n\n",  # another scheme
                    "protocol=https\nhost=api.example.com\n\n"):  # another port (443, not 8443)
        result = git(sidecar, request)
        assert result.code == 0 and result.stdout == "", (request, result.output)
        assert "no configured server's endpoint matches" in result.stderr


def test_git_a_single_header_is_the_password(sidecar: SidecarProcess) -> None:
    result = git(sidecar, "protocol=https\nhost=api.example.com:8443\n\n")
    assert answer(result) == {"username": "mcpcreds", "password": API_KEY}


def test_git_refuses_a_proxy_only_server(sidecar: SidecarProcess) -> None:
    for options in ((), ("--server", "hidden")):
        result = git(sidecar, "protocol=https\nhost=hidden.example.com\n\n", *options)
        assert result.code == 77, result.output
        assert result.stdout == "" and HIDDEN not in result.output
        assert "proxy_only" in result.stderr and "stays in the sidecar" in result.stderr


def test_git_store_and_erase_do_nothing(sidecar: SidecarProcess) -> None:
    request = f"protocol=https\nhost=git.example.com\npath=org/x.git\nusername=u\npassword={ORG_TOKEN}x\n\n"
    for action in ("store", "erase"):
        result = git(sidecar, request, action=action)
        assert result.code == 0 and result.output == "", result.output
    assert answer(git(sidecar, request))["password"] == ORG_TOKEN  # the sidecar's login is untouched
    assert git(sidecar, request, action="list").code == 2


# ---------------------------------------------------------------------------------------- docker


def test_docker_get_answers_json_with_the_basic_credential(sidecar: SidecarProcess) -> None:
    for url in ("registry.example.com:5000", "https://registry.example.com:5000/v2/"):
        result = docker(sidecar, url + "\n")
        assert result.code == 0, result.output
        assert json.loads(result.stdout) == {"ServerURL": url, "Username": REGISTRY_USER,
                                             "Secret": REGISTRY_PASSWORD}


def test_docker_get_for_an_unknown_registry_is_not_found(sidecar: SidecarProcess) -> None:
    result = docker(sidecar, "https://index.docker.io/v1/\n")
    assert result.code == 1 and result.stdout.strip() == "credentials not found in native keychain"


def test_docker_refuses_a_proxy_only_server_on_stdout(sidecar: SidecarProcess) -> None:
    result = docker(sidecar, "hidden.example.com\n")
    assert result.code == 77 and HIDDEN not in result.output
    assert "proxy_only" in result.stdout  # docker reports what the helper wrote on stdout


def test_docker_store_erase_list(sidecar: SidecarProcess) -> None:
    stored = json.dumps({"ServerURL": "registry.example.com:5000", "Username": "u", "Secret": "s"})
    assert docker(sidecar, stored, "store").code == 0
    assert docker(sidecar, "registry.example.com:5000\n", "erase").code == 0
    listed = docker(sidecar, "", "list")
    assert listed.code == 0 and json.loads(listed.stdout) == {}
    assert json.loads(docker(sidecar, "registry.example.com:5000\n").stdout)["Secret"] == REGISTRY_PASSWORD


def test_the_documented_docker_shim_works(sidecar: SidecarProcess, tmp_path: Path) -> None:
    """docs/reference/cli.md: a `docker-credential-mcpcreds` on PATH that runs `mcpcreds credential-helper --docker`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mcpcreds").write_text(f'#!/bin/sh\nexec {sys.executable} -m mcpcreds "$@"\n')
    shim = bin_dir / "docker-credential-mcpcreds"
    shim.write_text('#!/bin/sh\nexec mcpcreds credential-helper --docker "$@"\n')
    for path in (bin_dir / "mcpcreds", shim):
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "MCPCREDS_CONFIG": str(sidecar.config)}
    proc = subprocess.run(["docker-credential-mcpcreds", "get"], input="registry.example.com:5000",
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["Username"] == REGISTRY_USER


# ---------------------------------------------------------------------------------- the pieces


def test_read_git_request_stops_at_the_blank_line() -> None:
    import io

    request = read_git_request(io.StringIO("protocol=https\r\nhost=h\ncapability[]=authtype\nwwwauth[]=x\n\n"
                                           "host=after\n"))
    assert request == {"protocol": "https", "host": "h"}


def test_match_server_rules() -> None:
    servers: list[dict[str, Any]] = [{"name": "a", "endpoint": "https://h.example.com/mcp"},
                                     {"name": "b", "endpoint": "http://h.example.com:8080/"},
                                     {"name": "c", "endpoint": None}]
    assert match_server(servers, "https", "H.example.com:443", None) == "a"
    assert match_server(servers, "https", "h.example.com", "mcp/x") == "a"
    assert match_server(servers, None, "h.example.com:8080", None) == "b"  # docker: no scheme
    with pytest.raises(NoMatch):
        match_server(servers, "https", "h.example.com", "other/x")
    with pytest.raises(NoMatch):
        match_server(servers, "https", "h.example.com:8080", None)


def test_credential_of_headers() -> None:
    assert credential_of({"authorization": "bearer  t0k "}, None) == (None, "t0k")
    basic = base64.b64encode(b"me:p:w").decode()
    assert credential_of({"Authorization": f"Basic {basic}"}, None) == ("me", "p:w")
    assert credential_of({"X-A": "1", "X-B": "2"}, "x-b") == (None, "2")
    with pytest.raises(InvalidRequest, match="--header"):
        credential_of({"X-A": "1", "X-B": "2"}, None)
    with pytest.raises(InvalidRequest, match="Basic"):
        credential_of({"Authorization": "Basic !!!"}, None)
