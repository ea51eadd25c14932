"""Where the default socket is (mcpcreds.core.socket_check), the same for `serve` and every client
whatever environment the client was started with: an MCP client starts its stdio servers with a
reduced environment, without $XDG_RUNTIME_DIR."""

from __future__ import annotations

import os
from pathlib import Path

from mcpcreds.client.address import socket_file
from mcpcreds.config.load import default_socket_path
from mcpcreds.core.socket_check import default_socket, runtime_folder
from tests.test_hardening_socket import NOBODY

# what the MCP SDK passes a stdio server it starts (get_default_environment)
REDUCED = {k: v for k, v in {"HOME": "/root", "LOGNAME": "root", "PATH": "/usr/bin", "SHELL": "/bin/sh",
                             "TERM": "xterm", "USER": "root"}.items()}


def test_without_xdg_runtime_dir_the_users_run_folder_is_found(tmp_path: Path) -> None:
    uid = os.getuid()
    (tmp_path / str(uid)).mkdir()
    assert runtime_folder(REDUCED, uid, str(tmp_path)) == str(tmp_path / str(uid))
    assert default_socket(REDUCED, uid, str(tmp_path)) == str(tmp_path / str(uid) / "mcpcreds" / "mcpcreds.sock")
    assert runtime_folder({"XDG_RUNTIME_DIR": "/elsewhere"}, uid, str(tmp_path)) == "/elsewhere"


def test_a_run_folder_that_is_a_link_or_another_users_is_not_taken(tmp_path: Path) -> None:
    uid = os.getuid()
    (tmp_path / "real").mkdir()
    (tmp_path / str(uid)).symlink_to(tmp_path / "real")
    assert runtime_folder(REDUCED, uid, str(tmp_path)) is None
    assert default_socket(REDUCED, uid, str(tmp_path)) == f"/tmp/mcpcreds-{uid}/mcpcreds.sock"
    (tmp_path / str(NOBODY)).mkdir()  # owned by this uid, not by nobody
    assert runtime_folder(REDUCED, NOBODY, str(tmp_path)) is None


def test_serve_and_the_clients_agree(monkeypatch: object) -> None:
    assert socket_file() == str(default_socket_path())
