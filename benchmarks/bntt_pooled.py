"""A BNTT-trained network (``model.norm: bntt``) with its per-step norms pooled over T into one
norm per channel, the form that folds into a synapse for Lava: what the pooling costs.

Each StepBatchNorm becomes a ChannelBatchNorm with γ the mean of the per-step γ_t (no shift, as
BNTT), the running mean the mean of the μ_t and the running variance the pooled one
(mean of σ_t² + μ_t², minus the mean's square); then again with the statistics recomputed on
the training images under the pooled γ (PreciseBN). Accuracy is the mean over ``--draws``
draws of the rate-coded test input (one draw moves 450 stand-in images by about 2 points).
A probe: it measures, it does not export.

    python benchmarks/bntt_pooled.py RUN_DIR [--draws 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_header, with_one_line_errors  # noqa: E402


def pooled_copy(model, cfg: dict, dataset):
    """The run's model rebuilt with ``model.norm: batch``, each per-step norm pooled over T."""
    from neurofed.models import build_run_model

    pooled_cfg = {**cfg, "model": {**cfg["model"], "norm": "batch", "norm_steps": None}}
    pooled = build_run_model(pooled_cfg, dataset)
    src = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in pooled.named_parameters():
            q = src.get(name)
            if q is None:  # BNTT has no shift
                p.zero_()
            elif q.dim() == 2 and name.endswith("norm.weight"):
                p.copy_(q.mean(1))
            elif q.dim() == 2 and name.endswith("running_mean"):
                p.copy_(q.mean(1))
            elif q.dim() == 2 and name.endswith("running_var"):
                mu = src[name.replace("running_var", "running_mean")]
                p.copy_((q + mu ** 2).mean(1) - mu.mean(1) ** 2)
            else:
                p.copy_(q)
    return pooled.eval(), pooled_cfg


def main(argv: list[str] | None = None) -> int:
    from neurofed.data.encoding import as_tensor
    from neurofed.deploy.export import load_global_model
    from neurofed.models.norm import StepBatchNorm, precise_statistics
    from neurofed.training.local import encoded_batches, evaluate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--draws", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    run = load_global_model(args.run_dir)
    model, cfg, ds = run.model, run.cfg, run.dataset
    if not any(isinstance(m, StepBatchNorm) for m in model.modules()):
        sys.exit(f"bntt_pooled: {args.run_dir} was not trained with model.norm: bntt (got {cfg['model']['norm']!r})")
    x_test, y_test = as_tensor(ds.x_test), torch.as_tensor(ds.y_test)

    def accuracy(m, c) -> float:
        return round(100 * float(np.mean([evaluate(m, x_test, y_test, c, s)["accuracy"] for s in range(args.draws)])), 2)

    spread = [round(float((n.weight.detach().std(1) / n.weight.detach().mean(1).abs()).mean()), 3)
              for n in model.modules() if isinstance(n, StepBatchNorm)]
    out = {"run": args.run_dir, "draws": args.draws, "bntt": accuracy(model, cfg)}
    pooled, pooled_cfg = pooled_copy(model, cfg, ds)
    out["pooled"] = accuracy(pooled, pooled_cfg)
    gen = torch.Generator().manual_seed(0)
    x_train = as_tensor(ds.x_train)
    precise_statistics(pooled, (xb for _, xb, _ in encoded_batches(pooled, x_train, None, pooled_cfg["data"], 128, gen,
                                                                     shuffle=False)))
    out["pooled_precise"] = accuracy(pooled, pooled_cfg)
    out["gamma_spread_over_steps"] = spread  # per normed layer: mean over channels of std_t(γ) / |mean_t(γ)|
    print(machine_header("bntt_pooled", "(1 thread)"))
    print(f"test accuracy, mean of {args.draws} input draws: BNTT {out['bntt']} %, pooled {out['pooled']} %, "
          f"pooled + precise statistics {out['pooled_precise']} %")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))