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

- ``false``: float weights throughout (the papers'); export rounds them, unseen in training;
- ``true``: SLAYER's 8-bit hook from the first round (as before);
- an integer R >= 1: float weights up to round R-1, then every forward pass, in the
  clients' training and the server's evaluation, uses :func:`quantize_export`'s weights
  (fake quantization). R = 1 is QAT from the start;
- ``"last K"`` or ``"last P%"``: the same over the run's last K rounds, or the last P % of
  ``federation.rounds`` (at least one round), so a preset's QAT follows a reduced
  ``--set federation.rounds=...``; the paper presets' default is ``last 20%``.

The parameters stay float (the server averages them); what the network computes from round
R is exactly what export writes, so the global model's torch accuracy from round R is its
8-bit accuracy.
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
        set_weight_hook(model, quantize_export if rnd >= start else None)
    return model
