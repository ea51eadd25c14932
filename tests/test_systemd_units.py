"""The shipped units: install-units writes them, systemd-analyze accepts them, contrib/ matches,
the hardening the issue lists is there, and LoadCredential= reaches the dir: source."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mcpcreds.cli.units import SYSTEM_EXEC, USER_EXEC, install, render
from mcpcreds.config.load import parse_config
from mcpcreds.credentials.sources import DirSource, SecretResolver
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
ANALYZE = shutil.which("systemd-analyze")
EXEC = f"{sys.executable} -m mcpcreds"  # exists here, so verify can check ExecStart=
HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "UMask": "0077", "RuntimeDirectory": "mcpcreds",
    "StateDirectory": "mcpcreds", "Type": "notify", "ExecReload": "kill -HUP $MAINPID",
    "RuntimeDirectoryPreserve": "yes",  # else stopping the service deletes the socket unit's file
}


def keys(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("scope", ["user", "system"])
def test_units_carry_activation_notify_and_hardening(scope: str) -> None:
    units = {u.name: keys(u.text) for u in render(scope, EXEC)}
    service, sock = units["mcpcreds.service"], units["mcpcreds.socket"]
    for key, value in HARDENING.items():
        assert service.get(key) == [value], key
    assert service["ExecStart"] == [f"{EXEC} serve"]
    assert "WatchdogSec" in service
    assert sock["Accept"] == ["no"] and sock["SocketMode"] == ["0600"] and sock["DirectoryMode"] == ["0700"]
    # the service's MCPCREDS_SOCKET is the socket unit's path: serve refuses any other
    assert f"MCPCREDS_SOCKET={sock['ListenStream'][0]}" in service["Environment"]
    if scope == "system":
        assert service["User"] == ["mcpcreds"] and sock["SocketUser"] == ["mcpcreds"]
        assert "d /run/mcpcreds 0700 mcpcreds mcpcreds -" in render(scope, EXEC)[3].text


@pytest.mark.parametrize(("scope", "exec_start"), [("user", USER_EXEC), ("system", SYSTEM_EXEC)])
def test_contrib_is_what_install_units_writes(scope: str, exec_start: str) -> None:
    folder = ROOT / "contrib" / "systemd" / scope
    shipped = {p.name: p.read_text() for p in folder.iterdir()}
    assert shipped == {u.name: u.text for u in render(scope, exec_start)}


def test_install_units_writes_and_refuses_to_overwrite(tmp_path: Path) -> None:
    dest = tmp_path / "units"
    result = run_cli("install-units", "--user", "--dest", str(dest), "--exec", EXEC)
    assert result.code == 0, result.output
    assert sorted(p.name for p in dest.iterdir()) == ["mcpcreds.service", "mcpcreds.socket"]
    for path in dest.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert f"ExecStart={EXEC} serve\n" in (dest / "mcpcreds.service").read_text()
    assert "systemctl --user daemon-reload" in result.stdout
    (dest / "mcpcreds.service").write_text("mine")
    with pytest.raises(FileExistsError, match="--force"):
        install("user", dest, EXEC)
    assert (dest / "mcpcreds.service").read_text() == "mine"
    install("user", dest, EXEC, force=True)
    assert (dest / "mcpcreds.service").read_text() == render("user", EXEC)[1].text
    assert sorted(p.name for p in install("system", tmp_path / "sys", EXEC)) == [
        "mcpcreds.service", "mcpcreds.socket", "mcpcreds.sysusers.conf", "mcpcreds.tmpfiles.conf"]


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze missing")
@pytest.mark.parametrize("scope", ["user", "system"])
def test_systemd_analyze_verify_and_security(scope: str, tmp_path: Path) -> None:
    dest = tmp_path / "units"
    install(scope, dest, EXEC)
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0", "PATH": "/usr/bin:/bin"}
    mode = ["--user"] if scope == "user" else []
    verify = subprocess.run([str(ANALYZE), *mode, "verify", "mcpcreds.socket", "mcpcreds.service"],
                            cwd=dest, capture_output=True, text=True, env=env, timeout=60)
    assert verify.returncode == 0 and verify.stderr == "" and verify.stdout == "", verify
    security = subprocess.run([str(ANALYZE), *mode, "security", "--offline=true", "--no-pager",
                               "./mcpcreds.service"], cwd=dest, capture_output=True, text=True, env=env,
                              timeout=60)
    if "--offline" in security.stderr:
        pytest.skip("this systemd-analyze has no --offline")
    score = re.search(r"Overall exposure level for mcpcreds.service: ([0-9.]+)", security.stdout)
    assert score is not None, security
    # 1.3 (system) and 2.1 (user, no User=) with systemd 252; docs/tasks/systemd.md reports them
    assert float(score.group(1)) <= (1.5 if scope == "system" else 2.5), security.stdout


def test_credentials_directory_feeds_the_dir_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config({"secrets": {"sources": ["env", "dir:$CREDENTIALS_DIRECTORY"]},
                           "servers": [{"name": "docs", "endpoint": "https://docs.example.com/mcp",
                                        "headers": {"X-Api-Key": "{{secret:DOCS_KEY}}"}}]})
    creds = tmp_path / "credentials"  # what LoadCredential=DOCS_KEY:... makes
    creds.mkdir(mode=0o700)
    (creds / "DOCS_KEY").write_text("from-load-credential\n")
    (creds / "DOCS_KEY").chmod(0o400)
    monkeypatch.delenv("DOCS_KEY", raising=False)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    resolver = SecretResolver.from_config(config.secrets)
    assert [type(s) for s in resolver.sources][1] is DirSource
    assert resolver.secret("DOCS_KEY").reveal() == "from-load-credential"
    assert resolver.origin("DOCS_KEY") == f"dir:{creds}"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")  # not started by systemd: the source reads nothing
    assert len(SecretResolver.from_config(config.secrets).sources) == 1
    with pytest.raises(Exception, match="unknown source"):
        parse_config({"secrets": {"sources": ["dir:$HOME"]}})
