from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from mcpcreds.config.model import SecretsConfig
from mcpcreds.core.secret import REDACTOR, Secret
from mcpcreds.core.templates import parse_template
from mcpcreds.credentials.sources import MISSING_PAUSES, DirSource, EnvSource, KeyringSource, SecretResolver
from mcpcreds.errors import InvalidRequest, SecretUnavailable
from tests import hanging_keyring
from tests.conftest import CANARY, KeyringSession
from tests.vanishing_keyring import MissingCollection


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_secret_never_prints_its_value() -> None:
    s = Secret(CANARY, source="env")
    assert CANARY not in repr(s) and CANARY not in str(s) and CANARY not in f"{s}"
    assert CANARY not in repr([s]) and s.reveal() == CANARY
    assert REDACTOR.redact(f"token={CANARY}!") == "token=***!"


def test_env_source() -> None:
    assert EnvSource({"A": "1"}).get("A") == "1"
    assert EnvSource({}).get("A") is None


def test_dir_source_strips_one_newline_and_refuses_readable_files(tmp_path: Path) -> None:
    private_file(tmp_path / "TOKEN", "abc\n\n")
    source = DirSource(str(tmp_path))
    assert source.get("TOKEN") == "abc\n"
    assert source.get("MISSING") is None
    private_file(tmp_path / "OPEN", "abc", mode=0o644)
    with pytest.raises(SecretUnavailable, match="readable by group or others"):
        source.get("OPEN")
    with pytest.raises(InvalidRequest):
        source.get("../etc/passwd")


def test_dir_source_refuses_symlinks(tmp_path: Path) -> None:
    private_file(tmp_path / "real", "abc")
    (tmp_path / "LINK").symlink_to(tmp_path / "real")
    with pytest.raises(SecretUnavailable):
        DirSource(str(tmp_path)).get("LINK")


def test_resolver_looks_in_order_and_names_where_it_looked(tmp_path: Path) -> None:
    private_file(tmp_path / "A", "from-dir")
    resolver = SecretResolver([EnvSource({"A": "from-env", "B": "b"}), DirSource(str(tmp_path))])
    assert resolver.secret("A").reveal() == "from-env"
    resolver = SecretResolver([DirSource(str(tmp_path)), EnvSource({"A": "from-env"})])
    assert resolver.secret("A").reveal() == "from-dir"
    with pytest.raises(SecretUnavailable) as info:
        resolver.secret("NOPE")
    assert info.value.message == f"secret 'NOPE' not found (looked in: dir:{tmp_path}, env)"


def test_secret_file_template_is_reread_at_each_use(tmp_path: Path) -> None:
    path = private_file(tmp_path / "tok", "one\n")
    resolver = SecretResolver([])
    template = parse_template(f"Bearer {{{{secret-file:{path}}}}}")
    assert resolver.render(template) == "Bearer one"
    private_file(path, "two")
    assert resolver.render(template) == "Bearer two"
    path.unlink()
    with pytest.raises(SecretUnavailable, match="does not exist"):
        resolver.render(template)


def test_keyring_round_trip_on_a_real_secretservice(keyring_session: KeyringSession) -> None:
    service = f"mcpcreds-test-{uuid.uuid4().hex[:8]}"
    source = KeyringSource(SecretsConfig(keyring_service=service))
    assert source.get("CRM") is None
    source.set("CRM", CANARY)
    source.set("DOCS", "docs-key")
    assert source.get("CRM") == CANARY
    assert source.names() == ["CRM", "DOCS"]
    resolver = SecretResolver([EnvSource({}), source])
    assert resolver.render(parse_template("Bearer {{secret:CRM}}")) == f"Bearer {CANARY}"
    assert source.delete("CRM") and not source.delete("CRM")
    assert source.names() == ["DOCS"]


@pytest.mark.parametrize("misses", [1, len(MISSING_PAUSES)])
def test_a_write_the_keyring_daemon_missed_its_collection_for_is_tried_again(
        keyring_session: KeyringSession, misses: int) -> None:
    """gnome-keyring answered a write to a new keyring as if its collection were not there while
    other processes wrote their first entries; the login stored was lost with the error."""
    service = f"mcpcreds-test-{uuid.uuid4().hex[:8]}"
    MissingCollection.misses, MissingCollection.writes = misses, 0
    source = KeyringSource(SecretsConfig(keyring_service=service,
                                         keyring_backend="tests.vanishing_keyring.MissingCollection"))
    source.set("login.x", CANARY)
    assert KeyringSource(SecretsConfig(keyring_service=service)).get("login.x") == CANARY


def test_an_index_write_tried_again_keeps_the_names_another_process_added_meanwhile(
        keyring_session: KeyringSession) -> None:
    service = f"mcpcreds-test-{uuid.uuid4().hex[:8]}"
    other = KeyringSource(SecretsConfig(keyring_service=service))
    # the first write (the entry) passes; the second (the index) misses once, while another adds B
    MissingCollection.misses, MissingCollection.passes_first, MissingCollection.writes = 1, 1, 0
    MissingCollection.meanwhile = lambda: other.set("B", "b")
    try:
        KeyringSource(SecretsConfig(keyring_service=service,
                                    keyring_backend="tests.vanishing_keyring.MissingCollection")).set("A", "a")
    finally:
        MissingCollection.meanwhile, MissingCollection.passes_first = None, 0
    assert other.names() == ["A", "B"]


def test_a_collection_that_stays_missing_fails_the_write_clearly_after_a_bounded_number_of_tries(
        keyring_session: KeyringSession) -> None:
    MissingCollection.misses, MissingCollection.writes = 1000, 0
    source = KeyringSource(SecretsConfig(keyring_service=f"mcpcreds-test-{uuid.uuid4().hex[:8]}",
                                         keyring_backend="tests.vanishing_keyring.MissingCollection"))
    with pytest.raises(SecretUnavailable, match=r"storing 'login\.x' failed: ItemNotFoundException") as failed:
        source.set("login.x", CANARY)
    assert CANARY not in str(failed.value)
    assert MissingCollection.writes == len(MISSING_PAUSES) + 1


class CountedConnections:
    """secretstorage.dbus_init, counted: every D-Bus connection the keyring source opens."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import secretstorage

        self.opened: list[Any] = []
        real = secretstorage.dbus_init

        def counted() -> Any:
            connection = real()
            self.opened.append(connection)
            return connection

        monkeypatch.setattr(secretstorage, "dbus_init", counted)


def test_keyring_keeps_its_dbus_connections(keyring_session: KeyringSession,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection per call (keyring's own way) crashed gnome-keyring-daemon under load; the
    source keeps one per worker thread (two), however many calls it makes."""
    connections = CountedConnections(monkeypatch)
    source = KeyringSource(SecretsConfig(keyring_service=f"mcpcreds-test-{uuid.uuid4().hex[:8]}"))
    for i in range(10):
        source.set("K", f"value-{i}")
        assert source.get("K") == f"value-{i}"
    assert source.delete("K") and source.names() == []
    assert 1 <= len(connections.opened) <= 2


def test_a_broken_kept_connection_costs_one_retry(keyring_session: KeyringSession,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The bus or the daemon went away between two calls: the next call connects again instead
    of failing on the connection it kept."""
    connections = CountedConnections(monkeypatch)
    source = KeyringSource(SecretsConfig(keyring_service=f"mcpcreds-test-{uuid.uuid4().hex[:8]}"))
    source.set("K", "before")
    kept = len(connections.opened)
    for connection in connections.opened:
        connection.close()
    assert source.get("K") == "before"
    source.set("K", "after")
    assert source.get("K") == "after"
    assert len(connections.opened) > kept


def test_keyring_falls_back_after_env(keyring_session: KeyringSession) -> None:
    service = f"mcpcreds-test-{uuid.uuid4().hex[:8]}"
    source = KeyringSource(SecretsConfig(keyring_service=service))
    source.set("K", "from-keyring")
    resolver = SecretResolver([EnvSource({"K": "from-env"}), source])
    assert resolver.secret("K").reveal() == "from-env"
    assert SecretResolver([EnvSource({}), source]).secret("K").reveal() == "from-keyring"


def test_keyring_calls_are_time_boxed() -> None:
    source = KeyringSource(SecretsConfig(keyring_backend="tests.hanging_keyring.HangingKeyring",
                                         keyring_timeout=0.2))
    try:
        with pytest.raises(SecretUnavailable, match=r"timed out after 0\.2s"):
            source.get("X")
    finally:
        hanging_keyring.RELEASE.set()


def test_plaintext_keyring_refused_unless_opted_in() -> None:
    path = "tests.hanging_keyring.PlaintextKeyring"
    with pytest.raises(SecretUnavailable, match="plain text; refused"):
        KeyringSource(SecretsConfig(keyring_backend=path)).get("X")
    source = KeyringSource(SecretsConfig(keyring_backend=path, allow_plaintext_keyring=True))
    source.set("X", "v")
    assert source.get("X") == "v"


def test_keyring_without_dbus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")
    source = KeyringSource(SecretsConfig(keyring_service="x", keyring_timeout=5))
    with pytest.raises(SecretUnavailable) as info:
        source.get("X")
    assert info.value.message.startswith("keyring:")


def test_missing_backend_module() -> None:
    with pytest.raises(SecretUnavailable, match="cannot load backend"):
        KeyringSource(SecretsConfig(keyring_backend="nope.Missing")).get("X")


def test_environment_is_not_consulted_without_the_env_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(os.environ, "ONLY_ENV", "x")
    with pytest.raises(SecretUnavailable):
        SecretResolver([]).secret("ONLY_ENV")


def test_a_secret_file_that_is_not_text_is_unavailable(tmp_path: Path) -> None:
    private_file(tmp_path / "BIN", "x")
    (tmp_path / "BIN").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SecretUnavailable, match="not UTF-8"):
        DirSource(str(tmp_path)).get("BIN")


def test_escaped_spellings_of_a_secret_are_masked_too() -> None:
    import json

    value = 'p\u00e4"ss\\word-CANARY-esc'
    Secret(value)
    assert REDACTOR.redact(json.dumps(value))[1:-1] == "***"
    assert REDACTOR.redact(json.dumps(value, ensure_ascii=False))[1:-1] == "***"


async def test_static_headers_are_reread_in_the_background_once_warm() -> None:
    """Past their freshness, cached static headers are served while a re-read runs; a request
    waits on a secret source only when nothing usable is cached. The source is held shut by a
    gate, so "served at once" and "waits" are facts, not timings."""
    import asyncio
    import threading
    import tomllib

    from mcpcreds.broker.broker import Broker
    from mcpcreds.config.load import parse_config
    from mcpcreds.core.clock import FakeClock
    from mcpcreds.core.metrics import Metrics

    gate, entered = threading.Event(), threading.Event()

    class GatedEnv(EnvSource):
        reads = 0

        def get(self, name: str) -> str | None:
            GatedEnv.reads += 1
            entered.set()
            gate.wait(30)  # bounds only a failing run
            return super().get(name)

    environ = {"K": "one-0001"}
    config = parse_config(tomllib.loads(
        '[secrets]\ncache_ttl = "2s"\n[[servers]]\nname = "s"\nendpoint = "https://s.example/mcp"\n'
        'headers = { "X-Key" = "{{secret:K}}" }\n'))
    clock = FakeClock()
    broker = Broker(config, SecretResolver([GatedEnv(environ)]), clock, Metrics())
    target = broker.target("s")
    gate.set()
    try:
        assert (await broker.headers(target)).headers == {"X-Key": "one-0001"}
        environ["K"] = "two-0002"
        gate.clear()
        entered.clear()
        clock.advance(3)  # stale, within the grace of one more TTL: served at once, re-read behind
        served = await asyncio.wait_for(broker.headers(target), 10)  # the source is shut: no waiting
        assert served.headers == {"X-Key": "one-0001"}
        assert await asyncio.to_thread(entered.wait, 10)  # the re-read is under way
        clock.advance(10)  # past the grace: nothing usable, the caller waits for the read
        waiting = asyncio.ensure_future(broker.headers(target))
        await asyncio.sleep(0)  # one turn of the loop: the request runs up to its wait
        assert not waiting.done()
        gate.set()
        assert (await waiting).headers == {"X-Key": "two-0002"}
        assert GatedEnv.reads == 2  # the waiting request joined the read under way
        assert broker.cached_headers(target).headers == {"X-Key": "two-0002"}  # type: ignore[union-attr]
    finally:
        gate.set()
        await broker.aclose()
