"""A real `EgressProxy` in this process for the exec egress tests: on a socket in a fresh 0700
folder, admitting this uid, its audit log in `tmp_path`; and the credential header of a session."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from mcpcreds.core.audit import AuditLog
from mcpcreds.core.clock import FakeClock
from mcpcreds.exec.egress_proxy import EgressProxy


@asynccontextmanager
async def running_proxy(tmp_path: Path) -> AsyncIterator[tuple[EgressProxy, Path]]:
    """The proxy, started, and the path of its audit log; closed at the end of the block."""
    audit_path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(audit_path), FakeClock())
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    proxy = EgressProxy(str(folder / "egress.sock"), lambda: frozenset({os.getuid()}), audit, clock=FakeClock())
    await proxy.start()
    try:
        yield proxy, audit_path
    finally:
        proxy.close()
        audit.close()


def basic(token: str) -> bytes:
    """The `Proxy-Authorization: Basic` credential of a session's token."""
    return base64.b64encode(f"mcpcreds:{token}".encode())
