"""The client half of a neurofed algorithm as Flower ``ClientApp`` handlers.

A SuperNode trains the partition its node config names (``partition-id``, of
``num-partitions`` = ``partition.num_clients``); it loads the data set and cuts the
shards exactly as the in-process runner does (:func:`neurofed.fl.experiment.load_partitioned`,
same seed, same shards) and keeps its own. ``train`` runs ``Algorithm.Client.fit``
on the message's arrays and config (a heterogeneous-width client half, e.g. SFedHIFI's,
trains the model of ``config["width"]``); the client's persistent state (SCAFFOLD's c_i,
...) lives in the node's ``Context.state`` between rounds. ``evaluate`` scores the
received global model on the node's shard; ``query`` tells the server which
partition this node serves.

What a process builds once (:class:`Node`: the data set and its shards, the models,
the fast SLAYER kernels) stays in memory for every later message the same process
handles: in Flower's simulation engine (one long-lived Ray actor) and under
:mod:`neurofed.flower.worker` (one long-lived process per SuperNode). Flower's default
``--isolation subprocess`` starts a new ``flwr-clientapp`` process per message and
pays it all each time. Each reply carries its timing (``neurofed.timing``: start-up
of a fresh process, set-up, decode, fit, encode) for the round records.
"""

from __future__ import annotations

import os
import time
import traceback
from functools import lru_cache
from logging import ERROR

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log
from flwr.common.constant import ErrorCode

from neurofed.algorithms import get_algorithm_class
from neurofed.algorithms.base import ClientData, FitContext
from neurofed.data.encoding import as_tensor
from neurofed.training.params import ParamSpec
from neurofed.fl.experiment import configure_compute, load_partitioned
from neurofed.seeds import seed_for
from neurofed.training.local import evaluate
from neurofed.flower.records import from_arrays, from_config, load_state, save_state, to_arrays, to_metrics
from neurofed.flower.settings import experiment_config, settings
from neurofed.flower.strategy import EXTRA_KEY, NODE_KEY, NUM_EXAMPLES, TARGET_KEY, TIMING_KEY
from neurofed.device import resolve_device
from neurofed.models import build_run_model


class Node:
    """What a process needs to serve any partition of one experiment: the config, the
    data set and its shards, and the algorithm's client half (built once, like the
    runner's single client half)."""

    def __init__(self, cfg: dict):
        t0 = time.perf_counter()
        self.kernels = configure_compute(cfg, kernels_required=True)  # as the runner's: the same bits
        t1 = time.perf_counter()
        self.cfg = cfg
        self.device = resolve_device(cfg["federation"].get("device", "auto"))  # this SuperNode's own device
        self.dataset, self.parts = load_partitioned(cfg)
        t2 = time.perf_counter()
        self.algorithm = get_algorithm_class(cfg["algorithm"]["name"])
        self.new_model = lambda: build_run_model(cfg, self.dataset).to(self.device)
        self.spec = ParamSpec.from_model(self.new_model())
        self.client = self.algorithm.Client(cfg, self.spec, self.new_model)
        self._eval_models: dict = {}
        # set-up seconds, reported by the first message that uses this node
        self.setup_times = {"kernels": t1 - t0, "data": t2 - t1, "model": time.perf_counter() - t2}

    def data(self, pid: int) -> ClientData:
        ds, idx = self.dataset, self.parts[pid]
        return ClientData(pid, as_tensor(np.asarray(ds.x_train[idx])),
                          torch.as_tensor(ds.y_train[idx]), ds.num_classes)

    def eval_model(self, width: float | None = None) -> tuple[torch.nn.Module, ParamSpec]:
        """(model, its ParamSpec) to evaluate a received global model: the run's model,
        or the run's model config at ``width`` (heterogeneous-width runs keep one global
        model per width). Built once each."""
        width = float(self.cfg["model"]["width"] if width is None else width)
        if width not in self._eval_models:
            model = build_run_model(self.cfg, self.dataset, width).to(self.device)
            self._eval_models[width] = (model, ParamSpec.from_model(model))
        return self._eval_models[width]


@lru_cache(maxsize=2)
def _node(config: str, overrides: str) -> Node:
    return Node(experiment_config({"neurofed-config": config, "neurofed-set": overrides}))


def node_for(context: Context, defaults: dict | None = None) -> Node:
    s = settings(context.run_config, defaults)
    return _node(str(s["neurofed-config"]), str(s["neurofed-set"]))


def _process_started() -> float:
    """Wall-clock time this process started (Linux /proc; now elsewhere)."""
    try:
        ticks = int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19])
        boot = next(float(l.split()[1]) for l in open("/proc/stat") if l.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


_first_message = [True]


def fresh_process(flag: bool) -> None:
    """Whether the next message's ``start`` time counts this process's start-up."""
    _first_message[0] = flag


class Timer:
    """Seconds per step of one message: ``start`` (a fresh process: from its start to
    the handler, i.e. interpreter, imports, FAB install, app load; 0 for a later
    message), ``setup`` (all of :class:`Node`'s set-up, 0 when cached; when it ran, its
    parts too: ``kernels``, ``data`` = data set read and shards cut, ``model``), then
    the steps the handler marks."""

    def __init__(self):
        now = time.time()
        self.times = {"start": now - _process_started() if _first_message[0] else 0.0}
        _first_message[0] = False
        self._t = time.perf_counter()

    def mark(self, step: str) -> None:
        t = time.perf_counter()
        self.times[step] = self.times.get(step, 0.0) + t - self._t
        self._t = t


def partition_of(context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config."""
    cfg = context.node_config
    missing = [k for k in ("partition-id", "num-partitions") if k not in cfg]
    if missing:
        raise ValueError(f"node config lacks {' and '.join(missing)}; start the SuperNode with "
                         f"--node-config 'partition-id=K num-partitions=N' (N = partition.num_clients)")
    return int(cfg["partition-id"]), int(cfg["num-partitions"])


def _error_reply(msg: Message, exc: Exception) -> Message:
    log(ERROR, "neurofed ClientApp: %s", traceback.format_exc())
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc).__name__}: {exc}"),
                   reply_to=msg)


def _reply(msg: Message, metrics: dict, arrays: dict | None = None, timer: Timer | None = None) -> Message:
    numeric, extra = to_metrics(metrics)
    content = RecordDict({"metrics": numeric})
    if arrays is not None:
        content["arrays"] = to_arrays(arrays)
    if extra is not None:
        content[EXTRA_KEY] = extra
    if timer is not None:
        timer.mark("encode")
        content[TIMING_KEY] = MetricRecord({k: round(v, 6) for k, v in timer.times.items()})
    return Message(content, reply_to=msg)


def make_client_app(defaults: dict | None = None) -> ClientApp:
    """A ClientApp whose run config falls back to ``defaults`` (for ``run_simulation``,
    which passes none)."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        try:
            pid, n = partition_of(context)
            return Message(RecordDict({NODE_KEY: ConfigRecord({"partition-id": pid, "num-partitions": n})}),
                           reply_to=msg)
        except Exception as exc:
            return _error_reply(msg, exc)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        timer = Timer()
        try:
            pid, _ = partition_of(context)
            target = int(msg.content[TARGET_KEY]["partition-id"])
            if target != pid:
                raise ValueError(f"asked to train partition {target}, but this node serves partition {pid}")
            node = node_for(context, defaults)
            data = node.data(pid)
            timer.mark("setup")
            timer.times.update(getattr(node, "setup_times", {}))
            node.setup_times = {}
            keep_state = node.algorithm.needs_client_state
            state = load_state(context.state) if keep_state else {}
            params, config = from_arrays(msg.content["arrays"]), from_config(msg.content["config"])
            timer.mark("decode")
            params, n, metrics = node.client.fit(FitContext(params, config, data, state))
            timer.mark("fit")
            if keep_state:
                save_state(context.state, state)
            return _reply(msg, {**metrics, NUM_EXAMPLES: n}, params, timer)
        except Exception as exc:  # the server logs the reason and drops this client for the round
            return _error_reply(msg, exc)

    @app.evaluate()
    def evaluate_(msg: Message, context: Context) -> Message:
        """Accuracy, loss and firing rates of the received model on this node's shard
        (the model of width ``config["width"]`` when the message has a config naming one)."""
        try:
            pid, _ = partition_of(context)
            node = node_for(context, defaults)
            config = from_config(msg.content["config"]) if "config" in msg.content else {}
            (model, spec), data = node.eval_model(config.get("width")), node.data(pid)
            spec.set(model, spec.pack(from_arrays(msg.content["arrays"])))
            ev = evaluate(model, data.x, data.y, node.cfg, seed_for(node.cfg["seed"], "client_eval", pid))
            return _reply(msg, {**ev, NUM_EXAMPLES: int(len(data.y))})
        except Exception as exc:
            return _error_reply(msg, exc)

    return app
