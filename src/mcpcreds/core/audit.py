"""The audit log: one JSON line per rotation, invalidation, reload or grant; never a value."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from .clock import Clock
from .logs import get_logger
from .secret import redact_json

_log = get_logger("audit")


class AuditLog:
    def __init__(self, path: str | None, clock: Clock) -> None:
        self.path = path
        self.clock = clock
        self._fd: int | None = None
        if path:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            mode = stat.S_IMODE(os.fstat(self._fd).st_mode)
            if mode & 0o077:
                os.fchmod(self._fd, 0o600)
                _log.warning("audit log was readable by others; set to 0600", extra={"path": path})

    def write(self, event: str, **fields: Any) -> None:
        if self._fd is None:
            return
        entry = {"time": round(self.clock.time(), 3), "event": event, **fields}
        line = json.dumps(redact_json(entry), separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())  # one write per line: appends do not interleave

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
