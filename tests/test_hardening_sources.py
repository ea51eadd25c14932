"""Issue 12, secret sources: a `dir:` folder or a `{{secret-file:}}` path serves only files that no
other user can have planted, never blocks on a FIFO, and a rotation writes only a file it created."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from mcpcreds.credentials.sources import DirSource, SecretResolver
from mcpcreds.errors import SecretUnavailable
from tests.conftest import CANARY

NOBODY = 65534
NAME = "API_TOKEN"
Reader = Callable[[Path, str], str | None]


def read_dir(folder: Path, name: str) -> str | None:
    return DirSource(str(folder)).get(name)


def read_secret_file(folder: Path, name: str) -> str | None:
    return SecretResolver([]).file(str(folder / name)).reveal()


@pytest.fixture(params=[read_dir, read_secret_file], ids=["dir", "secret-file"])
def read(request: pytest.FixtureRequest) -> Reader:
    reader: Reader = request.param
    return reader


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "creds"
    path.mkdir(mode=0o700)
    return path


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def refusal(read: Reader, folder: Path, name: str = NAME) -> str:
    with pytest.raises(SecretUnavailable) as info:
        read(folder, name)
    assert CANARY not in info.value.message and CANARY not in str(info.value.to_wire())
    return info.value.message


def test_a_file_owned_by_another_user_is_refused(read: Reader, folder: Path) -> None:
    os.chown(private_file(folder / NAME, CANARY), NOBODY, NOBODY)
    message = refusal(read, folder)
    assert f"{folder / NAME}: refused: owned by uid {NOBODY}" in message


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777], ids=oct)
def test_a_folder_writable_by_group_or_others_is_refused(read: Reader, folder: Path, mode: int) -> None:
    private_file(folder / NAME, CANARY)
    folder.chmod(mode)
    assert f"folder {folder} is writable by group or others (mode {mode:04o})" in refusal(read, folder)


def test_a_folder_owned_by_another_user_is_refused(read: Reader, folder: Path) -> None:
    private_file(folder / NAME, CANARY)
    os.chown(folder, NOBODY, NOBODY)
    assert f"folder {folder} is owned by uid {NOBODY}" in refusal(read, folder)


def test_a_symlinked_folder_is_judged_by_the_folder_it_leads_to(read: Reader, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    private_file(shared / NAME, CANARY)
    (tmp_path / "link").symlink_to(shared)
    assert "is writable by group or others" in refusal(read, tmp_path / "link")


def test_a_symlinked_file_is_refused_with_a_clear_error(folder: Path, tmp_path: Path) -> None:
    private_file(tmp_path / "elsewhere", CANARY)
    (folder / NAME).symlink_to(tmp_path / "elsewhere")
    assert refusal(read_secret_file, folder) == f"secret-file {folder / NAME}: refused: is a symbolic link"
    with pytest.raises(SecretUnavailable) as info:
        read_dir(folder, NAME)
    assert info.value.message == f"dir:{folder}/{NAME}: refused: is a symbolic link"
    assert info.value.to_wire()["error"]["secret"] == NAME


def test_a_fifo_planted_as_a_secret_is_refused_without_blocking(read: Reader, folder: Path) -> None:
    fifo = folder / NAME
    os.mkfifo(fifo, 0o600)
    outcome: list[BaseException | str | None] = []

    def attempt() -> None:
        try:
            outcome.append(read(folder, NAME))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=30)
    try:
        assert not worker.is_alive(), "reading a FIFO blocked"
    finally:
        if worker.is_alive():  # release the reader stuck in open() so it does not outlive the test
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            worker.join(timeout=30)
    [result] = outcome
    assert isinstance(result, SecretUnavailable)
    assert result.message.endswith("refused: is a FIFO, not a regular file")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Where an attacker keeps files it hard-links into the secrets folder."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


def planted_link(folder: Path, name: str, outside: Path) -> Path:
    bait = private_file(outside / f"bait-{len(list(outside.iterdir()))}", "bait", mode=0o644)
    os.link(bait, folder / name)
    return bait


def test_a_link_planted_at_a_temp_name_never_receives_the_rotated_value(folder: Path, outside: Path) -> None:
    private_file(folder / NAME, "old")
    names = iter([".guessed", ".guessed-symlink", ".fresh"])
    source = DirSource(str(folder))
    guessing = DirSource(str(folder), temp_name=lambda: next(names))
    predictable = planted_link(folder, f".{NAME}.tmp-{os.getpid()}", outside)  # the name used before
    source.set(NAME, f"{CANARY}-1")
    assert predictable.read_text() == "bait" and source.get(NAME) == f"{CANARY}-1"

    # an attacker who guesses the temp name: a hard link and a symlink there are skipped, not written
    guessed = planted_link(folder, ".guessed", outside)
    (folder / ".guessed-symlink").symlink_to(outside / "symlink-target")
    guessing.set(NAME, f"{CANARY}-2")
    assert source.get(NAME) == f"{CANARY}-2"
    assert guessed.read_text() == "bait"
    assert not (outside / "symlink-target").exists()
    assert (folder / ".guessed").exists() and (folder / ".guessed-symlink").is_symlink()


def test_a_rotated_value_lands_0600_and_replaces_the_old_file(folder: Path, outside: Path) -> None:
    bait = planted_link(folder, NAME, outside)  # the target is a hard link to a file elsewhere
    os.chmod(bait, 0o600)
    private_file(folder / f".{NAME}.tmp-{os.getpid()}", "planted", mode=0o644)
    old = os.open(folder / NAME, os.O_RDONLY)
    try:
        DirSource(str(folder)).set(NAME, CANARY)
        new = os.stat(folder / NAME)
        assert stat.S_IMODE(new.st_mode) == 0o600 and new.st_uid == os.geteuid()
        assert new.st_ino != os.fstat(old).st_ino  # a new file renamed over the old one
        assert os.pread(old, 100, 0) == b"bait"  # the old file was not written in place
    finally:
        os.close(old)
    assert (folder / NAME).read_text() == CANARY and bait.read_text() == "bait"
    assert sorted(p.name for p in folder.iterdir()) == sorted([NAME, f".{NAME}.tmp-{os.getpid()}"])


def test_a_rotation_into_an_unsafe_folder_is_refused(folder: Path) -> None:
    folder.chmod(0o777)
    with pytest.raises(SecretUnavailable, match=f"folder {folder} is writable by group or others"):
        DirSource(str(folder)).set(NAME, CANARY)
    assert list(folder.iterdir()) == []

