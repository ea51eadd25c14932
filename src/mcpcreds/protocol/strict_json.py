"""JSON as the gateway reads and writes it (pure): one reading of the bytes, whatever parser the
other side runs.

The gateway judges a message and forwards what it judged, re-serialised from the parsed object,
never the bytes it was sent. The reading is strict where parsers differ:

- UTF-8 only, no byte order mark, no lone surrogate (each parser mends those its own way);
- no duplicate key (parsers take the first or the last);
- no key that folds onto a member the gateway judges without being it: Go's `encoding/json` matches
  keys case-insensitively with Unicode folding (`Name`, `NAME`, the long s for `s`, the Kelvin
  sign for `k`) and other decoders ignore `_` and `-`, so `{"name": "search", "Name": "delete_all"}`
  is refused;
- no NaN or Infinity, no number that overflows a double, nesting at most `MAX_DEPTH` deep.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

from ..core.http import holds

MAX_DEPTH: Final = 128  # a tools/list of nested JSON Schemas stays far below; Python's own limit is ~1000
MIN_MASKED: Final = 8  # shorter credential values are not masked: they would mangle ordinary text
MASK: Final = "***"
_BOM: Final = b"\xef\xbb\xbf"
_LF: Final = 10  # as an integer: `in` finds it at once in bytes (a bytes needle costs an exception first)


class StrictJsonError(ValueError):
    """Bytes the gateway does not read as exactly one JSON document (the message says why)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise StrictJsonError("an object has a duplicate key")
    return out


def _constant(_: str) -> Any:
    raise StrictJsonError("NaN and Infinity are not JSON")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJsonError("a number overflows a double")
    return value


# made once: `json.loads` and `json.dumps` with options build a new decoder or encoder per call,
# and the decoder's and encoder's own methods are Python frames around C (the encoder makes its C
# encoder anew on every call): the C scanner and the C encoder are called directly
_DECODER: Final = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_SCAN: Final = _DECODER.scan_once  # type: ignore[attr-defined]
_SPACE: Final = re.compile(r"[ \t\n\r]*").match  # JSON's whitespace, as json.decoder reads it
# the values written are trees (parsed JSON, or built from it): no cycle to look for (`markers`)
_C_ENCODE: Final = None if c_make_encoder is None else c_make_encoder(
    None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, True)


def loads(data: bytes | str) -> Any:
    """The one JSON document in `data`; StrictJsonError for anything read otherwise elsewhere."""
    if isinstance(data, bytes):
        if data.startswith(_BOM):
            raise StrictJsonError("a byte order mark")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise StrictJsonError("not UTF-8") from None
    elif data.startswith("\ufeff"):
        raise StrictJsonError("a byte order mark")
    try:
        # what JSONDecoder.decode does, less its frames (`_SPACE` always matches: `*`)
        value, end = _SCAN(data, _SPACE(data, 0).end())  # type: ignore[union-attr]
    except RecursionError:
        raise StrictJsonError("nested too deep") from None
    except StrictJsonError:
        raise
    except (StopIteration, ValueError):  # no value; JSONDecodeError; ints past the digit limit
        raise StrictJsonError("not JSON") from None
    if _SPACE(data, end).end() != len(data):  # type: ignore[union-attr]
        raise StrictJsonError("not JSON")  # more after the document
    if data.count("[") + data.count("{") > MAX_DEPTH:  # only then can it be too deep
        check_depth(value)
    return value


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; StrictJsonError if a string holds a lone surrogate (not UTF-8)."""
    try:
        if _C_ENCODE is None:  # an interpreter without the C accelerator
            return _ENCODER.encode(value).encode("utf-8")
        return "".join(_C_ENCODE(value, 0)).encode("utf-8")
    except UnicodeEncodeError:
        raise StrictJsonError("a lone surrogate in a string") from None


def check_depth(value: Any) -> None:
    """StrictJsonError if `value` nests deeper than MAX_DEPTH (no recursion: any depth is safe)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise StrictJsonError(f"nested deeper than {MAX_DEPTH}")
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values() if isinstance(child, dict | list))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node if isinstance(child, dict | list))


def folded(key: str) -> str:
    """A key as the most lenient decoder matches it: compatibility-normalised, case-folded, without
    `_` and `-`."""
    return _folded_short(key) if len(key) <= 64 else _fold(key)


def _fold(key: str) -> str:
    return unicodedata.normalize("NFKC", key).casefold().replace("_", "").replace("-", "")


# the same few member names, message after message; only short keys, so the cache stays small
_folded_short = lru_cache(maxsize=4096)(_fold)


@lru_cache(maxsize=64)
def _member_folds(members: frozenset[str]) -> dict[str, str]:
    return {folded(member): member for member in members}


def check_members(obj: dict[str, Any], members: frozenset[str]) -> None:
    """StrictJsonError if a key of `obj` reads as one of `members` without being it, or two of its
    keys read as one, to a lenient decoder."""
    keys = tuple(obj)
    passed = _passed.get(members)
    if passed is not None and keys in passed:  # the same keys in the same order pass again
        return
    _check_keys(keys, members)
    if len(keys) > _PASSED_KEYS or sum(map(len, keys)) > _PASSED_CHARS:
        return
    if passed is None:
        if len(_passed) >= _PASSED_SETS:
            return
        passed = _passed[members] = set()
    elif len(passed) >= _PASSED_PER_SET:
        passed.clear()
    passed.add(keys)


# the key tuples that passed `check_members`, per member set: the same few shapes come message
# after message (each check is pure); bounded in number and size, whatever a peer sends
_PASSED_KEYS: Final = 16
_PASSED_CHARS: Final = 256
_PASSED_PER_SET: Final = 1024
_PASSED_SETS: Final = 64
_passed: dict[frozenset[str], set[tuple[str, ...]]] = {}


def _check_keys(keys: tuple[str, ...], members: frozenset[str]) -> None:
    wanted = _member_folds(members)
    seen: set[str] = set()
    for key in keys:
        fold = folded(key)
        if fold in seen:
            raise StrictJsonError("two keys that read as one (another case or spelling)")
        seen.add(fold)
        member = wanted.get(fold)
        if member is not None and member != key:
            raise StrictJsonError("a key that reads as a member it is not (another case or spelling)")


class Masker:
    """Masks credential values in a parsed message: each value, its token after an auth scheme
    (`Bearer x`: `x` too), in every string (keys included), so an escaped spelling (`\\u0041`)
    is caught too. What the client itself sent is left alone (`known`): masking it would tell
    the client which of its guesses is a credential."""

    def __init__(self, values: Iterable[str], known: str = "") -> None:
        forms: set[str] = set()
        for value in values:
            candidates = {value}
            scheme, _, rest = value.partition(" ")
            if rest.strip() and scheme.isalpha():
                candidates.add(rest.strip())
            forms.update(c for c in candidates if len(c) >= MIN_MASKED and c not in known)
        self._set(forms)

    def _set(self, forms: Iterable[str]) -> None:
        self.forms: tuple[str, ...] = tuple(sorted(forms, key=len, reverse=True))
        # each form as it stands in compact JSON text (escaped where JSON escapes it), for `present`
        self._written = tuple(json.dumps(f, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass")
                              for f in self.forms)
        # and as raw bytes in a UTF-8 body and in a header value (latin-1; None: no such spelling)
        self._utf8 = tuple(f.encode("utf-8", "surrogatepass") for f in self.forms)
        self._latin1 = tuple(f.encode("latin-1") if all(ord(ch) < 256 for ch in f) else None
                             for f in self.forms)

    def sparing(self, body: bytes, headers: Sequence[tuple[bytes, bytes]]) -> Masker:
        """This masker less the forms the client sent itself, in its UTF-8 `body` or in one of its
        header values (see the class doc); the same object when it sent none, which is the rule:
        a masker made once per login serves every request."""
        if not self.forms:
            return self
        values = b"\n".join([value for _, value in headers])

        def in_a_header(form: bytes) -> bool:
            # in the values joined once, by an LF: a form without one is found there only where it
            # stands in one value; a form with one (never sent: no header value may hold an LF) is
            # looked for value by value, so that two values never spare it together
            return any(holds(v, form) for _, v in headers) if _LF in form else holds(values, form)

        spared = {form for form, utf8, latin1 in zip(self.forms, self._utf8, self._latin1, strict=True)
                  if holds(body, utf8) or (latin1 is not None and in_a_header(latin1))}
        if not spared:
            return self
        narrowed = Masker(())
        narrowed._set(f for f in self.forms if f not in spared)
        return narrowed

    def present(self, written: bytes) -> bool:
        """Whether a credential form stands in JSON text `written` (as `dumps` writes it: a string
        that holds one holds it so, whatever escapes the sender used): when not, nothing is to be
        masked and the walk is spared."""
        return any(holds(written, form) for form in self._written)

    def text(self, value: str) -> str:
        for form in self.forms:
            if form in value:
                value = value.replace(form, MASK)
        return value

    def value(self, value: Any) -> Any:
        """`value` with every credential form masked (the same object when none occurs)."""
        if not self.forms:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value

    def header(self, value: bytes) -> bytes:
        if not self.forms:
            return value
        text = value.decode("latin-1")
        masked = self.text(text)
        return value if masked == text else masked.encode("latin-1", "replace")
