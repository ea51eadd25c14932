"""The config an import writes, before it is text: tables of keys, each with the comment that says
where it came from and what changed in meaning; and their rendering as TOML (pure).

Comments are one line of printable text, bounded: what they quote (a key of the source file, a
note) cannot end the comment or start a TOML line of its own."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

MAX_NOTE: Final = 240
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+\Z")


@dataclass
class Key:
    name: str
    value: Any  # str, int, float, bool, a list of those or of tables, a dict (an inline table)
    note: str = ""


@dataclass(eq=False)  # one entry of the output: compared and hashed by identity
class Table:
    """`[name]` (or `[[name]]` with `array`), its keys in order, and a comment line above it."""

    name: str
    array: bool = False
    note: str = ""
    keys: list[Key] = field(default_factory=list)

    def set(self, name: str, value: Any, note: str = "") -> None:
        for key in self.keys:
            if key.name == name:
                key.value, key.note = value, note or key.note
                return
        self.keys.append(Key(name, value, note))

    def get(self, name: str) -> Any:
        return next((k.value for k in self.keys if k.name == name), None)

    def drop(self, name: str) -> None:
        self.keys = [k for k in self.keys if k.name != name]

    def as_dict(self) -> dict[str, Any]:
        return {k.name: k.value for k in self.keys}


@dataclass
class Document:
    header: list[str] = field(default_factory=list)  # comment lines at the top
    tables: list[Table] = field(default_factory=list)

    def table(self, name: str, note: str = "", array: bool = False) -> Table:
        if not array:
            for table in self.tables:
                if table.name == name and not table.array:
                    return table
        table = Table(name, array, note)
        self.tables.append(table)
        return table

    def render(self) -> str:
        lines = [f"# {one_line(h)}" for h in self.header]
        for table in self.tables:
            lines.append("")
            if table.note:
                lines.append(f"# {one_line(table.note)}")
            name = ".".join(key(part) for part in split_name(table.name))
            lines.append(f"[[{name}]]" if table.array else f"[{name}]")
            for k in table.keys:
                line = f"{key(k.name)} = {value(k.value)}"
                lines.append(f"{line}  # {one_line(k.note)}" if k.note else line)
        return "\n".join(lines).lstrip("\n") + "\n"


def split_name(name: str) -> list[str]:
    """`services.crm` -> ["services", "crm"]; a dotted table name's second part is one name."""
    head, dot, rest = name.partition(".")
    return [head, rest] if dot else [head]


def one_line(text: str) -> str:
    """Printable, on one line, bounded: safe inside a TOML comment."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    return clean if len(clean) <= MAX_NOTE else clean[:MAX_NOTE - 3] + "..."


def key(name: str) -> str:
    return name if _BARE_KEY.match(name) else string(name)


def string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write a {type(v).__name__} as TOML")
