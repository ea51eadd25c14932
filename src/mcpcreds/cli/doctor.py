"""`mcpcreds doctor`: check the setup and say what is wrong, one line per check, with the fix.

Checks, in order: the config parses; the socket's folder and the socket are safe (owner, mode,
no symlink); the sidecar answers and runs as the expected uid; each secret source is usable
(environment, keyring backend loaded and unlocked, dir: folders readable); each server's
secrets resolve; each token endpoint (or issuer discovery) answers through the server's egress
policy; Redis answers when it holds the shared state (version 5 or later, the bucket script
loaded or loadable, our state_key opening the logins other sidecars stored); the clock agrees
with the servers' `Date`; installed systemd units listen where the config says and start a
program that is there.

Only names are printed, never a value: secret values are read (to know they resolve) and
dropped. Every check is bounded: socket and HTTP calls by `timeout`, keyring calls by
`secrets.keyring_timeout`, the network checks by one overall deadline; nothing waits forever.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

from ..core.socket_check import UntrustedSidecar, expected_sidecar_uid
from ..errors import ConfigError, McpcredsError
from .doctor_probe import ask, secret_origin

if TYPE_CHECKING:  # the parser of every command imports this module: the config parser comes later
    from ..config.model import Config, Target

PASS: Final = "✓"
FAIL: Final = "✗"
DEFAULT_TIMEOUT: Final = 3.0
MAX_SKEW: Final = 60.0  # seconds of clock difference with a server's Date before it matters
# the bucket script writes after TIME: Redis 5 replicates script effects by default; 4 refuses
MIN_REDIS: Final = (5, 0)
MAX_LOGINS_CHECKED: Final = 20  # stored logins the state_key check tries to open
MAX_KEYS_SCANNED: Final = 2000  # Redis keys the state_key check looks through for them
_SAFE_ERRORS: Final = (McpcredsError, OSError, TimeoutError)


@dataclass(slots=True)
class Check:
    ok: bool
    name: str
    detail: str
    fix: str = ""

    def lines(self) -> list[str]:
        out = [f"{PASS if self.ok else FAIL} {self.name}: {self.detail}"]
        if self.fix and not self.ok:
            out.append(f"    fix: {self.fix}")
        return out


def _msg(exc: BaseException) -> str:
    """What an error says, for a line: our errors carry no secret; others by type and text."""
    if isinstance(exc, McpcredsError):
        return exc.message.splitlines()[0]
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Doctor:
    def __init__(self, config_path: str | None = None, socket_path: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.config_path = config_path
        self.socket_override = socket_path
        self.timeout = timeout
        self.checks: list[Check] = []
        self.sidecar: tuple[Path, int] | None = None  # where a sidecar answered /v1/health
        self.dates: list[tuple[str, float]] = []  # (host, server clock - ours)

    def add(self, ok: bool, name: str, detail: str, fix: str = "") -> Check:
        check = Check(ok, name, detail, fix)
        self.checks.append(check)
        return check

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    # -- the run

    def run(self) -> list[Check]:
        from ..config.load import default_socket_path

        config = self.check_config()
        socket_path = Path(self.socket_override) if self.socket_override else \
            default_socket_path(config.sidecar.socket if config else None)
        uid = expected_sidecar_uid(config.sidecar.sidecar_uid if config else None)
        if self.check_socket_files(socket_path, uid):
            self.check_sidecar(socket_path, uid)
        if config is None:
            return self.checks
        usable = self.check_sources(config)
        self.check_secrets(config, usable)
        asyncio.run(self._network(config))
        self.check_clock()
        self.check_units(socket_path)
        return self.checks

    async def _network(self, config: Config) -> None:
        jobs = [self.check_login(t) for t in _login_targets(config)]
        if config.sidecar.state != "memory":
            jobs.append(self.check_redis(config))
        if not jobs:
            return
        tasks = [asyncio.ensure_future(job) for job in jobs]
        done, pending = await asyncio.wait(tasks, timeout=self.timeout * 3)
        for task in pending:
            task.cancel()
        if pending:
            self.add(False, "network", f"{len(pending)} check(s) still waiting after {self.timeout * 3:.0f}s "
                     "(stopped)", "see which endpoint hangs: curl -v URL")
        for task in done:
            if (exc := task.exception()) is not None:
                self.add(False, "network", f"check failed: {_msg(exc)}")

    # -- config

    def check_config(self) -> Config | None:
        from ..config.load import find_config_path, load_config

        where = find_config_path(self.config_path)
        try:
            config = load_config(self.config_path)
        except ConfigError as exc:
            first = exc.errors[0] if exc.errors else exc.message
            more = f" (and {len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""
            if not first.startswith(str(where)):
                first = f"{where}: {first}"
            fix = f"mcpcreds check --config {where} lists every error" if where.exists() else \
                f"write {where} (docs/reference/configuration.md), or pass --config / set MCPCREDS_CONFIG"
            self.add(False, "config", f"{first}{more}", fix)
            return None
        n = len(config.servers) + len(config.services)
        self.add(True, "config", f"{where} parses ({n} server{'s' if n != 1 else ''})")
        for warning in config.warnings:
            self.add(True, "config warning", warning)
        return config

    # -- the socket

    def check_socket_files(self, path: Path, uid: int) -> bool:
        folder = path.parent
        try:
            info = folder.lstat()
        except FileNotFoundError:
            self.add(False, "socket folder", f"{folder} does not exist: no sidecar has started here",
                     "start it: systemctl --user start mcpcreds.socket (after mcpcreds install-units), "
                     "or mcpcreds serve")
            return False
        problem = None
        if stat.S_ISLNK(info.st_mode):
            problem = "is a symlink"
        elif not stat.S_ISDIR(info.st_mode):
            problem = "is not a folder"
        elif info.st_uid != uid:
            problem = f"belongs to uid {info.st_uid}, not to the sidecar's uid {uid}"
        elif stat.S_IMODE(info.st_mode) & 0o077:
            problem = f"has mode {stat.S_IMODE(info.st_mode):04o}, not 0700"
        if problem:
            self.add(False, "socket folder", f"{folder} {problem}",
                     f"remove it and restart the sidecar (it creates {folder} 0700), or set sidecar.socket "
                     "to a folder of your own")
            return False
        self.add(True, "socket folder", f"{folder} is a 0700 folder of uid {uid}")
        try:
            sinfo = path.lstat()
        except FileNotFoundError:
            self.add(False, "socket", f"{path} does not exist: the sidecar is not running",
                     "start it: systemctl --user start mcpcreds.socket, or mcpcreds serve")
            return False
        if not stat.S_ISSOCK(sinfo.st_mode):
            self.add(False, "socket", f"{path} is not a socket", f"remove {path} and restart the sidecar")
            return False
        mode = stat.S_IMODE(sinfo.st_mode)
        if sinfo.st_uid != uid or mode & 0o077:
            self.add(False, "socket", f"{path}: uid {sinfo.st_uid}, mode {mode:04o}; expected uid {uid}, "
                     "mode 0600",
                     "SocketMode=0600 and SocketUser= the sidecar's user in mcpcreds.socket, or restart "
                     "mcpcreds serve")
            return True
        self.add(True, "socket", f"{path} is a socket of uid {uid}, mode {mode:04o}")
        return True

    def check_sidecar(self, path: Path, uid: int) -> None:
        try:
            answer, peer_pid = ask(path, uid, self.timeout, "/v1/health", b"\r\n")
        except UntrustedSidecar as exc:
            self.add(False, "sidecar", _msg(exc), "stop whatever listens there; check sidecar.sidecar_uid")
            return
        except ConnectionRefusedError:
            self.add(False, "sidecar", f"nothing listens on {path} (a stale socket)",
                     "start it: systemctl --user start mcpcreds.socket, or mcpcreds serve")
            return
        except (OSError, TimeoutError) as exc:
            self.add(False, "sidecar", f"{path}: {_msg(exc)}",
                     "journalctl --user -u mcpcreds (or the serve output) says why")
            return
        status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        if status.startswith("HTTP/1.1 200"):
            self.add(True, "sidecar", f"answers on {path} (pid {peer_pid}, uid {uid})")
            self.sidecar = (path, uid)
        elif status.startswith("HTTP/1.1 403"):
            self.add(False, "sidecar", f"answers but refuses uid {os.getuid()}",
                     f"add {os.getuid()} to sidecar.allow_uids and reload (systemctl reload mcpcreds)")
        else:
            self.add(False, "sidecar", f"unexpected answer on /v1/health: {status or 'none'}",
                     "journalctl --user -u mcpcreds (or the serve output) says why")

    # -- secrets

    def check_sources(self, config: Config) -> list[Any]:
        from ..config.model import CREDENTIALS_SOURCE
        from ..credentials.sources import DirSource, EnvSource, KeyringSource

        usable: list[Any] = []
        names = _secret_names(config)
        for spec in config.secrets.sources:
            if spec == "env":
                present = sum(1 for n in names if n in os.environ)
                self.add(True, "source env", f"{present} of the {len(names)} secret names set in this "
                         "environment (the sidecar's may differ)")
                usable.append(EnvSource())
            elif spec == "keyring":
                source = KeyringSource(config.secrets)
                try:
                    stored = source.names()
                except _SAFE_ERRORS as exc:
                    self.add(False, "source keyring", _msg(exc),
                             "unlock the keyring (log in to the desktop session, or gnome-keyring-daemon "
                             "--unlock), or drop 'keyring' from secrets.sources")
                    continue
                backend = source._backend_path or "default"
                listed = f"{len(stored)} secret{'s' if len(stored) != 1 else ''} listed"
                if "plaintext" in backend.lower():  # allowed by allow_plaintext_keyring, still a problem
                    self.add(False, "source keyring", f"backend {backend} keeps secrets in plain text "
                             f"on disk ({listed})", "use an encrypting backend (SecretService: unset "
                             "secrets.keyring_backend) or dir:$CREDENTIALS_DIRECTORY under systemd")
                else:
                    self.add(True, "source keyring", f"backend {backend} reachable and unlocked ({listed})")
                usable.append(source)
            elif spec == CREDENTIALS_SOURCE:
                folder = os.environ.get("CREDENTIALS_DIRECTORY", "").strip()
                if not folder:
                    self.add(True, f"source {spec}", "set by systemd inside the service only "
                             "(LoadCredential=); checked against the unit's LoadCredential= lines")
                    continue
                if self._check_dir(spec, Path(folder)):
                    usable.append(DirSource(folder))
            elif spec.startswith("dir:") and self._check_dir(spec, Path(spec[4:])):
                usable.append(DirSource(spec[4:]))
        return usable

    def _check_dir(self, spec: str, folder: Path) -> bool:
        name = f"source {spec}"
        try:
            info = folder.stat()
            count = sum(1 for _ in folder.iterdir())
        except OSError as exc:
            self.add(False, name, f"{folder}: {_msg(exc)}",
                     f"create it (install -d -m 0700 {folder}) or fix its permissions")
            return False
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (0, os.getuid()) or mode & 0o022:
            self.add(False, name, f"{folder}: uid {info.st_uid}, mode {mode:04o}: others could plant secrets",
                     f"chown it to uid {os.getuid()} (or root) and chmod go-w {folder}")
            return False
        self.add(True, name, f"{folder} readable ({count} file{'s' if count != 1 else ''})")
        return True

    def sidecar_origin(self, name: str) -> str | None:
        """The source the running sidecar resolves `name` from, None if it does not (or none answered)."""
        return None if self.sidecar is None else secret_origin(*self.sidecar, self.timeout, name)

    def check_secrets(self, config: Config, usable: list[Any]) -> None:
        from ..credentials.sources import SecretResolver

        resolver = SecretResolver(usable)
        loaded = _load_credentials(config)
        deadline = time.monotonic() + self.timeout * 3
        for target in _targets(config):
            missing, found, skipped = [], [], []
            for name in sorted(target.secret_names):
                if time.monotonic() > deadline:
                    skipped.append(name)
                    continue
                try:
                    origin = resolver.origin(name)
                except _SAFE_ERRORS as exc:  # a refused file, a keyring that timed out: names only
                    missing.append(f"{name} ({_msg(exc)})")
                    continue
                if origin is not None:
                    found.append(name)
                elif name in loaded:
                    found.append(f"{name} (LoadCredential=)")
                elif (source := self.sidecar_origin(name)) is not None:
                    # the sidecar's environment is not this one's: it was asked
                    found.append(f"{name} (the sidecar's {'environment' if source == 'env' else source})")
                else:
                    missing.append(name)
            label = f"secrets of {target.name}"
            if not target.secret_names:
                continue
            if missing:
                where = ", ".join(config.secrets.sources)
                self.add(False, label, f"not found: {', '.join(missing)} (looked in: {where})",
                         f"mcpcreds secret set {missing[0].split()[0]} (keyring), export it, or add "
                         f"LoadCredential={missing[0].split()[0]}:PATH to the unit")
            elif skipped:
                self.add(False, label, f"not checked in time: {', '.join(skipped)}",
                         "a secret source is slow; see the source lines above")
            else:
                self.add(True, label, f"all resolve: {', '.join(found)}")

    # -- the network

    async def check_login(self, target: Target) -> None:
        from ..credentials.discovery import metadata_urls
        from ..net.egress_http import egress_client

        login = target.login
        assert login is not None
        label = f"token endpoint of {target.name}"
        async with egress_client(target.egress, timeout=self.timeout) as client:
            if login.issuer:
                errors = []
                for url in metadata_urls(login.issuer):
                    try:
                        response = await asyncio.wait_for(client.get(url), self.timeout)
                    except Exception as exc:  # each becomes a line
                        errors.append(_msg(exc))
                        continue
                    self._date(url, response.headers.get("date"))
                    if response.status_code == 200:
                        try:
                            token = response.json().get("token_endpoint")
                        except ValueError:
                            token = None
                        if isinstance(token, str):
                            self.add(True, label, f"discovery at {url} names {token}")
                            return
                    errors.append(f"{url}: HTTP {response.status_code}")
                self.add(False, label, f"discovery for issuer {login.issuer} failed: "
                         f"{'; '.join(dict.fromkeys(errors))}",
                         "check the issuer URL, DNS, TLS and egress (net, allow_hosts, allow_private)")
                return
            url = login.token_url or ""
            try:
                # anonymous and without a body: any HTTP answer proves DNS, TLS and the route
                response = await asyncio.wait_for(client.post(url), self.timeout)
            except Exception as exc:  # each becomes a line
                self.add(False, label, f"{url}: {_msg(exc)}",
                         "check the token_url, DNS, TLS and egress (net, allow_hosts, allow_private)")
                return
            self._date(url, response.headers.get("date"))
            self.add(True, label, f"{url} answers (HTTP {response.status_code} to an anonymous request)")

    def _date(self, url: str, value: str | None) -> None:
        if not value:
            return
        try:
            theirs = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return
        self.dates.append((urlsplit(url).hostname or url, theirs - time.time()))

    async def check_redis(self, config: Config) -> None:
        from redis import asyncio as aioredis

        url = config.sidecar.state
        shown = _redact_url(url)
        password = None
        if config.sidecar.state_password is not None:
            from ..credentials.sources import SecretResolver

            try:
                password = SecretResolver.from_config(config.secrets).render(config.sidecar.state_password)
            except _SAFE_ERRORS as exc:
                self.add(False, "redis", f"{shown}: the state_password does not resolve ({_msg(exc)})",
                         "set the secret state_password names")
                return
        options: dict[str, Any] = {"password": password, "socket_timeout": self.timeout,
                                   "socket_connect_timeout": self.timeout}
        if url.startswith("rediss://"):
            options["ssl_cert_reqs"] = "required"
            if config.sidecar.state_ca:
                options["ssl_ca_certs"] = config.sidecar.state_ca
        if url.startswith("unix://"):
            client = aioredis.Redis(unix_socket_path=url[len("unix://"):], **options)
        else:
            client = aioredis.Redis.from_url(url, **options)
        try:
            try:
                info = await asyncio.wait_for(client.info("server"), self.timeout)
            except Exception as exc:  # the line names the type
                self.add(False, "redis", f"{shown}: {type(exc).__name__}",
                         "is Redis running and reachable? check sidecar.state, state_password, state_ca")
                return
            version = str(info.get("redis_version", "?"))
            if redis_version_ok(version):
                self.add(True, "redis", f"{shown} answers (Redis {version})")
            else:
                self.add(False, "redis", f"{shown} runs Redis {version}; the bucket script needs "
                         f"{MIN_REDIS[0]}.{MIN_REDIS[1]} or later", "upgrade Redis (or use Valkey)")
            await self._redis_script(client)
            await self._redis_eviction(client)
            await self._redis_state_key(client, config)
        finally:
            await client.aclose()

    async def _redis_script(self, client: Any) -> None:
        """The bucket script is cached on the server, or can be (as the sidecar does on first use):
        an ACL without scripting, or a server without Lua, would fail every rated request."""
        from ..state.bucket_scripts import BUCKET_SCRIPT

        sha = hashlib.sha1(BUCKET_SCRIPT.encode()).hexdigest()
        try:
            if (await asyncio.wait_for(client.script_exists(sha), self.timeout))[0]:
                self.add(True, "redis script", f"the bucket script is loaded ({sha[:12]})")
                return
            await asyncio.wait_for(client.script_load(BUCKET_SCRIPT), self.timeout)
        except Exception as exc:  # the line names the type and Redis's first words
            self.add(False, "redis script", f"cannot load the bucket script: {_redis_msg(exc)}",
                     "allow scripting for the sidecar's Redis user (ACL: +script|load +script|exists "
                     "+evalsha), on a server with Lua scripting")
            return
        self.add(True, "redis script", f"the bucket script loads ({sha[:12]}; no sidecar had used it yet)")

    async def _redis_eviction(self, client: Any) -> None:
        """Redis must not evict the sidecars' keys: buckets, logins and grants carry TTLs (so
        volatile-* policies may pick them too) and the salt none. A bucket dropped while leases of
        it live would start full beside what its holders still spend (over the limit)."""
        try:
            got = await asyncio.wait_for(client.config_get("maxmemory*"), self.timeout)
        except Exception as exc:  # CONFIG is often disabled on managed Redis: say what to check
            self.add(True, "redis eviction", f"the eviction settings cannot be read ({_redis_msg(exc)}): "
                     "with a maxmemory, maxmemory-policy must be noeviction")
            return
        policy, limit = str(got.get("maxmemory-policy", "?")), str(got.get("maxmemory", "0"))
        if limit == "0" or policy == "noeviction":
            self.add(True, "redis eviction", f"nothing is evicted (maxmemory {limit}, {policy})")
        else:
            self.add(False, "redis eviction",
                     f"maxmemory {limit} with {policy}: Redis may drop a bucket while leases of it live "
                     "(then over the limit), logins, grants or the key salt",
                     "set maxmemory-policy to noeviction on this Redis (or no maxmemory)")

    async def _redis_state_key(self, client: Any, config: Config) -> None:
        """Our state_key opens the logins other sidecars stored (the same salt, the same key): with
        another key, each sidecar ignores the others' logins and fetches its own."""
        from cryptography.fernet import InvalidToken

        from ..credentials.sources import SecretResolver
        from ..state.redis_state import SALT_KEY, derive_keys

        label = "redis state_key"
        if config.sidecar.state_key is None:
            return  # check refuses a shared state without one
        try:
            state_key = SecretResolver.from_config(config.secrets).render(config.sidecar.state_key)
        except _SAFE_ERRORS as exc:
            self.add(False, label, f"does not resolve ({_msg(exc)})", "set the secret state_key names")
            return
        try:
            salt = await asyncio.wait_for(client.get(SALT_KEY), self.timeout)
            blobs = await asyncio.wait_for(_stored_logins(client), self.timeout) if salt else []
        except Exception as exc:  # the line names the type
            self.add(False, label, f"cannot read the stored logins: {_redis_msg(exc)}")
            return
        if not salt:
            self.add(True, label, "resolves; no sidecar has written to this Redis yet")
            return
        if not blobs:
            self.add(True, label, "resolves; no stored login to try it on yet")
            return
        fernet = derive_keys(state_key, bytes(salt)).fernet
        opened = 0
        for blob in blobs:
            with contextlib.suppress(InvalidToken, TypeError, ValueError):
                fernet.decrypt(blob)
                opened += 1
        if opened == len(blobs):
            self.add(True, label, f"opens the {opened} stored login{'s' if opened != 1 else ''} tried")
        else:
            self.add(False, label, f"opens {opened} of the {len(blobs)} stored logins tried: another "
                     "sidecar on this Redis uses a different state_key (each ignores the others' logins)",
                     "give every sidecar sharing this Redis the same state_key secret")

    # -- the clock and the units

    def check_clock(self) -> None:
        now = time.time()
        if now < 1_700_000_000:  # 2023-11: a clock reset to 1970 or a dead RTC
            self.add(False, "clock", time.strftime("reads %Y-%m-%d %H:%M:%S UTC", time.gmtime(now)),
                     "set the time (timedatectl set-ntp true)")
            return
        if not self.dates:
            self.add(True, "clock", "no server Date header to compare with")
            return
        host, skew = max(self.dates, key=lambda d: abs(d[1]))
        if abs(skew) > MAX_SKEW:
            self.add(False, "clock", f"{abs(skew):.0f}s {'behind' if skew > 0 else 'ahead of'} {host}; "
                     "tokens may look expired or not yet valid", "sync the clock (timedatectl set-ntp true)")
        else:
            self.add(True, "clock", f"within {max(1.0, abs(skew)):.0f}s of {host}")

    def check_units(self, socket_path: Path) -> None:
        from .units import default_dest

        found = [d / "mcpcreds.socket" for d in (default_dest("user"), default_dest("system"))
                 if (d / "mcpcreds.socket").is_file()]
        if not found:
            self.add(True, "systemd units", "none installed (optional: mcpcreds install-units)")
            return
        for unit in found:
            listen = _unit_values(unit, "ListenStream")
            runtime = os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.getuid()}")
            paths = [v.replace("%t", runtime) for v in listen]
            if str(socket_path) in paths:
                self.add(True, "systemd units", f"{unit} listens on {socket_path}")
            else:
                self.add(False, "systemd units", f"{unit} listens on {', '.join(paths) or 'nothing'}, but "
                         f"the config's socket is {socket_path}: serve refuses that socket",
                         "make ListenStream= and sidecar.socket the same path (or re-run install-units)")
            self._check_service(unit.with_name("mcpcreds.service"))

    def _check_service(self, service: Path) -> None:
        """The service beside the socket unit exists and its ExecStart= runs a program that is
        there (a pipx reinstall or a removed venv leaves a unit that fails at the first connection)."""
        scope = "--system" if str(service).startswith("/etc/") else "--user"
        fix = f"mcpcreds install-units {scope} --force (ExecStart= for this installation)"
        if not service.is_file():
            self.add(False, "systemd units", f"{service} is missing: the socket has no service to start",
                     fix)
            return
        starts = _unit_values(service, "ExecStart")
        words = starts[0].split() if starts else []
        program = words[0].lstrip("-@:+!") if words else ""
        program = program.replace("%h", str(Path.home()))
        if not program.startswith("/") or not os.access(program, os.X_OK):
            self.add(False, "systemd units", f"{service} runs {program or 'nothing'}, which is not an "
                     "executable file", fix)
            return
        self.add(True, "systemd units", f"{service} runs {program}")


def redis_version_ok(version: str) -> bool:
    """Whether a `redis_version` is MIN_REDIS or later (an unreadable one passes: Valkey and
    other servers that speak the protocol may spell it their way)."""
    try:
        parts = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return True
    return len(parts) < 2 or parts >= MIN_REDIS


def _redis_msg(exc: BaseException) -> str:
    """A Redis error by type and its first words (Redis's own text names no secret)."""
    text = str(exc).splitlines()[0][:120] if str(exc) else ""
    return type(exc).__name__ + (f": {text}" if text else "")


async def _stored_logins(client: Any) -> list[bytes]:
    """Up to MAX_LOGINS_CHECKED encrypted login blobs, looking at MAX_KEYS_SCANNED keys at most."""
    blobs: list[bytes] = []
    seen = 0
    async for name in client.scan_iter(match="mcpcreds:{*}:login", count=200):
        seen += 1
        blob = await client.hget(name, "blob")
        if blob is not None:
            blobs.append(bytes(blob))
        if len(blobs) >= MAX_LOGINS_CHECKED or seen >= MAX_KEYS_SCANNED:
            break
    return blobs


def _targets(config: Config) -> list[Target]:
    return [*config.services.values(), *config.servers.values()]


def _login_targets(config: Config) -> list[Target]:
    """One target per distinct token endpoint or issuer (a server of a catalog entry shares it)."""
    seen: dict[tuple[str | None, str | None, str], Target] = {}
    for target in _targets(config):
        login = target.login
        if login is not None and (login.issuer or login.token_url):
            seen.setdefault((login.issuer, login.token_url, repr(target.egress)), target)
    return list(seen.values())


def _secret_names(config: Config) -> set[str]:
    return {name for target in _targets(config) for name in target.secret_names}


def _unit_values(path: Path, key: str) -> list[str]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [line.partition("=")[2].strip() for line in text.splitlines() if line.startswith(f"{key}=")]


def _load_credentials(config: Config) -> set[str]:
    """The credential names the installed service unit loads (LoadCredential[Encrypted]=NAME:...),
    when the config reads them: outside the service, $CREDENTIALS_DIRECTORY is not there to look in."""
    from ..config.model import CREDENTIALS_SOURCE
    from .units import default_dest

    if CREDENTIALS_SOURCE not in config.secrets.sources or os.environ.get("CREDENTIALS_DIRECTORY"):
        return set()

    names: set[str] = set()
    for folder in (default_dest("user"), default_dest("system")):
        unit = folder / "mcpcreds.service"
        for key in ("LoadCredential", "LoadCredentialEncrypted", "SetCredential", "SetCredentialEncrypted"):
            names |= {v.split(":", 1)[0] for v in _unit_values(unit, key) if v}
    return names


def report(checks: list[Check], as_json: bool, write: Callable[[str], Any]) -> None:
    if as_json:
        write(json.dumps({"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}, indent=2))
        return
    for check in checks:
        for line in check.lines():
            write(line)
    failed = sum(1 for c in checks if not c.ok)
    write(f"\n{failed} problem{'s' if failed != 1 else ''} found" if failed else "\nall checks passed")


def cmd_doctor(args: argparse.Namespace) -> int:
    doctor = Doctor(getattr(args, "config", None), getattr(args, "socket", None), args.timeout)
    report(doctor.run(), args.json, print)
    code = 0 if doctor.ok else 1
    # a keyring or DNS call stuck in a worker thread must not keep the command alive at exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    """`mcpcreds doctor`; `add` is cli.build_parser's add_client()."""
    p = add("doctor", cmd_doctor, "check the setup and explain each problem with its fix "
            "(exit 0 only when every check passes)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds per network check (default {DEFAULT_TIMEOUT:g})")
