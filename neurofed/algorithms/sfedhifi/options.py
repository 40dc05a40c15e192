"""The ``algorithm`` keys of the heterogeneous-width algorithms and their checks,
including the cross-key checks every one of them shares (:class:`HeteroConfig`)."""

from __future__ import annotations

import numbers
from typing import Any

from neurofed.algorithms.base import weighting_check
from neurofed.config import boolean, choice, number

BANK_SUFFIX = ".bank"  # neurofed.models.factorized: the width-independent filter bank B
MIX_SUFFIX = ".mix"  # ... and the width-specific mixing factor M^p
FUSIONS = ("mode", "none", "fixed", "random")
MAX_DRAWS = 10_000  # redraws of a round's selection/widths before giving up


def _widths(v):
    if (isinstance(v, list) and v and all(isinstance(x, numbers.Real) and not isinstance(x, bool) and 0 < x <= 1
                                          for x in v) and len(set(v)) == len(v)):
        return None
    return "expected a non-empty list of distinct widths in (0, 1]"


def _client_widths(v):
    if v is None or (isinstance(v, list) and v and all(isinstance(x, numbers.Real) and not isinstance(x, bool)
                                                       for x in v)):
        return None
    return "expected null (a balanced seeded draw) or one width per client"


def _ranks(v):
    if v in ("min", "per_width"):
        return None
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v <= 1:
        return None
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v):
        return None
    return ("expected min (the widths' smallest shape), a fraction in (0, 1] of it on the first two modes "
            "(the authors' 0.25), a list of positive integers (one per mode), or per_width")


HETERO_DEFAULTS: dict[str, Any] = {
    "widths": [0.25, 0.5, 0.75, 1.0],
    "assign": "fixed",  # fixed (a client keeps its width) | round (drawn every round, as the authors' code)
    "client_widths": None,  # assign fixed: one width per client; null: a balanced seeded draw
    "loss": "tet",  # tet (Eq. 14) | rate (cross-entropy of the spike-rate logits)
    "orth_lambda": 0.1,  # λ of Eq. 13 (the authors' Fashion-MNIST runs, baselines included)
    "orth_norm": "l2",  # Eq. 13's printed ‖B Bᵀ − I‖_2 (entry-wise 2-norm) | mse (the authors' nn.MSELoss)
    "selection": "random",  # random (the paper: 5 of 10 at random) | cover_widths (redraw until every width)
}
HETERO_CHECKS = {
    "widths": _widths,
    "assign": choice(("fixed", "round")),
    "client_widths": _client_widths,
    "loss": choice(("tet", "rate")),
    "orth_lambda": number(0),
    "orth_norm": choice(("l2", "mse")),
    "selection": choice(("random", "cover_widths")),
}
SFEDHIFI_DEFAULTS: dict[str, Any] = {
    **HETERO_DEFAULTS,
    "fusion": "mode",  # mode (SFedHIFI) | none (HIFI_w/o) | fixed (HIFI_fixed) | random (HIFI_rand)
    "fusion_layer": -1,  # HIFI_fixed: index among the factorized layers (-1: the last, the authors' choice)
    "fusion_every": 1,  # fuse every k-th round (the authors' --merger_epoch)
    "fusion_until": None,  # last round with fusion (the authors' --tucker_epochs); null: every round
    "tucker_view": "matrix",  # matrix: M's first mode × the rest (authors' code) | tensor: M's 3 modes
    "tucker_ranks": "min",  # Eq. 10's fixed ranks, one core shape: min | a fraction (authors 0.25) | a list | per_width
    "rate_data": "test",  # test | train: where the server's firing-rate batch comes from
    "rate_samples": 256,
    "rate_source": "output",  # output (Eq. 7) | input (the authors' code)
    "weighting": "uniform",  # uniform (Eq. 5-6) | samples (n_k)
    "share_banks": True,  # Eq. 5; false keeps B within each width too (a check of what B sharing adds)
}
SFEDHIFI_CHECKS = {
    **HETERO_CHECKS,
    "fusion": choice(FUSIONS),
    "fusion_layer": number(integer=True),
    "fusion_every": number(1, integer=True),
    "fusion_until": number(1, integer=True, nullable=True),
    "tucker_view": choice(("matrix", "tensor")),
    "tucker_ranks": _ranks,
    "rate_data": choice(("test", "train")),
    "rate_samples": number(1, integer=True),
    "rate_source": choice(("output", "input")),
    "weighting": weighting_check,
    "share_banks": boolean,
}


def factorized_layers(model_name: str) -> list[int]:
    """Indices (in the topology) of the factorized conv layers of a zoo model."""
    from neurofed.models.spec import ZOO

    return [i for i, layer in enumerate(ZOO[model_name](1.0, 2)) if layer.options.get("block") == "factorized_conv"]


class HeteroConfig:
    """The cross-key checks every heterogeneous-width algorithm shares."""

    needs_banks = False

    @classmethod
    def validate_config(cls, algo_cfg: dict, cfg: dict) -> list[str]:
        problems = super().validate_config(algo_cfg, cfg)
        if problems:
            return problems
        a, fed, part, model = algo_cfg, cfg["federation"], cfg["partition"], cfg["model"]
        widths = [float(w) for w in a["widths"]]
        if float(model["width"]) not in widths:
            problems.append(f"model.width: got {model['width']!r}; with {cls.name} it names the global model that is "
                            f"exported and measured, so it must be one of algorithm.widths {a['widths']}")
        if a["selection"] == "cover_widths" and fed["clients_per_round"] < len(widths):
            problems.append(f"federation.clients_per_round: got {fed['clients_per_round']}; with selection "
                            f"cover_widths every width must be among each round's clients, so at least "
                            f"len(algorithm.widths) = {len(widths)}")
        if a["assign"] == "fixed":
            cw = a["client_widths"]
            if cw is None and part["num_clients"] < len(widths):
                problems.append(f"partition.num_clients: got {part['num_clients']}; assign fixed needs a client for "
                                f"each of the {len(widths)} widths")
            if cw is not None:
                if len(cw) != part["num_clients"]:
                    problems.append(f"algorithm.client_widths: got {len(cw)} widths; expected one per client "
                                    f"(partition.num_clients = {part['num_clients']})")
                elif any(float(w) not in widths for w in cw) or {float(w) for w in cw} != set(widths):
                    problems.append(f"algorithm.client_widths: every value must be one of algorithm.widths "
                                    f"{a['widths']}, and every width must have a client")
        elif a["client_widths"] is not None:
            problems.append("algorithm.client_widths: only used with algorithm.assign: fixed; set it to null")
        if cls.needs_banks:
            if not factorized_layers(model["name"]):
                problems.append(f"model.name: got {model['name']!r}; {cls.name} shares filter banks, so it needs a "
                                f"model with factorized convolutions (hifi_cnn)")
            if model["kind"] != "snn":
                problems.append(f"model.kind: got {model['kind']!r}; {cls.name} measures firing rates and shares "
                                f"the banks of the spiking model; use snn")
        return problems
