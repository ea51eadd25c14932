"""Secret-free templates: `Bearer {{secret:NAME}}`, `{{secret-file:/path}}` (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

_SECRET_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}\Z")
_CREDENTIAL_EXACT: Final = frozenset(
    {"authorization", "api-key", "x-api-key", "token", "password", "secret"}
)
_CREDENTIAL_SUFFIXES: Final = ("-token", "_token", "-key", "_key")


class TemplateError(ValueError):
    """A template that cannot be parsed; the message never repeats the value."""


@dataclass(frozen=True, slots=True)
class SecretRef:
    """`{{secret:NAME}}`: looked up in the configured sources."""

    name: str


@dataclass(frozen=True, slots=True)
class FileRef:
    """`{{secret-file:PATH}}`: read from that file at each use."""

    path: str


Part = str | SecretRef | FileRef


@dataclass(frozen=True, slots=True)
class Template:
    source: str
    parts: tuple[Part, ...]

    @property
    def refs(self) -> tuple[SecretRef | FileRef, ...]:
        return tuple(p for p in self.parts if not isinstance(p, str))

    @property
    def secret_names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.parts if isinstance(p, SecretRef))

    @property
    def is_literal(self) -> bool:
        return not self.refs

    def render(self, lookup: Callable[[SecretRef | FileRef], str]) -> str:
        if self.is_literal:
            return self.source
        return "".join(p if isinstance(p, str) else lookup(p) for p in self.parts)

    def __str__(self) -> str:
        return self.source


def parse_template(text: str) -> Template:
    """Split `text` into literal parts and references; raise TemplateError on bad syntax."""
    parts: list[Part] = []
    pos = 0
    while True:
        start = text.find("{{", pos)
        if start < 0:
            if pos < len(text):
                parts.append(text[pos:])
            return Template(text, tuple(parts))
        end = text.find("}}", start + 2)
        if end < 0:
            raise TemplateError("unterminated '{{' (no closing '}}')")
        if start > pos:
            parts.append(text[pos:start])
        parts.append(_parse_placeholder(text[start + 2 : end]))
        pos = end + 2


def _parse_placeholder(inner: str) -> SecretRef | FileRef:
    kind, sep, arg = inner.strip().partition(":")
    kind, arg = kind.strip(), arg.strip()
    if sep and kind == "secret":
        if not _SECRET_NAME.match(arg):
            # not quoted: an invalid name is often a secret value pasted in its place
            raise TemplateError("invalid secret name (letters, digits, '_', '.', '-'; at most 255)")
        return SecretRef(arg)
    if sep and kind == "secret-file":
        if not arg.startswith("/"):
            raise TemplateError("secret-file needs an absolute path")
        return FileRef(arg)
    # the text inside the braces is not quoted: it may be a secret pasted by mistake
    raise TemplateError("unknown placeholder: use {{secret:NAME}} or {{secret-file:PATH}}")


def is_credential_header(name: str) -> bool:
    """Header names whose values must come from a secret, never a literal in the config."""
    lowered = name.strip().lower()
    return lowered in _CREDENTIAL_EXACT or lowered.endswith(_CREDENTIAL_SUFFIXES)
