"""A Flower deployment on this machine: one SuperLink and N SuperNodes on 127.0.0.1.

For trials, tests and ``benchmarks/flower_rounds.py``: free ports picked at start,
one ``FLWR_HOME`` per component (as on separate machines), TLS with a self-signed CA
made here (or ``--insecure``), and each SuperNode either with Flower's default
``--isolation subprocess`` (a new ``flwr-clientapp`` process per message) or with
``--isolation process`` and a long-lived :mod:`neurofed.flower.worker`. Every
process started here, and every process they spawn, is stopped by PID.

    with Loopback(Path("/tmp/lb"), nodes=3) as lb:
        status = lb.run("neurofed-set='partition.num_clients=3' out='/tmp/lb/run'")
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from neurofed.flower.settings import APP_DIR

BIN = Path(sys.executable).parent
QUIET = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0",
         "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def self_signed(folder: Path) -> dict[str, Path]:
    """A CA and a server certificate it signs for 127.0.0.1 and localhost (PEM files
    ``ca.crt``, ``server.crt``, ``server.key`` in ``folder``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject, key, issuer, issuer_key, ca: bool):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("neurofed loopback CA", ca_key, "neurofed loopback CA", ca_key, True)
    server = cert("127.0.0.1", key, "neurofed loopback CA", ca_key, False)
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.crt", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (None if fields[0] == "Z" else (int(fields[1]), int(fields[19])))


class Processes:
    """Processes started here and all their descendants (a scan every 0.2 s of /proc),
    each remembered with its start time so that a reused PID is never signalled."""

    def __init__(self):
        self.roots: list[subprocess.Popen] = []
        self.seen: dict[int, int] = {}  # pid -> start time
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def start(self, args: list[str], log: Path, env: dict, cwd: Path) -> subprocess.Popen:
        p = subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             start_new_session=True)
        self.roots.append(p)
        self.scan()
        return p

    def scan(self) -> None:
        table = {int(e): st for e in os.listdir("/proc") if e.isdigit() and (st := _stat(int(e))) is not None}
        for p in self.roots:
            if p.pid in table:
                self.seen.setdefault(p.pid, table[p.pid][1])
        live = {pid for pid, start in self.seen.items() if pid in table and table[pid][1] == start}
        grown = True
        while grown:  # children of live known processes, until no new one
            grown = False
            for pid, (ppid, start) in table.items():
                if pid not in live and ppid in live:
                    self.seen[pid] = start
                    live.add(pid)
                    grown = True

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.scan()

    def alive(self) -> list[int]:
        return [pid for pid, start in self.seen.items() if (st := _stat(pid)) is not None and st[1] == start]

    def signal(self, pid: int, sig: int) -> None:
        st = _stat(pid)
        if st is not None and pid in self.seen and st[1] == self.seen[pid]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 10.0) -> list[int]:
        """SIGTERM, then SIGKILL to whatever is left; returns the PIDs still alive."""
        self.scan()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.alive():
                self.signal(pid, sig)
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.alive():
                break
        self._stop.set()
        for p in self.roots:
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        return self.alive()


class Loopback:
    """A SuperLink and ``nodes`` SuperNodes (SuperNode k serves partition k of
    ``nodes``) under ``folder``; ``tls=True`` serves every API over TLS with a CA made
    here, ``isolation="process"`` gives each SuperNode a :mod:`neurofed.flower.worker`."""

    def __init__(self, folder: Path, nodes: int, *, tls: bool = True, isolation: str = "process",
                 env: dict | None = None, app: Path = APP_DIR, runtime_tls: bool = True):
        if isolation not in ("process", "subprocess"):
            raise ValueError(f"isolation: got {isolation!r}; allowed: process, subprocess")
        self.folder, self.num_nodes, self.tls, self.isolation, self.app = Path(folder), nodes, tls, isolation, app
        # with tls: also each SuperNode's Runtime API (its worker connects over TLS); False: the
        # README's recipe, TLS to the SuperLink only and the worker --insecure on 127.0.0.1
        self.runtime_tls = tls and runtime_tls
        self.folder.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **QUIET, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
        self.certs = self_signed(self.folder / "certs") if tls else None
        self.port, *self.node_ports = free_ports(nodes + 1)
        self.procs = Processes()
        self.nodes: dict[int, subprocess.Popen] = {}
        self.home = self.folder / "flwr-cli"

    def _env(self, name: str) -> dict:
        home = self.folder / name
        home.mkdir(parents=True, exist_ok=True)
        return {**self.env, "FLWR_HOME": str(home)}

    def _tls_server(self) -> list[str]:
        c = self.certs
        return ["--ssl-ca-certfile", str(c["ca"]), "--ssl-certfile", str(c["cert"]), "--ssl-keyfile", str(c["key"])]

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    # -- the SuperLink --------------------------------------------------------------
    def start(self, node_wait: float = 60.0) -> "Loopback":
        args = [str(BIN / "flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-runtime-dependency-installation"]
        args += self._tls_server() if self.tls else ["--insecure"]
        self.procs.start(args, self.log("superlink"), self._env("flwr-superlink"), self.folder)
        self.home.mkdir(parents=True, exist_ok=True)
        tls = f'root-certificates = "{self.certs["ca"]}"' if self.tls else "insecure = true"
        (self.home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                               f'address = "127.0.0.1:{self.port}"\n{tls}\n')
        self.wait_healthy(self.port, "superlink", node_wait)
        for k in range(self.num_nodes):
            self.start_node(k)
        return self

    def wait_healthy(self, port: int, name: str, timeout: float) -> None:
        scheme = "https" if self.tls else "http"
        context = ssl.create_default_context(cafile=str(self.certs["ca"])) if self.tls else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/health", timeout=1, context=context)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{name} did not start in {timeout:.0f} s; see {self.log(name)}")

    # -- SuperNodes -----------------------------------------------------------------
    def start_node(self, k: int) -> subprocess.Popen:
        """Start (or restart) SuperNode ``k`` (and its worker)."""
        port = self.node_ports[k]
        args = [str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{self.port}", "--host", "127.0.0.1",
                "--port", str(port), "--node-config", f"partition-id={k} num-partitions={self.num_nodes}",
                "--isolation", self.isolation]
        if self.tls:
            args += ["--root-certificates", str(self.certs["ca"]), *(self._tls_server() if self.runtime_tls else [])]
        else:
            args += ["--insecure"]
        env = self._env(f"flwr-node{k}")
        node = self.procs.start(args, self.log(f"supernode{k}"), env, self.folder)
        self.nodes[k] = node
        if self.isolation == "process":
            tls = ["--root-certificates", str(self.certs["ca"])] if self.runtime_tls else ["--insecure"]
            self.procs.start([sys.executable, "-m", "neurofed.flower.worker", "--runtime-api-address",
                              f"127.0.0.1:{port}", "--parent-pid", str(node.pid), *tls],
                             self.log(f"worker{k}"), env, self.folder)
        return node

    def kill_node(self, k: int, sig: int = signal.SIGKILL) -> None:
        """Signal SuperNode ``k``'s own process (a crash: its children are left to notice)."""
        self.procs.signal(self.nodes[k].pid, sig)
        self.nodes[k].wait(timeout=30)

    # -- runs -----------------------------------------------------------------------
    def flwr(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "flwr"), *args], cwd=self.app, env={**self.env, "FLWR_HOME": str(self.home)},
                              capture_output=True, text=True, timeout=timeout)

    def run(self, run_config: str, timeout: float = 600.0) -> dict:
        """``flwr run <app> loopback --stream --run-config ...``; returns the run's entry
        of ``flwr ls`` (``status``: ``finished:completed``, ``finished:failed``, ...) with
        the command's output under ``output`` (``flwr run`` exits 0 even when the
        ServerApp fails)."""
        res = self.flwr("run", ".", "loopback", "--stream", "--run-config", run_config, timeout=timeout)
        out = res.stdout + res.stderr
        if res.returncode != 0:
            raise RuntimeError(f"flwr run exited {res.returncode}: {out[-2000:]}")
        run_id = next(l.split()[-1] for l in res.stdout.splitlines() if l.startswith("Successfully started run"))
        runs = json.loads(self.flwr("ls", "loopback", "--format", "json", timeout=60).stdout)["runs"]
        return {**next(r for r in runs if r["run-id"] == run_id), "output": out}

    def stop(self) -> list[int]:
        """Stop everything; returns the PIDs that survived SIGKILL (none expected)."""
        return self.procs.stop()

    def __enter__(self) -> "Loopback":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
