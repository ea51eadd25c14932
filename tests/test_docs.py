"""The documentation: the README stays a front page whose links resolve, README and docs/ carry
no history (issue numbers, commit hashes: that is CHANGELOG.md's), the README's test commands are
the ones CI runs, the architecture's floor plan is the import graph, and `mkdocs build --strict`
passes with its generated pages complete."""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_cli
from tests.house import SRC, read_house
from tests.sidecar_proc import run_sidecar

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 260

ISSUE = re.compile(r"\b(?:issues?|PR|pull requests?)\s*#?\d+", re.I)
# a commit hash: 7 to 40 lowercase hex characters, at least one digit and one letter, standing
# alone (a longer run of hex, such as a sha256 in an example, is not one)
COMMIT = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move detail into docs/"


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_or_commit_hashes(path: Path) -> None:
    found = [(n, m.group(0)) for n, line in enumerate(path.read_text().splitlines(), 1)
             for m in [*ISSUE.finditer(line), *COMMIT.finditer(line)]]
    assert not found, f"{path.relative_to(ROOT)}: history belongs in CHANGELOG.md, by version: {found}"


def test_the_history_patterns_catch_what_they_are_for() -> None:
    assert ISSUE.search("fixed since issue 18") and ISSUE.search("issues #140") and ISSUE.search("PR #152")
    assert COMMIT.search("before `6aa4988`") and COMMIT.search("at HEAD 9ca436d,")
    sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert not COMMIT.search(f"digest {sha256}") and not COMMIT.search("1800003600 deadbeef")


def test_every_relative_link_of_the_readme_is_a_file() -> None:
    targets = LINK.findall(README.read_text())
    relative = [t.split("#", 1)[0] for t in targets if not re.match(r"^[a-z]+:|^#", t)]
    assert relative, "the README links into docs/"
    missing = [t for t in relative if not (ROOT / t).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    assert any(t.startswith("docs/") and t.endswith(".md") for t in relative)


def test_the_readme_test_commands_are_the_ones_ci_runs() -> None:
    readme = README.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    run = [line.split("||")[0].strip() for line in ci.splitlines() if line.startswith("python3 -m pytest")]
    assert run == ["python3 -m pytest -q", "python3 -m pytest -q -m soak"]
    assert "```sh\n" + "\n".join(run) + "\n```" in readme


def quick_start() -> tuple[list[list[str]], str]:
    """The README's quick start: the command lines of its ```sh blocks, in order (each split as
    the shell would, its comment dropped), and its prose."""
    section = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)
    lines = [shlex.split(line, comments=True) for block in blocks for line in block.splitlines()]
    return [words for words in lines if words], section


def test_the_quick_start_runs_the_example_config(tmp_path: Path) -> None:
    """Each command of the quick start, run as written from the checkout, with one change: the
    demo's socket is moved to a folder of this test's (the same in the config and in `curl`), so
    that runs at once on one machine do not meet. The install line is not run: the tests run the
    package they import."""
    commands, prose = quick_start()
    demo = (ROOT / "examples" / "demo.toml").read_text()
    written = re.search(r'^socket = "([^"]+)"$', demo, re.M)
    assert written is not None
    env = {"HOME": str(tmp_path)}  # another shell of this user: no DEMO_TOKEN there
    assert "DEMO_TOKEN" not in os.environ
    ran: list[str] = []
    with contextlib.ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="mcpc-qs-"))  # short: a socket path has at most 107 bytes
        stack.callback(shutil.rmtree, folder, True)
        socket = folder / "demo" / "mcpcreds.sock"
        config = folder / "demo.toml"
        config.write_text(demo.replace(written.group(0), f'socket = "{socket}"'))
        sidecar = None
        for words in commands:
            words = [str(config) if w == "examples/demo.toml" else w for w in words]
            assigned = dict(w.split("=", 1) for w in itertools.takewhile(lambda w: "=" in w, words))
            command = words[len(assigned):]
            if command[:3] == ["python3", "-m", "venv"]:
                continue  # the install
            if command[:2] == ["mcpcreds", "serve"]:
                assert command[2:] == ["--config", str(config)] and sidecar is None, command
                sidecar = stack.enter_context(run_sidecar(config, socket, assigned))
            elif command[0] == "mcpcreds":
                assert sidecar is not None and not assigned, f"{command}: the sidecar is started first"
                done = run_cli(*command[1:], env=env)
                assert done.code == 0, f"{command}:\n{done.output}"
                ran.append(command[1])
                if command[1] == "check":  # "the servers, their cache keys and rates"
                    assert all(w in done.stdout for w in ("search", "service:search", "10/1s", "local-tools"))
                elif command[1] == "headers":
                    assert "X-Api-Key: demo-token" in done.stdout.splitlines()
                elif command[1] == "doctor":  # "a ✓ line per check"
                    checks = [line for line in done.stdout.splitlines() if line[:2] in ("✓ ", "✗ ")]
                    assert checks and all(line.startswith("✓ ") for line in checks), done.stdout
            elif command[0] == "curl":
                assert command[1] == "--unix-socket" and command[2] == written.group(1), command
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket))) as curl:
                    answer = curl.get(command[3])
                assert answer.status_code == 200, answer.text
                # what the README says `curl` gets: its members before the "..."
                said = re.search(r"`curl` gets `(\{.*?),\.\.\.\}`", prose)
                assert said is not None
                expected = json.loads(said.group(1) + "}")
                assert {k: answer.json().get(k) for k in expected} == expected
                ran.append("curl")
            else:
                pytest.fail(f"a quick start command this test does not know how to run: {command}")
        assert sidecar is not None
        sidecar.signal(signal.SIGINT)  # "Ctrl-C (or SIGTERM) drains and stops the sidecar"
        assert sidecar.wait() == 0 and "stopped" in sidecar.log
    assert ran == ["check", "curl", "headers", "doctor"]


TOML_BLOCK = re.compile(r"^( *)```toml\n(.*?)^\1```", re.M | re.S)


def whole_configs() -> list[tuple[str, str]]:
    """Every TOML block of the task pages that is a whole config, as a user copies it (indented
    in a list item: dedented), by "page.md#N" (N: the block's rank on its page). A block is a
    whole config when it opens with a table (after comments); one that opens with a key is a line
    to add to a config shown before it."""
    found = []
    for page in sorted((DOCS / "tasks").glob("*.md")):
        for rank, match in enumerate(TOML_BLOCK.finditer(page.read_text()), 1):
            block = textwrap.dedent(match.group(2))
            first = next(line for line in block.splitlines() if line.strip() and not line.startswith("#"))
            if first.startswith("["):
                found.append((f"{page.name}#{rank}", block))
    return found


def test_the_task_pages_toml_blocks_are_found() -> None:
    blocks = dict(whole_configs())
    assert len(blocks) >= 7 and "crm-ro" in blocks["gateway-fleet.md#1"]  # the fleet's example is one


@pytest.mark.parametrize(("where", "block"), whole_configs(), ids=[w for w, _ in whole_configs()])
def test_every_whole_config_of_the_task_pages_passes_check(where: str, block: str, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(block)
    checked = run_cli("check", "--config", str(config))
    assert checked.code == 0, f"docs/tasks/{where}: `mcpcreds check` refuses it as shown:\n{checked.output}"


def floor_plan() -> list[str]:
    """The packages of docs/architecture.md's floor plan, top floor first."""
    block = (DOCS / "architecture.md").read_text().split("```\n", 2)[1]
    return re.findall(r"^([a-z_]+)/ ", block, re.M)


def test_the_architecture_floor_plan_is_the_import_graph() -> None:
    plan = floor_plan()
    house = read_house()
    package = {name: name.split(".")[1] for name, path in house.modules.items() if path.parent != SRC}
    assert sorted(plan) == sorted(set(package.values())), "docs/architecture.md lists every package once"
    upward = sorted({(package[i.source], package[i.target]) for i in house.imports
                     if i.source in package and i.target in package
                     and plan.index(package[i.target]) < plan.index(package[i.source])})
    assert not upward, f"docs/architecture.md: a folder imports only the folders below it, not {upward}"


def words(page: str) -> str:
    """What a reader sees of an HTML page: tags (code highlighting's too) and entities undone."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_mkdocs_builds_strict_with_the_generated_pages(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

    # every config key `mcpcreds help config` prints, from the same definitions
    sys.path.insert(0, str(ROOT / "src"))
    from mcpcreds.cli.help_config import entries

    config = (site / "reference" / "configuration" / "index.html").read_text()
    assert "generated: config keys" not in config
    for heading, key, _default, _meaning in entries():
        assert f"<td><code>{key}</code></td>" in config, (heading, key)

    # every route of the OpenAPI document the sidecar serves, and every schema it names
    api = (site / "reference" / "socket-api" / "index.html").read_text()
    doc = json.loads((ROOT / "src" / "mcpcreds" / "openapi.json").read_text())
    assert "generated: socket API" not in api
    for path, item in doc["paths"].items():
        for method in ("get", "post", "put", "patch", "delete"):
            if method in item:
                assert f'id="op-{item[method]["operationId"].lower()}"' in api, (method, path)
                assert f"<code>{method.upper()} {path}</code>" in api, (method, path)
    for name in doc["components"]["schemas"]:
        assert f'id="schema-{name.lower()}"' in api, name

    # the front page is the README, its links made the site's
    index = (site / "index.html").read_text()
    assert "generated: README" not in index
    assert "DEMO_TOKEN=demo-token mcpcreds serve --config examples/demo.toml" in words(index)
    assert 'href="tasks/desktop-stdio/"' in index
