"""`AsyncClient`'s connections (uds_async, issue 18), and the stdio bridge's (uds_stream): what a
sidecar that misbehaves on a kept connection does to the next call. The sidecar is a hand-written fake (fault injection): an asyncio
server in the test's own loop that answers each request as its script says, per connection."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from mcpcreds import AsyncClient, SidecarUnavailable
from mcpcreds.client.uds import MAX_HEAD, MAX_RESPONSE, Retryable
from mcpcreds.client.uds_stream import StreamUdsHttp

BOUND = 20.0  # what no correct run comes near


def answer(text: str, extra: bytes = b"") -> bytes:
    body = json.dumps({"headers": {"X": text}, "key": "k", "expires_at": None, "fingerprint": None}).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s%s" % (
        len(body), body, extra)


class Fake:
    """Connection i's request j gets `scripts[i][j]` ("answer" once the script runs out):
    "answer" (keep-alive), "hold" (answer once `release` is set), "close" (no answer),
    "answer+close", "answer+stray" (a second answer in the same write), "huge head", "huge body".
    Every answer names its connection and request: "c0r1"."""

    def __init__(self, scripts: list[list[str]]) -> None:
        self.scripts = scripts
        self.opened = 0
        self.release = asyncio.Event()
        self.holding = asyncio.Event()  # a "hold" request has arrived
        self.ended: list[asyncio.Event] = []  # set when connection i is closed by the client

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index, self.opened = self.opened, self.opened + 1
        self.ended.append(asyncio.Event())
        script = self.scripts[index] if index < len(self.scripts) else []
        turn = 0
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")  # IncompleteReadError once the client closes
                what = script[turn] if turn < len(script) else "answer"
                if what == "close":
                    return
                if what == "hold" and not await self._released(reader):
                    return
                if what == "huge head":
                    writer.write(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (MAX_HEAD + 10))
                elif what == "huge body":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * MAX_RESPONSE)
                                 + b"a" * (MAX_RESPONSE + 10))
                else:
                    writer.write(answer(f"c{index}r{turn}", answer("stray") if what == "answer+stray" else b""))
                await writer.drain()
                if what == "answer+close":
                    return
                turn += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.ended[index].set()
            writer.close()

    async def _released(self, reader: asyncio.StreamReader) -> bool:
        """Waits for `release`; False if the client closes the connection first."""
        self.holding.set()
        closed = asyncio.ensure_future(reader.read(1))  # b"": closed (a byte: a next request)
        released = asyncio.ensure_future(self.release.wait())
        await asyncio.wait({closed, released}, return_when=asyncio.FIRST_COMPLETED)
        if closed.done() and not closed.result():
            released.cancel()
            return False
        await released
        return True

    async def closed(self, index: int) -> None:
        await asyncio.wait_for(self.ended[index].wait(), BOUND)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Path, list[Fake]]]:
    """The socket path and a list to put the fake in (each test scripts its own)."""
    path = tmp_path / "run" / "s.sock"
    path.parent.mkdir(mode=0o700)
    fakes: list[Fake] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await fakes[0].serve(reader, writer)

    server = await asyncio.start_unix_server(handle, str(path))
    async with server:
        yield path, fakes


def scripted(served: tuple[Path, list[Fake]], *scripts: list[str]) -> tuple[Path, Fake]:
    path, fakes = served
    fakes.append(Fake(list(scripts)))
    return path, fakes[0]


async def until_closed_seen(creds: AsyncClient) -> None:
    """Until the client's loop has read the sidecar's close of its one kept connection."""
    async with asyncio.timeout(BOUND):
        while not creds._http._idle[0].closed:
            await asyncio.sleep(0.001)


async def test_a_timed_out_call_is_an_error_and_its_connection_is_closed_not_reused(
        served: tuple[Path, list[Fake]]) -> None:
    path, fake = scripted(served, ["answer", "hold"])
    async with AsyncClient(path, connect_retry=0) as creds:
        assert (await creds.headers("a"))["X"] == "c0r0"
        creds.timeout = 0.3  # for the held call only: the others may take long on a busy machine
        with pytest.raises(SidecarUnavailable, match="did not answer in time"):
            await creds.headers("a")
        creds.timeout = BOUND
        await fake.closed(0)  # the sidecar sees the connection end
        fake.release.set()  # a late answer on it would be read as the next call's
        assert (await creds.headers("a"))["X"] == "c1r0"


async def test_a_cancelled_call_closes_its_connection(served: tuple[Path, list[Fake]]) -> None:
    path, fake = scripted(served, ["hold"])
    async with AsyncClient(path, timeout=3 * BOUND, connect_retry=0) as creds:  # closed before its timeout
        call = asyncio.ensure_future(creds.headers("a"))
        await asyncio.wait_for(fake.holding.wait(), BOUND)  # the request is in flight
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await fake.closed(0)
        fake.release.set()
        assert (await creds.headers("a"))["X"] == "c1r0"


async def test_a_kept_connection_the_sidecar_closes_as_it_is_used_is_retried(
        served: tuple[Path, list[Fake]]) -> None:
    path, fake = scripted(served, ["answer", "close"])
    async with AsyncClient(path) as creds:
        assert (await creds.headers("a"))["X"] == "c0r0"
        assert (await creds.headers("a"))["X"] == "c1r0"  # retried on a new connection, no error
    assert fake.opened == 2


async def test_a_kept_connection_the_sidecar_closed_while_idle_costs_no_retry(
        served: tuple[Path, list[Fake]]) -> None:
    path, _ = scripted(served, ["answer+close"])
    async with AsyncClient(path, connect_retry=0) as creds:  # a retry would be an error
        assert (await creds.headers("a"))["X"] == "c0r0"
        await until_closed_seen(creds)
        assert (await creds.headers("a"))["X"] == "c1r0"


async def test_bytes_past_an_answer_are_not_read_as_the_next_answer(served: tuple[Path, list[Fake]]) -> None:
    path, fake = scripted(served, ["answer+stray"])
    async with AsyncClient(path, connect_retry=0) as creds:
        assert (await creds.headers("a"))["X"] == "c0r0"
        assert (await creds.headers("a"))["X"] == "c1r0"
    await fake.closed(0)


@pytest.mark.parametrize("what", ["huge head", "huge body"])
async def test_an_oversized_answer_is_malformed_at_once(served: tuple[Path, list[Fake]], what: str) -> None:
    path, fake = scripted(served, [what])
    async with AsyncClient(path, timeout=BOUND, connect_retry=0) as creds:
        with pytest.raises(SidecarUnavailable, match="malformed"):  # not a wait for the timeout
            await creds.headers("a")
        await fake.closed(0)
        assert (await creds.headers("a"))["X"] == "c1r0"


# ------------------------------------------------------------------------ the stdio bridge's client


class Collected:
    """An answer as `StreamUdsHttp` hands it over."""

    def __init__(self) -> None:
        self.status = 0
        self.chunks: list[bytes] = []

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status

    def body(self, chunk: bytes) -> None:
        self.chunks.append(chunk)


async def streamed(http: StreamUdsHttp) -> str:
    got = Collected()
    await http.request("GET", {"Accept": "application/json"}, None, got)  # the fake reads no body
    assert got.status == 200
    return str(json.loads(b"".join(got.chunks))["headers"]["X"])


def stream_client(path: Path) -> StreamUdsHttp:
    return StreamUdsHttp(str(path), os.getuid(), "/mcp/x", {})


async def test_the_bridge_keeps_its_connection_and_retries_one_closed_as_it_is_used_once(
        served: tuple[Path, list[Fake]]) -> None:
    path, fake = scripted(served, ["answer", "answer", "close"], ["close"])
    http = stream_client(path)
    assert [await streamed(http), await streamed(http)] == ["c0r0", "c0r1"]  # one kept connection
    with pytest.raises(Retryable):  # the kept one closed, then the new one too: not sent a third time
        await streamed(http)
    assert fake.opened == 2
    assert await streamed(http) == "c2r0"
    http.close()


async def test_the_bridge_closes_the_connection_of_a_cancelled_request(served: tuple[Path, list[Fake]]) -> None:
    path, fake = scripted(served, ["hold"])
    http = stream_client(path)
    call = asyncio.ensure_future(streamed(http))
    await asyncio.wait_for(fake.holding.wait(), BOUND)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await fake.closed(0)  # over HTTP, how a stream is ended
    fake.release.set()
    assert await streamed(http) == "c1r0"
    http.close()


@pytest.mark.parametrize("what", ["answer+stray", "huge head"])
async def test_the_bridge_reads_nothing_past_an_answer_nor_a_head_too_large(
        served: tuple[Path, list[Fake]], what: str) -> None:
    path, fake = scripted(served, [what])
    http = stream_client(path)
    if what == "huge head":
        with pytest.raises(ValueError, match="head too large"):
            await streamed(http)
    else:
        assert await streamed(http) == "c0r0"
    await fake.closed(0)
    assert await streamed(http) == "c1r0"
    http.close()


# ------------------------------------------------------------------------ one client, two loops


@pytest.fixture
def threaded(tmp_path: Path) -> Iterator[Path]:
    """A keep-alive fake in a thread: answers every request on every connection."""
    path = tmp_path / "run" / "s.sock"
    path.parent.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)

    def serve(conn: socket.socket) -> None:
        with conn:
            while conn.recv(65536):
                conn.sendall(answer("ok"))

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield path
    finally:
        server.close()


def test_a_client_works_in_one_event_loop_after_another(threaded: Path) -> None:
    creds = AsyncClient(threaded, connect_retry=0)
    assert asyncio.run(creds.headers("a"))["X"] == "ok"  # its kept connection's loop then ends
    assert asyncio.run(creds.headers("a"))["X"] == "ok"
    asyncio.run(creds.aclose())
