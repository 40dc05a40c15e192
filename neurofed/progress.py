"""What a run shows while it trains: on a terminal, progress bars (the rounds; inside a
round, its clients (line 2) and the batches of the client training now (line 3)); when
stderr is a file or a pipe (``make run > log 2>&1``, CI, a job scheduler), one line per
round instead, so the log stays readable. Warnings go through logging either way.

Off unless the runner turns them on (``neurofed run`` without ``--quiet``): a library
caller, a sweep worker and a Flower client draw nothing. An inner bar closes when its work
is done (``leave=False``), so only the round bar stays on screen.
"""

from __future__ import annotations

import sys

_shown = False


def on_terminal() -> bool:
    """True when stderr (where tqdm draws) is a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def show(enabled: bool) -> None:
    """Turn the inner bars on (only on a terminal) or off."""
    global _shown
    _shown = bool(enabled) and on_terminal()


def bar(total: int, desc: str, level: int, unit: str = "it"):
    """A tqdm bar at nesting ``level`` (1: clients, 2: batches); a no-op bar when off."""
    from tqdm.auto import tqdm

    # the clients' bar draws every update (a few per round), so its last count is seen
    return tqdm(total=total, desc=desc, unit=unit, position=level, leave=False, dynamic_ncols=True,
                disable=not _shown, mininterval=0 if level == 1 else 0.1)


class Rounds:
    """The rounds of a run: a bar on a terminal, else one line per round on stderr."""

    def __init__(self, total: int, done: int, algorithm: str):
        self.total, self.algorithm, self.bar = total, algorithm, None
        if on_terminal():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=done, desc=f"{algorithm} rounds", unit="round", dynamic_ncols=True)

    def round_done(self, record: dict) -> None:
        acc, rate = record["accuracy"], record.get("firing_rate") or 0.0
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(acc=f"{acc:.3f}", rate=f"{rate:.3f}")
        else:
            print(f"{self.algorithm} round {record['round']}/{self.total}: accuracy {acc:.3f}, firing rate {rate:.3f}, "
                  f"{len(record['trained'])} client(s) trained, {record['wall_time_s']:.1f} s", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
