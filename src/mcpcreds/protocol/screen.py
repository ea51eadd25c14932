"""What an untrusted MCP server sends, screened (pure: parsed JSON in, parsed JSON out, no I/O).

Every function takes what `json.loads` gives (dicts, lists, strings, numbers), never mutates it,
and bounds its work (depth, sizes, counts) whatever the server sent.

- `sanitize_text(text, limit=1024) -> str`: the text without Unicode format characters (category
  Cf: zero-width, bidi controls, BOM, tag characters), control characters (Cc, but `\\n` and `\\t`)
  and variation selectors (which can carry hidden bytes), cut to at most `limit` bytes of UTF-8 on
  a character boundary. At most the first `MAX_SCAN_CHARS` characters are read.
- `INJECTION_PATTERNS`: (name, regex) pairs for prompt-injection phrasing; `scan(text)` gives the
  names of those that match. A text is read as a model would read it: tag characters as the ASCII
  they spell, other format and control characters removed (so a zero-width character cannot split
  a phrase), NFKC-normalised (full-width letters, ligatures), case ignored; at most
  `MAX_SCAN_CHARS` characters of it.
- `sanitize_listing(result) -> (result, hits)`: a `tools/list`, `prompts/list`, `resources/list`
  or `resources/templates/list` result (whichever of `tools`, `prompts`, `resources`,
  `resourceTemplates` it holds: judged by shape, like the tool filter) with each item's
  `description` and `title`, a tool's `annotations.title`, a prompt's arguments' `description`
  and `title`, and every `description`, `title` and `$comment` string in a tool's `inputSchema`
  and `outputSchema`, sanitized (`sanitize_text`, `MAX_DESCRIPTION_BYTES`); one that matches an
  injection pattern becomes `SANITIZED`. Each text is read as far as it can be shown
  (`MAX_LISTING_TEXT_SCAN` characters), `MAX_LISTING_SCAN_CHARS` in all: past that, every text
  is `SANITIZED` (a hit named `OVER_BUDGET`). A key that a lenient decoder reads as one of those
  (`Description`, `DESCRIPTION`) is treated as it. A schema nested deeper than `MAX_SCHEMA_DEPTH`
  is cut there (`{}`, a hit named `TOO_DEEP`). `hits` (at most `MAX_HITS`) say where, for the
  audit line and the metric.
- `scan_result(result) -> list[str]`: the injection patterns found in the strings of a
  `tools/call`, `prompts/get` or `resources/read` result (content text, `structuredContent`,
  embedded resource text, ...; base64 `data` and `blob` are skipped); each string read up to
  `MAX_SCAN_CHARS`, `MAX_RESULT_SCAN_CHARS` in all, `MAX_WALK_DEPTH` deep.
- `withhold_media(result) -> (result, withheld)`: in a `tools/call` result (`content`), a
  `prompts/get` result (`messages[].content`) or a `resources/read` result (`contents`), each image
  and audio block, and each embedded resource or resource contents with a `blob` whose `mimeType`
  is image/* or audio/* (or whose first bytes are an image or audio signature, whatever it
  declares), is replaced by text saying what was withheld (`[image/png withheld by the gateway:
  12,345 bytes]`: the type, when it is a plain media type, and the decoded size reckoned from the
  base64 length; never the data). A block with keys that read as one another to a lenient decoder
  (`type` and `Type`) is withheld too. `withheld` lists the media types (`MALFORMED` for those).
- `tool_digest(tool) -> str`: sha256 (hex) of the canonical JSON (sorted keys, compact, ASCII) of a
  tool's `DIGESTED_FIELDS` (name, title, description, inputSchema, outputSchema, annotations): the
  pin of its definition. Key order and other members (`_meta`, `icons`) do not change it.
- Server-to-client requests the gateway answers itself. `server_request(message)` names one
  (`ELICIT_FORM`, `ELICIT_URL`, `ROOTS`, `SAMPLING`, or None): a JSON-RPC request with an id.
  `input_requests(result)`: the same for the requests a 2026-07-28 `input_required` result embeds
  (key -> kind). `elicitation_result(action)` (`decline` or `cancel`, never `accept`) and
  `roots_result(roots)` are the results; `elicitation_answer(id, action)` and
  `roots_answer(id, roots)` the JSON-RPC responses. `label_elicitation(message, server)` is an
  elicitation request with its message sanitized and prefixed with the server's name, for one
  that is relayed to the user.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .strict_json import StrictJsonError, check_members, folded

MAX_DESCRIPTION_BYTES: Final = 1024
MAX_SCAN_CHARS: Final = 64 * 1024  # of one text
MAX_RESULT_SCAN_CHARS: Final = 256 * 1024  # of all the texts of one result (a scan of it takes ~0.1 s)
MAX_SCHEMA_DEPTH: Final = 64
MAX_WALK_DEPTH: Final = 64
MAX_LISTING_TEXT_SCAN: Final = 2 * MAX_DESCRIPTION_BYTES  # characters read of a listing text: all it can show
MAX_LISTING_SCAN_CHARS: Final = 512 * 1024  # of all the texts of one listing; past it, each is SANITIZED
MAX_HITS: Final = 256
MAX_LABEL_BYTES: Final = 128  # an item name or a path in a hit
SANITIZED: Final = "[sanitized]"
TOO_DEEP: Final = "schema_too_deep"
OVER_BUDGET: Final = "scan_budget_exceeded"

# ------------------------------------------------------------------------------------ text


def _hidden_characters() -> re.Pattern[str]:
    """Characters that show nothing or steer how the rest shows: format (Cf) and control (Cc)
    characters but newline and tab, and variation selectors (they can carry hidden bytes). Only
    planes 0, 1 and 14 hold Cf or Cc characters (the others are CJK, unassigned and private use)."""
    planes = (range(0x20000), range(0xE0000, 0xE1000))
    codes = {c for plane in planes for c in plane if unicodedata.category(chr(c)) in ("Cf", "Cc")}
    codes |= {*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)}
    codes -= {ord("\n"), ord("\t")}
    ranges: list[list[int]] = []
    for code in sorted(codes):
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges) + "]+")


_HIDDEN: Final = _hidden_characters()


def _shown(text: str) -> str:
    return _HIDDEN.sub("", text)


def sanitize_text(text: str, limit: int = MAX_DESCRIPTION_BYTES) -> str:
    cut = _shown(text[:MAX_SCAN_CHARS]).encode("utf-8", "surrogatepass")[:max(0, limit)]
    return cut.decode("utf-8", "ignore")  # a character cut in two is dropped whole


_W: Final = r"[\W_]*"  # between words: any run of non-word characters, or none (a removed zero-width one)
_ANY: Final = r"(?:all|any|every|the|your|my|of|these|those)"
_BEFORE: Final = r"(?:previous|prior|above|earlier|preceding|former|foregoing|system|original|developer)"
_ORDERS: Final = r"(?:instructions?|prompts?|directions?|directives?|rules|guidelines|guidance|commands?)"
_TOLD: Final = r"(?:tell|inform|mention|reveal|show|notify|alert|disclose)"
_USER: Final = r"(?:the\W+)?(?:user|human)s?\b(?!['\u2019]s)"
_ROLE: Final = r"(?:system|assistant)(?:[ \t]+(?:prompt|message|instructions?))?"
_TOOL: Final = r"[\w.-]{1,64}\W+(?:tool|function)\b"

INJECTION_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = tuple(
    (name, re.compile(regex, re.IGNORECASE | re.MULTILINE | flags)) for name, regex, flags in (
        # "ignore all previous instructions", "ignore the above prompt", "ignore system rules"
        ("ignore_instructions", rf"ignore{_W}(?:{_ANY}{_W}){{0,3}}{_BEFORE}{_W}{_ORDERS}", 0),
        # "disregard your instructions", "forget all prior guidelines"
        ("disregard_instructions",
         rf"\b(?:disregard|forget){_W}(?:(?:{_ANY}|{_BEFORE}|safety){_W}){{0,4}}{_ORDERS}", 0),
        # chat-template and role markers a model reads as a turn of its own conversation
        ("role_marker",
         r"<\|\s*(?:im_start|im_end|system|user|assistant|endoftext|start_header_id|end_header_id|eot_id)\s*\|>"
         r"|\[/?INST\]|<</?SYS>>|<\s*/?\s*system(?:[-_ ]?prompt)?\s*>"
         rf"|^[ \t>*]*#{{1,6}}[ \t]*{_ROLE}[ \t]*:?[ \t]*$|^[ \t>*]*{_ROLE}[ \t]*:", 0),
        # tags that mark text as hidden orders: <IMPORTANT>, <secret>, <instructions>
        ("hidden_tag",
         r"<\s*/?\s*(?:important|secret|instructions?|hidden|admin|critical"
         r"|system[-_ ]?(?:prompt|instructions?|message))\b[^<>]{0,64}>", 0),
        # an HTML comment (hidden where markdown is rendered) that gives orders
        ("comment_instructions",
         r"<!--(?:[^<]|<(?!!--)){0,512}?\b(?:ignore|instructions?|assistant|must|always|never|do\s+not|don't"
         r"|you\s+(?:should|will|are)|call|invoke|send|read|tool)\b", 0),
        # "send the file contents to https://...", "upload ... to http://..."
        ("exfiltrate_url",
         r"\b(?:send|post|upload|forward|transmit|exfiltrate|leak|submit|beacon)(?:s|ed|ing)?\b.{0,80}?"
         r"\b(?:to|at|into|via)\W+(?:https?|ftp|wss?)://", 0),
        # "do not tell the user", "without telling the user", "the user must not know", "never say that you"
        ("conceal_from_user",
         rf"\b(?:do\s*not|don'?t|never|avoid)\W+(?:\w+\W+){{0,2}}?{_TOLD}(?:ing)?\W+(?:\w+\W+){{0,3}}?{_USER}"
         rf"|\bwithout\W+(?:\w+\W+)?(?:telling|informing|notifying|alerting|mentioning|letting|showing)"
         rf"\W+(?:(?:it|this|that)\W+to\W+)?{_USER}"
         r"|\b(?:do\s*not|don'?t|never)\W+(?:mention|reveal|say|disclose)\W+(?:that\W+)?you\b"
         r"|\b(?:user|human)\W+(?:must|should|need)\W*(?:not|never|n't)\W+(?:know|see|notice|be\W+told|find\W+out)"
         r"|\b(?:secret|hidden)\W+from\W+(?:the\W+)?(?:user|human)", 0),
        # credentials and keys on the user's machine; a .env file when it is to be read or sent
        ("secret_files",
         r"~/\.ssh\b|\.ssh/(?:id_|authorized_keys|known_hosts|config)|\bid_(?:rsa|dsa|ecdsa|ed25519)\b"
         r"|\.aws/credentials|/etc/(?:shadow|passwd)\b|\.netrc\b|\.pgpass\b|\.git-credentials\b"
         r"|\.docker/config\.json|\.kube/config\b|\.cursor/mcp\.json|claude_desktop_config\.json"
         r"|\b(?:read|cat|open|send|upload|include|print|dump|leak|paste)\b.{0,60}?(?<![\w.])\.env\b", 0),
        # steering the agent away from another server's tool, or into one
        ("tool_shadowing",
         rf"\binstead\W+of\W+(?:using|calling|invoking|running)\W+(?:the\W+)?{_TOOL}"
         rf"|\bwhen(?:ever)?\W+(?:the\W+)?user\W+(?:asks?|requests?|wants?|tries|says?|types?)\b.{{0,120}}?"
         rf"\b(?:call|invoke|use|run|send)\W+(?!this\b|it\b)(?:the\W+)?{_TOOL}", 0),
    )
)


# tag characters spell ASCII that some models read ("ASCII smuggling"): the scan reads it too
_TAGS: Final = {code: code - 0xE0000 for code in range(0xE0020, 0xE007F)}


def _readable(text: str) -> str:
    """`text` as a model reads it: tag characters as the ASCII they spell, other hidden characters
    removed, compatibility forms folded (full-width letters, the long s)."""
    return unicodedata.normalize("NFKC", _shown(text.translate(_TAGS)))


def _matches(readable: str) -> list[str]:
    return [name for name, pattern in INJECTION_PATTERNS if pattern.search(readable)]


def scan(text: str) -> list[str]:
    return _matches(_readable(text[:MAX_SCAN_CHARS]))


# --------------------------------------------------------------------------------- listings


@dataclass(frozen=True, slots=True)
class Hit:
    """A listing text that was replaced: the listing (`tools`, `prompts`, `resources`,
    `resourceTemplates`), the item's name (sanitized, capped), where in the item (a JSON pointer,
    capped) and the pattern names."""

    listing: str
    item: str
    where: str
    patterns: tuple[str, ...]


LISTINGS: Final = ("tools", "prompts", "resources", "resourceTemplates")
_TEXT_FOLDS: Final = frozenset({"description", "title"})
_SCHEMA_TEXT_FOLDS: Final = frozenset({"description", "title", "$comment"})
_SCHEMAS: Final = ("inputSchema", "outputSchema")


def _pointer(parts: Sequence[str | int]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class _Listing:
    def __init__(self, listing: str, budget: list[int]) -> None:
        self.listing = listing
        self.item = ""
        self.hits: list[Hit] = []
        self.budget = budget  # [characters left to scan], shared by the listings of one result

    def hit(self, where: Sequence[str | int], patterns: Sequence[str]) -> None:
        if len(self.hits) < MAX_HITS:
            self.hits.append(Hit(self.listing, self.item, sanitize_text(_pointer(where), MAX_LABEL_BYTES),
                                 tuple(patterns)))

    def text(self, value: str, where: Sequence[str | int]) -> str:
        # only what can be shown is read (hidden characters do not count against the cap)
        readable = _readable(value[:MAX_SCAN_CHARS])[:MAX_LISTING_TEXT_SCAN]
        self.budget[0] -= len(readable)
        found = _matches(readable) if self.budget[0] >= 0 else [OVER_BUDGET]
        if found:
            self.hit(where, found)
            return SANITIZED
        return sanitize_text(value, MAX_DESCRIPTION_BYTES)

    def texts(self, obj: dict[str, Any], where: list[str | int], folds: frozenset[str]) -> dict[str, Any]:
        """`obj` with its text members (and every key a lenient decoder reads as one) sanitized."""
        return {k: self.text(v, [*where, k]) if isinstance(v, str) and folded(k) in folds else v
                for k, v in obj.items()}

    def schema(self, node: Any, where: list[str | int]) -> Any:
        if len(where) > MAX_SCHEMA_DEPTH:
            self.hit(where, (TOO_DEEP,))
            return {}
        if isinstance(node, list):
            return [self.schema(v, [*where, i]) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        node = self.texts(node, where, _SCHEMA_TEXT_FOLDS)
        return {k: self.schema(v, [*where, k]) if isinstance(v, dict | list) else v for k, v in node.items()}

    def entry(self, item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        name = item.get("name", item.get("uri", item.get("uriTemplate")))
        self.item = sanitize_text(name, MAX_LABEL_BYTES) if isinstance(name, str) else ""
        out = self.texts(item, [], _TEXT_FOLDS)
        for key, value in item.items():
            fold = folded(key)
            if fold == "annotations" and isinstance(value, dict):
                out[key] = self.texts(value, [key], _TEXT_FOLDS)
            elif fold in ("inputschema", "outputschema"):
                out[key] = self.schema(value, [key])
            elif fold == "arguments" and isinstance(value, list):
                out[key] = [self.texts(a, [key, i], _TEXT_FOLDS) if isinstance(a, dict) else a
                            for i, a in enumerate(value)]
        return out


def sanitize_listing(result: Mapping[str, Any]) -> tuple[dict[str, Any], list[Hit]]:
    out = dict(result)
    hits: list[Hit] = []
    budget = [MAX_LISTING_SCAN_CHARS]
    for key, value in result.items():
        if key in LISTINGS and isinstance(value, list):
            listing = _Listing(key, budget)
            out[key] = [listing.entry(item) for item in value]
            hits.extend(listing.hits)
    return out, hits[:MAX_HITS]


# ---------------------------------------------------------------------------------- results

_BINARY_FOLDS: Final = frozenset({"data", "blob"})


def scan_result(result: Any) -> list[str]:
    """The pattern names found in the result's strings (in INJECTION_PATTERNS order)."""
    pieces: list[str] = []
    budget = MAX_RESULT_SCAN_CHARS
    stack: list[tuple[Any, int]] = [(result, 0)]
    while stack and budget > 0:
        node, depth = stack.pop()
        if isinstance(node, str):
            pieces.append(node[:min(MAX_SCAN_CHARS, budget)])
            budget -= len(pieces[-1]) + 2
        elif depth < MAX_WALK_DEPTH and isinstance(node, dict):
            stack.extend((v, depth + 1) for k, v in reversed(node.items()) if folded(k) not in _BINARY_FOLDS)
        elif depth < MAX_WALK_DEPTH and isinstance(node, list):
            stack.extend((v, depth + 1) for v in reversed(node))
    return _matches(_readable("\n\n".join(pieces)))  # one pass over all the texts, each on lines of its own


_MEDIA_TYPE: Final = re.compile(r"(?:image|audio)/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}", re.ASCII)
_SIGNATURES: Final = (  # (offset, bytes, media type) of the first bytes of common image and audio files
    (0, b"\x89PNG", "image/png"), (0, b"\xff\xd8\xff", "image/jpeg"), (0, b"GIF8", "image/gif"),
    (8, b"WEBP", "image/webp"), (8, b"WAVE", "audio/wav"), (0, b"ID3", "audio/mpeg"),
    (0, b"OggS", "audio/ogg"), (0, b"fLaC", "audio/flac"), (4, b"ftypavif", "image/avif"),
    (4, b"ftyphei", "image/heic"), (0, b"\x00\x00\x01\x00", "image/x-icon"),
)
_BLOCK_MEMBERS: Final = frozenset({"type", "data", "mimeType", "blob", "resource", "text", "uri"})
MALFORMED: Final = "malformed"


def _sniffed(data: str) -> str | None:
    try:
        head = base64.b64decode(data[:16], validate=True)
    except (binascii.Error, ValueError):
        return None
    return next((kind for at, magic, kind in _SIGNATURES if head[at:at + len(magic)] == magic), None)


def _size(data: Any) -> int:
    if not isinstance(data, str):
        return 0
    return max(0, len(data) * 3 // 4 - (len(data) - len(data.rstrip("="))))


def _notice(kind: str, size: int) -> str:
    return f"[{kind} withheld by the gateway: {size:,} bytes]"


def _media(obj: Mapping[str, Any], data_key: str, default: str | None) -> tuple[str, int] | None:
    """(media type, decoded size) when `obj` carries image or audio data in `data_key`, else None.
    `default` is the kind it is by its `type` (image, audio), None when only its data can tell."""
    data = obj.get(data_key)
    declared = obj.get("mimeType")
    declared = declared.lower() if isinstance(declared, str) else ""
    plain = _MEDIA_TYPE.fullmatch(declared) is not None
    if default is None:
        sniffed = _sniffed(data) if isinstance(data, str) else None
        if not isinstance(data, str) or not (plain or sniffed):
            return None
        return (declared if plain else str(sniffed)), _size(data)
    return (declared if plain and declared.startswith(default) else default), _size(data)


def _block(block: Any, withheld: list[str]) -> Any:
    """A content block, or the text block that stands for its image or audio."""
    if not isinstance(block, dict):
        return block
    found: tuple[str, int] | None
    try:
        check_members(block, _BLOCK_MEMBERS)
        resource = block.get("resource")
        if isinstance(resource, dict):
            check_members(resource, _BLOCK_MEMBERS)
        kind = block.get("type")
        if kind in ("image", "audio"):
            found = _media(block, "data", str(kind))
        elif kind == "resource" and isinstance(resource, dict):
            found = _media(resource, "blob", None)
        else:
            found = None
    except StrictJsonError:
        found = (MALFORMED, 0)
    if found is None:
        return block
    withheld.append(found[0])
    return {"type": "text", "text": _notice(found[0] if found[0] != MALFORMED else "content block", found[1])}


def _contents(item: Any, withheld: list[str]) -> Any:
    """A `resources/read` contents item, or a text one in its place (same uri)."""
    if not isinstance(item, dict):
        return item
    try:
        check_members(item, _BLOCK_MEMBERS)
        found = _media(item, "blob", None)
    except StrictJsonError:
        found = (MALFORMED, 0)
    if found is None:
        return item
    withheld.append(found[0])
    text = _notice(found[0] if found[0] != MALFORMED else "resource contents", found[1])
    uri = item.get("uri")
    return {**({"uri": uri} if isinstance(uri, str) else {}), "mimeType": "text/plain", "text": text}


def _message_content(content: Any, withheld: list[str]) -> Any:
    """A prompt message's content: one block (or, in some revisions, a list of them)."""
    return [_block(b, withheld) for b in content] if isinstance(content, list) else _block(content, withheld)


def withhold_media(result: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    out = dict(result)
    withheld: list[str] = []
    content = result.get("content")
    if isinstance(content, list):
        out["content"] = [_block(block, withheld) for block in content]
    contents = result.get("contents")
    if isinstance(contents, list):
        out["contents"] = [_contents(item, withheld) for item in contents]
    messages = result.get("messages")
    if isinstance(messages, list):
        out["messages"] = [{**m, "content": _message_content(m["content"], withheld)}
                           if isinstance(m, dict) and "content" in m else m for m in messages]
    return out, withheld


# ----------------------------------------------------------------------------------- pinning

DIGESTED_FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


def canonical_definition(tool: Mapping[str, Any]) -> str:
    """The canonical JSON (sorted keys, compact, ASCII) of a tool's DIGESTED_FIELDS."""
    pinned = {k: tool[k] for k in DIGESTED_FIELDS if k in tool}
    return json.dumps(pinned, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def tool_digest(tool: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_definition(tool).encode("ascii")).hexdigest()


# ------------------------------------------------------------------ server-to-client requests

ELICIT_FORM: Final = "elicitation_form"
ELICIT_URL: Final = "elicitation_url"
ROOTS: Final = "roots"
SAMPLING: Final = "sampling"
SAMPLING_METHOD: Final = "sampling/createMessage"
_METHODS: Final = {"roots/list": ROOTS, SAMPLING_METHOD: SAMPLING}


def _request_kind(request: Mapping[str, Any]) -> str | None:
    method = request.get("method")
    if method == "elicitation/create":
        params = request.get("params")
        # no mode (the 2025-06-18 revision) is form mode; an unknown one is still an elicitation
        return ELICIT_URL if isinstance(params, dict) and params.get("mode") == "url" else ELICIT_FORM
    return _METHODS.get(method) if isinstance(method, str) else None


def server_request(message: Any) -> str | None:
    """The kind of server-to-client request `message` is, if the gateway intercepts it."""
    if not isinstance(message, dict) or "result" in message or "error" in message:
        return None
    id_ = message.get("id")
    if not (isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))):
        return None
    return _request_kind(message)


def input_requests(result: Any) -> dict[str, str]:
    """key -> kind of each request an `input_required` result (2026-07-28) embeds that the gateway
    intercepts; {} for any other result."""
    if not isinstance(result, dict) or result.get("resultType") != "input_required":
        return {}
    requests = result.get("inputRequests")
    if not isinstance(requests, dict):
        return {}
    kinds = {key: _request_kind(request) for key, request in requests.items() if isinstance(request, dict)}
    return {key: kind for key, kind in kinds.items() if kind is not None}


def elicitation_result(action: str) -> dict[str, Any]:
    if action not in ("decline", "cancel"):
        raise ValueError("the gateway only declines or cancels an elicitation")
    return {"action": action}


def roots_result(roots: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """`roots`: (uri, name or None) pairs, each uri file://."""
    if any(not uri.startswith("file://") for uri, _ in roots):
        raise ValueError("a root is a file:// URI")
    return {"roots": [{"uri": uri, **({"name": name} if name is not None else {})} for uri, name in roots]}


SAMPLING_REFUSED_CODE: Final = -1  # the spec's example of a rejected sampling request
SAMPLING_REFUSED: Final = ("sampling refused by the mcpcreds gateway: this MCP server may not ask the "
                           "client's LLM (sampling_enabled, or a sandboxed server)")


class Refused(Exception):
    """A request of the server's that the policy refuses and that has no result the gateway could
    give in the client's place (sampling: a 2026-07-28 input response has no error arm). In the
    2025 revisions the server gets an error (SAMPLING_REFUSED_CODE, SAMPLING_REFUSED: the policy's
    words, never the server's); in 2026-07-28 the client's request
    whose result carried it fails."""

    def __init__(self, policy: str) -> None:
        super().__init__(f"the MCP server's request was refused by the gateway's {policy} policy: the "
                         "server may not ask the client's LLM (sampling/createMessage)")
        self.policy = policy


def elicitation_answer(id_: str | int, action: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": elicitation_result(action)}


def roots_answer(id_: str | int, roots: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": roots_result(roots)}


def label_elicitation(request: Mapping[str, Any], server: str) -> dict[str, Any]:
    """An `elicitation/create` request (or embedded input request) whose message says which
    server asks, its own text sanitized: the user must know who sends them to a URL."""
    params = request.get("params")
    if not isinstance(params, dict):
        return dict(request)
    message = params.get("message")
    text = sanitize_text(message) if isinstance(message, str) else ""
    return {**request, "params": {**params, "message": f"[MCP server {server!r}] {text}"}}
