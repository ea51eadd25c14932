"""The parts of the socket API made at their first use: the gateway, the AAuth and SigV4 signers
and the exec routes. Their modules import httpx, cryptography and the gateway's screens, which
are no part of a sidecar's start; after it, serve.py imports them in a worker thread when the
config uses them, so the first request does not wait for them either."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..config.model import uses_aauth

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from ..core.audit import AuditLog
    from ..core.metrics import Metrics
    from ..core.templates import Template
    from ..exec.session import ExecRoutes
    from ..gateway.relay import Gateway
    from ..signers.aauth import AAuthSigner
    from ..signers.sigv4 import SigV4Signer


class Later:
    """An object made at its first use: attributes are looked up on what `make` returns."""

    def __init__(self, make: Callable[[], object]) -> None:
        self._make = make

    def __getattr__(self, name: str) -> Any:
        return getattr(self._make(), name)


class Parts:
    """What `Api` makes at first use; `audit` is the Api's."""

    audit: AuditLog

    def __init__(self, broker: Broker, metrics: Metrics) -> None:
        self.broker = broker
        self.metrics = metrics
        self._aauth: AAuthSigner | None = None
        self._sigv4: SigV4Signer | None = None
        self._gateway: Gateway | None = None
        self._exec_routes: ExecRoutes | None = None

    def _render(self, template: Template) -> str:
        return self.broker.resolver.render(template)  # the resolver of the config now in force

    @property
    def aauth(self) -> AAuthSigner:
        """Signs for the servers with `aauth` (aauth.py): the agent key stays in the sidecar."""
        if self._aauth is None:
            from ..signers.aauth import AAuthSigner

            broker = self.broker
            self._aauth = AAuthSigner(broker.config, broker.clock.time, self._render, broker.http_for)
        return self._aauth

    @property
    def sigv4(self) -> SigV4Signer:
        """Signs for the servers of auth kind "aws" (sigv4.py): so does the AWS secret key."""
        if self._sigv4 is None:
            from ..signers.sigv4 import SigV4Signer

            broker = self.broker
            self._sigv4 = SigV4Signer(broker.config, broker.clock.time, self._render, broker.http_for)
        return self._sigv4

    @property
    def gateway(self) -> Gateway:
        if self._gateway is None:
            from ..gateway.relay import Gateway

            # the signers as the gateway first uses them (for a server that signs): a config
            # without one imports neither cryptography nor botocore's helpers
            aauth = cast("AAuthSigner", Later(lambda: self.aauth))
            sigv4 = cast("SigV4Signer", Later(lambda: self.sigv4))
            self._gateway = Gateway(self.broker, self.metrics, aauth, sigv4)
        return self._gateway

    @property
    def exec_routes(self) -> ExecRoutes:
        if self._exec_routes is None:
            from ..exec.session import ExecRoutes

            self._exec_routes = ExecRoutes(self.broker, lambda: self.audit, self.metrics)
        return self._exec_routes

    def start(self) -> None:
        """AAuth: the agent key loaded (or created) if a server signs; a refused key file fails the start."""
        if uses_aauth(self.broker.config):
            self.aauth.start()

    def close(self) -> None:
        """At stop: the exec proxy's socket (egress.sock) closed and unlinked, if it was made."""
        if self._exec_routes is not None:
            self._exec_routes.close()

    def reload_parts(self) -> None:
        """A new config for the signers already made (one made later reads the broker's config)."""
        if self._aauth is not None:
            self._aauth.reload(self.broker.config)
        if self._sigv4 is not None:
            self._sigv4.reload(self.broker.config)
