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
  (fake quantization). R = 1 is QAT from the start; R = rounds - k + 1 the last k rounds.

The parameters stay float (the server averages them); what the network computes from round
R is exactly what export writes, so the global model's torch accuracy from round R is its
8-bit accuracy.
"""

from __future__ import annotations

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


def quantize_value(v):
    """Validator of ``model.quantize``: true, false or the first QAT round R >= 1."""
    if isinstance(v, bool) or (isinstance(v, int) and v >= 1):
        return None
    return f"got {v!r}; allowed: true (SLAYER's 8-bit hook), false (float), or a round R >= 1 (float, then " \
           f"quantization-aware training on export's 8-bit grid from round R)"


def qat_round(model_cfg: dict) -> int | None:
    """The first round of quantization-aware training (None: ``model.quantize`` is a switch)."""
    q = model_cfg.get("quantize", True)
    return None if isinstance(q, bool) else int(q)


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


def for_round(model: nn.Module, rnd: int | None) -> nn.Module:
    """``model`` as round ``rnd`` trains and evaluates it: with ``model.quantize: R``, float
    weights before round R and export's grid from R on; otherwise (or ``rnd`` None) as built."""
    start = qat_round(getattr(model, "model_cfg", {}))
    if start is not None and rnd is not None:
        set_weight_hook(model, quantize_export if rnd >= start else None)
    return model
