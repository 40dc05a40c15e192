"""Named round policies that papers add to the plain round: which selected clients
reply (FedSNN's stragglers), the per-round learning rate (FedSNN's milestones) and
noise on the uploaded update (FedSNN's gradient-noise study). Each is a pure
function of the config, the round and the run seed, so every transport draws the same.
"""

from __future__ import annotations

import numpy as np

from neurofed.seeds import rng_for, seed_for


def survivors(cfg: dict, rnd: int, chosen: list[int]) -> list[int]:
    """The clients of ``chosen`` that reply in round ``rnd``: FedSNN's straggler rule
    (Venkatesha et al. 2021, Sec. IV-D). Of the P selected clients one, drawn uniformly,
    always replies; each of the other P − 1 drops with probability
    q = ``federation.straggler_prob``. E[survivors] = 1 + (P − 1)(1 − q)."""
    q = cfg["federation"]["straggler_prob"]
    if q <= 0 or not chosen:
        return list(chosen)
    rng = rng_for(cfg["seed"], "straggler", rnd)
    keep = rng.random(len(chosen)) >= q
    keep[rng.integers(len(chosen))] = True  # the guaranteed reply
    return [c for c, k in zip(chosen, keep) if k]


def round_lr(fed: dict, rnd: int) -> float:
    """The learning rate of round ``rnd`` (1-based): lr · lr_decay^(r−1) · lr_gamma^k,
    k = the number of ``federation.lr_milestones`` m with m < r.

    ``lr_decay`` is an exponential decay per round; ``lr_milestones``/``lr_gamma`` the step
    schedule (as torch's MultiStepLR, counted in rounds): FedSNN Sec. IV-A reduces its SNN
    lr (0.1, SGD) "by a factor of 5 after 40, 60, and 80 epochs" of its 100 rounds, i.e.
    ``lr_milestones: [40, 60, 80], lr_gamma: 0.2``."""
    steps = sum(1 for m in fed.get("lr_milestones") or () if m < rnd)
    return fed["lr"] * fed.get("lr_decay", 1.0) ** (rnd - 1) * fed.get("lr_gamma", 1.0) ** steps


def update_noise(upload: np.ndarray, global_flat: np.ndarray, spec, fed: dict, round_seed: int) -> np.ndarray:
    """FedSNN's gradient-noise study (Venkatesha et al. 2021, Sec. IV-E, Fig. 8b):
    N(0, 1) · strength added to the uploaded update, seeded from the round's client seed.

    ``federation.update_noise_mode: relative`` (default, the authors' code): per tensor
    the strength s = ``federation.update_noise`` is scaled by the mean magnitude of this
    client's update of that tensor, noise_t = N(0, 1) · s · mean|w_t − w_t^global|
    (Fig. 8b's strengths 0…4); ``absolute``: noise = N(0, 1) · s on every value.

    ``upload`` and ``global_flat``: flat vectors in ``spec`` order; ``round_seed``: the
    client's fit seed of this round."""
    strength = fed.get("update_noise", 0.0)
    if not strength:
        return upload
    rng = np.random.default_rng(seed_for(round_seed, "update_noise"))
    noise = rng.normal(0.0, 1.0, size=upload.shape) * strength
    if fed.get("update_noise_mode", "relative") == "relative":
        delta = np.abs(upload.astype(np.float64) - global_flat)
        offsets = spec.offsets
        scale = np.add.reduceat(delta, offsets[:-1]) / spec.sizes  # mean |Δ| per tensor
        noise *= np.repeat(scale, spec.sizes)
    return upload + noise.astype(np.float32)
