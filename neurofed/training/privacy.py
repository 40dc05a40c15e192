"""Local differential privacy of what a client sends, and its ε accounting.

Noise source (``federation.privacy_noise``):

- ``os_entropy`` (default): uniforms from ``os.urandom`` (the operating system's
  cryptographic generator), turned into Laplace / Gaussian draws by inverse CDF /
  Box–Muller. Nothing the server holds (config, seeds, earlier rounds) predicts them,
  so the server cannot subtract the noise. A resumed run draws new noise, so it is
  not bit-identical to an uninterrupted one.
- ``seeded_not_private``: numpy generators seeded from the round's client seed, which
  the server computes and ``config.yaml`` stores. Reproducible (resume stays exact),
  and **no privacy at all**: the server can regenerate the noise and remove it.

Update mechanism (``federation.ldp_laplace`` = b, ``federation.ldp_clip`` = C): the
client's update Δ = y − x (y its trained parameters, x the global model it received)
is clipped to L1 norm C, Δ ← Δ · min(1, C/‖Δ‖₁), and it uploads x + Δ + Laplace(0, b)
per value (computed in float64, rounded to float32 after the noise). Neighbouring
inputs are *any two local datasets of one client* (local DP: Kasiviswanathan et al.,
"What can we learn privately?", SIAM J. Comput. 2011; Duchi, Jordan & Wainwright,
FOCS 2013). Two clipped updates differ by at most 2C in L1 (triangle inequality),
so the L1 sensitivity is 2C and the Laplace mechanism gives ε = 2C / b per upload
(Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", 2014,
Thm 3.6). (C alone would hold for add/remove-one-client neighbours in central DP,
where an absent client contributes 0; that is not the local setting here.)
``ldp_clip: null`` is FedLEC's Eq. 16 (Yu et al. 2025): noise of scale b on the
unclipped parameters, with no bound on the sensitivity — ε is reported as unbounded.

Composition: a client that uploads in k rounds has spent k·ε (basic sequential
composition, Dwork & Roth 2014, Thm 3.16; for (ε, δ) mechanisms ε and δ both add).
The run reports the largest total over clients. Several mechanisms in one round
(SFedCA's firing-rate report beside the update) add the same way.
"""

from __future__ import annotations

import math
import os

import numpy as np

from neurofed.seeds import rng_for

OS_ENTROPY = "os_entropy"
SEEDED = "seeded_not_private"
NOISE_SOURCES = (OS_ENTROPY, SEEDED)
COMPOSITION = "basic sequential composition (Dwork & Roth 2014, Thm 3.16): per-client epsilons (and deltas) add"
NEIGHBOURS = "local DP: any two local datasets of one client"


def _os_uniform(n: int) -> np.ndarray:
    """n uniforms in the open interval (0, 1), 53 random bits each, from os.urandom."""
    bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * 2.0 ** -53


class Noise:
    """Laplace and Gaussian draws from the configured source (see the module docstring)."""

    def __init__(self, source: str, seed: int, stream: str, *keys: int):
        if source not in NOISE_SOURCES:
            raise ValueError(f"federation.privacy_noise: got {source!r}; allowed: {', '.join(NOISE_SOURCES)}")
        self.rng = rng_for(seed, stream, *keys) if source == SEEDED else None

    def laplace(self, scale: float, shape) -> np.ndarray:
        if self.rng is not None:
            return self.rng.laplace(0.0, scale, size=shape)
        u = _os_uniform(int(np.prod(shape))).reshape(shape) - 0.5  # (−½, ½)
        return -scale * np.sign(u) * np.log1p(-2.0 * np.abs(u))

    def normal(self, scale: float, shape) -> np.ndarray:
        if self.rng is not None:
            return self.rng.normal(0.0, scale, size=shape)
        n = int(np.prod(shape))
        u1, u2 = _os_uniform(n), _os_uniform(n)
        return (scale * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).reshape(shape)


def clip_l1(delta: np.ndarray, bound: float) -> np.ndarray:
    """``delta`` scaled to L1 norm at most ``bound`` (float64)."""
    delta = np.asarray(delta, dtype=np.float64)
    norm = float(np.abs(delta).sum())
    return delta * (bound / norm) if norm > bound else delta


def privatize_update(upload: np.ndarray, reference: np.ndarray, fed: dict, noise: Noise) -> np.ndarray:
    """x + clip(y − x) + Laplace(0, b): the only form of y that leaves a client
    (``fed`` = the federation config; unchanged when ``ldp_laplace`` is 0)."""
    b = fed.get("ldp_laplace", 0.0)
    if not b:
        return upload
    x = np.asarray(reference, dtype=np.float64)
    y = np.asarray(upload, dtype=np.float64)
    clip = fed.get("ldp_clip")
    delta = y - x if clip is None else clip_l1(y - x, clip)
    return (x + delta + noise.laplace(b, y.shape)).astype(np.float32)


def laplace_epsilon(scale: float, clip: float | None) -> float | None:
    """ε of one upload: L1 sensitivity 2C over the Laplace scale b; None when unbounded."""
    return None if clip is None else 2.0 * clip / scale


def gaussian_epsilon(sigma: float, sensitivity: float, delta: float) -> float:
    """The smallest ε for which the Gaussian mechanism (L2 sensitivity Δ, noise σ) is
    (ε, δ)-DP, from the exact condition of Balle & Wang ("Improving the Gaussian
    mechanism for differential privacy: analytical calibration and optimal denoising",
    ICML 2018, Thm 8):  Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) ≤ δ; found by bisection."""
    def phi(t):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))

    def excess(eps):
        a, c = sensitivity / (2 * sigma), eps * sigma / sensitivity
        return phi(a - c) - math.exp(eps) * phi(-a - c) - delta

    if excess(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return hi


# --------------------------------------------------------------------------- accounting


def mechanisms(cfg: dict, num_classes: int, algorithm=None) -> list[dict]:
    """What each uploading client releases per round, with its guarantee:
    ``{"release", "mechanism", "epsilon" (None: unbounded), "delta", ...}``; empty
    when no privacy noise is configured at all. ``algorithm`` (the run's
    :class:`~neurofed.algorithms.base.Algorithm` class) adds what its clients release
    besides the update (``privacy_mechanisms``, e.g. SFedCA's firing-rate reports)."""
    fed = cfg["federation"]
    b = fed.get("ldp_laplace", 0.0)
    clip = fed.get("ldp_clip")
    if b:
        update = {"release": "model update", "mechanism": "laplace", "scale": b, "clip_l1": clip,
                  "sensitivity_l1": None if clip is None else 2.0 * clip,
                  "epsilon": laplace_epsilon(b, clip), "delta": 0.0}
    else:  # the update leaves in the clear
        update = {"release": "model update", "mechanism": "none", "epsilon": None, "delta": 0.0}
    out = [update] + (algorithm.privacy_mechanisms(cfg, num_classes) if algorithm is not None else [])
    return out if any(m["mechanism"] != "none" for m in out) else []


def _round_cost(mechs: list[dict]) -> tuple[float | None, float]:
    if any(m["epsilon"] is None for m in mechs):
        return None, sum(m["delta"] for m in mechs)
    return sum(m["epsilon"] for m in mechs), sum(m["delta"] for m in mechs)


class Accountant:
    """Per-client ε and δ spent so far (uploads counted from the clients that replied)."""

    def __init__(self, cfg: dict, num_classes: int, algorithm=None):
        self.cfg = cfg
        self.mechs = mechanisms(cfg, num_classes, algorithm)
        self.eps, self.delta = _round_cost(self.mechs)
        self.uploads: dict[int, int] = {}

    def replay(self, history: list[dict]) -> None:
        for h in history:
            self.count(h.get("trained", []))

    def count(self, trained: list[int]) -> None:
        for cid in trained:
            self.uploads[int(cid)] = self.uploads.get(int(cid), 0) + 1

    def spent(self) -> tuple[float | None, float, int]:
        k = max(self.uploads.values(), default=0)
        return (None if self.eps is None else self.eps * k), self.delta * k, k

    def record(self, trained: list[int]) -> dict | None:
        """Count this round's uploads; the ``privacy`` entry of its metrics line."""
        self.count(trained)
        if not self.mechs:
            return None
        eps, delta, k = self.spent()
        return {"epsilon_round": self.eps, "delta_round": self.delta, "epsilon_spent": eps, "delta_spent": delta,
                "max_uploads_per_client": k}

    def summary(self) -> dict:
        noise = self.cfg["federation"].get("privacy_noise", OS_ENTROPY)
        eps, delta, k = self.spent()
        return {
            "noise": noise if self.mechs else None,
            # ε is a guarantee only when the server cannot regenerate the noise and every
            # mechanism has a bounded sensitivity, the model update included
            "private": bool(self.mechs and noise == OS_ENTROPY and eps is not None),
            "mechanisms": self.mechs,
            "epsilon_per_round": self.eps if self.mechs else None,
            "delta_per_round": self.delta if self.mechs else None,
            "epsilon_run": eps if self.mechs else None,
            "delta_run": delta if self.mechs else None,
            "max_uploads_per_client": k,
            "composition": COMPOSITION,
            "neighbouring": NEIGHBOURS,
        }
