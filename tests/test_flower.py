"""neurofed as a Flower app: records, the strategy on hand-built replies, the ClientApp
against the in-process client half, and end-to-end equivalence with the in-process
runner — in Flower's simulation engine (Ray), through ``flwr run``, and in a
loopback deployment (SuperLink + SuperNodes).

Every process a test starts is stopped by PID, with every descendant it spawned
(Ray's raylet/GCS/workers, Flower's SuperExec/ServerApp/ClientApp processes); the
end-to-end tests fail if any is still alive after the run ended.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_overrides

import neurofed.flower  # noqa: F401  (telemetry off before flwr is imported)
from neurofed.flower.loopback import free_ports
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from neurofed.algorithms.base import FitContext, FitResult
from neurofed.config import ConfigError, load_config
from neurofed.flower.records import (from_arrays, from_config, from_metrics, load_state, save_state, to_arrays,
                                     to_config, to_metrics)
from neurofed.flower.strategy import EXTRA_KEY, NODE_KEY, NUM_EXAMPLES, TARGET_KEY, AlgorithmStrategy
from neurofed import rundir

REPO = Path(__file__).resolve().parents[1]
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


# --------------------------------------------------------------------------- records


def test_records_carry_every_message_losslessly():
    rng = np.random.default_rng(0)
    arrays = {"blocks.0.synapse.weight": rng.normal(size=(3, 4, 1, 1, 1)).astype(np.float32),
              "scaffold/c": rng.normal(size=7).astype(np.float32)}
    back = from_arrays(to_arrays(arrays))
    assert back.keys() == arrays.keys()
    for k in arrays:
        assert back[k].dtype == arrays[k].dtype and np.array_equal(back[k], arrays[k])

    config = {"round": 3, "seed": 2**31 - 1, "lr": 0.5, "name": "x", "flag": True, "none": None,
              "nested": {"a": [1, 2]}, "np": np.int64(4)}
    assert from_config(to_config(config)) == {**config, "np": 4}

    metrics = {"train_loss": 0.25, "steps": 7, "label_counts": [3, 0, 5], "delta_r": np.float64(1e-3),
               "rates": [0.5, 0.25], "ok": True, "note": None, "mixed": [1, 2.5], "empty": []}
    numeric, extra = to_metrics(metrics)
    assert set(numeric) == {"train_loss", "steps", "label_counts", "delta_r", "rates", "empty"}
    assert set(from_config(extra)) == {"ok", "note", "mixed"}
    assert from_metrics(numeric, extra) == {**metrics, "delta_r": 1e-3}

    store = RecordDict()
    save_state(store, {"c_i": arrays["scaffold/c"], "seen": 3})
    state = load_state(store)
    assert np.array_equal(state["c_i"], arrays["scaffold/c"]) and state["seen"] == 3


# --------------------------------------------------------------------------- the strategy


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


def test_strategy_sends_the_server_half_plan_and_aggregates_hand_built_replies(tiny_cfg, task_identity):
    from neurofed.fl.experiment import Experiment

    cfg = tiny_cfg(**{"federation.clients_per_round": 3})
    exp, twin = Experiment(cfg), Experiment(cfg)
    plan = twin.server.configure(1)  # the same seed: the same selection and configs
    assert len(plan) == 3
    missing = plan[-1][0]  # a selected partition whose SuperNode never connects
    # Node ids unrelated to partition ids.
    node_of = {k: 900 + 3 - k for k in range(4) if k != missing}
    grid = HandGrid({n: {"partition-id": k, "num-partitions": 4} for k, n in node_of.items()})
    strategy = AlgorithmStrategy(exp.server, exp.spec, node_timeout=0.0)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)

    served = plan[:-1]
    assert [int(m.content[TARGET_KEY]["partition-id"]) for m in msgs] == [c for c, _ in served]
    for m, (cid, conf) in zip(msgs, served):
        assert m.metadata.dst_node_id == node_of[cid] and m.metadata.message_type == "train"
        assert from_config(m.content["config"]) == conf
        sent = from_arrays(m.content["arrays"])
        assert all(np.array_equal(sent[k], v) for k, v in twin.server.message().items())

    # Client k uploads the constant vector k+1 with n_k = 10 (k+1); the first reply is an error.
    rs = [reply(m, exp.spec.unpack(np.full(exp.spec.size, cid + 1.0, np.float32)), 10 * (cid + 1),
                train_loss=0.5, label_counts=[cid] * 10)
          for m, (cid, _) in zip(msgs, served)]
    rs[0] = Message(Error(code=2, reason="RuntimeError: device out of memory"), reply_to=msgs[0])
    ok = [cid for cid, _ in served[1:]]
    arrays, metrics = strategy.aggregate_train(1, list(reversed(rs)))

    expected = sum((c + 1.0) * 10 * (c + 1) for c in ok) / sum(10 * (c + 1) for c in ok)
    assert np.allclose(exp.spec.pack(from_arrays(arrays)), expected, rtol=1e-6)
    assert np.array_equal(exp.server.params, exp.spec.pack(from_arrays(arrays)))
    assert isinstance(metrics, MetricRecord)
    tr = strategy.last_round
    assert [r.cid for r in tr.results] == ok  # plan order, whatever the reply order
    assert tr.results[0].metrics == {"train_loss": 0.5, "label_counts": [ok[0]] * 10}
    assert tr.results[0].num_examples == 10 * (ok[0] + 1)
    failed = {f["client"]: f["error"] for f in tr.failed}
    assert failed == {served[0][0]: "RuntimeError: device out of memory",
                      missing: "no SuperNode serves this partition"}


def test_strategy_drops_non_finite_and_missing_replies(tiny_cfg, task_identity):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"partition.num_clients": 3, "federation.clients_per_round": 3}))
    grid = HandGrid({k: {"partition-id": k, "num-partitions": 3} for k in range(3)})
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)
    before = exp.server.params.copy()
    nan = reply(msgs[0], exp.spec.unpack(np.full(exp.spec.size, np.nan, np.float32)), 5)
    good = reply(msgs[1], exp.spec.unpack(np.full(exp.spec.size, 2.0, np.float32)), 5)
    strategy.aggregate_train(1, [nan, good])  # client 2 never replies
    assert np.all(exp.server.params == 2.0) and not np.array_equal(before, exp.server.params)
    errors = {f["client"]: f["error"] for f in strategy.last_round.failed}
    assert errors == {0: "FloatingPointError: update has non-finite values",
                      2: "no reply within the round timeout"}


def test_sfedca_candidates_all_train_and_the_top_p_by_delta_r_are_aggregated(tiny_cfg, task_identity):
    """SFedCA's candidate round under Flower: S candidates get train messages; the
    server half keeps the P replies with the largest ΔR."""
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"algorithm.name": "sfedca", "algorithm.candidates": 3,
                                 "federation.clients_per_round": 2}))
    grid = HandGrid({k: {"partition-id": k, "num-partitions": 4} for k in range(4)})
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)
    cids = [int(m.content[TARGET_KEY]["partition-id"]) for m in msgs]
    assert len(cids) == 3  # all S candidates train, not P
    dr = {c: float(i) for i, c in enumerate(sorted(cids))}  # the two largest ids have the largest ΔR
    rs = [reply(m, exp.spec.unpack(np.full(exp.spec.size, float(c), np.float32)), 7, delta_r=dr[c], steps=1)
          for m, c in zip(msgs, cids)]
    _, metrics = strategy.aggregate_train(1, rs)
    top = sorted(cids)[1:]
    assert list(metrics["aggregated"]) == top
    assert np.allclose(exp.server.params, np.mean(top))  # plain average of the top P (Alg. 1)


def test_heterogeneous_widths_get_their_width_s_model_and_replies_are_read_in_its_layout(tiny_cfg, task_identity):
    """hetero_fedavg under Flower: each partition downloads the global model of the width
    in its config; each reply is unpacked with that width's ParamSpec and averaged only
    within its width."""
    from neurofed.fl.experiment import Experiment

    cfg = tiny_cfg(**{"algorithm.name": "hetero_fedavg", "model.name": "hifi_cnn_digits", "model.width": 1.0,
                      "algorithm.widths": "[0.5,1.0]", "federation.clients_per_round": 3})
    exp = Experiment(cfg)
    grid = HandGrid({k: {"partition-id": k, "num-partitions": 4} for k in range(4)})
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    msgs = strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)
    width = {int(m.content[TARGET_KEY]["partition-id"]): from_config(m.content["config"])["width"] for m in msgs}
    assert len(msgs) == 3 and set(width.values()) == {0.5, 1.0}
    for m in msgs:
        cid = int(m.content[TARGET_KEY]["partition-id"])
        sent = from_arrays(m.content["arrays"])
        expected = exp.server.servers[width[cid]].message()
        assert sent.keys() == expected.keys() and all(np.array_equal(sent[k], v) for k, v in expected.items())
    sizes = {p: exp.server.specs[p].size for p in (0.5, 1.0)}
    assert sizes[0.5] < sizes[1.0]
    rs = [reply(m, exp.server.specs[width[c]].unpack(np.full(sizes[width[c]], c + 1.0, np.float32)), 10, width=width[c])
          for m, c in ((m, int(m.content[TARGET_KEY]["partition-id"])) for m in msgs)]
    strategy.aggregate_train(1, rs)
    assert strategy.last_round.failed == []
    for p in (0.5, 1.0):
        mine = [c + 1.0 for c, w in width.items() if w == p]
        np.testing.assert_allclose(exp.server.servers[p].params, np.mean(mine), rtol=1e-6)


def test_client_app_evaluates_the_model_of_the_width_its_message_names(task_identity):
    from neurofed.fl.experiment import Experiment
    from neurofed.flower.app import flower_apps

    neurofed_set = tiny_set(**{"algorithm.name": "hetero_fedavg", "model.name": "hifi_cnn_digits",
                               "model.width": 1.0, "algorithm.widths": "[0.5,1.0]"})
    exp = Experiment(load_config(REPO / YAML, neurofed_set.split()))
    _, client_app = flower_apps(**{"neurofed-config": YAML, "neurofed-set": neurofed_set})
    ctx = Context(run_id=1, node_id=77, node_config={"partition-id": 1, "num-partitions": 4}, state=RecordDict(),
                  run_config={})
    half = exp.server.servers[0.5].message()
    ev = client_app(Message(RecordDict({"arrays": to_arrays(half), "config": to_config({"width": 0.5})}),
                            dst_node_id=77, message_type="evaluate"), ctx)
    assert not ev.has_error(), ev.error
    assert 0 <= ev.content["metrics"]["accuracy"] <= 1 and ev.content["metrics"][NUM_EXAMPLES] == len(exp.parts[1])
    # without the width the node builds the run's model (width 1), which the half-width arrays do not fit
    assert client_app(Message(RecordDict({"arrays": to_arrays(half)}), dst_node_id=77, message_type="evaluate"),
                      ctx).has_error()


def test_nodes_that_serve_no_partition_are_refused_with_the_reason(tiny_cfg, task_identity):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg())  # 4 partitions
    strategy = AlgorithmStrategy(exp.server, exp.spec)
    grid = HandGrid({1: {"partition-id": 0, "num-partitions": 4}, 2: {"partition-id": 0, "num-partitions": 4},
                     3: {"partition-id": 1, "num-partitions": 10}, 4: {}})
    assert strategy.map_nodes(grid) == {0: 1}
    assert "already served by node 1" in strategy.refused[2]
    assert "num-partitions=10, but partition.num_clients=4" in strategy.refused[3]
    assert "lacks partition-id" in strategy.refused[4]
    # Node 1 gone (a SuperNode restarted as node 2 before the SuperLink dropped node 1):
    # node 2 takes partition 0 over; the misconfigured nodes stay refused.
    del grid.node_configs[1]
    assert strategy.map_nodes(grid) == {0: 2} and 2 not in strategy.refused and {3, 4} <= set(strategy.refused)
    # A federation where no node serves this experiment stops at once, saying why.
    with pytest.raises(ConfigError, match="num-supernodes=4"):
        AlgorithmStrategy(exp.server, exp.spec).map_nodes(HandGrid({7: {"partition-id": 0, "num-partitions": 2}}))


# --------------------------------------------------------------------------- the ClientApp


def test_client_app_trains_like_the_in_process_client_half(task_identity):
    """SCAFFOLD through the ClientApp (its c_i kept in the node's Context.state) gives
    bit for bit the in-process client half's uploads and state, round after round."""
    from neurofed.fl.experiment import Experiment
    from neurofed.flower.app import flower_apps

    neurofed_set = tiny_set(**{"algorithm.name": "scaffold"})
    exp = Experiment(load_config(REPO / YAML, neurofed_set.split()))
    _, client_app = flower_apps(**{"neurofed-config": YAML, "neurofed-set": neurofed_set})
    cid = 2
    ctx = Context(run_id=1, node_id=77, node_config={"partition-id": cid, "num-partitions": 4},
                  state=RecordDict(), run_config={})
    state = {}
    for rnd in (1, 2):
        config = exp.server.client_config(rnd, cid)
        message = exp.server.message()
        params, n, metrics = exp.client.fit(FitContext(message, config, exp.client_data(cid), state))
        msg = Message(RecordDict({"arrays": to_arrays(message), "config": to_config(config),
                                  TARGET_KEY: ConfigRecord({"partition-id": cid})}),
                      dst_node_id=77, message_type="train")
        out = client_app(msg, ctx)
        assert not out.has_error(), out.error
        got = from_arrays(out.content["arrays"])
        assert all(np.array_equal(got[k], v) for k, v in params.items())
        flower_metrics = from_metrics(out.content["metrics"])
        assert flower_metrics.pop(NUM_EXAMPLES) == n and flower_metrics == metrics
        assert np.array_equal(load_state(ctx.state)["c_i"], state["c_i"])
        exp.server.aggregate(rnd, [FitResult(cid, exp.spec.pack(params), n, metrics)])  # new x and c

    # query: the node's partition; a train message for another partition is refused.
    q = client_app(Message(RecordDict(), dst_node_id=77, message_type="query"), ctx)
    assert dict(q.content[NODE_KEY]) == {"partition-id": cid, "num-partitions": 4}
    wrong = Message(RecordDict({"arrays": to_arrays(exp.server.message()), "config": to_config({}),
                                TARGET_KEY: ConfigRecord({"partition-id": 0})}), dst_node_id=77, message_type="train")
    assert "serves partition 2" in client_app(wrong, ctx).error.reason
    # evaluate: the global model on this node's shard.
    ev = client_app(Message(RecordDict({"arrays": to_arrays(exp.server.message())}), dst_node_id=77,
                            message_type="evaluate"), ctx)
    assert 0 <= ev.content["metrics"]["accuracy"] <= 1 and ev.content["metrics"][NUM_EXAMPLES] == len(exp.parts[cid])
    bare = Context(run_id=1, node_id=78, node_config={}, state=RecordDict(), run_config={})
    assert "--node-config 'partition-id=K num-partitions=N'" in client_app(wrong, bare).error.reason


# --------------------------------------------------------------------------- processes


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


# --------------------------------------------------------------------------- simulation

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


def test_fedavg_in_flower_simulation_equals_the_in_process_runner(tmp_path, processes):
    """FedAvg, 2 rounds, 4 clients, 2 per round: the same global parameters (bit for
    bit) and the same metrics lines, in process and in Flower's simulation engine."""
    neurofed_set = tiny_set()
    out = simulate(tmp_path, processes, "flower", neurofed_set)
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    assert [l["round"] for l in lines] == [1, 2] and all(len(l["trained"]) == 2 for l in lines)
    assert (out / "summary.json").exists() and (out / "plots" / "accuracy.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("algo", [{"algorithm.name": "scaffold"},
                                  {"algorithm.name": "sfedca", "algorithm.candidates": 3}])
def test_stateful_and_candidate_algorithms_in_flower_simulation_equal_the_runner(tmp_path, processes, algo):
    """SCAFFOLD (c_i in each node's Context.state across rounds) and SFedCA (S
    candidates train, the top P by ΔR are aggregated) give the runner's result."""
    neurofed_set = tiny_set(**algo, **{"federation.rounds": 3})
    params, lines = read_run(simulate(tmp_path, processes, "flower", neurofed_set))
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    if algo["algorithm.name"] == "sfedca":
        assert all(len(l["trained"]) == 3 and len(l["aggregated"]) == 2 for l in lines)


def test_sfedhifi_in_flower_simulation_equals_the_in_process_runner(tmp_path, processes):
    """SFedHIFI (one global model per width; each client downloads its width's model and
    uploads in that width's layout; banks averaged over all, mixes within width, HIFI
    fusion on the server) for 2 rounds: every width's global parameters and every
    metrics line equal the in-process runner's."""
    neurofed_set = tiny_set(**{"algorithm.name": "sfedhifi", "model.name": "hifi_cnn_digits", "model.width": 1.0,
                               "algorithm.widths": "[0.5,1.0]", "algorithm.rate_samples": 16,
                               "algorithm.selection": "cover_widths"})  # both widths every round
    params, lines = read_run(simulate(tmp_path, processes, "flower", neurofed_set))
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    same_records(lines, ref_lines)
    widths = [rundir.load_state(tmp_path / d / "checkpoint.npz", "checkpoint")["server"]["widths"]
              for d in ("flower", "inprocess")]
    assert set(widths[0]) == {"0.5", "1"}
    for p in widths[0]:
        assert np.array_equal(widths[0][p]["params"], widths[1][p]["params"])
    assert np.array_equal(params, ref_params)
    assert all(l["clients_per_width"] == {"0.5": 1, "1": 1} and l["hifi_layer"] is not None for l in lines)
    assert set(lines[-1]["accuracy_per_width"]) == {"0.5", "1"}


# --------------------------------------------------------------------------- flwr CLI


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


@pytest.mark.slow
def test_flwr_run_simulation_matches_the_runner_and_reports_failures_in_flwr_ls(tmp_path, processes):
    neurofed_set = tiny_set()
    (port,) = free_ports(1)
    home = start_superlink(tmp_path, processes, port, simulation=True)
    sim = "num-supernodes=4 client-resources-num-cpus=1"
    out = tmp_path / "flower"
    status = flwr_run(home, f"neurofed-set='{neurofed_set}' out='{out}'", "--federation-config", sim)
    assert status == "finished:completed"
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    # A broken config fails the run; `flwr run` still exits 0, `flwr ls` says so.
    bad = flwr_run(home, f"neurofed-set='{neurofed_set} federation.lr=-1' out='{tmp_path / 'bad'}'",
                   "--federation-config", sim)
    assert bad.startswith("finished:failed")


@pytest.mark.slow
def test_loopback_deployment_superlink_and_two_supernodes(tmp_path, processes):
    """One round on a SuperLink and two SuperNodes (distinct ports, insecure, one
    FLWR_HOME each as on separate machines); the result equals the runner's."""
    neurofed_set = tiny_set(**{"partition.num_clients": 2, "federation.rounds": 1})
    link, node0, node1 = free_ports(3)
    home = start_superlink(tmp_path, processes, link, simulation=False)
    for k, port in enumerate((node0, node1)):
        args = [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{link}", "--port", str(port),
                "--node-config", f"partition-id={k} num-partitions=2", "--max-wait-time", "120"]
        processes.start(args, tmp_path / f"supernode{k}.log", env_for(tmp_path / f"flwr-node{k}"), tmp_path)
    out = tmp_path / "flower"
    t0 = time.monotonic()
    status = flwr_run(home, f"neurofed-set='{neurofed_set}' out='{out}' round-timeout=240.0 node-timeout=120.0")
    assert status == "finished:completed", (tmp_path / "superlink.log").read_text()[-3000:]
    assert time.monotonic() - t0 < 300
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    assert lines[0]["trained"] == [0, 1]


# --------------------------------------------------------------------------- loopback deployments (neurofed.flower.loopback)


def loopback(tmp_path: Path, nodes: int, env: dict | None = None, **kw):
    from neurofed.flower.loopback import Loopback

    return Loopback(tmp_path / "lb", nodes, env={"PYTHONPATH": str(REPO), **(env or {})}, **kw)


def assert_server_ran_fast_kernels(out: Path) -> None:
    """The run's summary says its ServerApp (installed from the FAB, which carries no C++)
    evaluated with the fast kernels, of the variant this machine runs."""
    from neurofed.kernels import variants

    kernels = json.loads((out / "summary.json").read_text())["kernels"]
    assert kernels["enabled"] and kernels["variant"] == variants.default_variant(), kernels


@pytest.mark.slow
def test_tls_deployment_with_long_lived_clientapps_equals_the_runner(tmp_path):
    """Every API over TLS (a CA and server certificate made by the test), each SuperNode
    with ``--isolation process`` and one neurofed worker: 3 rounds equal the runner's bit
    for bit; the SuperLink refuses plain HTTP; each worker built its data and model once
    (set-up parts reported in round 1 only) and started no process per message."""
    import http.client
    import urllib.request

    neurofed_set = tiny_set(**{"partition.num_clients": 2, "federation.rounds": 3})
    out = tmp_path / "flower"
    lb = loopback(tmp_path, 2, tls=True, isolation="process")
    try:
        lb.start()
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{lb.port}/health", timeout=10)
        res = lb.run(f"neurofed-set='{neurofed_set}' out='{out}' round-timeout=300.0 node-timeout=300.0")
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert res["status"] == "finished:completed", res["output"][-3000:]
    assert "--insecure" not in (lb.folder / "superlink.log").read_text()  # no "insecure" warning either
    assert_server_ran_fast_kernels(out)
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    for line in lines:
        times = line["time_clients"]
        assert sorted(times) == ["0", "1"] and all(t["start"] == 0.0 and t["fit"] > 0 for t in times.values())
        assert all(("model" in t) == (line["round"] == 1) for t in times.values()), times


@pytest.mark.slow
def test_a_killed_supernode_fails_its_partition_and_its_restart_brings_it_back(tmp_path):
    """Loopback, 3 SuperNodes (long-lived ClientApps), 3 of 3 partitions per round.
    SuperNode 2 is killed (SIGKILL) after the first round it trained in (round 1 unless
    a worker's first set-up outlasted the round timeout) and restarted once a round has
    recorded partition 2 as failed. Bound: a round whose SuperNode died ends at
    ``round-timeout`` (60 s) at the latest, or earlier when the SuperLink declares the
    node offline (flwr 1.41: 2 missed 30 s heartbeats); with training, evaluation and
    polling every round must end within 60 + 40 s. The other partitions train in every
    round after the kill; partition 2 trains again after the restart."""
    import threading

    rounds, round_timeout = 9, 60.0
    neurofed_set = tiny_set(**{"partition.num_clients": 3, "federation.clients_per_round": 3,
                               "federation.rounds": rounds})
    out = tmp_path / "flower"
    lb = loopback(tmp_path, 3, tls=False, isolation="process")
    events, result = {}, {}

    def lines() -> list[dict]:
        try:
            return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
        except (OSError, json.JSONDecodeError):
            return []

    try:
        lb.start()
        run = threading.Thread(target=lambda: result.update(lb.run(
            f"neurofed-set='{neurofed_set}' out='{out}' round-timeout={round_timeout} node-timeout=300.0",
            timeout=1200)), daemon=True)
        run.start()
        deadline = time.monotonic() + 1200
        while run.is_alive() and time.monotonic() < deadline:
            done = lines()
            if "killed" not in events and done and 2 in done[-1]["trained"]:
                lb.kill_node(2)
                events["killed"] = done[-1]["round"]
            if "restarted" not in events and any(f["client"] == 2 for l in done for f in l["failed"]):
                lb.start_node(2)
                events["restarted"] = done[-1]["round"]
            time.sleep(0.2)
        run.join(timeout=5)
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert result.get("status") == "finished:completed", result.get("output", "")[-3000:]
    done = lines()
    assert [l["round"] for l in done] == list(range(1, rounds + 1))
    assert "killed" in events and "restarted" in events, events
    after = done[events["killed"]:]
    failed = [l["round"] for l in after if any(f["client"] == 2 for f in l["failed"])]
    assert failed and all(2 not in done[r - 1]["trained"] for r in failed)
    assert all({0, 1} <= set(l["trained"]) for l in after), [l["trained"] for l in done]
    assert any(2 in l["trained"] for l in done[events["restarted"]:]), [l["trained"] for l in done]
    assert max(l["wall_time_s"] for l in done) < round_timeout + 40, [l["wall_time_s"] for l in done]


def test_resume_refuses_algorithms_whose_client_state_lived_on_the_supernodes(tmp_path, task_identity):
    """The ServerApp with ``resume`` and SCAFFOLD stops at once, naming what is lost."""
    from neurofed.flower.app import server_app

    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                  run_config={"neurofed-set": tiny_set(**{"algorithm.name": "scaffold"}), "resume": True,
                              "out": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match=r"resume: scaffold keeps client state .*c_i.* lost"):
        server_app(HandGrid({}), ctx)


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


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["after_round_2", "before_round_3_arrays"])
def test_a_killed_serverapp_resumes_from_its_checkpoint(tmp_path, kill):
    """FedAvg on a loopback deployment: the ServerApp process is killed (SIGKILL) after
    round 2, or between pushing round 3's messages and their arrays (the SuperNodes then
    give up messages their workers were already waiting for; issue 21); ``flwr run``
    with ``resume=true`` and the same ``out`` finishes the run, and the result equals an
    uninterrupted in-process run bit for bit."""
    import threading

    neurofed_set = tiny_set(**{"partition.num_clients": 2, "federation.rounds": 4})
    out, mark = tmp_path / "flower", tmp_path / "killed"
    env = {}
    if kill == "before_round_3_arrays":
        (tmp_path / "hook").mkdir()
        (tmp_path / "hook" / "sitecustomize.py").write_text(KILL_BEFORE_ROUND_3_ARRAYS)
        env = {"PYTHONPATH": f"{tmp_path / 'hook'}{os.pathsep}{REPO}", "KILL_MARK": str(mark)}
    lb = loopback(tmp_path, 2, tls=False, isolation="process", env=env)
    first: dict = {}
    try:
        lb.start()
        run = threading.Thread(target=lambda: first.update(lb.run(f"neurofed-set='{neurofed_set}' out='{out}'",
                                                                  timeout=900)), daemon=True)
        run.start()
        deadline = time.monotonic() + 900
        while kill == "after_round_2" and not mark.exists() and run.is_alive() and time.monotonic() < deadline:
            if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2:
                lb.procs.scan()
                for pid in lb.procs.alive():
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if b"flwr-serverapp" in cmd:
                        lb.procs.signal(pid, signal.SIGKILL)
                        mark.touch()
            time.sleep(0.1)
        run.join(timeout=600)
        assert mark.exists(), "no ServerApp process killed"
        assert first.get("status", "").startswith("finished:failed"), first
        rounds_before = len((out / "metrics.jsonl").read_text().splitlines())
        assert 2 <= rounds_before < 4
        second = lb.run(f"neurofed-set='{neurofed_set}' out='{out}' resume=true", timeout=900)
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert second["status"] == "finished:completed", second["output"][-3000:]
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)


def test_worker_drops_a_message_its_supernode_gave_up_and_serves_the_next_task(monkeypatch):
    """A task whose message objects never come (its SuperNode gave the message up when
    the run ended mid-transfer) ends as soon as the SuperNode queues another task; that
    task is claimed once, by one of the pull threads, and runs next."""
    from flwr.proto.message_pb2 import PullObjectResponse
    from flwr.proto.node_pb2 import Node as NodeProto
    from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
    from flwr.supercore.inflatable.inflatable_utils import pull_objects
    from flwr.supercore.runtime import RuntimeHttpClient

    from neurofed.flower.worker import MessageDropped, Worker

    monkeypatch.setattr(RuntimeHttpClient, "PullObject",
                        lambda self, request: PullObjectResponse(object_found=True, object_available=False))
    worker = Worker("127.0.0.1:9", insecure=True)  # no connection is made
    queued, claims = iter([None, None, None, "next-task"]), []  # a task is queued after three asks

    def acquire():
        claims.append(next(queued, None))
        return claims[-1]

    monkeypatch.setattr(worker, "acquire", acquire)
    client = worker._client("dead-run-task")
    pull = make_pull_object_fn_protobuf(client.PullObject, NodeProto(node_id=1), run_id=7)
    with pytest.raises(MessageDropped, match="run 7"):
        pull_objects(["arrays", "config", "message"], pull, initial_backoff=0.01, backoff_cap=0.01)
    assert claims.count("next-task") == 1 and worker.claimed == "next-task"

    ran, stop = [], threading.Event()

    def run_task(token):
        ran.append(token)
        stop.set()

    monkeypatch.setattr(worker, "run_task", run_task)
    worker.serve(stop)
    assert ran == ["next-task"] and worker.claimed is None


def test_worker_runs_only_fabs_that_ship_its_own_code(tmp_path):
    """The long-lived worker runs a run's tasks only if the FAB's neurofed sources,
    example configs and hardware profiles equal its own; it names the first that differs."""
    import io
    import zipfile

    from neurofed.flower.worker import differing_file

    root = tmp_path / "app"
    (root / "neurofed").mkdir(parents=True)
    (root / "neurofed" / "a.py").write_text("x = 1\n")
    (root / "examples").mkdir()
    (root / "examples" / "c.yaml").write_text("seed: 0\n")

    def fab(**files) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, text in files.items():
                z.writestr(name.replace("__", "/"), text)
        return buf.getvalue()

    same = {"neurofed__a.py": "x = 1\n", "examples__c.yaml": "seed: 0\n", "pyproject.toml": "[any]\n"}
    assert differing_file(fab(**same), root) is None  # pyproject.toml (rewritten by flwr) is not compared
    assert differing_file(fab(**{**same, "neurofed__a.py": "x = 2\n"}), root) == "neurofed/a.py"
    assert differing_file(fab(**{**same, "hw_profiles__new.yaml": "pj: 1\n"}), root) == "hw_profiles/new.yaml"


# --------------------------------------------------------------------------- the app bundle (FAB)


def test_the_app_bundle_holds_every_preset_and_its_neurofed_loads_the_installed_kernels(tmp_path):
    """``flwr build`` ships every example config (the paper presets and sweeps too) and
    hardware profile. Installed as Flower installs it (unpacked, first on sys.path), its
    neurofed compiles no kernels of its own: the FAB holds no C++ (flwr refuses it), so it
    loads the build of the installed neurofed's sources, the variant the run would use."""
    import zipfile

    from neurofed.kernels import variants

    # flwr takes the app's name from its folder's (letters, digits, hyphens): the checkout's
    # folder may be named otherwise (a CI clone), so the app's files are copied under a valid name
    app = tmp_path / "neurofed-app"
    app.mkdir()
    for item in ("pyproject.toml", "README.md", "neurofed", "examples", "hw_profiles"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, app / item)
    res = subprocess.run([str(BIN / "flwr"), "build", "--app", str(app)], cwd=tmp_path, env=env_for(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (fab,) = tmp_path.glob("*.fab")
    with zipfile.ZipFile(fab) as z:
        shipped = set(z.namelist())
        z.extractall(tmp_path / "app")
    wanted = {p.relative_to(REPO).as_posix() for folder in ("examples", "hw_profiles")
              for p in (REPO / folder).rglob("*.yaml")}
    assert {"examples/papers/sfedca_mnist_dir03.yaml", "examples/papers/sweeps/sfedca_table2.yaml"} <= wanted
    assert wanted - shipped == set()
    name = variants.default_variant()
    variants.build_variant(name)  # built once for the suite: the app below must load it, not compile
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import neurofed; from neurofed.kernels import variants; "
             "assert neurofed.__file__.startswith(sys.argv[1]), neurofed.__file__; "
             "print(variants.csrc()); print(variants.build() and variants.variant, variants.error())")
    res = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "app")], cwd=tmp_path / "app",
                         env={**env_for(), "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [str(REPO / "neurofed" / "kernels" / "csrc"), name, "None"]
    assert "compiling" not in res.stderr


@pytest.mark.slow
def test_a_paper_preset_runs_through_flwr_run_and_its_serverapp_runs_the_fast_kernels(tmp_path):
    """``flwr run .`` on a loopback deployment (3 SuperNodes, long-lived ClientApps) with a
    paper preset named in ``neurofed-config`` (SFedCA, MNIST Dir(0.3); tiny MNIST files in
    the published format, a small width and window): the run completes, the ServerApp
    evaluated with the fast kernels, and the result equals the in-process run's."""
    from dataset_files import write_mnist

    from neurofed.pipeline import run

    write_mnist(tmp_path / "data", n=60, n_test=30)
    preset = "examples/papers/sfedca_mnist_dir03.yaml"
    sets = [f"data.root={tmp_path / 'data'}", "data.timesteps=4", "model.width=0.25", "partition.num_clients=3",
            "algorithm.candidates=3", "federation.rounds=2", "federation.local_epochs=1", "federation.batch_size=16",
            "energy.enabled=false", "federation.threads=1", "federation.device=cpu"]
    out = tmp_path / "flower"
    lb = loopback(tmp_path, 3, tls=False, isolation="process")
    try:
        lb.start()
        res = lb.run(f"neurofed-config='{preset}' neurofed-set='{' '.join(sets)}' out='{out}' round-timeout=300.0 "
                     f"node-timeout=300.0")
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert res["status"] == "finished:completed", res["output"][-3000:]
    assert_server_ran_fast_kernels(out)
    import torch

    threads = torch.get_num_threads()
    try:
        run(load_config(REPO / preset, sets), tmp_path / "inprocess", progress=False)
    finally:
        torch.set_num_threads(threads)
    params, lines = read_run(out)
    ref_params, ref_lines = read_run(tmp_path / "inprocess")
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
