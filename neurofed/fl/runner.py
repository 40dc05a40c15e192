"""The in-process federated run: one experiment, one run directory.

Per round the experiment trains and evaluates (:mod:`neurofed.fl.experiment`); this
loop writes the round's line to ``metrics.jsonl``, the checkpoint and the kept
models, so a resumed run ends exactly where an uninterrupted one does. What runs
after training (export, Lava, NIR, energy) is handed in by the orchestrator
(:mod:`neurofed.pipeline`) as an :class:`AfterTraining`: nothing here imports it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from neurofed import progress as fl_progress
from neurofed.config import dump_config
from neurofed.device import describe_device, device_line, resolve_device
from neurofed.fl.experiment import Experiment
from neurofed.fl.health import Health
from neurofed.fl.resume import RunDirError, note, prepare_run_dir, remove_failed_start, run_dir_lock, signals_held
from neurofed.fl.summary import RunFailedError, announce, summarize, write_plots
from neurofed.logs import RUN_LOG, close_run_log, open_run_log
from neurofed.rundir import CHECKPOINT, MODEL_BEST, MODEL_LAST, RunDir, check_out_dir, run_outputs_in
from neurofed.seeds import measured_on
from neurofed.stamp import environment
from neurofed.tracking import TensorBoardLog
from neurofed.training.privacy import Accountant

log = logging.getLogger(__name__)


class AfterTraining(Protocol):
    """The steps an orchestrator runs around training (:class:`neurofed.pipeline.PostTraining`)."""

    def plan(self, exp: Experiment) -> None:
        """Decide, before any training, which steps apply to ``exp``'s model and config,
        so that a step that cannot work is said at once, not after hours of training."""

    def run(self, run_dir: RunDir, exp: Experiment, summary: dict) -> dict:
        """Run the planned steps on the finished ``run_dir``; return ``{step: record}`` for
        summary.json's ``after_training`` (a failed step is recorded, never raised)."""


def train(cfg: dict, out: str | Path, resume: bool = False, progress: bool = True,
          experiment: Callable[[dict], Experiment] = Experiment, after: AfterTraining | None = None) -> dict:
    """Train (or resume) the experiment in ``out``, then run ``after``'s steps; return the summary.

    ``experiment`` builds the :class:`Experiment` (the Flower app passes one whose
    clients live on SuperNodes); the run directory is the same either way. A start that
    fails before its first checkpoint leaves ``out`` as it found it."""
    out = Path(out)
    created, before = not out.exists(), set(run_outputs_in(out)) | ({RUN_LOG} if (out / RUN_LOG).exists() else set())
    check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    with run_dir_lock(out):  # refused here, another run's files are not this start's to clean up
        try:
            return _train(cfg, out, resume, progress, after, experiment)
        except BaseException:
            remove_failed_start(out, created, before)
            raise


def _train(cfg: dict, out: Path, resume: bool, progress: bool, after: AfterTraining | None,
           experiment: Callable[[dict], Experiment]) -> dict:
    resolve_device(cfg["federation"].get("device", "auto"))  # a GPU asked for but missing: stop before any work
    state = prepare_run_dir(out, cfg, resume)
    open_run_log(out)
    log.info("%s %s in %s", "resuming" if state is not None else "starting",
             f"{cfg['algorithm']['name']} on {cfg['data']['name']} ({cfg['model']['name']})", out)
    announce(cfg)
    exp = experiment(cfg)
    run_dir = RunDir(out)
    if after is not None:  # steps known not to apply are refused now, not after hours of training
        after.plan(exp)
    device = describe_device(exp.device)
    log.info("training on %s", device_line(device), extra={"console": progress})
    dump_config(cfg, out / "config.yaml")
    (out / "partition.json").write_text(json.dumps({"label_counts": exp.counts.tolist()}))
    start = 0
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
        history, notes = run_dir.read_metrics(start)
        for line in notes:
            note(line)
        run_dir.rewrite_metrics(history)
        accountant.replay(history)
        health.replay(history, exp.eval_model)
        # the model files may be a round ahead of (or behind) the checkpoint after a kill
        if best is not None:
            run_dir.save(MODEL_BEST, best, "model")
        run_dir.save(MODEL_LAST, exp.model_state(start, history[-1]["accuracy"] if history else None), "model")

    rounds = cfg["federation"]["rounds"]
    fl_progress.show(progress)  # the clients' and batches' bars inside a round (on a terminal)
    bar = fl_progress.Rounds(rounds, start, cfg["algorithm"]["name"]) if progress else None
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
        with signals_held():  # the round's files are written whole, or not at all
            if best is None or record["accuracy"] > best["accuracy"]:
                best = model
                run_dir.save(MODEL_BEST, best, "model")
            run_dir.append_metrics(record)  # before the checkpoint: a resume drops a line past it
            run_dir.save(CHECKPOINT, {**exp.checkpoint_state(rnd), "best": best}, "checkpoint")
            run_dir.save(MODEL_LAST, model, "model")
        history.append(record)
        if tensorboard is not None:
            tensorboard.round(record)
        log.info("round %d: accuracy %.4f, %d client(s) trained, %.1f s", rnd, record["accuracy"],
                 len(record["trained"]), record["wall_time_s"])
        if bar is not None:
            bar.round_done(record)
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
        summary["init"] = ({"mode": "lsuv", "layers": exp.init_report} if cfg["model"]["kind"] == "ann" else
                           {"mode": "firing", "rates": cfg["model"]["init_rates"], "layers": exp.init_report})
    run_dir.write_summary(summary)
    write_plots(out, cfg, history, exp.counts)
    if history and not any(h["trained"] for h in history):
        failed = [f for h in history for f in h["failed"]]
        why = f"{len(failed)} client replies failed, first: client {failed[0]['client']}: {failed[0]['error']}" \
            if failed else "no client replied"
        raise RunFailedError(f"no client's update was aggregated in any of the {len(history)} rounds ({why}); "
                             f"the global model is the initial one (results kept in {out})")
    if after is not None:
        summary["after_training"] = after.run(run_dir, exp, summary)
        run_dir.write_summary(summary)
    if tensorboard is not None:
        if after is not None and summary["after_training"].get("energy", {}).get("status") == "ok":
            tensorboard.energy(out, rounds)
        tensorboard.close()
    log.info("finished: final accuracy %.4f after %d rounds", summary["final_accuracy"] or 0.0, summary["rounds"])
    close_run_log()
    return summary

