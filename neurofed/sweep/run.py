"""Running a sweep: every grid point × seed as a normal run directory, in worker processes."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import yaml

from neurofed.config import ConfigError
from neurofed.pipeline import step_failure
from neurofed.sweep.grid import Sweep, load_sweep, point_configs, with_overrides
from neurofed.sweep.report import ReportRefused, report


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers() -> tuple[int, int]:
    """(worker processes, torch threads each): half the cores as workers, one thread
    each, so workers × threads never exceeds the cores. One thread, because these
    small models gain little from intra-op threads and lose much when the cores are
    shared: on this 2-core machine at load 6, three ANN digits rounds took 4.8 s with
    one thread and 30 s with two."""
    return max(1, _cores() // 2), 1


def _init_worker(threads: int) -> None:
    # Set here rather than as federation.threads so that the run configs (and with them
    # --resume's config check) do not depend on --workers.
    import torch

    torch.set_num_threads(threads)


def _execute(task: dict) -> dict:
    """Run one grid point × seed; never raises (a failure is written to error.txt)."""
    from neurofed.pipeline import run

    out = Path(task["out"])
    err = out / "error.txt"
    t0 = time.perf_counter()
    try:
        if err.exists():
            err.unlink()
        summary = run(task["cfg"], out, resume=task["resume"], progress=False)
        failure = step_failure(summary)
        if failure:  # the training's results stay; results.md lists the point as failed
            err.write_text(failure + f"\n\n{out / 'summary.json'} (after_training), {out / 'run.log'}\n")
            return {"run": task["run"], "ok": False, "error": failure, "final_accuracy": summary.get("final_accuracy")}
        return {"run": task["run"], "ok": True, "final_accuracy": summary.get("final_accuracy")}
    except Exception as exc:
        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
        out.mkdir(parents=True, exist_ok=True)
        err.write_text(line + "\n\n" + traceback.format_exc())
        return {"run": task["run"], "ok": False, "error": line, "seconds": time.perf_counter() - t0}


def _plan(sweep: Sweep, configs: dict[str, dict], out: Path, resume: bool) -> tuple[list[dict], int]:
    """The runs still to do (and how many are already finished)."""
    from neurofed.fl.resume import comparable_config
    from neurofed.rundir import RUN_FILES

    runs_dir = out / "runs"
    tasks, done = [], 0
    existing = []
    for point in sweep.points:
        for seed in sweep.seeds:
            rid = point.run_id(seed)
            cfg, rdir = configs[rid], runs_dir / rid
            has_run = any((rdir / f).exists() for f in RUN_FILES)
            if has_run and not resume:
                existing.append(rid)
                continue
            if resume and (rdir / "config.yaml").exists():
                old = yaml.safe_load((rdir / "config.yaml").read_text())
                if comparable_config(old) != comparable_config(cfg):
                    raise ConfigError(f"--resume: {rdir} was run with a different config than the sweep now gives; "
                                      f"only federation.rounds may change (use another --out for a new sweep)")
            summary = rdir / "summary.json"
            if resume and summary.exists():
                finished = json.loads(summary.read_text())
                # a point whose export, Lava or energy step failed is run again (its rounds are kept)
                if finished.get("rounds", 0) >= cfg["federation"]["rounds"] and step_failure(finished) is None:
                    done += 1
                    continue
            tasks.append({"run": rid, "cfg": cfg, "out": str(rdir), "resume": resume})
    if existing:
        raise ConfigError(f"--out {out}: already holds runs of this sweep ({existing[0]}"
                          f"{f' and {len(existing) - 1} more' if len(existing) > 1 else ''}); pass --resume to "
                          f"finish them, or choose another --out")
    return tasks, done


def run_sweep(path: str | Path, out: str | Path | None = None, workers: int | None = None, resume: bool = False,
              progress: bool = True, overrides=()) -> list[dict]:
    """Validate the sweep and every run's config, run what is not finished, write the report.

    ``overrides``: ``KEY=VALUE`` items (``neurofed sweep --set``) added to the sweep's
    ``set`` for every run (:func:`neurofed.sweep.grid.with_overrides`); sweep.json records them.
    Returns the result rows (one per point) as :func:`report` does.
    """
    sweep = with_overrides(load_sweep(path), overrides)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"--workers: got {workers!r}; expected an integer >= 1")
    configs = point_configs(sweep)
    out = Path(out) if out is not None else Path("sweeps") / sweep.name
    tasks, done = _plan(sweep, configs, out, resume)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(sweep.to_json(), indent=1, default=str))

    default, threads = default_workers()
    workers = default if workers is None else workers
    workers = max(1, min(workers, len(tasks)))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks) + done, initial=done, desc=f"sweep {sweep.name}", unit="run", dynamic_ncols=True,
                   disable=None)  # None: a terminal only
    failed: list[dict] = []

    def finished(result: dict) -> None:
        if not result["ok"]:
            failed.append(result)
        if bar is not None:
            bar.update(1)
            acc = result.get("final_accuracy")
            bar.set_postfix_str(f"failed {len(failed)}; last {result['run']}: "
                                + (f"acc {acc:.3f}" if acc is not None else "failed"))

    try:
        if workers == 1:
            import torch

            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                for task in tasks:  # in-process: no start-up cost, and tests can patch it
                    finished(_execute(task))
            finally:
                torch.set_num_threads(before)
        elif tasks:
            # spawn: forking a process that has loaded torch can deadlock in the child
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                                     initargs=(threads,)) as pool:
                futures = {pool.submit(_execute, t): t for t in tasks}
                try:
                    for fut in as_completed(futures):
                        try:
                            result = fut.result()
                        except Exception as exc:  # the worker process itself died
                            task = futures[fut]
                            line = f"{type(exc).__name__}: {exc}".splitlines()[0] or type(exc).__name__
                            Path(task["out"]).mkdir(parents=True, exist_ok=True)
                            (Path(task["out"]) / "error.txt").write_text(line + "\n")
                            result = {"run": task["run"], "ok": False, "error": line}
                        finished(result)
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        if bar is not None:
            bar.close()
        try:
            rows = report(out)
        except ReportRefused as exc:  # e.g. interrupted before any run finished
            print(f"neurofed sweep: {exc}", file=sys.stderr)
            rows = []
    for f in failed:
        print(f"neurofed sweep: {f['run']} failed: {f['error']} (see {out / 'runs' / f['run'] / 'error.txt'})")
    return rows
