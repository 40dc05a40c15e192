"""Data-driven initialization: every spiking layer fires from the first step.

SLAYER's default initialization leaves deep networks silent on many inputs: each layer's
weights are drawn for unit-variance activations, but a spiking layer passes on only what
crosses its threshold, so the rate falls layer by layer, and SLAYER's surrogate gradient
(exponential in the distance to threshold) vanishes far below it. A silent output layer
gives equal logits and a loss of ln(K) that never moves.

``model.init: firing`` rescales each layer's weights, in order from the input, on one
batch of training samples encoded as in training, so that its firing rate (spikes per
neuron per step, over the batch) lies in ``model.init_rates`` = [lo, hi]: the gain is
found by bisection in log space (rates rise with the gain) and aims at the band's
geometric middle. This is layer-sequential calibration on data as LSUV does for ANNs
(Mishkin & Matas, "All you need is a good init", ICLR 2016: scale layer by layer until
the output statistics on a batch hit a target) applied to firing rates, the quantity
that the data-based weight normalization of converted SNNs balances (Diehl et al.,
"Fast-classifying, high-accuracy spiking deep networks through weight and threshold
balancing", IJCNN 2015; Rueckauer et al., Front. Neurosci. 11:682, 2017).

What changes: one positive factor per layer on its trainable synaptic weights (the
per-width factor ``mix`` of a factorized convolution, ``weight_g`` under weight norm).
The architecture, thresholds, decays and pools are the paper's; the weights stay the
synapse's weights, so 8-bit training and netx export are unchanged (the factor is
applied before SLAYER's 8-bit quantization hook, which keeps every weight on the 8-bit
grid). Fixed-weight layers (pools) are not scaled: a trainable layer followed by pools is
calibrated on the rate of the last of those pools, so that spikes pass through them. A
residual join scales its main and shortcut synapses by the same factor.
With ``model.norm: batch`` a normed layer's norm sets its current to mean 0, std 1 whatever
its weights' scale (it would undo a gain), so only the layers without a norm (the output
layer) are scaled; the normed ones run on the batch's own statistics, as the first training
step runs them (:func:`as_training_starts`), and their running statistics are left as built.
A layer that reads out its voltage (``model.readout: voltage``) has no rate: it is scaled,
as LSUV scales every layer, so that the logits it gives have unit standard deviation on
the batch (``READOUT_STD``; the logits are linear in its weights, so one factor is exact).
SLAYER's initialization left them at a std of 0.05 (S-VGG9, T = 20, logits U_L^T / T), so
small that SGD spent its first rounds at a loss of ln K.
"""

from __future__ import annotations

import math

import torch

from neurofed.models.norm import ChannelBatchNorm, as_training_starts

INIT_MODES = ("slayer", "firing")
ANN_INIT_MODES = ("torch", "lsuv")
READOUT_STD = 1.0  # a voltage readout's logit std on the calibration batch (LSUV's unit variance)
GAIN_RANGE = (2.0 ** -6, 2.0 ** 10)  # the bisection's bounds on one layer's factor
STEPS = 14  # bisection steps at most; it stops as soon as the rate is in the band


def _scaled_parameters(block) -> list[torch.nn.Parameter]:
    """The trainable parameters whose common factor is the layer's gain."""
    params = []
    for module in block.modules():
        for name in ("mix", "weight_g", "weight"):  # the first a synapse has
            p = getattr(module, "_parameters", {}).get(name)
            if p is not None:
                if p.requires_grad:
                    params.append(p)
                break
    return params


def _rate(spikes: torch.Tensor) -> float:
    return float(spikes.float().mean())


def _bisect_gain(rate_at, lo: float, hi: float) -> float:
    """The gain (log-bisection in GAIN_RANGE) whose rate lies in [lo, hi], else the one
    closest to the band's geometric middle; ``rate_at(gain)`` sets it and measures."""
    target = math.sqrt(lo * hi)
    a, b = math.log(GAIN_RANGE[0]), math.log(GAIN_RANGE[1])
    best = (math.inf, 0.0)
    for _ in range(STEPS):
        mid = (a + b) / 2
        r = rate_at(math.exp(mid))
        if lo <= r <= hi:  # in the band: done (the middle is only the aim)
            return math.exp(mid)
        best = min(best, (abs(math.log(max(r, 1e-9) / target)), mid))
        a, b = (mid, b) if r < target else (a, mid)
    return math.exp(best[1])


@torch.no_grad()
def calibrate_firing(model, x: torch.Tensor, rates: tuple[float, float]) -> list[dict]:
    """Scale ``model``'s layers in place so each fires within ``rates`` on input ``x``
    ((N, C, H, W, T), encoded). Returns one record per trainable layer: its index, the
    layer its rate was measured at (itself, or the last of the pools after it), that rate
    before and after, and the gain applied (1.0 when none was needed)."""
    lo, hi = rates
    layers = model.layers
    record = []
    with as_training_starts(model):
        h, i = x, 0  # the input of layer i under the layers calibrated so far
        while i < len(layers):
            group = [i]  # a trainable layer and the fixed-weight pools right after it
            while layers[i].kind != "pool" and group[-1] + 1 < len(layers) and layers[group[-1] + 1].kind == "pool":
                group.append(group[-1] + 1)
            params = _scaled_parameters(model.blocks[i])
            if isinstance(getattr(model.blocks[i], "norm", None), ChannelBatchNorm):
                out = _run(model, group, h)
                record.append({"layer": i, "kind": layers[i].kind, "measured_at": group[-1], "gain": 1.0,
                               "normed": True, "rate_after": _rate(out) if layers[group[-1]].has_neurons else None})
            elif params and model.is_voltage_layer(i):
                before = float(model.readout(_run(model, group, h)).std())
                gain = READOUT_STD / before if before > 0 else 1.0
                for p in params:
                    p.mul_(gain)
                out = _run(model, group, h)
                record.append({"layer": i, "kind": layers[i].kind, "measured_at": group[-1], "gain": gain,
                               "logit_std_before": before, "logit_std_after": float(model.readout(out).std())})
            elif params and layers[group[-1]].has_neurons:
                base = [p.detach().clone() for p in params]

                def run_at(gain: float) -> torch.Tensor:
                    for p, b in zip(params, base):
                        p.copy_(b * gain)
                    return _run(model, group, h)

                before = _rate(run_at(1.0))
                gain = 1.0 if lo <= before <= hi else _bisect_gain(lambda g: _rate(run_at(g)), lo, hi)
                out = run_at(gain)  # the calibrated output is the next layer's input: run once
                record.append({"layer": i, "kind": layers[i].kind, "measured_at": group[-1], "gain": gain,
                               "rate_before": before, "rate_after": _rate(out)})
            else:
                out = _run(model, group, h)
            h = out
            i = group[-1] + 1
    return record


def _run(model, indices: list[int], h: torch.Tensor) -> torch.Tensor:
    for j in indices:
        h = model.run_block(j, h)
    return h


def calibration_indices(cfg: dict, num_train: int) -> tuple[torch.Tensor, torch.Generator]:
    """The ``model.init_samples`` training samples the calibration (and the run's start-up
    health check) use, drawn from the run's seed, and the generator after the draw."""
    from neurofed.seeds import seed_for

    gen = torch.Generator().manual_seed(seed_for(cfg["seed"], "init_batch"))
    n = min(int(cfg["model"].get("init_samples", 64)), num_train)
    return torch.randperm(num_train, generator=gen)[:n], gen


def calibration_batch(model, cfg: dict, x_train: torch.Tensor) -> torch.Tensor:
    """The calibration samples, encoded from the run's seed (the same batch in process
    and on a Flower ServerApp, which loads the same data)."""
    from neurofed.data.encoding import encode_for

    idx, gen = calibration_indices(cfg, len(x_train))
    return encode_for(model, x_train[idx], cfg["data"], gen)


def calibrates(cfg: dict) -> bool:
    """Whether ``cfg``'s model is calibrated on data when built: an SNN under ``init: firing``,
    an ANN twin under ``ann_init: lsuv``."""
    m = cfg["model"]
    if m.get("kind", "snn") == "ann":
        return m.get("ann_init", "torch") == "lsuv"
    return m.get("init", "slayer") == "firing"


def initialize(model, cfg: dict, x_train: torch.Tensor) -> list[dict] | None:
    """Apply ``model.init`` (an SNN) or ``model.ann_init`` (its ANN twin) to a freshly built
    model; the calibration record, or None (SLAYER's or PyTorch's initialization)."""
    if not calibrates(cfg):
        return None
    if getattr(model, "kind", "snn") == "ann":
        return calibrate_unit_std(model, calibration_batch(model, cfg, x_train))
    lo, hi = cfg["model"].get("init_rates", (0.02, 0.2))
    return calibrate_firing(model, calibration_batch(model, cfg, x_train), (float(lo), float(hi)))


@torch.no_grad()
def calibrate_unit_std(model, x: torch.Tensor) -> list[dict]:
    """LSUV's scaling step on the ANN twin (Mishkin & Matas 2016, the method
    :func:`calibrate_firing` carries over to firing rates): each convolution and linear layer,
    in order from the input, has its weight and bias multiplied by one factor so that its output
    has unit standard deviation on ``x`` (the last layer's output is the logits, as
    ``READOUT_STD`` sets a voltage readout's). PyTorch's default initialization (uniform,
    gain 1/√3 of He's) shrinks the signal through every ReLU layer, so a deep twin under plain
    SGD spends its first epochs at chance where the calibrated SNN beside it learns. A layer
    followed by a norm is left as built (the norm undoes any factor), and so is a residual
    join (the presets that have them norm every join). Returns one record per scaled layer."""
    from torch import nn

    from neurofed.models.residual import AnnResidualJoin

    targets = []
    for i, parts in enumerate(model.parts):
        if any(isinstance(m, AnnResidualJoin) for m in parts):
            continue
        for j, m in enumerate(parts):
            normed = any(isinstance(n, ChannelBatchNorm) for n in parts[j + 1:])
            if isinstance(m, (nn.Conv2d, nn.Linear)) and not normed:
                targets.append((i, m))
    record = []
    with as_training_starts(model):
        for i, module in targets:
            seen = []
            hook = module.register_forward_hook(lambda _m, _inp, out: seen.append(out))
            try:
                model(x)
            finally:
                hook.remove()
            before = float(seen[0].std())
            gain = READOUT_STD / before if before > 0 else 1.0
            module.weight.mul_(gain)
            if module.bias is not None:
                module.bias.mul_(gain)
            record.append({"layer": i, "kind": model.layers[i].kind, "gain": gain, "std_before": before})
    return record
