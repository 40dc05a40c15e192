"""What the algorithm tests share: one round of a tiny run, the label-skew algorithms, a client for the noise tests."""

from __future__ import annotations

import numpy as np

from neurofed.algorithms.base import Client, FitContext
from neurofed.config import load_config
from neurofed.training.params import ParamSpec


LABEL_SKEW = ("fedprox", "scaffold", "fednova", "fedlc", "fedrs", "fedlec")


def one_round(cfg):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(cfg)
    exp.record = exp.run_round(1)
    return exp


# Each paper's other rows (its tables' baselines), one --set away from every preset of it.
PAPER_ROWS = {"fedlec": ["fedavg", "fedprox", "scaffold", "fednova", "fedlc", "fedrs"],
              "sfedca": ["fedavg", "divfl", "fedmos"],
              "sfedhifi": ["hetero_fedavg", "hetero_fedprox", "hetero_fednova"]}


def ldp_client(delta, n, **fed):
    cfg = load_config(None, [f"federation.ldp_laplace={delta}"] + [f"federation.{k}={v}" for k, v in fed.items()])
    spec = ParamSpec(("w",), ((n,),))
    return Client(cfg, spec, lambda: None), FitContext({}, {"seed": 1234}, None, spec=spec, global_flat=np.zeros(n, np.float32))


def privatized(delta, n, upload, **fed):
    client, ctx = ldp_client(delta, n, **fed)
    return client.add_privacy_noise(ctx, upload)


BUILT_ONCE = {"cfg", "spec", "model_factory", "_model", "_teacher", "_prev_model"}  # run-wide, not per call
