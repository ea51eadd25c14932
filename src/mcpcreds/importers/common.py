"""What every import shares (pure): the notes it gathers for its summary, the secrets it takes out
of the file, and the checks of the names, URLs, tags, rates and tool lists it carries over.

A value the source file holds in clear that is, or looks like, a credential never reaches the
output nor a message: it becomes `{{secret:NAME}}` and the summary names the `mcpcreds secret set
NAME` to run. Notes name the place a value came from by its keys, never by the value; a key that
itself reads like a credential is shown by its position (`<key #2>`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..config.reader import NAME, TAGS, check_url, key_path
from ..core.credshape import credential_name, credential_value
from ..core.policy import tool_pattern_problem
from ..core.rates import parse_duration, parse_rate
from ..core.templates import TemplateError, is_credential_header, parse_template

ENV_REF: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,127})\}")
_SCHEME: Final = re.compile(r"(?i)(bearer|basic|token|bot|dpop)\s+(?=\S+\Z)")
_SECRET_CHARS: Final = re.compile(r"[^A-Z0-9_]+")
_WORD: Final = re.compile(r"[A-Za-z0-9_.\-]{1,40}\Z")
MAX_SECRET_NAME: Final = 96


@dataclass
class Notes:
    """What an import tells its user, gathered as it goes."""

    seed: str
    differences: list[str] = field(default_factory=list)  # what changes in meaning, for this file
    secrets: dict[str, str] = field(default_factory=dict)  # NAME -> where the value was
    environment: dict[str, str] = field(default_factory=dict)  # ${VAR} -> where
    commands: list[str] = field(default_factory=list)  # `mcpcreds exec ...` lines
    logins: list[str] = field(default_factory=list)  # `mcpcreds login ...` lines
    dropped: list[str] = field(default_factory=list)  # "path: why", never a value
    _literals: dict[str, str] = field(default_factory=dict)  # sha256 of a literal -> its secret name

    def differ(self, text: str) -> None:
        if text not in self.differences:
            self.differences.append(text)

    def drop(self, path: str, why: str) -> None:
        line = f"{path}: {why}"
        if line not in self.dropped:
            self.dropped.append(line)

    def unknown(self, path: str, table: Mapping[str, Any], known: tuple[str, ...], why: str) -> None:
        """List every key of `table` not in `known` as not carried over."""
        for i, k in enumerate(table):
            if k not in known:
                self.drop(key_path(path, str(k), i), why)

    # -- secrets

    def secret_name(self, hint: str, literal: str) -> str:
        """The secret a literal becomes: one name per distinct value, from `hint`."""
        digest = hashlib.sha256(literal.encode()).hexdigest()
        if digest in self._literals:
            return self._literals[digest]
        base = _SECRET_CHARS.sub("_", hint.upper()).strip("_")[:MAX_SECRET_NAME] or "IMPORTED_SECRET"
        name, n = base, 1
        while name in self.secrets:
            n += 1
            name = f"{base}_{n}"
        self._literals[digest] = name
        return name

    def value(self, raw: str, *, where: str, hint: str, credential: bool) -> str:
        """`raw` as the output writes it: `${VAR}` becomes `{{secret:VAR}}`, a template stays, and a
        literal that is (by its place) or looks like a credential becomes a new `{{secret:NAME}}`."""
        for var in ENV_REF.findall(raw):
            self.environment.setdefault(var, where)
        text = ENV_REF.sub(lambda m: "{{secret:" + m.group(1) + "}}", raw)
        try:
            template = parse_template(text)
        except TemplateError:
            template = None  # `{{...}}` that is no template of ours: kept out, as a literal would be
        if template is not None:
            looks = any(isinstance(p, str) and credential_value(p) is not None for p in template.parts)
            if not looks and not (credential and template.is_literal):
                return text
        scheme = _SCHEME.match(raw)
        name = self.secret_name(hint, raw[scheme.end():] if scheme else raw)
        self.secrets.setdefault(name, f"{where}, in clear in the file")
        return (scheme.group(1) + " " if scheme else "") + "{{secret:" + name + "}}"

    def header(self, name: str, raw: str, *, where: str, hint: str) -> str:
        return self.value(raw, where=where, hint=f"{hint}_{name}",
                          credential=is_credential_header(name) or credential_name(name))


def label(raw: Any, fallback: str) -> str:
    """A name from the source as it may be shown: itself when it reads as a short name, else
    `fallback`."""
    if isinstance(raw, str) and _WORD.match(raw) and credential_value(raw) is None:
        return raw
    return fallback


def entry_name(notes: Notes, raw: Any, where: str, fallback: str, taken: set[str]) -> str:
    """A server or exec entry name mcpcreds accepts, unique among `taken`."""
    name = raw if isinstance(raw, str) and NAME.match(raw) and credential_value(raw) is None else None
    if name is None:
        cleaned = re.sub(r"[^A-Za-z0-9_.\-]+", "-", raw).strip("-.")[:64] if isinstance(raw, str) else ""
        name = cleaned if cleaned and NAME.match(cleaned) and credential_value(cleaned) is None else fallback
        notes.differ(f"{where}: its name is not one mcpcreds takes (letters, digits, '_', '.', '-'): "
                     f"written as {name!r}")
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def endpoint(notes: Notes, raw: Any, where: str) -> str | None:
    if not isinstance(raw, str):
        notes.drop(where, "required: an https:// URL (a loopback http:// one for development)")
        return None
    if (problem := check_url(raw)) is not None:
        notes.drop(where, f"not carried over: the URL {problem}")
        return None
    return raw


def tags(notes: Notes, raw: Any, where: str) -> list[str] | None:
    if not isinstance(raw, list):
        notes.drop(where, "expected a list of tags")
        return None
    kept = []
    for i, tag in enumerate(raw):
        if tag in TAGS:
            kept.append(tag)
        else:
            notes.drop(f"{where}[{i}]", f"not a tag mcpcreds knows ({', '.join(TAGS)})")
    return list(dict.fromkeys(kept))


def tool_list(notes: Notes, raw: Any, where: str) -> list[str] | None:
    """Tool names and `prefix*` patterns; one out of shape is listed as not carried over."""
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        notes.drop(where, "expected a list of tool names or patterns")
        return None
    kept = []
    for i, pattern in enumerate(raw):
        if (problem := tool_pattern_problem(pattern)) is None:
            kept.append(pattern)
        else:
            notes.drop(f"{where}[{i}]", f"not carried over: {problem}")
    return kept


def rate(notes: Notes, raw: Any, where: str) -> str | None:
    if not isinstance(raw, str):
        notes.drop(where, "expected a rate string (\"<burst>/<per>\")")
        return None
    try:
        parse_rate(raw)
    except ValueError as exc:
        notes.drop(where, f"not carried over: {exc}")
        return None
    return raw


def duration(notes: Notes, raw: Any, where: str, low: float = 1.0, high: float = 3600.0) -> float | None:
    try:
        seconds = parse_duration(raw)
    except (ValueError, TypeError):
        notes.drop(where, "not carried over: not a duration (seconds, or \"30s\", \"5m\"...)")
        return None
    if not low <= seconds <= high:
        notes.drop(where, f"not carried over: mcpcreds takes {low:g}s to {high:g}s")
        return None
    return seconds


def strings(notes: Notes, raw: Any, where: str) -> list[str] | None:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        notes.drop(where, "expected a list of strings")
        return None
    return list(raw)


def headers(notes: Notes, raw: Any, where: str, hint: str) -> dict[str, str] | None:
    """A header map, or a list of [name, value] pairs (agentd's shape), with secrets taken out."""
    pairs: list[tuple[Any, Any]]
    if isinstance(raw, Mapping):
        pairs = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        pairs = [(p[0], p[1]) for p in raw]
    else:
        notes.drop(where, "expected a map of header names to values")
        return None
    out: dict[str, str] = {}
    for i, (name, value) in enumerate(pairs):
        path = key_path(where, str(name), i)
        if not isinstance(name, str) or not isinstance(value, str) or "\n" in value or "\r" in value:
            notes.drop(path, "not carried over: a header is a name and a one-line string value")
            continue
        out[name] = notes.header(name, value, where=path, hint=hint)
    return out
