"""`mcpcreds init`: a commented starter config where the config is looked for, that `mcpcreds
check` passes without a warning, with the keyring as a source when a real one (gnome-keyring on a
private D-Bus) answers, else the environment and a private `dir:` folder; never over a file."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

from tests.conftest import KeyringSession, run_cli


def user_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_DATA_HOME": str(tmp_path / "data"),
            "MCPCREDS_CONFIG": "", "MCPCREDS_SOCKET": "", **extra}


def test_init_writes_a_config_check_passes_and_says_what_to_run(tmp_path: Path,
                                                                keyring_session: KeyringSession) -> None:
    env = user_env(tmp_path, DBUS_SESSION_BUS_ADDRESS=keyring_session.bus_address)
    result = run_cli("init", env=env)
    assert result.code == 0, result.output
    path = tmp_path / "config" / "mcpcreds" / "config.toml"
    assert f"wrote {path}" in result.stdout
    assert "mcpcreds check" in result.stdout and "mcpcreds serve" in result.stdout
    assert "--config" not in result.stdout  # the default path: the commands need no --config
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    data = tomllib.loads(text)
    assert data["sidecar"]["socket"] == str(tmp_path / "run" / "mcpcreds" / "mcpcreds.sock")
    assert data["secrets"]["sources"] == ["env", "keyring"]  # a keyring answers here
    (server,) = data["servers"]
    assert server["tool_allowlist"] and server["expose"] == "proxy"
    assert text.count("\n#") >= 5  # commented: what each part is for
    check = run_cli("check", env=env)
    assert check.code == 0 and check.stderr == "", check.output  # not even a warning or a hint
    assert "example  mcp:example  https://mcp.example.com/mcp" in check.stdout
    # never over a file, not even its own
    again = run_cli("init", env=env)
    assert again.code == 73 and f"{path} exists: not overwritten" in again.stderr
    assert path.read_text() == text


def test_without_a_keyring_the_sources_are_env_and_a_private_folder(tmp_path: Path) -> None:
    env = user_env(tmp_path, DBUS_SESSION_BUS_ADDRESS=f"unix:path={tmp_path / 'no-bus'}")
    out = tmp_path / "elsewhere" / "mine.toml"
    result = run_cli("init", "-o", str(out), env=env)
    assert result.code == 0, result.output
    assert f"--config {out}" in result.stdout and "no usable keyring" in result.stdout
    folder = tmp_path / "data" / "mcpcreds" / "secrets"
    assert tomllib.loads(out.read_text())["secrets"]["sources"] == ["env", f"dir:{folder}"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not (tmp_path / "config" / "mcpcreds" / "config.toml").exists()
    check = run_cli("check", "--config", str(out), env=env)
    assert check.code == 0 and check.stderr == "", check.output
    # `--config PATH` names where to write, as for every command
    other = tmp_path / "other.toml"
    assert run_cli("init", "--config", str(other), env=env).code == 0 and other.exists()
    assert run_cli("init", "--config", str(other), env=env).code == 73
    assert os.path.getsize(other) == os.path.getsize(out)
