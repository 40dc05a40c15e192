"""The global model(s) on the test split, once per round.

A server that keeps several global models (``Server.global_models()``, e.g. one per
width in SFedHIFI) gets each evaluated; ``accuracy``, ``loss`` and the firing rates
are then their means and ``accuracy_per_<models_by>`` lists them.
"""

from __future__ import annotations

import numpy as np

from neurofed.models.quantize import for_round
from neurofed.seeds import seed_for
from neurofed.training.local import evaluate
from neurofed.training.params import ParamSpec


def evaluate_global(exp) -> dict:
    """Test metrics of ``exp``'s (an :class:`~neurofed.fl.experiment.Experiment`) global model(s)."""
    seed = seed_for(exp.cfg["seed"], "eval")
    several = exp.server.global_models()
    rounds = exp.cfg["federation"]["rounds"]
    if several is None:
        model = for_round(exp.device_model(exp.cfg["model"]), exp.round, rounds)  # model.quantize
        exp.spec.set(model, exp.server.params)
        if model is not exp.eval_model:
            exp.spec.set(exp.eval_model, exp.server.params)  # the CPU copy stays current
        return evaluate(model, exp.x_test, exp.y_test, exp.cfg, seed)
    per = {}
    for label, (model_cfg, flat) in several.items():
        model = for_round(exp.device_model(model_cfg), exp.round, rounds)
        ParamSpec.from_model(model).set(model, flat)
        per[label] = evaluate(model, exp.x_test, exp.y_test, exp.cfg, seed)
    ev = {k: float(np.mean([e[k] for e in per.values()])) for k in ("accuracy", "loss", "firing_rate")
          if all(e.get(k) is not None for e in per.values())}
    rates = [e.get("layer_firing_rates") for e in per.values()]
    if all(r is not None and len(r) == len(rates[0]) for r in rates):
        ev["layer_firing_rates"] = [round(float(x), 6) for x in np.mean(rates, axis=0)]
    ev[f"accuracy_per_{exp.server.models_by}"] = {label: e["accuracy"] for label, e in per.items()}
    return ev
