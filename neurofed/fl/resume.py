"""The run folder of a training run: created afresh, or reopened to resume from its
checkpoint; a start that fails before its first checkpoint leaves it as it was."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from neurofed.config import ConfigError
from neurofed.logs import RUN_LOG, close_run_log
from neurofed.rundir import CHECKPOINT, LEGACY_CHECKPOINT, legacy_checkpoint_error, load_state, run_outputs_in

log = logging.getLogger(__name__)


class RunDirError(ConfigError):
    """The run directory cannot be used as asked (exists without --resume, etc.)."""


def note(msg: str) -> None:
    """One warning line for a setting or a resume that does less than asked."""
    log.warning("note: %s", msg)


def comparable_config(cfg: dict) -> dict:
    """The parts of a config that must match for a resume (rounds may grow)."""
    c = json.loads(json.dumps(cfg))
    c["federation"].pop("rounds", None)
    c["federation"].pop("device", None)  # a run may resume on another machine's device
    c["federation"].pop("threads", None)  # or with more cores: a resource, like the device (noted)
    c["federation"].pop("fast_kernels", None)  # same bits with or without (fast_gradients is compared)
    for section in ("export", "lava", "energy", "log"):
        c.pop(section, None)
    return c


def config_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between a run's saved config and ``current``.

    A key that a newer neurofed added (absent from ``saved``) only counts when its
    value is not the default, so runs started before it existed still resume.
    """
    from neurofed.config import flatten, defaults as config_defaults

    old, new = flatten(comparable_config(saved)), flatten(comparable_config(current))
    defaults = flatten(config_defaults())
    diffs = []
    for key in sorted(set(old) | set(new)):
        if key not in old and key in defaults and new[key] == defaults[key]:
            continue
        if old.get(key, "<absent>") != new.get(key, "<absent>"):
            diffs.append(key)
    return diffs


@contextmanager
def run_dir_lock(out: Path):
    """Hold an exclusive ``flock`` on the run folder itself while a run writes in it.

    A second run on the same ``--out`` (a resume started while the first still runs)
    stops at once with one line, where it would otherwise interleave its rounds with
    the first's in metrics.jsonl and race it for the checkpoint. The kernel drops the
    lock when its holder exits, however it ends, so it never outlives a run."""
    fd = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(f"--out {out}: another neurofed run is writing in this folder; wait for it to end "
                              f"(or stop it), then resume, or choose another --out") from None
        yield
    finally:
        os.close(fd)


_STOPPING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


@contextmanager
def signals_held(signums: tuple[int, ...] = _STOPPING_SIGNALS):
    """Hold these signals while a round's files are written, then act on the first one
    that came, as it would have acted: a kill between the round's line in metrics.jsonl
    and its checkpoint left a folder that --resume refused. (Not SIGKILL: nothing can.)
    Only the main thread may set handlers; elsewhere this holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = {s: signal.signal(s, lambda signum, _frame: came.append(signum)) for s in signums}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if came:
            signal.raise_signal(came[0])


def prepare_run_dir(out: Path, cfg: dict, resume: bool) -> dict | None:
    """Check the run folder ``out`` (made and locked by the runner's ``train``) for this
    start; return the checkpoint state when resuming.

    Nothing a run would write may already be there unless it continues that run from
    its checkpoint: without ``--resume`` any such file is refused, and ``--resume``
    without a checkpoint starts afresh only in a folder that holds none of them."""
    ckpt = out / CHECKPOINT
    existing = run_outputs_in(out)
    if resume:
        if not ckpt.exists():
            if (out / LEGACY_CHECKPOINT).exists():
                raise legacy_checkpoint_error(out)
            if existing:
                raise RunDirError(f"--resume: {out} holds {_listed(existing)} but no {CHECKPOINT} to continue "
                                  f"from; starting again would overwrite them: choose another --out")
            note(f"--resume: {out} holds no {CHECKPOINT}; starting from round 1")
            return None
        state = load_state(ckpt, "checkpoint")
        if not isinstance(state, dict) or not {"round", "server", "clients", "config"} <= set(state):
            raise RunDirError(f"{ckpt}: not a run checkpoint (missing round/server/clients/config)")
        diffs = config_differences(state["config"], cfg)
        if diffs:
            raise RunDirError(f"--resume: {', '.join(diffs[:5])} differ from the config {out} was started with; "
                              f"resume with the same config (only federation.rounds may change)")
        before, now = state["config"]["federation"].get("threads"), cfg["federation"].get("threads")
        if before != now:  # oneDNN's reduction order follows the thread count
            note(f"--resume: federation.threads {before} -> {now}; from round {int(state['round']) + 1} "
                 f"the rounds may differ in the last float bits from a run kept at {before}")
        done, asked = int(state["round"]), cfg["federation"]["rounds"]
        if asked < done:
            raise RunDirError(f"federation.rounds: got {asked}; {out} has already completed {done} rounds "
                              f"(resume with federation.rounds >= {done}, or read its results as they are)")
        return state
    if existing:
        raise RunDirError(f"--out {out}: already holds {_listed(existing)}, which this run would overwrite; "
                          f"pass --resume to continue a run, or choose another --out")
    return None


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def remove_failed_start(out: Path, created: bool, before: set[str]) -> None:
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

