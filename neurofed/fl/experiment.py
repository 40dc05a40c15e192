"""The experiment of one run: data, shards, models, the algorithm's two halves, and
one round (selection, local training, aggregation, evaluation).

Every random draw derives from the run seed (:mod:`neurofed.seeds`), so a resumed
run ends exactly where an uninterrupted one does.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch

from neurofed.algorithms import get_algorithm_class
from neurofed.algorithms.base import ClientData, FitContext, FitResult, ServerContext, screen_update
from neurofed.algorithms.policies import survivors
from neurofed.config import ConfigError
from neurofed.data import load_dataset
from neurofed.data.encoding import as_tensor
from neurofed.data.partition import label_counts, partition
from neurofed.device import configure_cuda, resolve_device
from neurofed import progress as fl_progress
from neurofed.fl.evaluation import evaluate_global
from neurofed.models import build_model, build_run_model
from neurofed.models.init import initialize
from neurofed.models.quantize import for_round
from neurofed.seeds import rng_for, seed_for
from neurofed.training.params import ParamSpec


def load_partitioned(cfg: dict) -> tuple:
    """``(dataset, shards)``: the data set and every client's index array, exactly as
    every run of ``cfg`` sees them — in process, or on a Flower SuperNode that keeps
    only its own shard (same seed, same shards)."""
    ds = load_dataset(cfg["data"], cfg["seed"])
    if ds.kind == "events" and cfg["data"]["encoding"] != "events":
        raise ConfigError(f"data.encoding: got {cfg['data']['encoding']!r}; dataset {ds.name} is event data, use events")
    if ds.kind == "image" and cfg["data"]["encoding"] == "events":
        raise ConfigError(f"data.encoding: got 'events'; dataset {ds.name} holds images, use rate or direct")
    channels = ds.input_shape[0]
    for key in ("mean", "std"):
        v = cfg["data"].get(key)
        if isinstance(v, (list, tuple)) and len(v) not in (1, channels):
            raise ConfigError(f"data.{key}: got {len(v)} values; {ds.name} has {channels} input channel(s): "
                              f"give one value per channel or a single number")
    return ds, partition(ds.y_train, ds.num_classes, cfg["partition"], rng_for(cfg["seed"], "partition"))


@dataclass
class RoundTraining:
    """What one round's training produced, however the clients were reached."""

    plan: list  # [(cid, config)] from the server half's configure
    stragglers: list  # selected clients that dropped out before training
    results: list  # FitResults of the clients that replied, in plan order
    failed: list  # [{"client": cid, "error": "..."}]
    metrics: dict  # the server half's aggregate metrics
    time_train_s: float
    time_aggregate_s: float


def configure_compute(cfg: dict, kernels_required: bool = False) -> dict:
    """This process's torch threads and fast kernels as ``federation`` says (the in-process
    runner and every Flower ClientApp: the same bits); returns the kernels' record for the
    summary (:func:`neurofed.kernels.configure`; ``kernels_required``: ``auto`` must load them)."""
    configure_cuda(cfg["federation"].get("tf32", "auto"), cfg["federation"].get("gpu_kernels", False))
    threads = cfg["federation"].get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    from neurofed import kernels

    # same spikes as stock SLAYER, faster on CPU; gradients bit-identical unless
    # fast_gradients (then equal up to float32 rounding)
    return kernels.configure(cfg["federation"].get("fast_kernels", "auto"),
                             gradients="fast" if cfg["federation"].get("fast_gradients") else "exact",
                             required=kernels_required)



class Experiment:
    """Everything one run needs, built from a validated config."""

    kernels_required = False  # fast_kernels: auto falls back to stock SLAYER here (one warning line)

    def __init__(self, cfg: dict):
        self.cfg = cfg
        # local training and the global evaluation run here; everything else stays on the CPU
        self.device = resolve_device(cfg["federation"].get("device", "auto"))
        self.kernels = configure_compute(cfg, self.kernels_required)
        self.dataset, self.parts = load_partitioned(cfg)
        ds = self.dataset
        self.counts = label_counts(ds.y_train, self.parts, ds.num_classes)
        # as stored (file image sets: one uint8 memory map shared by all clients); the
        # encoder makes floats per batch
        self.x_train = as_tensor(ds.x_train)
        self.y_train = torch.as_tensor(ds.y_train)
        self.x_test = as_tensor(ds.x_test)
        self.y_test = torch.as_tensor(ds.y_test)
        self.algorithm = get_algorithm_class(cfg["algorithm"]["name"])
        torch.manual_seed(seed_for(cfg["seed"], "init"))
        self.eval_model = self.new_model()  # on the CPU: export and energy read it
        # model.init: firing, on the weights as round 1 sees them
        self.init_report = initialize(for_round(self.eval_model, 1, cfg["federation"]["rounds"]), cfg, self.x_train)
        self._eval_models: dict[str, torch.nn.Module] = {}  # other global models' (model_for)
        self._device_models: dict[str, torch.nn.Module] = {}  # their twins on self.device
        self.spec = ParamSpec.from_model(self.eval_model)
        self.initial = self.spec.get(self.eval_model)
        self.server = self.algorithm.Server(cfg, self.spec, self.initial, ServerContext(
            num_clients=len(self.parts), client_sizes=self.counts.sum(1), dataset=ds))
        self.client = self.algorithm.Client(cfg, self.spec, self.new_train_model)
        self.client_states: dict[int, dict] = {}
        self.round: int | None = None  # the round being run (set by run_round)

    def new_model(self) -> torch.nn.Module:
        return build_run_model(self.cfg, self.dataset)

    def new_train_model(self) -> torch.nn.Module:
        """A model on the run's device, for the client half (local training)."""
        return self.new_model().to(self.device)

    def device_model(self, model_cfg: dict) -> torch.nn.Module:
        """The evaluation model for ``model_cfg`` on the run's device: ``model_for``'s
        own on the CPU; otherwise a twin built once on the device (never a copy)."""
        if self.device.type == "cpu":
            return self.model_for(model_cfg)
        key = json.dumps(model_cfg, sort_keys=True)
        if key not in self._device_models:
            ds = self.dataset
            self._device_models[key] = build_model(model_cfg, ds.input_shape, ds.num_classes,
                                                   self.cfg["federation"]["logit_scale"]).to(self.device)
        return self._device_models[key]

    def client_data(self, cid: int) -> ClientData:
        idx = torch.as_tensor(self.parts[cid])
        return ClientData(cid, self.x_train[idx], self.y_train[idx], self.dataset.num_classes)

    def survivors(self, rnd: int, chosen: list[int]) -> list[int]:
        """The selected clients that reply this round (:func:`~neurofed.algorithms.policies.survivors`)."""
        return survivors(self.cfg, rnd, chosen)

    # ------------------------------------------------------------------ one round
    def run_round(self, rnd: int) -> dict:
        self.round = rnd  # the evaluation's weights follow it (model.quantize: R)
        t0 = time.perf_counter()
        tr = self.train_round(rnd)
        results = tr.results
        t_eval = time.perf_counter()
        ev = self.evaluate_global()
        t_end = time.perf_counter()
        nbytes = {cid: self.server.spec_for(config).nbytes for cid, config in tr.plan}
        record = {
            "round": rnd,
            "accuracy": ev["accuracy"],
            "loss": ev["loss"],
            "selected": [c for c, _ in tr.plan],
            "trained": [r.cid for r in results],
            "stragglers": tr.stragglers,
            "failed": tr.failed,
            "bytes_down": sum(nbytes[cid] for cid, _ in tr.plan if cid not in tr.stragglers),
            "bytes_up": sum(nbytes[r.cid] for r in results),
            "train_loss": float(np.mean([r.metrics.get("train_loss", np.nan) for r in results])) if results else None,
            "firing_rate": ev.get("firing_rate"),
            "layer_firing_rates": ev.get("layer_firing_rates"),
            "wall_time_s": t_end - t0,
            "time_train_s": tr.time_train_s,
            "time_aggregate_s": tr.time_aggregate_s,
            "time_eval_s": t_end - t_eval,
        }
        record.update({k: v for k, v in ev.items() if k not in record})  # e.g. accuracy_per_width
        record.update({k: v for k, v in tr.metrics.items() if k not in record})
        self.last_results = results
        return record

    def evaluate_global(self) -> dict:
        """Test metrics of the global model(s) (:func:`neurofed.fl.evaluation.evaluate_global`)."""
        return evaluate_global(self)

    def model_for(self, model_cfg: dict) -> torch.nn.Module:
        """An evaluation model for ``model_cfg`` (built once; ``eval_model`` for the run's own)."""
        if model_cfg == self.cfg["model"]:
            return self.eval_model
        key = json.dumps(model_cfg, sort_keys=True)
        if key not in self._eval_models:
            ds = self.dataset
            self._eval_models[key] = build_model(model_cfg, ds.input_shape, ds.num_classes,
                                                 self.cfg["federation"]["logit_scale"])
        return self._eval_models[key]

    def train_round(self, rnd: int) -> RoundTraining:
        """Selection, local training of the surviving clients (here, one after another)
        and aggregation. The Flower app overrides this to reach the clients over Flower
        (:class:`neurofed.flower.server.FlowerExperiment`); everything else is shared."""
        plan = self.server.configure(rnd)
        alive = set(self.survivors(rnd, [c for c, _ in plan]))
        results, failed = [], []
        t_train = time.perf_counter()
        clients = fl_progress.bar(len(alive), f"round {rnd} clients", level=1, unit="client")
        for cid, config in plan:
            if cid not in alive:
                continue
            clients.set_postfix(client=cid)
            state = self.client_states.setdefault(cid, {}) if self.algorithm.needs_client_state else {}
            try:
                params, n, metrics = self.client.fit(FitContext(self.server.message_for(cid, config), config,
                                                                self.client_data(cid), state))
                flat = screen_update(self.server.spec_for(config), params)
            except Exception as exc:  # a broken client never reaches the global model
                failed.append({"client": cid, "error": f"{type(exc).__name__}: {exc}"})
                if os.environ.get("NEUROFED_DEBUG"):
                    traceback.print_exc()
                continue
            finally:
                clients.update(1)
            results.append(FitResult(cid, flat, n, metrics))
        clients.close()
        t_agg = time.perf_counter()
        agg_metrics = self.server.aggregate(rnd, results) if results else {"skipped": "no client replied"}
        return RoundTraining(plan, [c for c, _ in plan if c not in alive], results, failed, agg_metrics,
                             t_agg - t_train, time.perf_counter() - t_agg)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self, rnd: int) -> dict:
        return {"round": rnd, "server": self.server.state_dict(), "clients": self.client_states,
                "config": self.cfg}

    def model_state(self, rnd: int, accuracy: float | None) -> dict:
        """The global model(s) after round ``rnd``, as ``model_last.npz`` / ``model_best.npz`` hold them."""
        state = {"round": rnd, "accuracy": accuracy, "params": np.array(self.server.params, dtype=np.float32)}
        several = self.server.global_models()
        if several is not None:
            state["models"] = {label: {"model": model_cfg, "params": np.array(flat, dtype=np.float32)}
                               for label, (model_cfg, flat) in several.items()}
        return state

    def restore(self, state: dict) -> int:
        self.server.load_state_dict(state["server"])
        self.client_states = state["clients"]
        return int(state["round"])

