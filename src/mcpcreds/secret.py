"""Secret values that cannot be printed, and the redactor that masks live ones."""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Final

REDACTED: Final = "***"
_MIN_MASK_LEN: Final = 4


class Secret:
    """A secret value. `repr`/`str` never show it; `reveal()` is the one way to read it."""

    __slots__ = ("__value", "source")

    def __init__(self, value: str, source: str = "") -> None:
        self.__value = value
        self.source = source
        REDACTOR.add(value)

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
    """Remembers every secret value and token the process has handled and masks them in text.

    Values are kept in a plain set: a value that was ever live may still sit in a log buffer,
    so forgetting it early would be the wrong trade.
    """

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()
        self._ordered: tuple[str, ...] = ()

    def add(self, value: str) -> None:
        if len(value) < _MIN_MASK_LEN or value in self._values:
            return
        # text is masked after JSON encoding too: mask the escaped spellings of the value as well
        forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
        with self._lock:
            self._values.update(forms)
            # longest first so a secret containing another is masked whole
            self._ordered = tuple(sorted(self._values, key=len, reverse=True))

    def redact(self, text: str) -> str:
        for value in self._ordered:
            if value in text:
                text = text.replace(value, REDACTED)
        return text

    def __contains__(self, value: str) -> bool:
        return value in self._values


REDACTOR: Final = Redactor()



def fingerprint(token: str) -> str:
    """The first 8 hex of SHA-256: enough to tell tokens apart, useless to an attacker."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]
