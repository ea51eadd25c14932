"""A keyring backend for the write-then-use test: the real one (gnome-keyring, SecretService),
except that the first write of a login entry stops at its start until the test releases it.

The test names a FIFO in MCPCREDS_TEST_KEYRING_GATE. At the start of the write the backend opens
it (read-write, so the open never blocks and a byte the test writes from then on is not lost),
logs a JSON line with the event "test keyring write started" to stderr (the sidecar's log,
which the test reads), and blocks reading one byte; only then does it store the entry. A bound
(GATE_TIMEOUT) ends the wait if the test never releases it, so a failed test cannot hang the
sidecar."""

from __future__ import annotations

import json
import os
import select
import sys
from typing import Final

from tests.fault_keyring import FirstLoginWrite, RealKeyring

GATE_ENV: Final = "MCPCREDS_TEST_KEYRING_GATE"
STARTED: Final = "test keyring write started"
GATE_TIMEOUT: Final = 120.0
_FIRST: Final = FirstLoginWrite()


class BlockFirstLoginWrite(RealKeyring):
    def set_password(self, service: str, username: str, password: str) -> None:
        if _FIRST(username):
            _wait_for_release(username)
        super().set_password(service, username, password)


def _wait_for_release(username: str) -> None:
    fd = os.open(os.environ[GATE_ENV], os.O_RDWR)
    try:
        # one write below PIPE_BUF: whole, never interleaved with the sidecar's own log lines
        os.write(sys.stderr.fileno(), (json.dumps({"event": STARTED, "entry": username}) + "\n").encode())
        ready, _, _ = select.select([fd], [], [], GATE_TIMEOUT)
        if ready:
            os.read(fd, 1)
    finally:
        os.close(fd)
