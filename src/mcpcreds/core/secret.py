"""Secret values that cannot be printed, and the redactor that masks live ones."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any, Final

REDACTED: Final = "***"
_MIN_MASK_LEN: Final = 4
REDACTOR_LIMIT: Final = 4096  # owners (secret names, cache keys) whose values are masked
# texts masked before, kept with their masked form while the values held stay the same: a log or
# audit line repeats the same names (server, key, tool, status) line after line
SEEN_LIMIT: Final = 4096
SEEN_TEXT: Final = 256  # longer texts are masked anew each time


class Secret:
    """A secret value. `repr`/`str` never show it; `reveal()` is the one way to read it.

    Making one registers its value with the redactor, under `owner` (`secret:NAME`) when given: a
    later value for the same owner replaces it there."""

    __slots__ = ("__value", "source")

    def __init__(self, value: str, source: str = "", owner: str | None = None) -> None:
        self.__value = value
        self.source = source
        REDACTOR.add(value, owner)

    def reveal(self) -> str:
        return self.__value

    def __repr__(self) -> str:
        origin = f" from {self.source}" if self.source else ""
        return f"Secret({REDACTED}{origin})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.__value == self.__value

    def __hash__(self) -> int:
        return hash(("Secret", self.__value))

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("Secret values cannot be pickled")


class Redactor:
    """Masks the live secret values (resolved secrets, the access tokens being served) in text.

    Each value belongs to an owner (`secret:NAME`, `login:KEY`); a new value for an owner
    replaces and forgets the old one. A value added without an owner is its own owner until an
    owner claims it. At most `limit` owners are kept, the least recently added forgotten first.
    Adding costs the same whatever the number of values; so does masking, which looks values up
    by their last four characters among the text's four-character substrings.
    """

    def __init__(self, limit: int = REDACTOR_LIMIT) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], tuple[str, ...]] = OrderedDict()  # owner -> forms
        self._refs: dict[str, int] = {}  # form -> how many entries hold it
        self._index: dict[str, tuple[str, ...]] = {}  # last four characters -> forms
        self._generation = 0  # moves with every change of the forms held
        self._seen: dict[str, tuple[int, str]] = {}  # text -> (the generation it was masked in, masked)

    def add(self, value: str, owner: str | None = None) -> None:
        if len(value) < _MIN_MASK_LEN:
            if owner is not None:
                self.forget(owner)
            return
        key = ("owner", owner) if owner is not None else ("value", value)
        with self._lock:
            held = self._entries.get(key)
            if held is not None and held[0] == value:
                self._entries.move_to_end(key)
                return
            if owner is None and value in self._refs:
                return  # an owner holds it already and decides when it goes
            # JSON-escaped spellings too, for text that was serialised before it was masked
            forms = tuple(dict.fromkeys((value, json.dumps(value)[1:-1],
                                         json.dumps(value, ensure_ascii=False)[1:-1])))
            # the new forms are held before the old ones are let go: a text masked meanwhile on
            # another thread never finds the value missing (it was, while a claim was written)
            replaced = self._entries.pop(key, ())
            self._entries[key] = forms
            for form in forms:
                self._hold(form)
            if owner is not None:
                self._drop(("value", value))  # claimed: forgotten when its owner moves on
            self._release(replaced)
            while len(self._entries) > self.limit:
                self._drop(next(iter(self._entries)))

    def forget(self, owner: str) -> None:
        with self._lock:
            self._drop(("owner", owner))

    def _drop(self, key: tuple[str, str]) -> None:
        self._release(self._entries.pop(key, ()))

    def _release(self, forms: tuple[str, ...]) -> None:
        for form in forms:
            count = self._refs.pop(form) - 1
            if count:
                self._refs[form] = count
                continue
            rest = tuple(f for f in self._index[form[-4:]] if f != form)
            if rest:
                self._index[form[-4:]] = rest
            else:
                del self._index[form[-4:]]
            self._generation += 1  # a forgotten value is no longer masked in a text seen before

    def _hold(self, form: str) -> None:
        count = self._refs.get(form, 0)
        self._refs[form] = count + 1
        if not count:
            self._index[form[-4:]] = (*self._index.get(form[-4:], ()), form)
            # after the index: a text masked by the index of before is kept under the generation before
            self._generation += 1

    def redact(self, text: str) -> str:
        generation = self._generation  # read first: a text masked while the forms change is not kept
        index = self._index
        if not index or len(text) < _MIN_MASK_LEN:
            return text
        kept = len(text) <= SEEN_TEXT
        if kept and (seen := self._seen.get(text)) is not None and seen[0] == generation:
            return seen[1]
        masked = text
        grams = {text[i:i + 4] for i in range(len(text) - 3)}
        found = [form for gram in grams if (forms := index.get(gram)) for form in forms]
        # longest first, so that a value containing another is masked whole
        for form in sorted(found, key=len, reverse=True):
            if form in masked:
                masked = masked.replace(form, REDACTED)
        if kept:
            if len(self._seen) >= SEEN_LIMIT:
                self._seen.clear()
            self._seen[text] = (generation, masked)
        return masked

    def __contains__(self, value: str) -> bool:
        return value in self._refs

    def __len__(self) -> int:
        """The number of values held (one per owner)."""
        return len(self._entries)


REDACTOR: Final = Redactor()


def redact_json(data: Any) -> Any:
    """A copy of JSON-ready data with live secrets masked inside its strings (keys included),
    never across its syntax: whatever the values, the result serialises to valid JSON. Objects
    JSON has no type for become their (masked) `str`."""
    if isinstance(data, str):
        return REDACTOR.redact(data)
    if data is None or isinstance(data, bool | int | float):
        return data
    if isinstance(data, dict):
        return {REDACTOR.redact(k) if isinstance(k, str) else k: redact_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_json(v) for v in data]
    return REDACTOR.redact(str(data))


def fingerprint(token: str) -> str:
    """The first 8 hex of SHA-256: enough to tell tokens apart, useless to an attacker."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]
