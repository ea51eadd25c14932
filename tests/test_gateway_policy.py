"""The gateway's protocol logic (mcpcreds.protocol.jsonrpc, .sse, .strict_json), with no I/O: parsing
what a client POSTs, counting permits, refusing tool calls, filtering tools/list results in JSON and
SSE, splitting SSE streams, and masking the credentials the gateway sent."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from mcpcreds.core.policy import TrustPolicy
from mcpcreds.protocol import jsonrpc, strict_json
from mcpcreds.protocol.jsonrpc import Inspector, JsonRpcError, parse_body
from mcpcreds.protocol.sse import _BLANK_LINE, EventTooLarge, SseSplitter
from mcpcreds.protocol.strict_json import Masker

TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "add", "delete_all")]
ALLOW_ECHO = TrustPolicy("untrusted", ("echo",))
CLOSED = TrustPolicy()
TRUSTED = TrustPolicy("trusted")


def body(data: Any) -> bytes:
    return json.dumps(data).encode()


def call(id_: Any, tool: Any = "echo") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def listing(id_: Any, tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": {"tools": tools, "nextCursor": "page-2"}}


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("raw", "code"), [
    (b"not json", jsonrpc.PARSE_ERROR),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "x", "params": NaN}', jsonrpc.PARSE_ERROR),
    (b"[" * 100_000 + b"]" * 100_000, jsonrpc.PARSE_ERROR),
    (b"\xff\xfe", jsonrpc.PARSE_ERROR),
    (b"[]", jsonrpc.INVALID_REQUEST),
    (b'"a string"', jsonrpc.INVALID_REQUEST),
    (b'{"id": 1, "method": "ping"}', jsonrpc.INVALID_REQUEST),  # no jsonrpc member
    (b'{"jsonrpc": "2.0", "id": 1, "method": 7}', jsonrpc.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', jsonrpc.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', jsonrpc.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3}', jsonrpc.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}', jsonrpc.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0"}', jsonrpc.INVALID_REQUEST),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "a"}, {"jsonrpc": "2.0", "id": 1, "method": "b"}]',
     jsonrpc.INVALID_REQUEST),  # two requests with one id: their answers could not be told apart
])
def test_what_is_not_json_rpc_is_refused_with_its_code(raw: bytes, code: int) -> None:
    with pytest.raises(JsonRpcError) as refused:
        parse_body(raw)
    assert refused.value.code == code


def test_requests_notifications_and_responses_are_told_apart() -> None:
    out = parse_body(body([call(1), {"jsonrpc": "2.0", "method": "notifications/initialized"},
                           {"jsonrpc": "2.0", "id": 9, "result": {}}, {"jsonrpc": "2.0", "id": "1", "method": "ping"}]))
    assert out.batch
    assert [m.kind for m in out.messages] == ["request", "notification", "response", "request"]
    assert out.tool_calls() == {("n", 1): "echo"}
    assert out.methods() == {("n", 1): "tools/call", ("s", "1"): "ping"}  # "1" and 1 are two ids
    assert out.single_id is None
    assert parse_body(body(call("abc"))).single_id == "abc"


@pytest.mark.parametrize(("messages", "rate_methods", "permits"), [
    ([call(1)], None, 1),
    ([call(1), call(2), {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}], None, 3),
    ([call(1), call(2), {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}], ("tools/call",), 2),
    ([{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}], ("tools/call",), 0),
    ([{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}], None, 0),
    ([{"jsonrpc": "2.0", "id": 4, "result": {}}], None, 0),  # a response to the server's request
])
def test_one_permit_per_counted_request(messages: list[dict[str, Any]], rate_methods: tuple[str, ...] | None,
                                        permits: int) -> None:
    assert jsonrpc.permits(parse_body(body(messages)), rate_methods) == permits


# ---------------------------------------------------------------------------- refusals


def test_a_call_outside_the_policy_is_refused_naming_the_policy_not_the_tool() -> None:
    guessed = "ghp_" + "x" * 36  # whatever the caller puts in a name is never echoed
    (answer,) = jsonrpc.refusals(parse_body(body(call(7, guessed))), ALLOW_ECHO, "crm")
    assert answer["id"] == 7 and answer["error"]["code"] == jsonrpc.INVALID_PARAMS
    assert "trust policy of server 'crm'" in answer["error"]["message"]
    assert "tool_allowlist" in answer["error"]["message"]
    assert guessed not in json.dumps(answer)
    assert jsonrpc.refusals(parse_body(body(call(7, "echo"))), ALLOW_ECHO, "crm") == []


def test_an_untrusted_server_without_allowlist_refuses_every_call() -> None:
    (answer,) = jsonrpc.refusals(parse_body(body(call("a", "echo"))), CLOSED, "x")
    assert "no tool_allowlist: no tool is exposed" in answer["error"]["message"]
    assert jsonrpc.refusals(parse_body(body(call("a", "anything"))), TRUSTED, "x") == []


@pytest.mark.parametrize("params", [None, {"arguments": {}}, {"name": 3}, ["echo"]])
def test_a_call_that_names_no_tool_is_refused(params: Any) -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    if params is not None:
        message["params"] = params
    (answer,) = jsonrpc.refusals(parse_body(body(message)), TRUSTED, "x")
    assert answer["error"]["code"] == jsonrpc.INVALID_PARAMS


def test_a_batch_with_a_refused_call_is_refused_whole() -> None:
    batch = [call(1, "echo"), call(2, "delete_all"), {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
             {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}]
    answers = jsonrpc.refusals(parse_body(body(batch)), ALLOW_ECHO, "x")
    assert [(a["id"], a["error"]["code"]) for a in answers] == [
        (1, jsonrpc.INVALID_REQUEST), (2, jsonrpc.INVALID_PARAMS), (3, jsonrpc.INVALID_REQUEST)]
    assert "forwarded whole or not at all" in answers[0]["error"]["message"]
    assert jsonrpc.refusals(parse_body(body([call(1, "echo"), call(2, "echo")])), ALLOW_ECHO, "x") == []


# ---------------------------------------------------------------------------- answers


def read(inspector: Inspector, raw: bytes) -> Any:
    """An answer as the inspector lets it through (it must)."""
    out = inspector.json_body(raw)
    assert out is not None
    return json.loads(out)


def names(message: dict[str, Any]) -> list[str]:
    return [t["name"] for t in message["result"]["tools"]]


def test_a_tools_list_result_is_filtered_in_a_json_answer() -> None:
    inspector = Inspector(ALLOW_ECHO, pending={("n", 1): "tools/list"})
    out = read(inspector, body(listing(1)))
    assert names(out) == ["echo"]
    assert out["result"]["nextCursor"] == "page-2"  # pagination passes: each page is filtered
    assert inspector.pending == {}


def test_any_result_shaped_like_a_tool_list_is_filtered_whatever_its_stream() -> None:
    """A listing replayed on a resumed GET stream is not known as tools/list by its id: filtered anyway."""
    assert names(read(Inspector(CLOSED), body(listing("other")))) == []
    assert names(read(Inspector(TRUSTED), body(listing(1)))) == ["echo", "add", "delete_all"]


def test_a_batch_answer_is_filtered_and_each_answer_reported() -> None:
    seen: list[tuple[Any, str, str]] = []
    inspector = Inspector(ALLOW_ECHO, pending={("n", 1): "tools/list", ("n", 2): "tools/call"},
                          on_answer=lambda key, method, status: seen.append((key, method, status)))
    answer = [listing(1), {"jsonrpc": "2.0", "id": 2, "result": {"content": [], "isError": True}}]
    out = read(inspector, body(answer))
    assert names(out[0]) == ["echo"] and out[1]["result"]["isError"] is True
    assert seen == [(("n", 1), "tools/list", "ok"), (("n", 2), "tools/call", "tool_error")]


def test_answer_status() -> None:
    assert jsonrpc.answer_status({"result": {}}) == "ok"
    assert jsonrpc.answer_status({"result": {"isError": True}}) == "tool_error"
    assert jsonrpc.answer_status({"error": {"code": -32602, "message": "x"}}) == "error:-32602"
    assert jsonrpc.answer_status({"error": {"code": True}}) == "error"


def test_an_sse_event_is_written_anew_from_what_was_read() -> None:
    inspector = Inspector(ALLOW_ECHO)
    progress = b'id: 7\r\nevent: message\r\ndata: {"jsonrpc": "2.0", "method": "notifications/progress"}\r\n\r\n'
    assert inspector.event(progress) == b'id: 7\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\n\n'
    changed = b"id: 8\nevent: message\ndata: " + body(listing(1)) + b"\n\n"
    out = inspector.event(changed)
    assert out.startswith(b"id: 8\ndata: ") and out.endswith(b"\n\n")
    assert names(json.loads(out.split(b"data: ", 1)[1])) == ["echo"]


def test_an_sse_event_split_over_data_lines_is_read_whole() -> None:
    text = json.dumps(listing(1), indent=1)  # a JSON document over many data: lines
    raw = b"".join(b"data: " + line.encode() + b"\n" for line in text.split("\n")) + b"\n"
    out = Inspector(ALLOW_ECHO).event(raw)
    assert names(json.loads(out.split(b"data: ", 1)[1])) == ["echo"]


def test_what_is_no_message_event_is_dropped_and_keep_alives_stay_empty() -> None:
    """Fail closed: an event of another type, or data that is not JSON-RPC, never reaches the client
    (a client reading it otherwise would see hidden tools); comments keep a stream alive, emptied."""
    inspector = Inspector(CLOSED)
    for raw in (b"event: ping\ndata: " + body(listing(1)) + b"\n\n", b"data: not json\n\n",
                b'data: {"not": "json-rpc"}\n\n', b"data: [1, 2]\n\n"):
        assert inspector.event(raw) == b"", raw
    assert inspector.dropped == 4
    assert inspector.event(b": a comment that says anything\n\n") == b":\n\n"
    assert inspector.event(b"retry: 100\n\n") == b"retry: 100\n\n"
    assert inspector.event(b"id: prime-1\ndata:\n\n") == b"id: prime-1\ndata:\n\n"  # a priming event
    assert inspector.dropped == 4


# ---------------------------------------------------------------------------- masking


def test_the_credentials_sent_are_masked_in_every_spelling() -> None:
    token = "tok/en-" + "z" * 20
    masker = Masker(["Bearer " + token, "short", "k3y-" + "q" * 10])
    assert "short" not in masker.forms  # a short value would mangle ordinary text
    inspector = Inspector(TRUSTED, masker)
    escaped = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"a": token, "b": "Bearer " + token,
                                                                "c": "k3y-" + "q" * 10}}, ensure_ascii=True)
    escaped = escaped.replace("tok/en", "tok\\/\\u0065n")  # the same string to any JSON reader
    out = inspector.json_body(escaped.encode())
    assert out is not None and token.encode() not in out and b"qqqqqqqqqq" not in out
    assert json.loads(out)["result"] == {"a": "***", "b": "***", "c": "***"}
    assert token.encode() not in inspector.event(b"data: " + body({"jsonrpc": "2.0", "id": 1, "result": token})
                                                 + b"\n\n")
    assert inspector.json_body(b"not json " + token.encode()) is None  # withheld, not passed on masked


def test_what_the_client_sent_itself_is_never_masked() -> None:
    """A mask on a guess the client sent (as an id or an argument echoed back) would confirm it."""
    secret = "s3cret-value-0123456789"
    masker = Masker([secret], known='{"arguments":{"text":"' + secret + '"}}')
    assert masker.forms == ()
    inspector = Inspector(TRUSTED, Masker([secret]))
    out = read(inspector, body({"jsonrpc": "2.0", "id": secret, "result": {"echo": secret}}))
    assert out["id"] == secret and out["result"]["echo"] == "***"  # the id is the client's own


def test_a_masker_spares_only_the_forms_a_request_carried_in_its_body_or_a_header() -> None:
    token = "t0ken-" + "k" * 20
    masker = Masker(["Bearer " + token])
    assert masker.sparing(b'{"text":"hello"}', [(b"accept", b"application/json")]) is masker  # nothing sent
    in_body = masker.sparing(('{"text":"' + token + '"}').encode(), [])
    assert in_body.forms == ("Bearer " + token,) and masker.forms == ("Bearer " + token, token)
    in_header = masker.sparing(b"{}", [(b"x-a", b"x"), (b"x-b", ("Bearer " + token).encode("latin-1"))])
    assert in_header.forms == ()
    # the halves of a form in two header values are not the form sent (the values are searched
    # joined by an LF: a form holding one is looked for value by value)
    split = Masker(["abcdefgh\nijklmnop"])
    assert split.sparing(b"{}", [(b"x-a", b"abcdefgh"), (b"x-b", b"ijklmnop")]) is split
    assert split.sparing(b"{}", [(b"x-a", b"abcdefgh\nijklmnop")]).forms == ()
    read_back = read(Inspector(TRUSTED, in_body), body({"jsonrpc": "2.0", "id": 1, "result": [token, "Bearer " + token]}))
    assert read_back["result"] == [token, "***"]


# ---------------------------------------------------------------------------- SSE splitting


def feed_all(chunks: list[bytes], limit: int = 1 << 20) -> tuple[list[bytes], bytes]:
    splitter = SseSplitter(limit)
    events = [e for chunk in chunks for e in splitter.feed(chunk)]
    return events, splitter.rest()


STREAM = b"id: 1\r\ndata: a\r\n\r\n: comment\n\ndata: b\rdata: c\r\r" + b"event: message\ndata: d\n\n"


def test_events_come_out_whole_and_byte_for_byte_however_the_stream_is_cut() -> None:
    whole, rest = feed_all([STREAM])
    assert rest == b"" and b"".join(whole) == STREAM
    assert whole == [b"id: 1\r\ndata: a\r\n\r\n", b": comment\n\n", b"data: b\rdata: c\r\r",
                     b"event: message\ndata: d\n\n"]
    for size in (1, 2, 3, 5, 7):
        chunks = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
        events, rest = feed_all(chunks)
        assert b"".join(events) + rest == STREAM, size
        assert [e.replace(b"\r\n", b"\n").strip(b"\r\n") for e in events if e.strip(b"\r\n")] == \
               [e.replace(b"\r\n", b"\n").strip(b"\r\n") for e in whole], size


def pattern_feed_all(chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    """What SseSplitter did before its LF-only shortcut: the blank-line pattern searched, always."""
    buffer, scanned, events = b"", 0, []
    for chunk in chunks:
        buffer += chunk
        start, pos = 0, max(0, scanned - 2)
        while (found := _BLANK_LINE.search(buffer, pos)) is not None:
            events.append(buffer[start:found.end()])
            start = pos = found.end()
        buffer = buffer[start:]
        scanned = len(buffer)
    return events, buffer


def test_the_splitter_cuts_as_the_blank_line_pattern_does_however_line_ends_mix() -> None:
    """Its LF-only shortcut changes no cut: random streams of mixed line ends, cut at random, give
    the events the pattern alone gives, chunk by chunk."""
    rng = random.Random(7)
    for _ in range(1000):
        stream = bytes(rng.choice(b"\r\n\nab:") for _ in range(rng.randrange(1, 60)))
        cuts = sorted(rng.sample(range(1, len(stream) + 1), min(len(stream), rng.randrange(1, 6))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True) if b > a]
        assert feed_all(chunks) == pattern_feed_all(chunks), chunks
        assert feed_all([stream]) == pattern_feed_all([stream]), stream


def test_a_crlf_is_one_line_end_never_an_empty_line() -> None:
    events, rest = feed_all([b"data: a\r\n", b"data: b\r\n", b"\r\n"])
    assert events == [b"data: a\r\ndata: b\r\n\r\n"] and rest == b""


def test_an_incomplete_event_is_held_and_an_endless_one_refused() -> None:
    events, rest = feed_all([b"data: done\n\n", b'data: {"partial":'])
    assert events == [b"data: done\n\n"] and rest == b'data: {"partial":'
    splitter = SseSplitter(64)
    splitter.feed(b"data: " + b"x" * 40)
    with pytest.raises(EventTooLarge):
        splitter.feed(b"x" * 40)


def test_keys_that_passed_are_remembered_and_what_reads_as_another_member_still_is_not() -> None:
    """`check_members` remembers key shapes that passed (the same few come message after message),
    never one that failed, and no more than its bounds, whatever a peer sends."""
    members = frozenset({"name", "arguments"})
    for _ in range(3):
        strict_json.check_members({"name": "search", "arguments": {}}, members)
    for refused in ({"Name": "x", "arguments": {}}, {"name": "x", "Name": "y"}, {"name": "x", "ar_guments": {}}):
        for _ in range(2):  # refused the second time too: a failing shape is never remembered
            with pytest.raises(strict_json.StrictJsonError):
                strict_json.check_members(refused, members)
    for n in range(5000):
        strict_json.check_members({f"k{n}": 1, "name": "x"}, members)
        strict_json.check_members({("x" * 300) + str(n): 1}, members)  # too long to remember
    assert len(strict_json._passed[members]) <= strict_json._PASSED_PER_SET
    assert all(sum(map(len, keys)) <= strict_json._PASSED_CHARS for keys in strict_json._passed[members])
    with pytest.raises(strict_json.StrictJsonError):
        strict_json.check_members({"name": "search", "NAME": "delete"}, members)


def test_json_is_read_and_written_as_the_json_module_reads_and_writes_it() -> None:
    """The C scanner and encoder called directly: random documents, spaced at random, read and
    written as JSONDecoder.decode and JSONEncoder.encode do; what is not one document is refused."""
    rng = random.Random(11)

    def value(depth: int) -> Any:
        kind = rng.randrange(7 if depth < 4 else 4)
        if kind == 0:
            return rng.choice([None, True, False, 0, -1, 2**70, 1.5, -2.25e-7])
        if kind in (1, 2, 3):
            return "".join(rng.choice(["a", "é", "\u2028", '"', "\\", "\n", "😀", "\x00"]) for _ in range(4))
        if kind in (4, 5):
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{i}": value(depth + 1) for i in range(rng.randrange(4))}

    for _ in range(500):
        document = value(0)
        text = json.dumps(document, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
        spaced = rng.choice(["", " ", "\n\t "]) + text + rng.choice(["", " ", "\r\n"])
        assert strict_json.loads(spaced.encode()) == strict_json._DECODER.decode(spaced) == document
        assert strict_json.dumps(document) == strict_json._ENCODER.encode(document).encode()
    for bad in (b"", b" ", b"{} x", b"1 2", b"[", b'"a', b"[1,]", b"{}{}", b"\t"):
        with pytest.raises(strict_json.StrictJsonError):
            strict_json.loads(bad)
