"""The house stays as built: src/mcpcreds has no import circle, takes no private name across
modules, keeps the client side and the sidecar side apart, and keeps its rooms small.
Read from the source (tests/house.py: the AST, nothing imported), every import counted wherever it
stands; each rule is also shown to fail on a tree planted with what it forbids."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from tests.house import House, circles, private_imports, read_house, side_crossings

MAX_ROOT_MODULES = 6
MAX_PACKAGE_MODULES = 16
MAX_MODULE_LINES = 700


@pytest.fixture(scope="module")
def house() -> House:
    return read_house()


def test_no_import_circle(house: House) -> None:
    assert circles(house.edges()) == []


def test_no_private_name_is_imported_from_another_module(house: House) -> None:
    assert [f"{i.source}:{i.line} takes {i.names} from {i.target}" for i in private_imports(house)] == []


def test_the_client_side_and_the_sidecar_side_do_not_import_each_other(house: House) -> None:
    assert [f"{i.source}:{i.line} imports {i.target}" for i in side_crossings(house)] == []


def test_rooms_stay_small(house: House) -> None:
    per_package: dict[str, int] = {}
    for module, path in house.modules.items():
        if path.name != "__init__.py":
            package = module.rsplit(".", 1)[0]
            per_package[package] = per_package.get(package, 0) + 1
    assert per_package.pop("mcpcreds") <= MAX_ROOT_MODULES
    assert {p: n for p, n in per_package.items() if n > MAX_PACKAGE_MODULES} == {}
    long = {m: n for m, p in house.modules.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_package_faces_import_nothing_eagerly(house: House) -> None:
    """`mcpcreds.x` (a package's __init__) costs nothing: every command imports some of them."""
    faces = {m: p for m, p in house.modules.items() if p.name == "__init__.py" and m != "mcpcreds"}
    assert len(faces) >= 10, "the packages are read"
    eager = [m for m, p in faces.items()
             if any(isinstance(node, ast.Import | ast.ImportFrom) and not _is_future(node)
                    for node in ast.parse(p.read_text()).body)]
    assert eager == []


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def _plant(root: Path, files: dict[str, str]) -> House:
    package = root / "mcpcreds"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return read_house(package)


def test_a_planted_circle_is_found_through_function_and_type_checking_imports(tmp_path: Path) -> None:
    house = _plant(tmp_path, {
        "core/__init__.py": "",
        "core/a.py": "def f():\n    from .b import g\n    return g\n",
        "core/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..gateway.c import h\n",
        "gateway/__init__.py": "",
        "gateway/c.py": "from ..core import a\n",
        "gateway/d.py": "from ..core.a import f\n",  # below the circle, not in it
    })
    assert circles(house.edges()) == [["mcpcreds.core.a", "mcpcreds.core.b", "mcpcreds.gateway.c"]]


def test_a_planted_private_import_and_crossings_are_found(tmp_path: Path) -> None:
    house = _plant(tmp_path, {
        "client/__init__.py": "",
        "client/lib.py": "from ..sidecar.wire import LIMIT\n",
        "sidecar/__init__.py": "",
        "sidecar/wire.py": "LIMIT = 1\n_HIDDEN = 2\n",
        "gateway/__init__.py": "",
        "gateway/relay.py": "def f():\n    from mcpcreds.client import lib\n    from ..sidecar.wire import _HIDDEN, __doc__\n",
    })
    assert [(i.source, i.names) for i in private_imports(house)] == [("mcpcreds.gateway.relay", ("_HIDDEN", "__doc__"))]
    assert sorted((i.source, i.target) for i in side_crossings(house)) == [
        ("mcpcreds.client.lib", "mcpcreds.sidecar.wire"), ("mcpcreds.gateway.relay", "mcpcreds.client.lib")]


def test_a_face_that_hands_names_on_lazily_still_imports_them(tmp_path: Path) -> None:
    """A lazy table (`_LAZY = {"Name": ".module"}`) is an import too: it may close a circle."""
    house = _plant(tmp_path, {
        "config/__init__.py": '_LAZY = {"Config": ".load"}\n',
        "config/load.py": "from mcpcreds.config import Config\n",
    })
    assert ("mcpcreds.config", "mcpcreds.config.load") in {(i.source, i.target) for i in house.imports}
    assert circles(house.edges()) == [["mcpcreds.config", "mcpcreds.config.load"]]
