"""Issue #28 (14): the drop list of `POST /v1/exec/{name}/session` (`env_isolation = false`) is no
membership oracle. Only secrets the caller could be handed anyway are compared with the digests
it sends: an `expose = "proxy"` secret, a client secret, a server outside its grant never are."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpcreds import Client
from tests.sidecar_proc import SidecarProcess, run_sidecar

VALUES = {name: f"canary-{name.lower()}-{secrets.token_hex(12)}"
          for name in ("HIDDEN", "OPEN_KEY", "OTHER_KEY", "CLIENT_SECRET", "ENTRY_KEY", "OTHER_ENTRY_KEY")}
# the caller's variable -> the secret it holds
GUESSES = {"V_HIDDEN": "HIDDEN", "V_OPEN": "OPEN_KEY", "V_OTHER": "OTHER_KEY", "V_CLIENT": "CLIENT_SECRET",
           "V_ENTRY": "ENTRY_KEY", "V_OTHER_ENTRY": "OTHER_ENTRY_KEY"}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir: Path = tmp_path_factory.mktemp("env-oracle")
    socket, config = workdir / "run" / "s.sock", workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "hidden"
endpoint = "https://hidden.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:HIDDEN}}}}" }}
expose = "proxy"
[[servers]]
name = "open"
endpoint = "https://open.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:OPEN_KEY}}}}" }}
[[servers]]
name = "other"
endpoint = "https://other.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:OTHER_KEY}}}}" }}
[[servers]]
name = "oauthy"
endpoint = "https://oauthy.example.com/mcp"
oauth = {{ token_url = "https://127.0.0.1:9/token", client_id = "c", client_secret = "{{{{secret:CLIENT_SECRET}}}}" }}
[exec.loose]
env_isolation = false
env = {{ ENTRY_KEY = "{{{{secret:ENTRY_KEY}}}}" }}
[exec.other]
env = {{ OTHER_ENTRY_KEY = "{{{{secret:OTHER_ENTRY_KEY}}}}" }}
""")
    with run_sidecar(config, socket, env=VALUES) as proc:
        yield proc


def session(client: Client) -> list[str]:
    hashes = {var: hashlib.sha256(VALUES[name].encode()).hexdigest() for var, name in GUESSES.items()}
    hashes["V_PLAIN"] = hashlib.sha256(b"plain").hexdigest()
    answer = client.request("POST", "/v1/exec/loose/session", {"env_hashes": hashes, "proxy": False})
    assert answer["env"] == {"ENTRY_KEY": VALUES["ENTRY_KEY"]}
    drop: list[str] = answer["drop"]
    return drop


def test_a_caller_learns_nothing_of_a_secret_it_could_not_read(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        # every server's headers but the proxy-only one, and every exec entry's env, are its to read
        assert session(client) == ["V_ENTRY", "V_OPEN", "V_OTHER", "V_OTHER_ENTRY"]


def test_a_grant_holder_learns_nothing_outside_its_grant(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        grant = client.grant(["exec:loose", "open", "hidden"], ttl=60)["grant"]
    with Client(sidecar.socket, grant=grant) as held:
        assert session(held) == ["V_ENTRY", "V_OPEN"]
