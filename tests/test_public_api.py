"""The public face: `from mcpcreds import ...` keeps exactly these names, each of them usable, and
the command line is reached the same three ways, whatever the modules behind them are called."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import mcpcreds
from mcpcreds.errors import McpcredsError

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = [
    "AsyncClient",
    "Client",
    "Config",
    "ConfigError",
    "Forbidden",
    "InvalidRequest",
    "LoginRequired",
    "MalformedAnswer",
    "McpServerSpec",
    "McpcredsError",
    "RateLimited",
    "Secret",
    "SecretUnavailable",
    "SidecarUnavailable",
    "StateUnavailable",
    "TokenEndpointError",
    "TokenEndpointTimeout",
    "UnknownSecret",
    "UnknownServer",
    "UntrustedSidecar",
    "__version__",
    "load_config",
]


def test_all_is_exactly_the_public_list() -> None:
    assert mcpcreds.__all__ == PUBLIC


def test_every_public_name_resolves_and_is_listed_by_dir() -> None:
    for name in PUBLIC:
        assert getattr(mcpcreds, name) is not None, name
    assert set(PUBLIC) <= set(dir(mcpcreds))
    errors = [n for n in PUBLIC if isinstance(getattr(mcpcreds, n), type)
              and issubclass(getattr(mcpcreds, n), Exception)]
    assert all(issubclass(getattr(mcpcreds, n), McpcredsError) for n in errors)
    assert isinstance(mcpcreds.__version__, str) and mcpcreds.__version__


def test_star_import_gives_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from mcpcreds import *", namespace)
    assert set(PUBLIC) - {"__version__"} <= set(namespace)


def test_the_console_script_points_at_the_cli_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["mcpcreds"].partition(":")
    entry = getattr(__import__(module, fromlist=[function]), function)
    assert callable(entry)


def test_python_m_mcpcreds_and_the_cli_module_print_the_version() -> None:
    for args in (["-m", "mcpcreds", "--version"], ["-m", "mcpcreds.cli.main", "--version"]):
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"mcpcreds {mcpcreds.__version__}\n"
