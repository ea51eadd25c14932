"""MkDocs hooks: the parts of the documentation that are generated from the source at build time.

Four pages hold a marker that the build replaces, so they cannot drift from their source:

- index.md: the README (the repository's front page), its links turned into the site's;
- changelog.md: CHANGELOG.md, the same way;
- reference/configuration.md: every config key, its default and meaning, from the same
  definitions `mcpcreds help config` prints (mcpcreds.cli.help_config.entries());
- reference/socket-api.md: every route of the OpenAPI document the package ships and serves
  (src/mcpcreds/openapi.json), with its parameters, request body, answers and schemas as tables.

A page that lost its marker fails the build, rather than silently showing no reference.
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
OPENAPI = SRC / "mcpcreds" / "openapi.json"

METHODS = ("get", "post", "put", "patch", "delete")
MAX_DEPTH = 3  # nested object fields shown as dotted rows, this deep

Json = dict[str, Any]
Operation = tuple[str, str, Json, list[Json]]  # path, method, the operation, the path's parameters
Row = tuple[str, ...]


class GeneratedPageError(Exception):
    pass


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    uri = page.file.src_uri
    if uri not in GENERATED:
        return markdown
    marker, generate = GENERATED[uri]
    return replace_marker(markdown, marker, generate(), uri)


def replace_marker(markdown: str, marker: str, generated: str, uri: str) -> str:
    if markdown.count(marker) != 1:
        raise GeneratedPageError(f"{uri} must hold the line {marker} exactly once")
    return markdown.replace(marker, generated)


# -- text -------------------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_ESCAPE = re.compile(r"([\\*_\[\]{}|])")


def text(value: object) -> str:
    """Prose from the source as inline markdown: code spans kept, the rest escaped, one line."""
    out: list[str] = []
    raw = " ".join(str(value).split())
    pos = 0
    for match in _CODE_SPAN.finditer(raw):
        out.append(_plain(raw[pos:match.start()]))
        out.append(match.group(0))  # a pipe in a code span does not split a table cell
        pos = match.end()
    out.append(_plain(raw[pos:]))
    return "".join(out)


def _plain(chunk: str) -> str:
    return _ESCAPE.sub(r"\\\1", html.escape(chunk, quote=False))


def code(value: object) -> str:
    shown = str(value)
    fence = "``" if "`" in shown else "`"
    return f"{fence}{shown}{fence}"


def table(header: Row, rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- the front page ---------------------------------------------------------------------------

_LINK = re.compile(r"\[([^\]]+)\]\(([^)#\s]+)(#[^)\s]*)?\)")
_SKIP = re.compile(r"<!-- site: skip -->.*?<!-- /site -->\n*", re.S)


def root_file(name: str) -> str:
    return front_page((ROOT / name).read_text())


def front_page(readme: str) -> str:
    """A file of the repository's root with its links made the site's: docs/X is X, README.md and
    CHANGELOG.md their pages, another file of the repository its path (the site holds only docs/)."""
    def site_link(match: re.Match[str]) -> str:
        label, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        if re.match(r"^[a-z]+:", target):
            return match.group(0)
        if target.startswith("docs/"):
            return f"[{label}]({target.removeprefix('docs/')}{anchor})"
        if target in ("README.md", "CHANGELOG.md"):
            return f"[{label}]({'index' if target == 'README.md' else 'changelog'}.md{anchor})"
        return code(target) if label == target else f"{label} ({code(target)} in the source tree)"

    return _LINK.sub(site_link, _SKIP.sub("", readme))


# -- the configuration reference -------------------------------------------------------------

_LITERAL = re.compile(r'^(".*"|\[.*\]|\{.*\}|-?[0-9][0-9.]*|true|false)$')


def config_reference() -> str:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))  # the checkout's own source, whatever is installed
    from mcpcreds.cli.help_config import entries

    sections: dict[str, list[Row]] = {}
    for heading, key, default, meaning in entries():
        shown = code(default) if _LITERAL.match(default) else text(default)
        sections.setdefault(heading, []).append((code(key), shown, text(meaning)))
    parts = []
    for heading, rows in sections.items():
        parts.append(f"### {config_heading(heading)}\n\n" + table(("key", "default", "meaning"), rows))
    return "\n".join(parts)


def config_heading(heading: str) -> str:
    """`[[servers]]` and `[services.NAME]`; `oauth = {...}` (a server's OAuth client)."""
    name, _, note = heading.partition(" (")
    shown = " and ".join(code(part) for part in name.split(" and "))
    return f"{shown} ({text(note)}" if note else shown


# -- the socket API reference ------------------------------------------------------------------


def socket_api(doc: Json) -> str:
    api = OpenApi(doc)
    parts = [api.servers(), api.security()]
    for tag, operations in api.by_tag().items():
        parts.append(f"### {tag.capitalize()}\n\n{text(api.tag_description(tag))}\n")
        parts.extend(api.operation(path, method, op, shared) for path, method, op, shared in operations)
    parts.append("### Schemas\n\nThe bodies named above, field by field (nested fields dotted).\n")
    parts.extend(api.schema_section(name) for name in doc["components"]["schemas"])
    return "\n".join(parts)


def schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


class OpenApi:
    def __init__(self, doc: Json) -> None:
        self.doc = doc

    def resolve(self, node: Json) -> Json:
        while "$ref" in node:
            target: Any = self.doc
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return node

    def servers(self) -> str:
        rows = [(code(s["url"]), text(s.get("description", ""))) for s in self.doc.get("servers", [])]
        return table(("base URL", "meaning"), rows)

    def security(self) -> str:
        schemes = self.doc["components"].get("securitySchemes", {})
        rows = [(code(name), text(f"{s.get('scheme', s['type'])} ({s.get('bearerFormat', '')})"),
                 text(s.get("description", ""))) for name, s in schemes.items()]
        return "Authentication:\n\n" + table(("scheme", "kind", "meaning"), rows)

    def tag_description(self, tag: str) -> str:
        for entry in self.doc.get("tags", []):
            if entry["name"] == tag:
                return str(entry.get("description", ""))
        return ""

    def by_tag(self) -> dict[str, list[Operation]]:
        groups: dict[str, list[Operation]] = {entry["name"]: [] for entry in self.doc.get("tags", [])}
        for path, item in self.doc["paths"].items():
            for method in METHODS:
                if method in item:
                    op = item[method]
                    tag = (op.get("tags") or ["other"])[0]
                    groups.setdefault(tag, []).append((path, method, op, item.get("parameters", [])))
        return {tag: ops for tag, ops in groups.items() if ops}

    def operation(self, path: str, method: str, op: Json, shared: list[Json]) -> str:
        anchor = "op-" + op["operationId"].lower()
        out = [f"#### {code(method.upper() + ' ' + path)} {{ #{anchor} }}\n"]
        about = f" {text(op['description'])}" if "description" in op else ""
        out.append(f"**{text(op.get('summary', ''))}.**{about}\n")
        if op.get("security") == []:
            out.append("Needs no grant: open to every allowed peer, `grant_only_uids` included.\n")
        params = [self.resolve(p) for p in [*shared, *op.get("parameters", [])]]
        if params:
            out.append(table(("parameter", "in", "type", "meaning"), [
                (code(p["name"]), str(p["in"]), self.type_of(p.get("schema", {})),
                 text(p.get("description", ""))) for p in params]))
        if "requestBody" in op:
            out.append(self.request_body(self.resolve(op["requestBody"])))
        rows: list[Row] = []
        for status, answer in op.get("responses", {}).items():
            answer = self.resolve(answer)
            rows.append((f"**{status}**", text(answer.get("description", "")), self.body_summary(answer)))
        out.append("Answers:\n\n" + table(("status", "meaning", "body"), rows))
        for status, answer in op.get("responses", {}).items():
            inline = self.inline_fields(self.resolve(answer))
            if inline:
                out.append(f"The {status} body, field by field:\n\n{inline}")
        return "\n".join(out)

    def request_body(self, body: Json) -> str:
        required = "required" if body.get("required") else "optional"
        parts = []
        for media, content in body.get("content", {}).items():
            schema = content.get("schema", {})
            parts.append(f"Request body ({code(media)}, {required}): {self.type_of(schema)}."
                         + (f" {text(body['description'])}" if "description" in body else "") + "\n")
            rows = list(self.fields(schema))
            if rows:
                parts.append(table(("field", "type", "required", "meaning"), rows))
        return "\n".join(parts)

    def inline_fields(self, answer: Json) -> str:
        """Fields of an answer whose schema is written in place, not a named schema."""
        for content in answer.get("content", {}).values():
            schema = content.get("schema", {})
            if "$ref" not in schema and schema.get("properties"):
                return table(("field", "type", "required", "meaning"), list(self.fields(schema)))
        return ""

    def body_summary(self, answer: Json) -> str:
        parts = []
        for media, content in answer.get("content", {}).items():
            schema = content.get("schema", {})
            codes = self.error_codes(schema)
            shown = self.type_of(schema) if "$ref" in schema or not schema.get("allOf") else self.type_of(
                schema["allOf"][0])
            if codes:
                shown += ", code " + ", ".join(code(c) for c in codes)
            parts.append(f"{code(media)}: {shown}")
        for name in answer.get("headers", {}):
            parts.append(f"header {code(name)}")
        return "; ".join(parts)

    def error_codes(self, schema: Json) -> list[str]:
        for part in schema.get("allOf", []):
            part = self.resolve(part)
            error = part.get("properties", {}).get("error", {})
            enum = error.get("properties", {}).get("code", {}).get("enum")
            if enum:
                return [str(c) for c in enum]
        return []

    def type_of(self, schema: Json) -> str:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            return f"[{name}](#{schema_anchor(name)})"
        if "const" in schema:
            shown = code(json.dumps(schema["const"]))
        elif "enum" in schema:
            shown = "one of " + ", ".join(code(json.dumps(v)) for v in schema["enum"])
        elif "oneOf" in schema or "anyOf" in schema:
            variants: list[Json] = schema.get("oneOf") or schema.get("anyOf") or []
            shown = " or ".join(self.type_of(s) for s in variants)
        elif "allOf" in schema:
            shown = " and ".join(self.type_of(s) for s in schema["allOf"])
        else:
            kinds = schema.get("type", "any")
            kinds = kinds if isinstance(kinds, list) else [kinds]
            names = []
            for kind in kinds:
                if kind == "array":
                    names.append("array of " + self.type_of(schema.get("items", {})))
                elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
                    names.append("map of " + self.type_of(schema["additionalProperties"]))
                else:
                    names.append(str(kind))
            shown = " or ".join(names)
        limits = self.limits(schema)
        return f"{shown} ({limits})" if limits else shown

    @staticmethod
    def limits(schema: Json) -> str:
        words = {"minimum": "≥ {}", "maximum": "≤ {}", "exclusiveMinimum": "> {}", "minLength": "length ≥ {}",
                 "maxLength": "length ≤ {}", "minItems": "≥ {} items", "maxItems": "≤ {} items",
                 "maxProperties": "≤ {} entries", "format": "{}"}
        found = [words[k].format(schema[k]) for k in words if k in schema]
        if "pattern" in schema:
            found.append("pattern " + code(schema["pattern"]))
        if schema.get("uniqueItems"):
            found.append("unique")
        if "default" in schema:
            found.append("default " + code(json.dumps(schema["default"])))
        if schema.get("writeOnly"):
            found.append("write-only")
        return ", ".join(found)

    def properties(self, schema: Json) -> tuple[Json, set[str]]:
        """The fields of an object schema, its allOf parts' included (a $ref part by link only)."""
        props: Json = dict(schema.get("properties", {}))
        required = set(schema.get("required", []))
        for part in schema.get("allOf", []):
            if "$ref" not in part:
                more, needed = self.properties(part)
                props.update(more)
                required |= needed
        return props, required

    def fields(self, schema: Json, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, ...]]:
        schema = self.resolve(schema) if depth == 0 else schema
        props, required = self.properties(schema)
        for name, prop in props.items():
            yield (code(prefix + name), self.type_of(prop), "yes" if name in required else " ",
                   text(prop.get("description", "")))
            if "$ref" in prop or depth + 1 >= MAX_DEPTH:
                continue
            if prop.get("properties") or prop.get("allOf"):
                yield from self.fields(prop, f"{prefix}{name}.", depth + 1)
            items = prop.get("items", {})
            if "$ref" not in items and items.get("properties"):
                yield from self.fields(items, f"{prefix}{name}[].", depth + 1)

    def schema_section(self, name: str) -> str:
        schema = self.doc["components"]["schemas"][name]
        out = [f"#### {code(name)} {{ #{schema_anchor(name)} }}\n"]
        if "description" in schema:
            out.append(text(schema["description"]) + "\n")
        bases = [self.type_of(part) for part in schema.get("allOf", []) if "$ref" in part]
        rows = list(self.fields(schema))
        if bases:
            out.append("Everything in " + " and ".join(bases) + (", and:\n" if rows else ".\n"))
        if "oneOf" in schema:
            out.append("One of: " + ", ".join(self.type_of(s) for s in schema["oneOf"]) + ".\n")
        if rows:
            out.append(table(("field", "type", "required", "meaning"), rows))
        elif not bases and "oneOf" not in schema:
            out.append(f"A {self.type_of(schema)}.\n")
        return "\n".join(out)


# page -> (the marker it holds, what replaces it)
GENERATED: dict[str, tuple[str, Callable[[], str]]] = {
    "index.md": ("<!-- generated: README -->", lambda: root_file("README.md")),
    "changelog.md": ("<!-- generated: CHANGELOG -->", lambda: root_file("CHANGELOG.md")),
    "reference/configuration.md": ("<!-- generated: config keys -->", config_reference),
    "reference/socket-api.md": ("<!-- generated: socket API -->",
                                lambda: socket_api(json.loads(OPENAPI.read_text()))),
}
