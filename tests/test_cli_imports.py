"""The commands run once per operation import only what they need (issue 18, "a fast CLI").

`mcpcreds token|headers|acquire|status|credential-helper` against a real sidecar, each run under
`python -X importtime`, as `python -m mcpcreds` and as the console script runs it: the heavy
modules (httpx, authlib, asyncio, cryptography, redis, keyring, ssl, the config parser) must not
be imported. A behaviour test, not a timing test: bench/cli_bench.py measures the time.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpcreds.client import uds
from tests.conftest import run_cli
from tests.sidecar_proc import SidecarProcess, run_sidecar

SRC = Path(__file__).resolve().parents[1] / "src"
TOKEN = "cli-imports-token-4f2a9d"
HEAVY = ("httpx", "httpx2", "httpcore", "anyio", "authlib", "asyncio", "cryptography", "redis", "keyring",
         "secretstorage", "ssl", "dataclasses", "inspect", "rich",  # rich: status on a terminal only
         "importlib.metadata",  # the version: read for --version and the sidecar only
         # a few ms each (issue 18): the config is read by lean_toml, paths are text, the socket is
         # _socket's, the lock _thread's
         "tomllib", "datetime", "pathlib", "socket", "selectors", "threading", "struct", "getpass",
         "httptools")  # uds.Answer reads the one answer; httptools imports typing
# the package's modules these commands need; any other (the config parser, exec, login, units...)
# is a cost they should not pay
LEAN_MODULES = {"mcpcreds", "mcpcreds.__main__", "mcpcreds.cli.main", "mcpcreds.cli.common", "mcpcreds.errors", "mcpcreds.client.address",
                "mcpcreds.client.calls", "mcpcreds.client.client", "mcpcreds.core.socket_check", "mcpcreds.client.uds",
                "mcpcreds.cli.credential_helper", "mcpcreds.core.lean_toml",
                # the package faces on the way, which import nothing themselves
                "mcpcreds.cli", "mcpcreds.client", "mcpcreds.core"}
CONSOLE_SCRIPT = "import sys; from mcpcreds.cli.main import main; sys.exit(main())"  # what [project.scripts] runs

CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:CLI_IMPORTS_TOKEN}}}}" }}
"""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    folder = tmp_path_factory.mktemp("cli-imports")
    folder.chmod(0o700)
    socket = folder / "s.sock"
    config = folder / "config.toml"
    config.write_text(CONFIG.format(socket=socket))
    with run_sidecar(config, socket, {"CLI_IMPORTS_TOKEN": TOKEN}) as proc:
        yield proc


def imported(stderr: str) -> set[str]:
    """The modules `-X importtime` reports as imported."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.add(name)
    return names


def run_timed(how: str, *args: str, stdin: str = "", env: dict[str, str] | None = None,
              ) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Under `python -S` (site-packages on PYTHONPATH): a `.pth` file of the machine's site-packages
    may import modules (this sandbox's certifi hook imports pathlib, re...), which would hide the
    command's own imports of them."""
    head = ["-m", "mcpcreds"] if how == "module" else ["-c", CONSOLE_SCRIPT]
    path = os.pathsep.join([str(SRC), *site.getsitepackages(), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-S", "-X", "importtime", *head, *args], input=stdin,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})})
    return proc, imported(proc.stderr)


COMMANDS = {
    "token": (("token", "docs"), "", f"{TOKEN}\n"),
    "headers": (("headers", "docs"), "", f"Authorization: Bearer {TOKEN}\n"),
    "acquire": (("acquire", "docs", "--max-wait", "0"), "", ""),
    "status": (("status", "--json"), "", '"name": "docs"'),
    "status piped": (("status",), "", '"name": "docs"'),  # JSON, no table: rich is not imported
    "credential-helper": (("credential-helper", "get"), "protocol=https\nhost=docs.example.com\n\n",
                          f"username=mcpcreds\npassword={TOKEN}\n"),
    "credential-helper --docker": (("credential-helper", "--docker", "get"), "docs.example.com\n",
                                   f'"Secret": "{TOKEN}"'),
}


@pytest.mark.parametrize("how", ["module", "console-script"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_imports_no_heavy_module(sidecar: SidecarProcess, command: str, how: str) -> None:
    args, stdin, expected = COMMANDS[command]
    # through the config file, as a user runs it: the socket is read from [sidecar]
    proc, modules = run_timed(how, *args, "--config", str(sidecar.config), stdin=stdin)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expected in proc.stdout
    assert "mcpcreds.cli.main" in modules and "mcpcreds.client.client" in modules  # the report is read right
    allowed = {"struct"} if command.startswith("credential-helper") else set()  # base64's, for Basic
    assert sorted(m for m in modules - allowed if m in HEAVY or m.split(".")[0] in HEAVY) == []
    assert sorted(m for m in modules if m.split(".")[0] == "mcpcreds" and m not in LEAN_MODULES) == []
    if command in ("token", "headers"):  # their simple form is parsed without argparse
        assert "argparse" not in modules
        assert "json" not in modules  # the answer is scanned by _json (uds.decode_json)
        # nor typing, re or urllib.parse: with what they import, ~5 ms of a ~10 ms interpreter start
        # (issue 33: `token` within 2x `python -c pass`); `python -m`'s runpy imports the last four
        assert sorted(modules & {"typing", "re", "enum", "urllib.parse", "ipaddress", "math"}) == []
        if how == "console-script":
            assert sorted(modules & {"collections", "functools", "contextlib", "types"}) == []


SIMPLE_FORMS = [
    ["token", "docs"], ["headers", "docs"], ["headers", "docs", "--json"], ["headers", "--json", "docs"],
    ["--config", "c.toml", "token", "docs"], ["token", "docs", "--config=c.toml"],
    ["token", "docs", "--socket", "s.sock"], ["headers", "--socket=s.sock", "docs", "--config", "c.toml"],
    ["--socket", "s.sock", "token", "docs"], ["token", "--json", "docs"], ["token", "docs", "--json"],
    ["token"], ["token", "a", "b"],
    ["token", "-h"], ["token", "docs", "--config"], ["token", "docs", "--config", "a", "--config", "b"],
    ["token", "docs", "--socket="], ["token", "--", "-docs"], ["token", "-docs"], ["headers", "docs", "--jso"],
    ["token", "docs", "--conf", "c.toml"], ["status"], ["acquire", "docs"], ["--version"], [],
    ["token", "service:crm"], ["headers", "mcp:docs", "--json", "--json"],
]


@pytest.mark.parametrize("argv", SIMPLE_FORMS, ids=" ".join)
def test_the_simple_form_parses_as_argparse_does(argv: list[str]) -> None:
    """`token NAME` / `headers NAME [--json]` skip argparse: what they accept, argparse accepts
    alike; anything else is left to argparse (None)."""
    from mcpcreds.cli.main import _simple_form, build_parser

    simple = _simple_form(argv)
    try:
        parsed = build_parser().parse_args(argv)
    except SystemExit:
        assert simple is None
        return
    if simple is None:
        return  # argparse's own: fine, only slower
    assert (simple.command, simple.name, simple.handler) == (parsed.command, parsed.name, parsed.handler)
    assert simple.json == getattr(parsed, "json", False)
    for option in ("config", "socket"):
        assert getattr(simple, option, None) == getattr(parsed, option, None)


def test_import_mcpcreds_is_light_and_public_names_still_work() -> None:
    code = ("import sys, mcpcreds\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('httpx', 'asyncio', 'authlib', 'cryptography')"
            " or m in ('mcpcreds.config.load', 'mcpcreds.client.client')]\n"
            "assert not heavy, heavy\n"
            "from mcpcreds import AsyncClient, Client, Config, Forbidden, MalformedAnswer, McpServerSpec, Secret\n"
            "from mcpcreds import UntrustedSidecar, load_config, __version__\n"
            "import mcpcreds.client.client\n"
            "assert AsyncClient is mcpcreds.client.client.AsyncClient and Client is mcpcreds.client.client.Client\n"
            "assert set(mcpcreds.__all__) <= set(dir(mcpcreds))\n"
            "try:\n    mcpcreds.NoSuchName\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(3)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_full_command_list_is_still_there() -> None:
    """The lean parser is for the lean commands only: --help and the other commands get all."""
    result = run_cli("--help")
    assert result.code == 0
    for command in ("token", "headers", "credential-helper", "exec", "login", "secret", "serve"):
        assert command in result.stdout, command
    assert run_cli("exec", "--help").code == 0
    assert "--docker" in run_cli("credential-helper", "--help").stdout


def test_an_explicit_config_with_a_bad_sidecar_key_is_still_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[sidecar]\nsocket = 5\n')
    result = run_cli("token", "docs", "--config", str(config))
    assert result.code == 2 and "sidecar.socket" in result.stderr, result.output
    result = run_cli("headers", "docs", "--config", str(tmp_path / "missing.toml"))
    assert result.code == 2 and "cannot read config" in result.stderr, result.output


def test_the_socket_comes_from_the_config_it_names(sidecar: SidecarProcess, tmp_path: Path) -> None:
    """The lean reader of [sidecar] (address.py) finds the socket; $MCPCREDS_CONFIG too."""
    assert run_cli("token", "docs", "--config", str(sidecar.config)).stdout == f"{TOKEN}\n"
    env = {"MCPCREDS_CONFIG": str(sidecar.config), "MCPCREDS_SOCKET": str(tmp_path / "not-this.sock")}
    assert run_cli("token", "docs", env=env).stdout == f"{TOKEN}\n"  # the config's socket wins


@pytest.mark.parametrize("env", [
    {},
    {"MCPCREDS_CONFIG": "/x/c.toml", "MCPCREDS_SOCKET": "/x/s.sock"},
    {"XDG_CONFIG_HOME": "/cfg", "XDG_RUNTIME_DIR": "/run/user/7"},
    {"XDG_RUNTIME_DIR": "", "XDG_CONFIG_HOME": ""},
])
def test_address_locates_as_config_does(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from mcpcreds.client import address
    from mcpcreds.config import load as config

    for key in ("MCPCREDS_CONFIG", "MCPCREDS_SOCKET", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for explicit in (None, "/given.toml"):
        assert address.find_config_path(explicit) == config.find_config_path(explicit)
    for configured in (None, "/configured.sock"):
        assert address.default_socket_path(configured) == config.default_socket_path(configured)


# ---------------------------------------------------------------------------- the lean TOML reader

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))
TRICKY = [
    "", "\n\n", "# only a comment", "a = 1", "a=1\r\nb=2\r\n", "a = 1\rb = 2", "[ sidecar ]\nsocket = 's'",
    "[sidecar]\nsocket = 's'\n[sidecar]", "[a]\n[[a]]", "[[a]]\n[a]", "[a.b]\n[a]\nc = 1", "[a]\n[a.b]\n[a]",
    "[[a]]\nb = 1\n[a.c]\n[[a]]\n[a.c]", "a = {}\n[a]", "a = [{}]\n[[a]]", "a = 1\n[a.b]", "[a]\nb = 1\n[a.b]",
    'a = "x\\ty"', 'a = "x\\"', "a = 'x\\'", 'a = """x"""', "a = '''x'''", 'a = "x\ty"', 'a = "x\x01"',
    "a = 1 # c\x01", "a = 1 # c\t", "a = 01", "a = -0", "a = +7", "a = 1_000", "a = 0x1f", "a = 1.5",
    "a = 1e3", "a = inf", "a = nan", "a = 1979-05-27", "a = 07:32:00", "a = true", "a = truex", "a = TRUE",
    "a = [1, 2,]", "a = [,]", "a = [1 2]", "a = [\n1]", "a = {b = 1,}", "a = {b = 1, b = 2}", "a = {b.c = 1}",
    'a = {"b" = 1, \'c\' = [true, "x"]}', "a = 1\na = 2", 'a = 1\n"a" = 2', "a.b = 1", "a = ", "= 1",
    "[a", "[a]]", "[[a]", "[[a] ]", "[ [a]]", "[a.]", "[.a]", "[]", '["a b".c]', "a b = 1", "\ufeffa = 1",
    "a = 1 b = 2", "a = 'x' 'y'", "a = \"x", "a = [1, [2, {c = 'd'}]]", "é = 1", "a = 'é'", "a = 1\x00",
    "[sidecar]\nsocket = '/tmp/x/s.sock'\nsidecar_uid = 1000\n", '[sidecar]\nsocket = "/tmp/\\u0078/s.sock"\n',
]


def tomllib_or_none(text: str) -> Any:
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def test_the_lean_reader_reads_the_examples_as_tomllib_does() -> None:
    from mcpcreds.core.lean_toml import loads

    assert EXAMPLES
    for path in EXAMPLES:
        text = path.read_text(encoding="utf-8")
        assert loads(text) == tomllib_or_none(text) is not None, path  # read, not passed to tomllib


@pytest.mark.parametrize("text", TRICKY)
def test_the_lean_reader_reads_as_tomllib_or_not_at_all(text: str) -> None:
    """None (tomllib decides) or tomllib's own answer; None for whatever tomllib refuses."""
    from mcpcreds.core.lean_toml import loads

    got = loads(text)
    assert got is None or got == tomllib_or_none(text)


def test_the_lean_reader_agrees_with_tomllib_on_mutated_and_generated_documents() -> None:
    """Random edits of the examples (a character of TOML's syntax put in, a run cut out or
    repeated), and documents made of headers and pairs that meet TOML's rules on tables defined
    twice and keys given twice: whatever the lean reader reads, it reads as tomllib does."""
    import random

    from mcpcreds.core.lean_toml import loads

    rng = random.Random(18)
    texts = [path.read_text(encoding="utf-8") for path in EXAMPLES]
    pieces = [*" \t\n\r#[]{}=,.\"'\\abc_-019+", "[[", "]]", "\r\n", "\x00", "é", '"""', "1.5", "true",
              "[a]\n", "[[a]]\n", "a = 1\n", "a.b = 1\n", "[sidecar]\n"]
    lines = ["[a]", "[a.b]", "[[a]]", "[[a.b]]", "[ a . b ]", '["a"]', "[a.b.c]", "[[a.b.c]]", "[b]", "[[b]]",
             "a = 1", "b = 'x'", '"a" = {}', "c = [1, 2,]", "d = {x = 1, y = [true]}", "b = {}", "a = []",
             "b = [{}]", "# c", "", "  b = -0 # x", "a = {b = {c = 1}}", '"b" = 2', "[a.d]", "d = 1"]
    read = 0
    for n in range(3000):
        if n % 2:
            text = rng.choice(texts)
            for _ in range(rng.randint(1, 3)):
                at, to = rng.randrange(len(text) + 1), rng.randrange(len(text) + 1)
                edit = rng.random()
                if edit < 0.5:
                    text = text[:at] + rng.choice(pieces) + text[at:]
                elif edit < 0.8:
                    text = text[:at] + text[at + rng.randint(1, 5):]
                else:
                    text = text[:at] + text[min(at, to):max(at, to)] + text[at:]
        else:
            text = "\n".join(rng.choice(lines) for _ in range(rng.randint(1, 7)))
        got = loads(text)
        if got is not None:
            read += 1
            assert got == tomllib_or_none(text), text
    assert read > 600  # most of them are not TOML, but many are: the comparison is not empty


@pytest.mark.parametrize(("sidecar", "expected"), [
    ('socket = "/run/a/s.sock"\nsidecar_uid = 1000', ("/run/a/s.sock", 1000)),
    ('socket = "/run/\\u0061/s.sock"', ("/run/a/s.sock", None)),  # an escape: read by tomllib
    ("socket = '/run/a//s.sock/'\nwhen = 1979-05-27", ("/run/a/s.sock", None)),  # a date: tomllib
    ('socket = "/run/a/s.sock"\r\n', ("/run/a/s.sock", None)),
])
def test_the_socket_is_read_with_or_without_the_lean_reader(tmp_path: Path, sidecar: str,
                                                            expected: tuple[str, int | None]) -> None:
    from mcpcreds.client.address import sidecar_address

    config = tmp_path / "c.toml"
    config.write_text(f"[sidecar]\n{sidecar}\n[[servers]]\nname = 'docs'\n", encoding="utf-8")
    assert sidecar_address(str(config), None) == expected


def test_paths_are_spelled_as_pathlib_spells_them() -> None:
    """The socket and config paths are text on the fast path: `path_text` must name the file
    `pathlib` named (the socket a sidecar binds is found by the same spelling)."""
    import itertools
    from pathlib import PurePosixPath

    from mcpcreds.client.address import path_text

    for count in range(6):
        for parts in itertools.product(["/", "a", ".", "..", "b/", ""], repeat=count):
            path = "".join(parts)
            assert path_text(path) == str(PurePosixPath(path)), path


# ---------------------------------------------------------------------------- the blocking client's HTTP reader

ANSWERS = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"a\": 1}",
    "close": b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    "1.0": b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    "1.0 keep-alive": b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nhi",
    "empty": b"HTTP/1.1 429 Too Many\r\nContent-Length: 0\r\n\r\n",
    "no reason": b"HTTP/1.1 200\r\ncontent-length: 1\r\n\r\nx",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n3;x=1\r\nabc\r\n0\r\n\r\n",
    "hex sizes": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n1b\r\n" + b"x" * 27 + b"\r\n0\r\n\r\n",
    "trailer": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-T: 1\r\n\r\n",
    "204": b"HTTP/1.1 204 No Content\r\n\r\n",
    "close and keep-alive": b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close\r\nContent-Length: 0\r\n\r\n",
    # malformed: both refuse
    "html": b"<html>hello</html>\r\n\r\n",
    "HTTP/2": b"HTTP/2 200 OK\r\n\r\n",
    "long status": b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
    "bad length": b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nhi",
    "two lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi",
    "space in a name": b"HTTP/1.1 200 OK\r\nBad Header: x\r\nContent-Length: 0\r\n\r\n",
    "no colon": b"HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 0\r\n\r\n",
    "bad chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n",
    "bad chunk end": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiX\r\n0\r\n\r\n",
    "length and chunked": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"2\r\nhi\r\n0\r\n\r\n"),
    # incomplete: neither is done (the client then reports the connection closed mid-answer)
    "short body": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi",
    "until the end": b"HTTP/1.1 200 OK\r\n\r\nbody-until-close",
}


def read_answer(parser: Any, feed: Any, data: bytes, step: int) -> object:
    import httptools

    try:
        for at in range(0, len(data), step):
            feed(data[at:at + step])
    except (ValueError, httptools.HttpParserError):
        return "refused"
    return (parser.status, b"".join(parser.body), parser.keep_alive) if parser.done else "not done"


class Parsed:
    """An answer parsed by httptools: the oracle `uds.Answer` is held to."""

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.size = 0
        self.done = False
        self.keep_alive = False
        self.status = 0

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > uds.MAX_RESPONSE:
            raise ValueError("sidecar answer too large")
        self.body.append(body)

    def on_message_complete(self) -> None:
        # read while the parser still holds this message (it resets once the callback returns)
        self.keep_alive = self.parser.should_keep_alive()
        self.status = self.parser.get_status_code()
        self.done = True


@pytest.mark.parametrize("answer", ANSWERS)
def test_the_blocking_client_reads_answers_as_httptools_does(answer: str) -> None:
    """`uds.Answer` (the CLI's, without httptools) and httptools (the async client's parser):
    the same status, body and keep-alive, or both refuse, fed whole or a byte or three at a time."""
    from mcpcreds.client.uds import Answer

    for step in (1, 3, 1 << 16):
        ours = Answer()
        theirs = Parsed()
        expected = read_answer(theirs, theirs.parser.feed_data, ANSWERS[answer], step)
        assert read_answer(ours, ours.feed_data, ANSWERS[answer], step) == expected, step


def test_the_blocking_client_bounds_what_it_reads() -> None:
    from mcpcreds.client.uds import MAX_HEAD, MAX_RESPONSE, Answer

    for answer in (b"HTTP/1.1 200 OK\r\nX: " + b"x" * MAX_HEAD,
                   b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_RESPONSE + 1),
                   b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % (MAX_RESPONSE + 1),
                   b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (MAX_RESPONSE + 1)):
        with pytest.raises(ValueError):
            Answer().feed_data(answer)
    kept = Answer()
    kept.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\n")
    assert kept.done and not kept.keep_alive  # bytes past the answer: the connection is not kept
    endless = Answer()  # interim answers without end: refused, not read for ever
    with pytest.raises(ValueError):
        for _ in range(100):
            endless.feed_data(b"HTTP/1.1 102 Processing\r\n\r\n")


def test_a_kept_connection_with_bytes_nobody_asked_for_is_not_used_again() -> None:
    """Bytes that arrive on an idle kept connection (after its answer was read) would be taken as
    the next request's answer; a connection the sidecar closed would fail the next request. Both
    are dropped before reuse, and a fresh connection is made."""
    import socket as socket_module

    from mcpcreds.client.uds import _idle_and_open

    quiet, peer = socket_module.socketpair()
    stray, stray_peer = socket_module.socketpair()
    closed, closed_peer = socket_module.socketpair()
    try:
        stray_peer.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        closed_peer.close()
        assert [_idle_and_open(s) for s in (quiet, stray, closed)] == [True, False, False]
        assert stray.recv(64).startswith(b"HTTP/1.1 200")  # peeked, not consumed
    finally:
        for s in (quiet, peer, stray, stray_peer, closed):
            s.close()


JSON_ANSWERS = [
    b"", b" ", b"{}", b"[]", b'{"headers": {"Authorization": "Bearer t"}, "expires_at": 1.5e9}', b" \t\n\r{}\r\n",
    b'{"a": NaN, "b": Infinity, "c": -Infinity}', b"1e400", b"-0", b"12345678901234567890123", b'"\\ud800"',
    b'"caf\xc3\xa9"', b'"\xff"', b"\xef\xbb\xbf{}", '{"a": 1}'.encode("utf-16"), '{"a": 1}'.encode("utf-32-le"),
    b'{"a": 1} x', b'{"a": 1}{}', b'{"a": 1,}', b'{"a": "x\ny"}', b'{"a": 1, "a": 2}', b"[" * 200_000,
    b"[1, 2", b"tru", b"true", b"null", b"nul", b"01", b'{"a" 1}', b"\x00", b'"\\u00e9\\n"',
]


@pytest.mark.parametrize("raw", JSON_ANSWERS, ids=range(len(JSON_ANSWERS)))
def test_answers_are_decoded_as_json_loads_decodes_them(raw: bytes) -> None:
    """`uds.decode_json` scans UTF-8 without importing json: the same value as json.loads, or None
    where json.loads refuses."""
    import json

    from mcpcreds.client.uds import decode_json

    try:
        expected = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        expected = None
    assert repr(decode_json(raw)) == repr(expected)  # repr: NaN is not equal to itself


@given(st.text(), st.sampled_from(["", ":", "/", "~:/"]))
def test_a_path_segment_is_quoted_as_urllib_quotes_it(text: str, safe: str) -> None:
    """`calls.quote` spells a server or secret name in a path without importing urllib.parse: as
    `urllib.parse.quote` does, or the same UnicodeEncodeError (a lone surrogate)."""
    from urllib.parse import quote as urllib_quote

    from mcpcreds.client.calls import quote

    try:
        expected = urllib_quote(text, safe=safe)
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            quote(text, safe)
        return
    assert quote(text, safe) == expected


@pytest.mark.parametrize("how", ["module", "console-script"])
def test_token_and_headers_write_their_whole_answer_before_the_process_ends(sidecar: SidecarProcess,
                                                                              how: str) -> None:
    """They end the process once answered (os._exit, without the interpreter's teardown): what
    they printed is flushed first, with stdout a block-buffered pipe ($PYTHONUNBUFFERED unset)."""
    head = ["-m", "mcpcreds"] if how == "module" else ["-c", CONSOLE_SCRIPT]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    config = ["--config", str(sidecar.config)]
    for args, expected in ((["token", "docs"], f"{TOKEN}\n"), (["headers", "docs"], f"Authorization: Bearer {TOKEN}\n")):
        proc = subprocess.run([sys.executable, *head, *args, *config], capture_output=True, text=True, timeout=60,
                              env=env)
        assert (proc.returncode, proc.stdout) == (0, expected), proc.stderr
    proc = subprocess.run([sys.executable, *head, "headers", "docs", "--json", *config], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("}") and TOKEN in proc.stdout
    proc = subprocess.run([sys.executable, *head, "token", "nosuch", *config], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith("mcpcreds: unknown_server: ")
