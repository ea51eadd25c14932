"""The pipelined connection's reply parser (pure): every RESP2/RESP3 reply the bucket script and
the connection can see, incomplete input, and input that must drop the connection; and the
connection's protocol handing each reply to its caller, however the replies are cut into reads."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from redis.exceptions import NoScriptError

from mcpcreds.state.redis_pipe import ProtocolError, ReplyError, _Replies, pack, parse_reply

BUCKET_REPLY = b"*4\r\n:1\r\n$1\r\n0\r\n$6\r\n999999\r\n$1\r\n0\r\n"


def test_the_bucket_scripts_reply_and_every_prefix_of_it() -> None:
    assert parse_reply(BUCKET_REPLY) == ([1, b"0", b"999999", b"0"], len(BUCKET_REPLY))
    for cut in range(len(BUCKET_REPLY)):  # a reply split anywhere across reads waits for the rest
        assert parse_reply(BUCKET_REPLY[:cut]) is None
    two = BUCKET_REPLY + b":7\r\n"
    _, end = parse_reply(two) or (None, 0)
    assert parse_reply(two, end) == (7, len(two))


@pytest.mark.parametrize(("wire", "value"), [
    (b"+OK\r\n", b"OK"), (b":-3\r\n", -3), (b"$-1\r\n", None), (b"_\r\n", None), (b",1.5\r\n", 1.5),
    (b"#t\r\n", True), (b"#f\r\n", False), (b"$0\r\n\r\n", b""), (b"*0\r\n", []), (b"*-1\r\n", None),
    (b"%1\r\n+a\r\n:1\r\n", [b"a", 1]), (b"~1\r\n:2\r\n", [2]), (b"(12345678901234567890\r\n", 12345678901234567890),
])
def test_resp2_and_resp3_values(wire: bytes, value: object) -> None:
    assert parse_reply(wire) == (value, len(wire))


def test_errors_are_values_and_pushes_are_marked() -> None:
    error, _ = parse_reply(b"-NOSCRIPT No matching script\r\n") or (None, 0)
    assert isinstance(error, ReplyError) and str(error).startswith("NOSCRIPT")
    assert parse_reply(b">2\r\n+invalidate\r\n*0\r\n") == (("push", [b"invalidate", []]), 21)


@pytest.mark.parametrize("wire", [b"?1\r\n", b"$99999999999\r\n", b"*5000\r\n", b"*1\r\n" * 8 + b":1\r\n",
                                  b"x" * (2 << 20)])
def test_what_is_not_a_reply_drops_the_connection(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_reply(wire)


def test_pack_is_a_resp_array_of_bulk_strings() -> None:
    assert pack(("EVALSHA", b"ab", 1, 0.5)) == b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$3\r\n0.5\r\n"


def _replies() -> tuple[asyncio.AbstractEventLoop, list[asyncio.Future[Any]], _Replies, list[BaseException]]:
    loop = asyncio.new_event_loop()
    futures = [loop.create_future() for _ in range(3)]
    lost: list[BaseException] = []
    return loop, futures, _Replies(deque((f, 0.0) for f in futures), lost.append), lost


# three replies on one connection, the second an error
STREAM = BUCKET_REPLY + b"-NOSCRIPT No matching script\r\n" + BUCKET_REPLY.replace(b":1\r\n", b":0\r\n")


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_replies_split_anywhere_reach_their_callers_in_order(cut: int) -> None:
    """Three replies cut into two reads at every point: each caller gets its own reply, the error
    is raised to its caller only, nothing is lost or left over."""
    loop, futures, protocol, lost = _replies()
    try:
        protocol.data_received(STREAM[:cut])
        protocol.data_received(STREAM[cut:])
        assert lost == []
        assert futures[0].result() == [1, b"0", b"999999", b"0"]
        with pytest.raises(NoScriptError):
            futures[1].result()
        assert futures[2].result() == [0, b"0", b"999999", b"0"]
        assert protocol.buf == b""
    finally:
        loop.close()


def test_a_reply_nobody_asked_for_drops_the_connection() -> None:
    loop, futures, protocol, lost = _replies()
    try:
        protocol.data_received(BUCKET_REPLY * 4)
        assert all(f.done() for f in futures) and len(lost) == 1
    finally:
        loop.close()
