"""The in-process federated runner: one experiment, one run directory.

Per round: the server half picks clients and their configs; stragglers drop; each
surviving client half trains on its shard (only those clients train); replies that
raise or are non-finite are dropped and logged; the server half aggregates; the
global model is evaluated once on the test set; a line goes to ``metrics.jsonl``
and a checkpoint is written. Every random draw derives from the run seed
(:mod:`neurofed.fl.seeds`), so a resumed run ends exactly where an uninterrupted
one does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from neurofed.algorithms import get_algorithm_class
from neurofed.algorithms.base import ClientData, FitResult
from neurofed.config import ConfigError, dump_config
from neurofed.data import load_dataset
from neurofed.data.encoding import as_tensor
from neurofed.data.partition import label_counts, partition
from neurofed.device import configure_cuda, describe_device, device_line, resolve_device
from neurofed.fl import progress as fl_progress
from neurofed.fl.params import ParamSpec
from neurofed.fl.health import Health
from neurofed.fl.privacy import SEEDED, Accountant
from neurofed.fl.seeds import measured_on, rng_for, seed_for
from neurofed.fl.train import evaluate
from neurofed.logs import RUN_LOG, close_run_log, open_run_log
from neurofed.stamp import environment
from neurofed.tracking import TensorBoardLog
from neurofed.models import build_model, build_run_model
from neurofed.models.quantize import for_round
from neurofed.models.init import initialize
from neurofed.runfiles import (CHECKPOINT, LEGACY_CHECKPOINT, MODEL_BEST, MODEL_LAST, append_metrics, check_out_dir,
                               legacy_checkpoint_error, load_state, read_metrics, run_outputs_in, save_state)

log = logging.getLogger(__name__)

RUN_FILES = ("metrics.jsonl", "summary.json", CHECKPOINT, LEGACY_CHECKPOINT)


class RunDirError(ConfigError):
    """The run directory cannot be used as asked (exists without --resume, etc.)."""


class RunFailedError(ConfigError):
    """The run finished but did not train: no client's update was ever aggregated."""


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
        self.init_report = initialize(for_round(self.eval_model, 1), cfg, self.x_train)  # model.init: firing
        self._eval_models: dict[str, torch.nn.Module] = {}  # other global models' (model_for)
        self._device_models: dict[str, torch.nn.Module] = {}  # their twins on self.device
        self.spec = ParamSpec.from_model(self.eval_model)
        self.initial = self.spec.get(self.eval_model)
        self.server = self.algorithm.Server(cfg, self.spec, self.initial, len(self.parts))
        self.server.client_sizes = self.counts.sum(1)  # n_k: FedMoS samples clients by data share
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
        """FedSNN's straggler rule (Venkatesha et al. 2021, Sec. IV-D): of the P selected
        clients one, drawn uniformly, always replies ("one out of P participating clients
        is guaranteed to send the update"); each of the other P − 1 drops with probability
        q = ``federation.straggler_prob``. E[survivors] = 1 + (P − 1)(1 − q)."""
        q = self.cfg["federation"]["straggler_prob"]
        if q <= 0 or not chosen:
            return list(chosen)
        rng = rng_for(self.cfg["seed"], "straggler", rnd)
        keep = rng.random(len(chosen)) >= q
        keep[rng.integers(len(chosen))] = True  # the guaranteed reply
        return [c for c, k in zip(chosen, keep) if k]

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
        """Test metrics of the global model. A server that keeps several global models
        (``Server.global_models()``: label -> (model config, flat parameters), e.g. one
        per width in SFedHIFI) gets each evaluated; ``accuracy``, ``loss`` and the firing
        rates are then their means and ``accuracy_per_<models_by>`` lists them."""
        seed = seed_for(self.cfg["seed"], "eval")
        several = getattr(self.server, "global_models", None)
        if several is None:
            model = for_round(self.device_model(self.cfg["model"]), self.round)
            self.spec.set(model, self.server.params)
            if model is not self.eval_model:
                self.spec.set(self.eval_model, self.server.params)  # the CPU copy stays current
            return evaluate(model, self.x_test, self.y_test, self.cfg, seed)
        per = {}
        for label, (model_cfg, flat) in several().items():
            model = for_round(self.device_model(model_cfg), self.round)
            ParamSpec.from_model(model).set(model, flat)
            per[label] = evaluate(model, self.x_test, self.y_test, self.cfg, seed)
        ev = {k: float(np.mean([e[k] for e in per.values()])) for k in ("accuracy", "loss", "firing_rate")
              if all(e.get(k) is not None for e in per.values())}
        rates = [e.get("layer_firing_rates") for e in per.values()]
        if all(r is not None and len(r) == len(rates[0]) for r in rates):
            ev["layer_firing_rates"] = [round(float(x), 6) for x in np.mean(rates, axis=0)]
        by = getattr(self.server, "models_by", "model")
        ev[f"accuracy_per_{by}"] = {label: e["accuracy"] for label, e in per.items()}
        return ev

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
                params, n, metrics = self.client.fit(self.server.message_for(cid, config), config,
                                                     self.client_data(cid), state)
                flat = self.server.spec_for(config).pack(params)
                if not np.all(np.isfinite(flat)):
                    raise FloatingPointError("update has non-finite values")
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
        several = getattr(self.server, "global_models", None)
        if several is not None:
            state["models"] = {label: {"model": model_cfg, "params": np.array(flat, dtype=np.float32)}
                               for label, (model_cfg, flat) in several().items()}
        return state

    def restore(self, state: dict) -> int:
        self.server.load_state_dict(state["server"])
        self.client_states = state["clients"]
        return int(state["round"])


def _note(msg: str) -> None:
    log.warning("note: %s", msg)


def announce(cfg: dict) -> None:
    """One line for each setting that does less than its name may suggest."""
    fed = cfg["federation"]
    noised = fed.get("ldp_laplace") or cfg["algorithm"].get("rate_noise")
    if noised and fed.get("privacy_noise") == SEEDED:
        _note("federation.privacy_noise is seeded_not_private: the noise derives from seeds the server holds "
              "and can be removed by it (reproducible, no privacy)")
    if fed.get("ldp_laplace") and fed.get("ldp_clip") is None:
        _note("federation.ldp_laplace without federation.ldp_clip is FedLEC Eq. 16: updates are not bounded, "
              "so no epsilon holds (reported as unbounded)")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _comparable(cfg: dict) -> dict:
    """The parts of a config that must match for a resume (rounds may grow)."""
    c = json.loads(json.dumps(cfg))
    c["federation"].pop("rounds", None)
    c["federation"].pop("device", None)  # a run may resume on another machine's device
    c["federation"].pop("fast_kernels", None)  # same bits with or without (fast_gradients is compared)
    for section in ("export", "lava", "energy", "log"):
        c.pop(section, None)
    return c


def config_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between a run's saved config and ``current``.

    A key that a newer neurofed added (absent from ``saved``) only counts when its
    value is not the default, so runs started before it existed still resume.
    """
    from neurofed.config import _flatten, defaults as config_defaults

    old, new = _flatten(_comparable(saved)), _flatten(_comparable(current))
    defaults = _flatten(config_defaults())
    diffs = []
    for key in sorted(set(old) | set(new)):
        if key not in old and key in defaults and new[key] == defaults[key]:
            continue
        if old.get(key, "<absent>") != new.get(key, "<absent>"):
            diffs.append(key)
    return diffs


def prepare_run_dir(out: Path, cfg: dict, resume: bool) -> dict | None:
    """Create or reopen ``out``; return the checkpoint state when resuming.

    Nothing a run would write may already be there unless it continues that run from
    its checkpoint: without ``--resume`` any such file is refused, and ``--resume``
    without a checkpoint starts afresh only in a folder that holds none of them."""
    check_out_dir(out)
    ckpt = out / CHECKPOINT
    existing = run_outputs_in(out)
    if resume:
        if not ckpt.exists():
            if (out / LEGACY_CHECKPOINT).exists():
                raise legacy_checkpoint_error(out)
            if existing:
                raise RunDirError(f"--resume: {out} holds {_listed(existing)} but no {CHECKPOINT} to continue "
                                  f"from; starting again would overwrite them: choose another --out")
            _note(f"--resume: {out} holds no {CHECKPOINT}; starting from round 1")
            out.mkdir(parents=True, exist_ok=True)
            return None
        state = load_state(ckpt, "checkpoint")
        if not isinstance(state, dict) or not {"round", "server", "clients", "config"} <= set(state):
            raise RunDirError(f"{ckpt}: not a run checkpoint (missing round/server/clients/config)")
        diffs = config_differences(state["config"], cfg)
        if diffs:
            raise RunDirError(f"--resume: {', '.join(diffs[:5])} differ from the config {out} was started with; "
                              f"resume with the same config (only federation.rounds may change)")
        done, asked = int(state["round"]), cfg["federation"]["rounds"]
        if asked < done:
            raise RunDirError(f"federation.rounds: got {asked}; {out} has already completed {done} rounds "
                              f"(resume with federation.rounds >= {done}, or read its results as they are)")
        return state
    if existing:
        raise RunDirError(f"--out {out}: already holds {_listed(existing)}, which this run would overwrite; "
                          f"pass --resume to continue a run, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return None


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _remove_failed_start(out: Path, created: bool, before: set[str]) -> None:
    """After a start that failed before its first checkpoint: remove what it wrote (the
    folder itself when it made it), so that a second try is not refused as existing."""
    if (out / CHECKPOINT).exists() or not out.is_dir():
        return
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    close_run_log()  # its file goes too when this start made it
    for name in (set(run_outputs_in(out)) | {RUN_LOG}) - before:
        path = out / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def run(cfg: dict, out: str | Path, resume: bool = False, progress: bool = True, after: bool = True,
        experiment: Callable[[dict], Experiment] = Experiment) -> dict:
    """Run (or resume) the experiment in ``out``; return the summary dict.

    ``experiment`` builds the :class:`Experiment` (the Flower app passes one whose
    clients live on SuperNodes); the run directory is the same either way. A start that
    fails before its first checkpoint leaves ``out`` as it found it."""
    out = Path(out)
    created, before = not out.exists(), set(run_outputs_in(out)) | ({RUN_LOG} if (out / RUN_LOG).exists() else set())
    try:
        return _run(cfg, out, resume, progress, after, experiment)
    except BaseException:
        _remove_failed_start(out, created, before)
        raise


def _run(cfg: dict, out: Path, resume: bool, progress: bool, after: bool,
         experiment: Callable[[dict], Experiment]) -> dict:
    resolve_device(cfg["federation"].get("device", "auto"))  # a GPU asked for but missing: stop before any work
    state = prepare_run_dir(out, cfg, resume)
    open_run_log(out)
    log.info("%s %s in %s", "resuming" if state is not None else "starting",
             f"{cfg['algorithm']['name']} on {cfg['data']['name']} ({cfg['model']['name']})", out)
    announce(cfg)
    exp = experiment(cfg)
    if after:  # steps known not to apply are refused now, not after hours of training
        from neurofed.pipeline import plan_steps

        plan = plan_steps(cfg, exp)
    device = describe_device(exp.device)
    log.info("training on %s", device_line(device), extra={"console": progress})
    dump_config(cfg, out / "config.yaml")
    (out / "partition.json").write_text(json.dumps({"label_counts": exp.counts.tolist()}))
    start = 0
    metrics_path = out / "metrics.jsonl"
    history: list[dict] = []
    best = None  # the model state of the best round so far (first of equals, as summarize)
    accountant = Accountant(cfg, exp.dataset.num_classes, exp.algorithm)
    health = Health(cfg, exp.dataset.num_classes)
    if state is None:  # (prepare_run_dir left no metrics.jsonl of another run here)
        health.check_start(exp.eval_model, exp.x_train)
    else:
        try:
            start = exp.restore(state)
            if np.shape(exp.server.params) != (exp.spec.size,):
                raise ValueError(f"a server vector of {np.size(exp.server.params)} values for {exp.spec.size} "
                                 f"parameters")
        except Exception as exc:  # e.g. a server vector shortened, its digest recomputed
            raise RunDirError(f"{out / CHECKPOINT}: does not fit this run's model and algorithm "
                              f"({type(exc).__name__}: {exc})".splitlines()[0]) from None
        best = state.get("best")
        # keep the lines up to the checkpointed round (a kill may have left one more, or half a line)
        history, notes = read_metrics(out, start)
        for note in notes:
            _note(note)
        _atomic_write(metrics_path, "".join(json.dumps(h) + "\n" for h in history).encode())
        accountant.replay(history)
        health.replay(history, exp.eval_model)
        # the model files may be a round ahead of (or behind) the checkpoint after a kill
        if best is not None:
            save_state(out / MODEL_BEST, best, "model")
        save_state(out / MODEL_LAST, exp.model_state(start, history[-1]["accuracy"] if history else None), "model")

    rounds = cfg["federation"]["rounds"]
    bar = None
    fl_progress.show(progress)  # the clients' and batches' bars inside a round
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds, initial=start, desc=f"{cfg['algorithm']['name']} rounds", unit="round",
                   dynamic_ncols=True)
    tensorboard = TensorBoardLog.for_run(cfg, out)
    t_run = time.perf_counter()
    prior_time = sum(h.get("wall_time_s", 0.0) for h in history)
    for rnd in range(start + 1, rounds + 1):
        record = exp.run_round(rnd)
        health.check_round(record, exp.eval_model)
        privacy = accountant.record(record["trained"])
        if privacy is not None:
            record["privacy"] = privacy
        model = exp.model_state(rnd, record["accuracy"])
        if best is None or record["accuracy"] > best["accuracy"]:
            best = model
            save_state(out / MODEL_BEST, best, "model")
        append_metrics(out, record)  # before the checkpoint: a resume drops a line past it
        save_state(out / CHECKPOINT, {**exp.checkpoint_state(rnd), "best": best}, "checkpoint")
        save_state(out / MODEL_LAST, model, "model")
        history.append(record)
        if tensorboard is not None:
            tensorboard.round(record)
        log.info("round %d: accuracy %.4f, %d client(s) trained, %.1f s", rnd, record["accuracy"],
                 len(record["trained"]), record["wall_time_s"])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(acc=f"{record['accuracy']:.3f}", rate=f"{record.get('firing_rate') or 0:.3f}")
    if bar is not None:
        bar.close()
    fl_progress.show(False)

    summary = summarize(history, cfg, prior_time + time.perf_counter() - t_run)
    summary["num_params"] = exp.spec.size
    # final_accuracy / best_accuracy: the global model on these samples and input spikes
    summary["accuracy_measured_on"] = measured_on(cfg["data"], len(exp.y_test), len(exp.y_test), "eval")
    if exp.dataset.info.get("subset"):  # data.train_subset / data.test_subset: not the whole data set
        summary["data_subset"] = exp.dataset.info["subset"]
    if exp.dataset.info.get("files_identified"):  # which files were verified as the data set's, and how
        summary["data_files"] = exp.dataset.info["files_identified"]
    summary["privacy"] = accountant.summary()
    summary["models_kept"] = {"last": MODEL_LAST, "best": MODEL_BEST}
    summary["device"] = device
    summary["kernels"] = exp.kernels  # the fast-kernel variant this process (the server's) loaded
    summary["environment"] = environment()
    summary["health"] = health.summary()
    if exp.init_report is not None:
        summary["init"] = {"mode": "firing", "rates": cfg["model"]["init_rates"], "layers": exp.init_report}
    _atomic_write(out / "summary.json", json.dumps(summary, indent=2).encode())
    from neurofed.plots import plot_accuracy, write_class_coverage

    plot_accuracy(history, out / "plots" / "accuracy.png", title=f"{cfg['algorithm']['name']} on {cfg['data']['name']}")
    write_class_coverage(out, history, exp.counts, title=f"{cfg['algorithm']['name']}: class share of aggregated "
                                                          f"clients' samples ({cfg['partition']['scheme']})")
    if history and not any(h["trained"] for h in history):
        failed = [f for h in history for f in h["failed"]]
        why = f"{len(failed)} client replies failed, first: client {failed[0]['client']}: {failed[0]['error']}" \
            if failed else "no client replied"
        raise RunFailedError(f"no client's update was aggregated in any of the {len(history)} rounds ({why}); "
                             f"the global model is the initial one (results kept in {out})")
    if after:
        from neurofed.pipeline import after_training

        summary["after_training"] = after_training(out, cfg, exp, summary, plan)
        _atomic_write(out / "summary.json", json.dumps(summary, indent=2).encode())
    if tensorboard is not None:
        if after and summary["after_training"].get("energy", {}).get("status") == "ok":
            tensorboard.energy(out, rounds)
        tensorboard.close()
    log.info("finished: final accuracy %.4f after %d rounds", summary["final_accuracy"] or 0.0, summary["rounds"])
    close_run_log()
    return summary


def summarize(history: list[dict], cfg: dict, wall_time: float) -> dict:
    accs = [h["accuracy"] for h in history]
    target = cfg["federation"].get("target_accuracy")
    reached = next((h["round"] for h in history if target is not None and h["accuracy"] >= target), None)
    best = int(np.argmax(accs)) if accs else None
    return {
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "best_round": history[best]["round"] if best is not None else None,
        "rounds": len(history),
        "rounds_to_target": reached,
        "target_accuracy": target,
        "wall_time_s": round(wall_time, 3),
        "final_firing_rate": history[-1].get("firing_rate") if history else None,
        "bytes_up": int(sum(h["bytes_up"] for h in history)),
        "bytes_down": int(sum(h["bytes_down"] for h in history)),
        "failed_clients": int(sum(len(h["failed"]) for h in history)),
        "final_loss": history[-1]["loss"] if history else None,
        "algorithm": cfg["algorithm"]["name"],
        "model": cfg["model"]["name"],
        "model_kind": cfg["model"].get("kind", "snn"),
        "dataset": cfg["data"]["name"],
        **{k: v for k, v in (history[-1] if history else {}).items() if k.startswith("accuracy_per_")},
    }
