"""Progress bars inside a round, nested under the runner's round bar: the clients of
the round (line 2) and the batches of the client training now (line 3).

Off unless the runner turns them on (``neurofed run`` without ``--quiet``): a library
caller, a sweep worker and a Flower client draw nothing. A bar closes when its work is
done (``leave=False``), so only the round bar stays on screen.
"""

from __future__ import annotations

_shown = False


def show(enabled: bool) -> None:
    global _shown
    _shown = bool(enabled)


def bar(total: int, desc: str, level: int, unit: str = "it"):
    """A tqdm bar at nesting ``level`` (1: clients, 2: batches); a no-op bar when off."""
    from tqdm.auto import tqdm

    # the clients' bar draws every update (a few per round), so its last count is seen
    return tqdm(total=total, desc=desc, unit=unit, position=level, leave=False, dynamic_ncols=True,
                disable=not _shown, mininterval=0 if level == 1 else 0.1)
