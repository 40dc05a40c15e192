"""What the Flower tests share: the in-process reference run, the processes a test starts
(each stopped by PID, with every descendant it spawned: Ray's raylet/GCS/workers, Flower's
SuperExec/ServerApp/ClientApp processes; the end-to-end tests fail if any is still alive
after the run ended), and the `flwr` command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import neurofed.flower  # noqa: F401  (telemetry off before flwr is imported)
from conftest import tiny_overrides
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.serverapp import Grid
from neurofed.config import load_config
from neurofed.flower.records import to_arrays, to_metrics
from neurofed.flower.strategy import EXTRA_KEY, NODE_KEY, NUM_EXAMPLES
from neurofed import rundir


REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
YAML = "examples/digits_fedavg.yaml"
ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0",
       "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def tiny_set(**extra) -> str:
    """The conftest tiny run as a ``neurofed-set`` string; one torch thread so that the
    in-process run and Ray's one-CPU actors do the same float operations."""
    extra = {"energy.enabled": False, "federation.threads": 1, **extra}
    return " ".join(tiny_overrides(**extra))


def reference(tmp_path: Path, name: str, neurofed_set: str) -> tuple[np.ndarray, list[dict]]:
    """The in-process runner's final global parameters and metrics lines."""
    from neurofed.pipeline import run

    import torch

    threads = torch.get_num_threads()
    out = tmp_path / name
    try:
        run(load_config(REPO / YAML, neurofed_set.split()), out, progress=False)
    finally:
        torch.set_num_threads(threads)
    return read_run(out)


def read_run(out: Path) -> tuple[np.ndarray, list[dict]]:
    params = rundir.load_state(out / "checkpoint.npz", "checkpoint")["server"]["params"]
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return params, lines


def same_records(a: list[dict], b: list[dict]) -> None:
    """Every metrics line equal except the timings."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        keep = lambda d: {k: v for k, v in d.items() if not (k.startswith("time_") or k == "wall_time_s")}
        assert keep(x) == keep(y)


@pytest.fixture
def task_identity():
    """Flower stamps messages with the identity of the running task; a test is one."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


class HandGrid(Grid):
    """A grid of SuperNodes that answer ``query`` messages with the node config they
    were given; train messages are kept for the test to reply to by hand."""

    def __init__(self, node_configs: dict[int, dict]):
        self.node_configs = node_configs
        self.sent: list[Message] = []

    def set_run(self, run):
        pass

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.node_configs)

    def push_messages(self, messages):
        for m in messages:  # as a real grid does on push
            m.metadata.__dict__["_message_id"] = m.object_id
        self.pending = {r.metadata.reply_to_message_id: r for r in self.send_and_receive(messages)}
        return list(self.pending)

    def pull_messages(self, message_ids):
        return [self.pending.pop(i) for i in list(message_ids) if i in self.pending]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for m in messages:
            assert m.metadata.message_type == "query"
            nc = self.node_configs[m.metadata.dst_node_id]
            if "partition-id" not in nc:
                replies.append(Message(Error(code=2, reason="ValueError: node config lacks partition-id"),
                                       reply_to=m))
            else:
                replies.append(Message(RecordDict({NODE_KEY: ConfigRecord(nc)}), reply_to=m))
        return replies


def reply(msg: Message, arrays: dict, n: int, **metrics) -> Message:
    numeric, extra = to_metrics({**metrics, NUM_EXAMPLES: n})
    content = RecordDict({"arrays": to_arrays(arrays), "metrics": numeric})
    if extra is not None:
        content[EXTRA_KEY] = extra
    return Message(content, reply_to=msg)


class Processes:
    """Processes a test starts plus every descendant they spawn (watched every 0.2 s),
    all stopped by PID — never by name."""

    def __init__(self):
        import psutil

        self.psutil = psutil
        self.roots: list[subprocess.Popen] = []
        self.seen: dict[int, float] = {}  # pid -> create_time (guards against PID reuse)
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._loop, daemon=True)
        self._watch.start()

    def start(self, args, log: Path, env: dict, cwd: Path) -> subprocess.Popen:
        p = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             start_new_session=True)
        self.roots.append(p)
        self.scan()
        return p

    def scan(self) -> None:
        for root in self.roots:
            try:
                proc = self.psutil.Process(root.pid)
                for p in [proc, *proc.children(recursive=True)]:
                    self.seen.setdefault(p.pid, p.create_time())
            except self.psutil.Error:
                pass

    def _loop(self):
        while not self._stop.wait(0.2):
            self.scan()

    def alive(self) -> list[str]:
        out = []
        for pid, created in self.seen.items():
            try:
                p = self.psutil.Process(pid)
                if p.create_time() == created and p.status() != self.psutil.STATUS_ZOMBIE:
                    out.append(f"{pid} {' '.join(p.cmdline())[:100]}")
            except self.psutil.Error:
                pass
        return out

    def stop(self, grace: float = 15.0) -> None:
        self.scan()
        self._stop.set()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            for pid, created in self.seen.items():
                try:
                    p = self.psutil.Process(pid)
                    if p.create_time() == created:
                        p.send_signal(sig)
                except self.psutil.Error:
                    pass
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.alive():
                break
        for root in self.roots:
            try:
                root.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def processes():
    procs = Processes()
    try:
        yield procs
    finally:
        procs.stop()
        assert procs.alive() == [], "processes survived SIGKILL"


def env_for(flwr_home: Path | None = None) -> dict:
    env = {**os.environ, **ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    if flwr_home is not None:
        flwr_home.mkdir(parents=True, exist_ok=True)
        env["FLWR_HOME"] = str(flwr_home)
    return env


def wait_for(proc: subprocess.Popen, procs: Processes, timeout: float, log: Path) -> int:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs.stop()
        pytest.fail(f"timed out after {timeout:.0f} s; log tail:\n{log.read_text()[-3000:]}")
    return rc


def settle(procs: Processes, seconds: float = 20.0) -> list[str]:
    """Descendants still alive ``seconds`` after the run ended."""
    deadline = time.monotonic() + seconds
    while procs.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    return procs.alive()


SIMULATE = """
import json, sys
from neurofed.flower.app import flower_apps
from flwr.simulation import run_simulation

server_app, client_app = flower_apps(**json.loads(sys.argv[1]))
# One Ray actor: on 2 cores a second one costs more (torch import) than it saves.
run_simulation(server_app, client_app, num_supernodes=int(sys.argv[2]),
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"num_cpus": 1, "num_gpus": 0}})
"""


def simulate(tmp_path: Path, procs: Processes, name: str, neurofed_set: str, supernodes: int = 4,
             timeout: float = 240.0) -> Path:
    """The app in Flower's simulation engine (Ray), in a fresh process."""
    out, log = tmp_path / name, tmp_path / f"{name}.log"
    settings = {"neurofed-config": YAML, "neurofed-set": neurofed_set, "out": str(out)}
    proc = procs.start([sys.executable, "-c", SIMULATE, json.dumps(settings), str(supernodes)], log, env_for(), REPO)
    rc = wait_for(proc, procs, timeout, log)
    assert rc == 0, log.read_text()[-3000:]
    assert settle(procs) == [], "processes left behind by the simulation"
    return out


def start_superlink(tmp_path: Path, procs: Processes, port: int, simulation: bool) -> Path:
    """A SuperLink on ``port``; returns the FLWR_HOME whose config names it ``test``."""
    home = tmp_path / "flwr-cli"
    env = env_for(tmp_path / "flwr-superlink")
    args = [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
            "--disable-runtime-dependency-installation"] + (["--simulation"] if simulation else [])
    procs.start(args, tmp_path / "superlink.log", env, tmp_path)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "test"\n\n[superlink.test]\n'
                                      f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return home
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"SuperLink did not start:\n{(tmp_path / 'superlink.log').read_text()[-3000:]}")


def flwr(home: Path, *args, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "flwr"), *args], cwd=REPO, env=env_for(home), capture_output=True,
                          text=True, timeout=timeout)


def flwr_run(home: Path, run_config: str, *extra) -> str:
    """``flwr run . test --stream``; returns the run's status from ``flwr ls`` (the
    exit code is 0 even when the ServerApp fails)."""
    res = flwr(home, "run", ".", "test", "--stream", "--run-config", run_config, *extra)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_id = next(l.split()[-1] for l in res.stdout.splitlines() if l.startswith("Successfully started run"))
    runs = json.loads(flwr(home, "ls", "test", "--format", "json", timeout=60).stdout)["runs"]
    return next(r["status"] for r in runs if r["run-id"] == run_id)


def loopback(tmp_path: Path, nodes: int, env: dict | None = None, **kw):
    from neurofed.flower.loopback import Loopback

    return Loopback(tmp_path / "lb", nodes, env={"PYTHONPATH": str(REPO), **(env or {})}, **kw)


def assert_server_ran_fast_kernels(out: Path) -> None:
    """The run's summary says its ServerApp (installed from the FAB, which carries no C++)
    evaluated with the fast kernels, of the variant this machine runs."""
    from neurofed.kernels import variants

    kernels = json.loads((out / "summary.json").read_text())["kernels"]
    assert kernels["enabled"] and kernels["variant"] == variants.default_variant(), kernels


# sitecustomize for the deployment's processes: the ServerApp SIGKILLs itself once the
# SuperLink holds round 3's train messages but none of their arrays (once, marked by KILL_MARK).
KILL_BEFORE_ROUND_3_ARRAYS = """
import os, signal, sys
if sys.argv[0].endswith("flwr-serverapp") and not os.path.exists(os.environ["KILL_MARK"]):
    from flwr.app import Message
    from flwr.superlink.grid import http_grid

    push_objects = http_grid.push_objects

    def push_or_die(objects, *args, **kwargs):
        if any(isinstance(o, Message) and o.metadata.group_id == "3" for o in objects.values()):
            open(os.environ["KILL_MARK"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return push_objects(objects, *args, **kwargs)

    http_grid.push_objects = push_or_die
"""
