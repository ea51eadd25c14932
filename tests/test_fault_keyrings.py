"""The fault-test keyring backends (tests/hanging_keyring.py) stay out of keyring's detection.

keyring registers every KeyringBackend subclass it sees; a viable one joins the default backend
(a ChainerBackend) of the process that imported it. HangingKeyring in that chain made every
in-process `keyring.get_password` of an absent entry wait 30 s (test_aws_sso's read after logout:
34 s in the full file). The product names its backend (secrets.keyring_backend) and loads these
by path; nothing else may find them."""

from __future__ import annotations

from keyring.backend import KeyringBackend

from mcpcreds.config.model import SecretsConfig
from mcpcreds.credentials.sources import KeyringSource
from tests.hanging_keyring import HangingKeyring, PlaintextKeyring


def test_the_fault_backends_are_never_detected_by_keyring() -> None:
    viable = set(KeyringBackend.get_viable_backends())
    assert HangingKeyring not in viable and PlaintextKeyring not in viable


def test_the_fault_backends_still_load_when_named() -> None:
    PlaintextKeyring.store.clear()
    ring = KeyringSource(SecretsConfig(keyring_backend="tests.hanging_keyring.PlaintextKeyring",
                                       allow_plaintext_keyring=True, keyring_service="fault-unit"))
    ring.set("x", "value")
    assert ring.get("x") == "value" and PlaintextKeyring.store[("fault-unit", "x")] == "value"


def test_a_keyring_failure_names_the_d_bus_error_under_it_never_its_text() -> None:
    """`InitError` alone does not tell a keyring daemon that is gone from one that did not answer."""
    from mcpcreds.credentials.sources import failure_name

    class DBusErrorResponse(Exception):
        name = "org.freedesktop.DBus.Error.NoReply"

    class InitError(Exception):
        pass

    def failed(dbus_name: str) -> str:
        DBusErrorResponse.name = dbus_name
        try:
            try:
                raise DBusErrorResponse("the daemon's text, never shown")
            except DBusErrorResponse as exc:
                raise InitError("Failed to create the collection") from exc
        except InitError as exc:
            return failure_name(exc)

    assert failed("org.freedesktop.DBus.Error.NoReply") == "InitError (org.freedesktop.DBus.Error.NoReply)"
    assert failed("org.freedesktop.DBus.Error.NoReply; rm -rf /") == "InitError"  # no D-Bus name: left out
    assert failure_name(InitError()) == "InitError"
