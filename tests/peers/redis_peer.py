"""A private redis-server on a Unix socket, started and stopped by tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def make_tls_files(workdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1: (ca.pem, cert.pem, key.pem)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mcpcreds test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = workdir / "ca.pem", workdir / "cert.pem", workdir / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisPeer:
    def __init__(self, workdir: Path, tls: bool = False, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: run .ci/run (apt-get install redis-server)")
        self.binary = binary
        self.workdir = workdir
        self.socket = workdir / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.password = password
        self.tls_port = free_port() if tls else 0
        self.ca = None
        self._tls_args: list[str] = []
        if tls:
            self.ca, cert, key = make_tls_files(workdir)
            self._tls_args = ["--tls-port", str(self.tls_port), "--tls-cert-file", str(cert),
                              "--tls-key-file", str(key), "--tls-ca-cert-file", str(self.ca),
                              "--tls-auth-clients", "no"]

    @property
    def url(self) -> str:
        if self.tls_port:
            return f"rediss://127.0.0.1:{self.tls_port}/0"
        return f"unix://{self.socket}"

    def start(self) -> None:
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            [self.binary, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir), *self._tls_args, *auth],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30  # generous: a busy machine starts it late
        while time.monotonic() < deadline:  # wait until it accepts: the socket appears, then answers
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode} as it started")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(5)
                    s.connect(str(self.socket))
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):  # up (auth or not)
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are still accepted, nothing is answered."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT); harmless if it was not paused."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.resume()  # a stopped process would not act on SIGTERM
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None
        self.socket.unlink(missing_ok=True)


@contextmanager
def start_redis(tls: bool = False, password: str | None = None) -> Iterator[RedisPeer]:
    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-redis-"))
    peer = RedisPeer(workdir, tls=tls, password=password)
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()
        shutil.rmtree(workdir, ignore_errors=True)
