"""`mcpcreds login` and `logout` for a server whose role credentials come from AWS IAM Identity
Center (SSO): the device authorization, the keyring entry, and the sidecar told."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx

from ..credentials.login_store import entry_name
from ..signers.aws_sso import TIMEOUT, SsoLogin, login
from .common import tell_sidecar

if TYPE_CHECKING:
    import argparse

    from ..config.model import Config, Target


def sso_target(config: Config, name: str) -> Target | None:
    """The server (or cache key) `name` if its auth is kind "aws" with source "sso", else None."""
    from ..config.model import aws_auth_of, is_aws

    target = config.target(name)
    if target is None or not is_aws(target):
        return None
    return target if aws_auth_of(target).source == "sso" else None


def cmd_sso_login(args: argparse.Namespace, config: Config, target: Target) -> int:
    """`mcpcreds login NAME` for an SSO server: the device authorization, then the keyring."""
    import sys

    from ..config.model import aws_auth_of
    from ..credentials.login_store import login_store
    from ..net.egress_http import egress_client

    auth = aws_auth_of(target)
    keyring = login_store(config.secrets).keyring
    keyring.names()  # a keyring that does not work fails here, before anything is asked

    async def run() -> SsoLogin:
        async with egress_client(target.egress) as http:
            return await login(http, auth, target.name, sys.stderr)

    stored = asyncio.run(run())
    keyring.set(entry_name(target.key), stored.to_json(), person=True)
    print(f"logged in: {target.name} ({target.key}) at AWS IAM Identity Center; the SSO tokens are in "
          f"the keyring as {entry_name(target.key)}", file=sys.stderr)
    return 0


def cmd_sso_logout(args: argparse.Namespace, config: Config, target: Target) -> int:
    """`mcpcreds logout NAME` for an SSO server: the portal's Logout (best effort), the keyring
    entry deleted, and the sidecar told (it drops the role credentials it holds)."""
    import sys

    from ..config.model import aws_auth_of
    from ..credentials.login_store import login_store
    from ..net.egress_http import egress_client

    keyring = login_store(config.secrets).keyring
    text = keyring.get(entry_name(target.key))
    stored = SsoLogin.from_json(text) if text is not None else None
    if stored is None:
        print(f"{target.name}: no login stored", file=sys.stderr)
        return 1
    auth = aws_auth_of(target)

    async def run() -> int:
        async with egress_client(target.egress) as http:
            try:
                answer = await http.post(f"{auth.sso_portal_url}/logout", timeout=TIMEOUT,
                                         headers={"x-amz-sso_bearer_token": stored.access_token})
                return answer.status_code
            except httpx.HTTPError:
                return 0

    status = asyncio.run(run())
    if status != 200:
        print("could not sign out at AWS IAM Identity Center; deleting the login anyway", file=sys.stderr)
    keyring.delete(entry_name(target.key))
    print(f"logged out: {target.name} ({target.key})", file=sys.stderr)
    tell_sidecar(args, target, logout=True)
    return 0
