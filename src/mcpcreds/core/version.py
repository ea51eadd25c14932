"""The installed distribution's version."""

from __future__ import annotations

import functools


@functools.cache
def installed_version() -> str:
    """pyproject.toml's version, read from the package metadata: one place to bump.
    importlib.metadata costs ~10 ms of imports, so only `--version`, the sidecar's status and
    health, and `mcpcreds.__version__` pay it, not every command."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcpcreds")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
