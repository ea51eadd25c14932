"""The sidecar's side of a step-up (`POST /v1/servers/{name}/step-up`): a client of
`creds.auth(name)` got `403` with `WWW-Authenticate: Bearer error="insufficient_scope",
scope="..."` and reports the scope. A person's login cannot be widened by a refresh (RFC 6749
§6: a refresh may only narrow), so a wider one needs the person again: the sidecar records the
union of the scopes in the login's keyring entry, where the next `mcpcreds login NAME` takes it,
and answers `login_required` naming that command. The choice itself is scopes.step_up: no new
login when the login already asked for every scope named (it would be refused again), nor past
MAX_STEP_UPS step-up logins in a row. The reported scope is never echoed (errors, logs)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from ..config.model import LOGIN_GRANTS, Target
from ..core.logs import get_logger
from ..core.scopes import step_up
from ..credentials.login_store import LoginStore, StoredLogin
from ..errors import LoginRequired

if TYPE_CHECKING:
    from ..credentials.logins import LoginCache

_log = get_logger("step_up")


async def report_insufficient_scope(logins: LoginCache, store: LoginStore, target: Target,
                                    fingerprint: str | None, scope: str) -> dict[str, Any]:
    """The answer to a step-up report: `{"step_up": false, "renewed": bool, "why": ...}` when no
    login is due (`renewed`: the login named is no longer the one served, so a retry may pass);
    raises LoginRequired when the person must log in again with the wider scope."""
    login = target.login
    if login is None or login.grant not in LOGIN_GRANTS:
        # client credentials (the spec lets them abort) and static headers: nothing to widen
        return _no(target, "not_a_person_login")
    current = logins.peek(target.key)
    if fingerprint is not None and current is not None and current.fingerprint != fingerprint:
        return _no(target, "renewed", renewed=True)
    stored = await asyncio.to_thread(store.get, target.key)
    if stored is None:
        return _no(target, "no_login")
    choice = step_up(stored.scope, scope, stored.step_ups)
    if choice.verdict != "login":
        return _no(target, choice.verdict)
    assert choice.scope is not None
    if stored.step_up != choice.scope:
        await asyncio.to_thread(_record, store, target.key, stored, choice.scope)
    _log.info("step-up: a login with a wider scope is due", extra={"key": target.key,
                                                                   "step_ups": stored.step_ups})
    command = f"mcpcreds login {target.name}"
    raise LoginRequired(f"{target.key}: the server asks for a scope this login did not ask for (403 "
                        f"insufficient_scope); run `{command}`: it asks for the wider scope",
                        command=command)


def _no(target: Target, why: str, renewed: bool = False) -> dict[str, Any]:
    if why not in ("renewed", "not_a_person_login"):
        _log.warning("step-up refused: the 403 is handed back", extra={"key": target.key, "why": why})
    return {"step_up": False, "renewed": renewed, "why": why}


def _record(store: LoginStore, key: str, stored: StoredLogin, scope: str) -> None:
    """The wider scope into the login's entry, unless a new login replaced it meanwhile."""
    current = store.get(key)
    if current is not None and (current.refresh_token, current.access_token) == (
            stored.refresh_token, stored.access_token):
        store.put(key, dataclasses.replace(current, step_up=scope))
