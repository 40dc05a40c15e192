"""Quantization-aware training onto the 8-bit grid ``neurofed export`` writes (``model.quantize: R``).

The exported network is 8-bit: netx stores a mixed-sign weight matrix as 8-bit signed
mantissas in SLAYER's integer units of 2 (-256 .. 254, lava-dl 0.6
``netx.utils.optimize_weight_bits``, which clips beyond), so a weight w runs on Lava as
``clamp(round(64 w / 2) * 2, -256, 254) / 64``. :func:`quantize_export` is that map as a
SLAYER weight hook: SLAYER's own quantizer (``slayer.utils.quantize_hook_fx``) with the
range netx holds (its ``num_bits`` 7: ±2·2^7 in steps of 2), straight-through gradient
inside the range. SLAYER's 8-bit hook (``model.quantize: true``, :func:`quantize_8bit`)
rounds alike but clamps at -512 .. 510, which export refuses beyond 254.

``model.quantize``:

- ``false``: float weights throughout (the papers'); export rounds them, unseen in training,
  each layer on its own exponent's grid (below);
- ``true``: SLAYER's 8-bit hook from the first round (as before);
- an integer R >= 1: float weights up to round R-1, then every forward pass, in the
  clients' training and the server's evaluation, uses export's weights (fake quantization,
  each layer on its exponent's grid, :class:`ExportGrid`). R = 1 is QAT from the start;
- ``"last K"`` or ``"last P%"``: the same over the run's last K rounds, or the last P % of
  ``federation.rounds`` (at least one round), so QAT follows a reduced
  ``--set federation.rounds=...``. The paper presets train float weights (``false``), as the papers.

The parameters stay float (the server averages them); what the network computes from round
R is exactly what export writes, so the global model's torch accuracy from round R is its
8-bit accuracy.

**Per-layer exponents** (Loihi's weight exponent, the state scaling graded input already uses).
One grid of steps 2/64 up to ±4 for every layer wastes most of its 8 bits: trained float
layers hold weights of 0.05 to 0.6, and 5-35 % of them round to zero. A layer whose neuron
state runs 2^k finer (its threshold mantissa and bias x 2^k on the chip, SLAYER's ``s_scale``
x 2^k in torch) computes exactly the same spikes as one with weights 2^k larger, so layer j's
weights go on the grid of steps 2/(64 * 2^k_j): :class:`ExportGrid`. :func:`layer_exponent`
takes the largest k (at most :data:`MAX_EXPONENT`) for which the weights still fit the 8 bits
and the threshold, bias and worst-case state fit Lava's registers; a layer whose weights pass
the grid gets a negative k (a coarser grid instead of clipped weights). Export of a float or
QAT model (:mod:`neurofed.deploy.deployable`) and every QAT round (:func:`for_round`) choose
the exponents from the weights they quantize, with this one function; ``model.quantize: true``
keeps SLAYER's one grid (the weights it trained are already on it).
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from neurofed.compat import slayer  # called where needed: config validation imports this module

SCALE = 1 << 6  # SLAYER's weight units per 1.0 (export's integer weights are 64 w)
EXPORT_NUM_BITS = 7  # SLAYER's num_bits whose range is netx's -256 .. 254 (steps of 2)



def quantize_8bit(x: torch.Tensor, descale: bool = False) -> torch.Tensor:
    """SLAYER's 8-bit weight quantization hook (``model.quantize: true``; weights as they run
    on Loihi). A module-level function, not a lambda, so models pickle across processes."""
    return slayer().utils.quantize_hook_fx(x, scale=1 << 6, num_bits=8, descale=descale)

def quantize_export(x: torch.Tensor, descale: bool = False) -> torch.Tensor:
    """``x`` on export's 8-bit grid: multiples of 2/64 in [-4, 254/64] (integers -256 .. 254
    with ``descale``). A module-level function, so models pickle across processes."""
    return slayer().utils.quantize_hook_fx(x, scale=SCALE, num_bits=EXPORT_NUM_BITS, descale=descale)


# Lava's registers (lava/proc/lif/process.py, lava-nc 0.10) and SLAYER CUBA's state units
STATE_SCALE = 1 << 12  # SLAYER CUBA's s_scale: state units per 1.0 (Lava: weight units << act_shift 6)
STATE_BOUND = (1 << 23) / STATE_SCALE  # a 24-bit Lava state, in SLAYER units, at exponent 0
MAX_THRESHOLD_MANTISSA = (1 << 17) - 1  # vth: unsigned 17 bits
MAX_BIAS_MANTISSA = (1 << 12) - 1  # bias_mant: signed 13 bits
GRID_TOP = 254 / SCALE  # export's largest weight (netx's -256 .. 254, SLAYER units)
MAX_EXPONENT = 6  # 2^6 finer: a 0.06 weight uses the grid's full 8 bits
MIN_EXPONENT = -2  # weights up to 4 x the grid's range before they clip
READOUT_STEPS = 32  # the voltage readout sums its current over a sample (up to this many steps)
GRADED_INPUT_BITS = 6  # fractional bits of direct input sent as graded spikes (neurofed.deploy.lava_plan)


class ExportGrid:
    """Export's 8-bit grid for a layer whose state runs 2^``exponent`` finer: ``x`` on steps
    of 2/(64 * 2^exponent) up to ±4/2^exponent; with ``descale`` the integers netx writes
    (-256 .. 254, the weights of the scaled layer). Picklable (clients and Lava workers)."""

    def __init__(self, exponent: int = 0):
        self.exponent = int(exponent)

    def __call__(self, x: torch.Tensor, descale: bool = False) -> torch.Tensor:
        if self.exponent == 0:
            return quantize_export(x, descale)
        scale = 2.0 ** self.exponent
        q = quantize_export(x * scale, descale)  # straight-through: d/dx (q(s x) / s) = 1 inside the range
        return q if descale else q / scale

    def __eq__(self, other) -> bool:
        return isinstance(other, ExportGrid) and other.exponent == self.exponent

    def __hash__(self) -> int:
        return hash((ExportGrid, self.exponent))

    def __repr__(self) -> str:
        return f"ExportGrid({self.exponent})"


def effective_weight(synapse: nn.Module) -> torch.Tensor:
    """The synapse's weight as the forward pass uses it (weight norm recomputed:
    ``.weight`` is stale after ``load_state_dict`` until the next forward)."""
    for hook in synapse._forward_pre_hooks.values():
        if type(hook).__name__ == "WeightNorm":
            return hook.compute_weight(synapse).detach()
    return synapse.weight.detach()


def weight_exponent(synapse: nn.Module) -> int:
    """The exponent of ``synapse``'s grid (0 without :class:`ExportGrid`)."""
    return getattr(synapse.pre_hook_fx, "exponent", 0)


def _scaled(value: int, k: int) -> int | None:
    """``value`` x 2^k as an integer, None when that is not exact."""
    if k >= 0:
        return value << k
    return value >> -k if value % (1 << -k) == 0 else None


def layer_exponent(top: float, worst: float, threshold_mantissa: int | None, bias: torch.Tensor | None,
                   reserve: int = 0) -> int:
    """The largest exponent k in [MIN_EXPONENT, MAX_EXPONENT] with the largest weight ``top``
    (SLAYER units) on the 8-bit grid (``top`` x 2^k <= 254/64) and, in a state 2^(k + reserve)
    finer: the worst-case current ``worst`` within the 24-bit state, the threshold mantissa
    (None: the voltage readout) within 17 bits and the bias (integers, 1/64 units) within 13,
    both exact. ``reserve``: bits the caller scales the state by on top (graded input). Weights
    that fit the grid at k = 0 never get a negative k; where the registers allow no k >= 0, 0."""
    def registers_fit(k: int) -> bool:
        bits = k + reserve
        if worst * 2.0 ** bits > STATE_BOUND:
            return False
        if threshold_mantissa is not None:
            th = _scaled(int(threshold_mantissa), bits)
            if th is None or not 0 < th <= MAX_THRESHOLD_MANTISSA:
                return False
        if bias is not None and bias.numel():  # at netx's bias exponent 6
            b = [_scaled(int(v), bits) for v in (bias.min(), bias.max())]
            if None in b or max(abs(v) for v in b) > MAX_BIAS_MANTISSA or \
                    (bits < 0 and bool((bias % (1 << -bits)).any())):
                return False
        return True

    for k in range(MAX_EXPONENT, -1, -1):
        if top * 2.0 ** k <= GRID_TOP and registers_fit(k):
            return k
    if top <= GRID_TOP:
        return 0  # SLAYER's one grid; a register it passes is the constraint check's to report
    for k in range(-1, MIN_EXPONENT - 1, -1):  # weights past the grid: a coarser one, not clipped
        if top * 2.0 ** k <= GRID_TOP and registers_fit(k):
            return k
    return MIN_EXPONENT if registers_fit(MIN_EXPONENT) else 0


def settle_steps(neuron: nn.Module, steps: int) -> float:
    """Steps over which a constant input's current builds up in ``neuron``: 1 / current decay
    (SLAYER keeps the decay as a fraction of p_scale), at most ``steps``."""
    decay = float(neuron.current_decay) / neuron.p_scale if hasattr(neuron, "current_decay") else 0.0
    return min(steps, 1.0 / decay) if decay > 0 else steps


def block_exponent(block: nn.Module, reserve: int = 0, bias_units: int = SCALE) -> int:
    """:func:`layer_exponent` of a SLAYER block (its synapse, a residual join's shortcut, its
    neuron, the synapse's bias on the 1/``bias_units`` grid)."""
    syn, neuron = block.synapse, block.neuron
    weights = [effective_weight(syn).float()]
    if getattr(block, "shortcut", None) is not None:
        weights.append(effective_weight(block.shortcut).float())
    top = max(float(w.abs().max()) for w in weights)
    rows = [w.reshape(w.shape[0], -1) for w in weights]
    pos = sum(r.clamp(min=0).sum(1) for r in rows)
    neg = sum((-r).clamp(min=0).sum(1) for r in rows)
    if hasattr(block, "shortcut") and block.shortcut is None:  # an identity shortcut: spikes of weight 1
        top, pos = max(top, 1.0), pos + 1.0
    mantissa = int(neuron.v_th_mant)
    readout = mantissa <= 0  # SLAYER's Affine: a neuron that never fires
    settle = READOUT_STEPS if readout else settle_steps(neuron, READOUT_STEPS)
    worst = float(torch.maximum(pos, neg).max()) * settle
    bias = getattr(syn, "bias", None)
    bias = None if bias is None else torch.round(bias.detach().float() * bias_units).long()
    return layer_exponent(top, worst, None if readout else mantissa, bias, reserve)


def set_state_exponent(neuron: nn.Module, k: int) -> None:
    """``neuron``'s fixed-point state 2^k finer (SLAYER's ``s_scale``), as the chip runs it."""
    neuron.s_scale = int(STATE_SCALE * 2.0 ** k)
    # SLAYER's 0.01 / s_scale vanishes in float32 next to the threshold at finer scales (v ==
    # threshold would fire; Lava fires on v > threshold): half a unit of the scaled state
    neuron.threshold_eps = 0.01 / STATE_SCALE if k == 0 else 0.5 / neuron.s_scale


def set_export_grid(model: nn.Module, on: bool = True, reserve_first: int = 0) -> list[int]:
    """Every block of ``model`` on export's grid with its own exponent (:func:`block_exponent`,
    from its weights now), its neuron's state scaled alike; ``on=False``: float weights and
    SLAYER's state. ``reserve_first``: bits the first spiking layer's state is scaled by on
    top (graded input). Returns the exponents, per block with a synapse and neuron."""
    exponents, first = [], True
    for block in getattr(model, "blocks", []):
        syn, neuron = getattr(block, "synapse", None), getattr(block, "neuron", None)
        if syn is None or neuron is None:
            continue
        k = block_exponent(block, reserve_first if first else 0) if on else 0
        first = False
        for s in (syn, getattr(block, "shortcut", None)):
            if s is not None:
                s.pre_hook_fx = ExportGrid(k) if on else None
        set_state_exponent(neuron, k)
        exponents.append(k)
    return exponents


_LAST = re.compile(r"last\s+(\d+)\s*(%?)")


def _last_rounds(v) -> tuple[int, bool] | None:
    """``"last K"`` -> (K, False), ``"last P%"`` -> (P, True); None for anything else."""
    match = _LAST.fullmatch(v.strip()) if isinstance(v, str) else None
    if match is None:
        return None
    count, percent = int(match.group(1)), bool(match.group(2))
    return (count, percent) if count >= 1 and (not percent or count <= 100) else None


def quantize_value(v):
    """Validator of ``model.quantize``: true, false, the first QAT round R >= 1, or the last
    rounds (``"last K"``, ``"last P%"``)."""
    if isinstance(v, bool) or (isinstance(v, int) and v >= 1) or _last_rounds(v) is not None:
        return None
    return "allowed: true (SLAYER's 8-bit hook), false (float), a round R >= 1 (float, then " \
           "quantization-aware training on export's 8-bit grid from round R), or 'last K' / 'last P%' (that " \
           "training over the run's last K rounds / last P % of federation.rounds)"


def qat_round(quantize, rounds: int) -> int | None:
    """The first round of quantization-aware training in a run of ``rounds`` rounds (None:
    ``quantize`` is a switch, true or false)."""
    if isinstance(quantize, bool):
        return None
    last = _last_rounds(quantize)
    if last is None:
        return int(quantize)
    count, percent = last
    if percent:
        count = max(1, math.ceil(rounds * count / 100))
    return max(1, int(rounds) - count + 1)


def build_hook(model_cfg: dict):
    """The weight hook a model is built with: SLAYER's 8-bit hook for ``true``, export's grid
    for a QAT round (a fresh copy for export or Lava is the trained, quantized model), none
    for ``false``."""

    q = model_cfg.get("quantize", True)
    return None if q is False else quantize_8bit if q is True else quantize_export


def synapses(model: nn.Module) -> list[nn.Module]:
    """Every SLAYER synapse of ``model`` (blocks', residual shortcuts', factorized ones)."""
    return [m for m in model.modules() if isinstance(m, slayer().synapse.layer.GenericLayer)]


def set_weight_hook(model: nn.Module, hook) -> nn.Module:
    """Give every synapse of ``model`` the weight hook ``hook`` (None: float weights)."""
    for syn in synapses(model):
        syn.pre_hook_fx = hook
    return model


def for_round(model: nn.Module, rnd: int | None, rounds: int) -> nn.Module:
    """``model`` as round ``rnd`` of a ``rounds``-round run trains and evaluates it: with QAT
    (``model.quantize: R`` or ``last ...``), float weights before its first round and export's
    grid from it on; otherwise (or ``rnd`` None) as built."""
    start = qat_round(getattr(model, "model_cfg", {}).get("quantize", True), rounds)
    if start is not None and rnd is not None:
        set_export_grid(model, on=rnd >= start, reserve_first=first_layer_reserve())
    return model


def first_layer_reserve() -> int:
    """Bits the chip may scale the first spiking layer's state by on top of its exponent:
    graded input's (:mod:`neurofed.deploy.lava_plan`), reserved whatever the encoding, so
    training and export choose the same exponents without knowing the data."""
    return GRADED_INPUT_BITS
