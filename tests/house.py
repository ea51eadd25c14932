"""The import graph of src/mcpcreds, read from the source (AST, nothing imported or run).

Every import counts, wherever it stands: at the top, in a function, under `TYPE_CHECKING`.
`python tests/house.py` prints the circles, the private names taken across modules and the
client/sidecar crossings; tests/test_house.py asserts there are none.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "mcpcreds"
SRC = Path(__file__).resolve().parent.parent / "src" / PACKAGE

# what runs inside an agent's process, and what runs only in the sidecar: neither imports the other
CLIENT_SIDE = ("mcpcreds.client",)
SIDECAR_SIDE = ("mcpcreds.sidecar", "mcpcreds.broker", "mcpcreds.gateway", "mcpcreds.protocol", "mcpcreds.exec")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported
    names: tuple[str, ...]  # the names taken from it (empty for `import x`)
    line: int


@dataclass
class House:
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        graph: dict[str, set[str]] = {name: set() for name in self.modules}
        for imp in self.imports:
            if imp.target != imp.source:
                graph[imp.source].add(imp.target)
        return graph


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module a `from ... import` names (`from ..x import y` in a.b.c -> a.x)."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _imports_of(module: str, path: Path, modules: dict[str, Path]) -> Iterable[Import]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield Import(module, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            if not target.startswith(PACKAGE):
                continue
            taken: list[str] = []
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in modules:  # `from pkg import submodule` imports the submodule
                    yield Import(module, submodule, (), node.lineno)
                else:
                    taken.append(alias.name)
            if taken and target in modules:
                yield Import(module, target, tuple(taken), node.lineno)
        elif isinstance(node, ast.Call) and _is_import_module(node):
            yield from _dynamic_import(module, is_package, node, modules)


def _is_import_module(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "import_module"


def _dynamic_import(module: str, is_package: bool, node: ast.Call, modules: dict[str, Path]) -> Iterable[Import]:
    """`importlib.import_module(".x", __name__)` with a literal name: the package faces' lazy
    tables are imports too. A name held in a dict is followed where the dict is a literal."""
    if not node.args:
        return
    first = node.args[0]
    names: list[str] = []
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        names.append(first.value)
    for name in names:
        level = len(name) - len(name.lstrip("."))
        target = _resolve(module, is_package, level, name.lstrip(".") or None)
        if target in modules:
            yield Import(module, target, (), node.lineno)


def lazy_table_imports(module: str, path: Path, modules: dict[str, Path]) -> Iterable[Import]:
    """A face's `_LAZY = {"Name": ".sub.module"}`: each value is a module it imports on first use."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if not (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)):
            continue
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                continue
            if not value.value.startswith("."):
                continue
            level = len(value.value) - len(value.value.lstrip("."))
            target = _resolve(module, is_package, level, value.value.lstrip(".") or None)
            name = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
            if target in modules:
                yield Import(module, target, (name,) if name else (), node.lineno)


def read_house(root: Path = SRC) -> House:
    house = House()
    for path in sorted(root.rglob("*.py")):
        house.modules[module_name(path, root)] = path
    for module, path in house.modules.items():
        house.imports.extend(_imports_of(module, path, house.modules))
        house.imports.extend(lazy_table_imports(module, path, house.modules))
    return house


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), and the
    modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def private_imports(house: House) -> list[Import]:
    """Names with a leading underscore taken from another module (dunders are not private)."""
    return [
        imp
        for imp in house.imports
        if any(name.startswith("_") and not name.startswith("__") for name in imp.names)
    ]


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def side_crossings(house: House) -> list[Import]:
    """Imports from the client side into the sidecar side, and back."""
    return [
        imp
        for imp in house.imports
        if (_within(imp.source, CLIENT_SIDE) and _within(imp.target, SIDECAR_SIDE))
        or (_within(imp.source, SIDECAR_SIDE) and _within(imp.target, CLIENT_SIDE))
    ]


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor: 1 for a module that imports none of the package, else one above the
    highest it imports (only defined without circles)."""
    floor: dict[str, int] = {}

    def visit(node: str, seen: frozenset[str]) -> int:
        if node in floor:
            return floor[node]
        if node in seen:
            return 0
        below = [visit(child, seen | {node}) for child in graph[node]]
        floor[node] = 1 + max(below, default=0)
        return floor[node]

    for node in graph:
        visit(node, frozenset())
    return floor


def main() -> int:
    house = read_house()
    graph = house.edges()
    for component in circles(graph):
        print(f"circle of {len(component)}: {', '.join(component)}")
    for imp in private_imports(house):
        private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        print(f"private: {imp.source}:{imp.line} takes {', '.join(private)} from {imp.target}")
    for imp in side_crossings(house):
        print(f"crossing: {imp.source}:{imp.line} imports {imp.target}")
    packages: dict[str, int] = {}
    for module, path in house.modules.items():
        if path.name != "__init__.py":
            parent = module.rsplit(".", 1)[0]
            packages[parent] = packages.get(parent, 0) + 1
    for package, count in sorted(packages.items()):
        print(f"package {package}: {count} modules")
    longest = max(house.modules.items(), key=lambda item: len(item[1].read_text().splitlines()))
    print(f"longest: {longest[0]} ({len(longest[1].read_text().splitlines())} lines)")
    print(f"floors: {max(floors(graph).values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
