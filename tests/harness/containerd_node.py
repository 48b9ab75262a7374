"""A Kubernetes node's containerd on this machine, for the benchmarks and tests that pull as a node
does: Debian 13's containerd 1.7.24 (unpacked by `make services`) on an empty root, with Debian 13's
soci-snapshotter 0.4.1 beside it where asked; a TCP relay to the local registry that can cap each
connection's rate and speak TLS (soci's snapshotter reaches no plain-http registry); and the
loopback certificate it speaks TLS with. Needs root (containerd, FUSE, mount namespaces).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests.harness.services import STATE

ENGINE = STATE / "engine-trixie-v1" / "usr" / "bin"  # containerd 1.7.24 and its ctr, unpacked by `make services`
CACHE = Path.home() / ".cache" / "ascendkit-bench"
SOCI = CACHE / "soci-trixie-v1" / "usr" / "bin"  # Debian 13's soci-snapshotter 0.4.1, unpacked by soci_binaries


def soci_binaries() -> Path:
    """Where soci and soci-snapshotter-grpc are: Debian 13's package, fetched (sha256-checked) once."""
    if not (SOCI / "soci").is_file():
        from tests.harness.debian_packages import unpacked

        CACHE.mkdir(parents=True, exist_ok=True)
        unpacked(CACHE, "trixie", ("soci-snapshotter",), "soci")
    return SOCI


def private_var_lib(directory: Path) -> list[str]:
    """An argv prefix running a command with ``directory`` mounted over /var/lib, in a mount
    namespace of its own: soci 0.4 keeps its index store and database under
    /var/lib/soci-snapshotter-grpc, a path it does not let one move."""
    directory.mkdir(parents=True, exist_ok=True)
    return ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /var/lib && exec "$@"', str(directory)]


# How long a daemon may take to listen: a hang guard, not a speed limit. Under `make test` every job shares two
# cores, and soci-snapshotter-grpc once took more than the 10 s this used to allow (its socket not there yet, so
# containerd's first dial to it timed out and the pull failed).
READY_S = 180.0


def wait_listening(sock: Path, proc: subprocess.Popen[bytes], log: Path, name: str, answers: list[str] | None = None) -> None:
    """Wait until ``proc`` accepts connections on Unix socket ``sock`` (and, given ``answers``, that command
    succeeds: listening comes before serving); fail, with its log, if it ends or never does."""
    deadline = time.monotonic() + READY_S
    while True:
        if proc.poll() is not None:
            done = "answered" if answers else "listened"
            raise RuntimeError(f"{name} ended (exit {proc.returncode}) before it {done}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(sock))
            if answers is None or subprocess.run(answers, capture_output=True, check=False).returncode == 0:
                return
        if time.monotonic() > deadline:
            also = f" and answer {' '.join(answers[-1:])}" if answers else ""
            raise RuntimeError(f"{name} did not listen on {sock}{also} in {READY_S:.0f} s: {log.read_text()[-2000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def containerd(work: Path, soci: Path | None = None, ca: Path | None = None) -> Iterator[tuple[list[str], Path]]:
    """containerd on an empty root: ``ctr`` argv prefix to talk to it, and its root. With ``soci``
    (where soci-snapshotter-grpc is), a SOCI snapshotter on an empty root beside it, as ``soci``."""
    node = Path(tempfile.mkdtemp(prefix="node-", dir=work))
    config = node / "config.toml"
    text = 'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
    started: list[subprocess.Popen[bytes]] = []  # stopped in reverse, whether the start got through or not
    try:
        if soci is not None:
            text += f'[proxy_plugins.soci]\ntype = "snapshot"\naddress = "{node / "soci.sock"}"\n'
            (node / "soci.toml").write_text("")
            with (node / "soci.log").open("w") as log:
                started.append(subprocess.Popen(
                    [str(soci / "soci-snapshotter-grpc"), "-address", str(node / "soci.sock"), "-root", str(node / "soci"),
                     "-config", str(node / "soci.toml")],
                    stdout=subprocess.DEVNULL, stderr=log,
                    env={**os.environ, **({"SSL_CERT_FILE": str(ca)} if ca else {})},
                ))  # fmt: skip
            wait_listening(node / "soci.sock", started[-1], node / "soci.log", "soci-snapshotter-grpc")
        config.write_text(text)
        address = node / "containerd.sock"
        with (node / "containerd.log").open("w") as log:  # the child keeps its own descriptor
            started.append(subprocess.Popen(
                [str(ENGINE / "containerd"), "--config", str(config), "--root", str(node / "root"), "--state", str(node / "state"),
                 "--address", str(address)],
                stdout=subprocess.DEVNULL, stderr=log,
                env={**os.environ, "PATH": f"{ENGINE}:{os.environ['PATH']}"},
            ))  # fmt: skip
        ctr = [str(ENGINE / "ctr"), "--address", str(address), "-n", "bench"]
        wait_listening(address, started[-1], node / "containerd.log", "containerd", answers=[*ctr, "version"])
        yield ctr, node / "root"
    finally:
        for proc in reversed(started):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for line in reversed(Path("/proc/mounts").read_text().splitlines()):
            mountpoint = line.split()[1]
            if mountpoint.startswith(str(node)):
                subprocess.run(["umount", "-l", mountpoint], check=False)
        shutil.rmtree(node, ignore_errors=True)


@contextlib.contextmanager
def throttled(upstream_port: int, rate: int | None, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """A TCP relay to 127.0.0.1:``upstream_port`` giving each connection ``rate`` bytes/s towards the
    client (None: as fast as it goes), speaking TLS to clients that open with it given ``tls``; its port."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        started, sent = time.monotonic(), 0
        with contextlib.suppress(OSError):
            while chunk := src.recv(256 * 1024):
                dst.sendall(chunk)
                sent += len(chunk)
                if limit:
                    ahead = sent / limit - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                client, _ = server.accept()
                client.settimeout(30)
                # TLS where the client opens with a handshake record, plain HTTP otherwise: soci 0.4.1
                # fetches its index over https and its layers over http from the same loopback host
                if tls is not None and client.recv(1, socket.MSG_PEEK) == b"\x16":
                    client = tls.wrap_socket(client, server_side=True)
                client.settimeout(None)
            except (TimeoutError, ssl.SSLError, OSError):
                continue
            upstream = socket.create_connection(("127.0.0.1", upstream_port))
            threading.Thread(target=pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client, rate), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join()
        server.close()


def tls_for_loopback(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost: the relay's server context and the CA
    file (SSL_CERT_FILE) for the SOCI snapshotter, which reaches this registry only over https."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench-coldnode registry")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = directory / "registry.crt", directory / "registry.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context, cert_file
