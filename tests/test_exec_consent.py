"""mur's consent: a real sidecar writes an `[exec.NAME]` entry's `authorization` to the audit log
when it first applies `net = "broad_audited"` (the first proxy session of the entry), once per
entry per run, and again after a reload that changes it."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from mcpcreds import Client
from tests.sidecar_proc import SidecarProcess, run_sidecar


def _config(sock: Path, audit: Path, reason: str) -> str:
    return f"""
[sidecar]
socket = "{sock}"
audit_log = "{audit}"

[exec.wide]
net = "broad_audited"
authorization = {{ by = "alice (ops)", reason = "{reason}" }}

[exec.other]
net = "broad_audited"
authorization = {{ by = "bob", reason = "the other one" }}

[exec.narrow]
net = "restricted"
allow_hosts = ["pypi.org"]
"""


def _session(sidecar: SidecarProcess, name: str, proxy: bool = True) -> dict[str, Any]:
    with Client(str(sidecar.socket)) as client:
        answer: dict[str, Any] = client.request("POST", f"/v1/exec/{name}/session", {"proxy": proxy})
    return answer


def _consents(audit: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    return [{k: v for k, v in e.items() if k != "time"} for e in lines if e["event"] == "consent"]


def test_the_consent_is_audited_when_the_mode_is_first_applied(tmp_path: Path) -> None:
    sock, audit, config = tmp_path / "run" / "s.sock", tmp_path / "audit.jsonl", tmp_path / "config.toml"
    config.write_text(_config(sock, audit, "installs from PyPI"))
    first = {"event": "consent", "name": "wide", "net": "broad_audited", "by": "alice (ops)",
             "reason": "installs from PyPI"}
    with run_sidecar(config, sock) as sidecar:
        assert _session(sidecar, "wide", proxy=False)["proxy"] is None  # --print-env: the mode is not applied
        assert _session(sidecar, "narrow")["proxy"] is not None
        assert _consents(audit) == []
        for _ in range(2):
            assert _session(sidecar, "wide")["proxy"] is not None
        assert _consents(audit) == [first]  # once per entry per run
        _session(sidecar, "other")
        assert _consents(audit)[1:] == [{**first, "name": "other", "by": "bob", "reason": "the other one"}]

        sidecar.signal(signal.SIGHUP)  # the same consent: not written again
        sidecar.wait_for("config reloaded")
        _session(sidecar, "wide")
        assert len(_consents(audit)) == 2

        config.write_text(_config(sock, audit, "also installs from npm"))
        sidecar.signal(signal.SIGHUP)
        sidecar.wait_for("config reloaded")
        _session(sidecar, "wide")
        _session(sidecar, "wide")
        _session(sidecar, "other")
        assert _consents(audit)[2:] == [{**first, "reason": "also installs from npm"}]
        sessions = [e for e in map(json.loads, audit.read_text().splitlines()) if e["event"] == "exec"]
        assert len(sessions) == 9  # every session is audited as before, consent or not
