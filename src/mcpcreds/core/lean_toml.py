"""A small TOML reader for the commands run once per operation, which need two keys of
`[sidecar]` (address.py): importing `tomllib` costs each of them a few ms (datetime, its regexes).

It reads a plain subset of TOML: comments, `[table]` and `[[array]]` headers, and one-line
`key = value` pairs whose value is a string without escapes, a decimal integer, a boolean, or a
one-line array or inline table of those. On anything else (an escape, a float, a date, a dotted or
multi-line form...) it is unsure and returns None, and the caller asks `tomllib`. On what it reads
it follows TOML's rules, those on tables defined twice and keys given twice too, so for every
text it returns either None or what `tomllib.loads` returns (tests/test_cli_imports.py checks that,
on the examples and on their mutations).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`'s: importing typing costs these commands ~2 ms
if TYPE_CHECKING:
    from typing import Any

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# control characters, which TOML allows nowhere but in multi-line strings (and tab everywhere)
_ILLEGAL = frozenset(chr(i) for i in (*range(9), *range(10, 32), 127))
_SPACE = " \t"


class _Unsure(Exception):
    """Outside the subset this reader knows: `tomllib` decides."""


class _Table(dict[str, "Any"]):
    """A table made by a header; `explicit` once its own header was read (not only a sub-table's)."""

    explicit = False


class _Tables(list[_Table]):
    """An array of tables (`[[name]]`), which later headers may extend."""


def loads(text: str) -> dict[str, Any] | None:
    """`tomllib.loads(text)` if `text` is in the subset, else None (also when it is not TOML)."""
    try:
        return _Reader(text.replace("\r\n", "\n")).document()
    except (_Unsure, IndexError):  # IndexError: the text ended inside a form
        return None


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def document(self) -> dict[str, Any]:
        root = _Table()
        table = root
        text = self.text
        while True:
            self.space()
            if self.pos >= len(text):
                return root
            char = text[self.pos]
            if char == "[":
                table = self.header(root)
            elif char != "\n" and char != "#":
                key = self.key()
                self.equals()
                if key in table:
                    raise _Unsure
                table[key] = self.value()
            self.line_end()

    def space(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _SPACE:
            pos += 1
        self.pos = pos

    def line_end(self) -> None:
        """Spaces, an optional comment, then the end of the line or of the text."""
        self.space()
        text = self.text
        if self.pos < len(text) and text[self.pos] == "#":
            end = text.find("\n", self.pos)
            end = len(text) if end < 0 else end
            if not _ILLEGAL.isdisjoint(text[self.pos:end]):
                raise _Unsure
            self.pos = end
        if self.pos < len(text):
            if text[self.pos] != "\n":
                raise _Unsure
            self.pos += 1

    def expect(self, char: str) -> None:
        if self.text[self.pos] != char:
            raise _Unsure
        self.pos += 1

    def equals(self) -> None:
        self.space()
        self.expect("=")
        self.space()

    def header(self, root: _Table) -> _Table:
        many = self.text.startswith("[[", self.pos)
        self.pos += 2 if many else 1
        names = [self.spaced_key()]
        while self.text[self.pos] == ".":
            self.pos += 1
            names.append(self.spaced_key())
        self.expect("]")
        if many:
            self.expect("]")
        table = root
        for name in names[:-1]:
            child = table.setdefault(name, _Table())
            if isinstance(child, _Tables):
                child = child[-1]
            if not isinstance(child, _Table):
                raise _Unsure
            table = child
        last = names[-1]
        made = _Table()
        made.explicit = True
        child = table.get(last)
        if child is None:
            table[last] = _Tables([made]) if many else made
        elif many and isinstance(child, _Tables):
            child.append(made)
        elif not many and isinstance(child, _Table) and not child.explicit:
            child.explicit = True
            return child
        else:
            raise _Unsure
        return made

    def spaced_key(self) -> str:
        self.space()
        key = self.key()
        self.space()
        return key

    def key(self) -> str:
        text, start = self.text, self.pos
        if text[start] in "\"'":
            return self.string()
        pos = start
        while pos < len(text) and text[pos] in _BARE_KEY:
            pos += 1
        if pos == start:
            raise _Unsure
        self.pos = pos
        return text[start:pos]

    def string(self) -> str:
        """A one-line basic string without escapes, or a one-line literal string."""
        text, quote = self.text, self.text[self.pos]
        if text.startswith(quote * 3, self.pos):
            raise _Unsure
        end = text.find(quote, self.pos + 1)
        if end < 0:
            raise _Unsure
        value = text[self.pos + 1:end]
        if ("\\" in value and quote == '"') or not _ILLEGAL.isdisjoint(value):
            raise _Unsure
        self.pos = end + 1
        return value

    def value(self) -> Any:
        text, pos = self.text, self.pos
        char = text[pos]
        if char in "\"'":
            return self.string()
        if char == "[":
            return self.array()
        if char == "{":
            return self.inline_table()
        for word, meaning in (("true", True), ("false", False)):
            if text.startswith(word, pos):
                self.pos += len(word)
                return meaning
        end = pos
        while end < len(text) and text[end] not in " \t\n#,]}":
            end += 1
        digits = text[pos + (text[pos] in "+-"):end]
        if not (digits.isascii() and digits.isdigit()) or (digits[0] == "0" and len(digits) > 1):
            raise _Unsure  # a float, a date, hex, underscores, a leading zero, not a value...
        self.pos = end
        return int(text[pos:end])

    def array(self) -> list[Any]:
        self.pos += 1
        items = []
        while True:
            self.space()
            if self.text[self.pos] == "]":
                break
            items.append(self.value())
            self.space()
            if self.text[self.pos] != ",":
                break
            self.pos += 1
        self.expect("]")
        return items

    def inline_table(self) -> dict[str, Any]:
        self.pos += 1
        table: dict[str, Any] = {}
        self.space()
        if self.text[self.pos] != "}":
            while True:
                key = self.spaced_key()
                self.equals()
                if key in table:
                    raise _Unsure
                table[key] = self.value()
                self.space()
                if self.text[self.pos] != ",":
                    break
                self.pos += 1
        self.expect("}")
        return table
