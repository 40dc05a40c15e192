"""Probe, not part of the package (2026-12-01): ``neurofed run`` with each client's optimizer kept
from one round it trains to the next, instead of the fresh optimizer a federated client builds
every round. With one client and one local epoch a round (``benchmarks/twin_curves.py``'s central
runs) this is central training with one optimizer state for the whole run; the lr is set anew
each round from the run's schedule. A resumed run starts a fresh optimizer.

    python probe_kept_optimizer.py run PRESET --out DIR --set ...   # the arguments of ``neurofed run``
"""
import sys

import neurofed.algorithms.base as base
from neurofed.training.local import make_optimizer


def kept_optimizer(self, model, fed_cfg):
    opt = getattr(self, "_kept_optimizer", None)
    if opt is None:
        opt = self._kept_optimizer = make_optimizer(model.parameters(), fed_cfg)
    for group in opt.param_groups:
        group["lr"] = fed_cfg["lr"]
    return opt


base.Client.make_optimizer = kept_optimizer
from neurofed.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
