"""The asyncio twin of `uds.SyncUdsHttp`, for `AsyncClient`: asyncio streams + httptools.

Kept connections are reused (one per concurrent request, per event loop); a connection that fails
before any answer byte is reported retryable. Each new connection is checked before its first
byte (`socket_check`): the folder, then the peer's uid.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .socket_check import check_folder, check_peer
from .uds import Parsed, Retryable, decode_json, encode


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        parsed = Parsed()
        received = False
        self.writer.write(request)
        while not parsed.done:
            try:
                chunk = await self.reader.read(65536)
            except OSError as exc:
                if received:
                    raise
                raise Retryable(str(exc)) from None  # no answer byte yet: the sidecar went away
            if not chunk:
                if received:
                    raise ConnectionResetError("the sidecar closed the connection mid-answer")
                raise Retryable("the sidecar closed the connection")
            received = True
            parsed.parser.feed_data(chunk)
        return parsed.status, b"".join(parsed.body), parsed.keep_alive

    def close(self) -> None:
        self.writer.close()


class UdsHttp:
    """`await http.request("POST", "/v1/...", {"cost": 1}, timeout=10)` -> (status, JSON body)."""

    def __init__(self, path: str, headers: dict[str, str], sidecar_uid: int) -> None:
        self.path = path
        self.sidecar_uid = sidecar_uid
        self._head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._drop_idle()
            self._loop = loop
        if self._idle:
            return self._idle.pop()
        try:
            check_folder(self.path, self.sidecar_uid)
            reader, writer = await asyncio.open_unix_connection(self.path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise Retryable(str(exc)) from None
        try:
            check_peer(writer.get_extra_info("socket"), self.path, self.sidecar_uid)
        except BaseException:
            writer.close()
            raise
        return _Connection(reader, writer)

    async def request(self, method: str, path: str, body: dict[str, Any] | None,
                      timeout: float) -> tuple[int, Any]:
        async with asyncio.timeout(timeout):  # no task per call, unlike wait_for on 3.11
            conn = await self._connection()
            try:
                status, raw, keep = await conn.exchange(encode(self._head, method, path, body))
            except BaseException:  # failed or cancelled mid-request: its state is unknown
                conn.close()
                raise
        if keep:
            self._idle.append(conn)
        else:
            conn.close()
        return status, decode_json(raw)

    def _drop_idle(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def aclose(self) -> None:
        self._drop_idle()
