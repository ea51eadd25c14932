"""A 'browser' for the tests, named by $BROWSER: what Python's `webbrowser.open(url)` starts when a
login opens the browser. It records the URL (one line in $MCPCREDS_TEST_BROWSER_LOG, so a test
counts how many times a browser was opened) and approves the login as a person does
(`oidc_peer.approve_in_browser`: the sign-in and consent pages, then the redirect to the loopback
listener), in a process of its own: like a real browser, the command returns at once.

$BROWSER holds a path to an executable, so the test writes a two-line shell script that runs
``python -m tests.peers.browser "$1"`` with this repository on PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG_ENV = "MCPCREDS_TEST_BROWSER_LOG"


def script(folder: Path, log: Path) -> Path:
    """The executable to give as $BROWSER."""
    path = folder / "browser"
    path.write_text(f'#!/bin/sh\nMCPCREDS_TEST_BROWSER_LOG="{log}" PYTHONPATH="{ROOT}" '
                    f'exec "{sys.executable}" -m tests.peers.browser "$1"\n')
    path.chmod(0o700)
    return path


def opened(log: Path) -> list[str]:
    """The URLs the browser was opened with."""
    return log.read_text().splitlines() if log.exists() else []


def main(url: str) -> int:
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(url + "\n")
    subprocess.Popen([sys.executable, "-c", "import sys; from tests.peers.oidc_peer import approve_in_browser; "
                      "approve_in_browser(sys.argv[1])", url],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
