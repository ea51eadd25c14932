"""Server-Sent Events as the gateway relays them (pure): a byte stream cut into whole events, each
read field by field as the SSE standard says a client reads it, and written anew from what was
read, so the client gets the fields the gateway judged and nothing else (no comment text, no
field of a name a client might read otherwise, no second reading of a line end)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# a line end, then an empty line: CR LF is one line end, never a CR and an LF
_BLANK_LINE: Final = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")
_LINE: Final = re.compile(rb"\r\n|\r|\n")


class EventTooLarge(ValueError):
    pass


class BadEvent(ValueError):
    """An event the gateway does not read as exactly what a client would (not UTF-8)."""


class SseSplitter:
    """Complete SSE events (each with the blank line that ends it), byte for byte as received.

    An event longer than `limit` raises EventTooLarge: memory stays bounded whatever the
    upstream sends. What is left when the stream ends (`rest`) is an incomplete event, which a
    client would discard: it is not forwarded.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = b""
        self.scanned = 0  # the buffer up to here holds no event end (minus a possible \r)

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self.buffer + data if self.buffer else data
        events = []
        start = 0
        pos = max(0, self.scanned - 2)
        # where the next CR is: with none ahead, every line end is an LF and a blank line is LF LF,
        # which `find` finds at memchr's speed (the pattern tests each byte against its set)
        cr = buffer.find(b"\r", pos)
        while True:
            if cr < 0:
                end = buffer.find(b"\n\n", pos)
                if end < 0:
                    break
                end += 2
            else:
                found = _BLANK_LINE.search(buffer, pos)
                if found is None:
                    break
                end = found.end()
                if cr < end:  # past it: the next one (each stretch searched once)
                    cr = buffer.find(b"\r", end)
            # a final CR may be the start of a CR LF: the LF then opens the next event, as an empty
            # line a client ignores (holding the event back instead could delay it indefinitely)
            events.append(buffer[start:end])
            start = pos = end
        self.buffer = buffer[start:]
        self.scanned = len(self.buffer)
        if len(self.buffer) > self.limit:
            raise EventTooLarge(f"an SSE event exceeds {self.limit} bytes")
        return events

    def rest(self) -> bytes:
        return self.buffer


@dataclass(slots=True)
class SseEvent:
    data: str | None  # the joined data lines, None if the event has none
    event: str  # the type: the last `event` field ("message" if none)
    id: str | None  # the last `id` field, if it may be one (no NUL)
    retry: str | None  # the last `retry` field that is all digits
    comment: bool  # the event had a comment line (a keep-alive)

    @classmethod
    def parse(cls, raw: bytes) -> SseEvent:
        """Read as a client reads it; BadEvent if a line is not UTF-8."""
        data: list[str] = []
        event = ""
        id_: str | None = None
        retry: str | None = None
        comment = False
        for line_b in _LINE.split(raw):
            if not line_b:
                continue
            try:
                line = line_b.decode("utf-8")
            except UnicodeDecodeError:
                raise BadEvent("an SSE line that is not UTF-8") from None
            if line.startswith(":"):
                comment = True
                continue
            name, colon, value = line.partition(":")
            if colon and value.startswith(" "):
                value = value[1:]
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value  # the last one counts, as in a client
            elif name == "id":
                id_ = None if "\0" in value else value
            elif name == "retry":
                retry = value if value.isascii() and value.isdigit() else retry
        return cls("\n".join(data) if data else None, event or "message", id_, retry, comment)

    @property
    def is_message(self) -> bool:
        return self.event == "message"

    def write(self, data: bytes | None) -> bytes:
        """The event written anew with `data` (one line: compact JSON has no line end) and the
        `id` and `retry` read from it; a keep-alive comment stays an empty comment."""
        lines = [b":"] if self.comment and data is None and self.id is None and self.retry is None else []
        if self.id is not None:
            lines.append(b"id: " + self.id.encode())
        if self.retry is not None:
            lines.append(b"retry: " + self.retry.encode())
        if data is not None:
            lines.append(b"data: " + data if data else b"data:")
        return b"\n".join(lines) + b"\n\n" if lines else b""
