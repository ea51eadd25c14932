"""Packaging (issue 19): `mcpcreds --version` is the installed distribution's version (package
metadata, the one in pyproject.toml), read only when asked for; CHANGELOG.md keeps the
Keep-a-Changelog form and names the current version. (.ci/run builds the sdist and wheel with
`python -m build` and runs them from a fresh venv: too slow for the suite.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_version_comes_from_the_package_metadata() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version("mcpcreds") == declared
    for head in (["-m", "mcpcreds"], ["-c", "import sys; from mcpcreds.cli.main import main; sys.exit(main())"]):
        proc = subprocess.run([sys.executable, *head, "--version"], capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stdout) == (0, f"mcpcreds {declared}\n"), proc.stderr
    code = "import mcpcreds, sys; assert 'importlib.metadata' not in sys.modules; print(mcpcreds.__version__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout == f"{declared}\n", proc.stderr


def test_the_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text and "https://semver.org/" in text
    releases = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert len(releases) == len(re.findall(r"^## ", text, re.M))  # every release heading is well formed
    assert releases[0] == ("Unreleased", "")
    assert all(date for _, date in releases[1:])  # a release has its date
    # the version being built is released, or named as the coming one
    assert any(name == declared for name, _ in releases) or f"first release will be {declared}" in text
    for heading in re.findall(r"^### (.+)$", text, re.M):
        assert heading in ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"), heading
