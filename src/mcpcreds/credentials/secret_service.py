"""keyring's SecretService backend on one kept D-Bus connection per thread.

keyring opens a D-Bus connection for every call and closes it after: connect, authenticate,
Hello, look the collection up, then the call itself. Besides the cost, that churn crashes
gnome-keyring-daemon under load (GLib's `invoke_get_property_in_idle_cb` assertion, after
`gkd_secret_service_get_pkcs11_session: assertion 'client' failed`): six processes writing in a
loop brought it down within a minute, and every later call failed with `NoReply`. With the
connection kept, the same load ran without a crash."""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any


class KeptOpen:
    """A D-Bus connection whose `close()` keeps it open: keyring closes the connection after
    each call (`with closing(collection.connection)`), and the next call on this thread uses it
    again."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def close(self) -> None:
        """Kept for the next call; `KeptConnections.drop` closes it for real."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


class KeptConnections:
    """One D-Bus connection per thread, opened on first use, dropped after a failed call (a
    daemon that went away, a broken socket) so that the next call connects again."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self) -> KeptOpen:
        kept: KeptOpen | None = getattr(self._local, "kept", None)
        self._local.reused = kept is not None
        if kept is None:
            import secretstorage

            kept = KeptOpen(secretstorage.dbus_init())
            self._local.kept = kept
        return kept

    def drop(self) -> bool:
        """Close this thread's connection; whether it had served an earlier call (a failure on
        it may be the connection gone stale, which a new one does not share)."""
        kept: KeptOpen | None = getattr(self._local, "kept", None)
        reused = bool(getattr(self._local, "reused", False))
        self._local.kept = None
        if kept is not None:
            with contextlib.suppress(OSError):
                kept.connection.close()
        return reused and kept is not None


def collection_missing(exc: BaseException) -> bool:
    """Whether a keyring call failed on an object the daemon did not hold at that moment:
    secretstorage's `ItemNotFoundException`, raised for D-Bus's UnknownMethod / UnknownObject.
    gnome-keyring answered a write to its default collection so while other processes wrote their
    first entries to a new keyring (a login in the conformance suite, 24 first writes at once in a
    stress run); that write is worth one more try on a new connection."""
    return type(exc).__name__ == "ItemNotFoundException" and type(exc).__module__.startswith("secretstorage")


def keep_connections(backend: Any) -> Any:
    """`backend` on kept connections when it is keyring's SecretService backend itself; any
    other backend (a subclass may look its collection up its own way) as it is."""
    try:
        from keyring.backends.SecretService import Keyring as SecretService
    except ImportError:  # keyring without its SecretService dependencies
        return backend
    if type(backend) is not SecretService:
        return backend
    return kept_connection_class()()


@functools.cache
def kept_connection_class() -> type:
    """keyring's SecretService backend, looking its collection up on this thread's kept
    connection (made once: keyring registers every backend class it sees)."""
    import secretstorage
    from keyring.backends.SecretService import Keyring as SecretService
    from keyring.errors import InitError, KeyringLocked
    from secretstorage import exceptions

    class KeptConnectionSecretService(SecretService):
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.connections = KeptConnections()

        def get_preferred_collection(self) -> Any:
            """keyring's own lookup, on a kept connection."""
            bus = self.connections.get()
            try:
                if hasattr(self, "preferred_collection"):
                    collection = secretstorage.Collection(bus, self.preferred_collection)
                else:
                    collection = secretstorage.get_default_collection(bus)
            except exceptions.SecretStorageException as exc:
                self.connections.drop()
                raise InitError(f"Failed to create the collection: {exc}.") from exc
            if collection.is_locked():
                collection.unlock()
                if collection.is_locked():
                    raise KeyringLocked("Failed to unlock the collection!")
            return collection

        def drop_connection(self) -> bool:
            return self.connections.drop()

    return KeptConnectionSecretService
