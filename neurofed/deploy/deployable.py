"""The network the chip runs, as a torch model: batch norm folded, an analog global pool folded
into the readout, factorized kernels fused, weights on the 8-bit grid.

Export, the Lava graph, the constraint check and the torch reference all read this one model
(:func:`deployable_copy`), so what Lava is compared with is what it runs.

- **Batch norm** (``model.norm: batch``, running statistics): evaluation's
  ``norm(z) = scale * z + shift`` per output channel (:meth:`ChannelBatchNorm.affine`). ``scale``
  multiplies the synapse's weights, which are then quantized like any others; ``shift`` is a
  constant current each step, the synapse's bias, on SLAYER's current grid (1/64). netx and
  Lava hold it as the neuron's bias, which Lava adds to the *voltage*; SLAYER adds the synapse
  bias to the *current*. The two are one when the current decays fully each step
  (``model.current_decay: 1``, as in every SFedHIFI preset); otherwise the model is refused.
- **Residual joins**: the 3×3 synapse's norm and the 1×1 shortcut's fold into their own
  weights; their two shifts sum into the join's one bias.
- **Analog global pool** (``model.global_pool: analog``: the map's mean passed as a value) before
  the voltage readout: the readout reads the map's spikes directly with its weights repeated
  over the H×W positions, i.e. H·W times the pooled current. The voltage readout never leaks
  or fires (``snn.VOLTAGE_NEURON``), so its voltage is H·W times the model's and the prediction
  is the same, with no rounding of the mean (the agreement with the trained model is reported).
- **Factorized convolutions** (SFedHIFI Eq. 4) export as the plain convolution of their fused
  kernel (as netx loads them already).
- **Per-layer exponents**: a model trained with float weights or QAT (``model.quantize`` false,
  R or ``last ...``) goes on export's grid layer by layer, each layer's weights on steps
  2/(64 * 2^k) with its neuron's state 2^k finer (:func:`neurofed.models.quantize.set_export_grid`;
  the netx entries carry threshold and bias x 2^k). ``model.quantize: true`` keeps SLAYER's
  one grid, on which it trained.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from neurofed.deploy import DeployError

CURRENT_SCALE = 64  # SLAYER's current units per 1.0 (its neurons' s_scale): the bias's grid
FACTORIZED_OPTIONS = ("block", "full_in", "full_out", "bank_fraction", "group_fraction")


def fresh_copy(model: nn.Module) -> nn.Module:
    """A new model with ``model``'s parameters and buffers and the 8-bit hook on
    (weights leave as they run on Loihi even if training did without the hook)."""
    model_cfg = getattr(model, "model_cfg", None)
    if model_cfg is None:
        raise DeployError(f"{type(model).__name__} has no model_cfg; build it with neurofed.models.build_model")
    quantize = model_cfg.get("quantize") or True  # a QAT model keeps its grid (neurofed.models.quantize)
    copy = type(model)(model.layers, {**model_cfg, "quantize": quantize},
                       logit_scale=getattr(model, "logit_scale", 1.0))
    copy.load_state_dict(model.state_dict())
    return copy.eval()


def _synapse_weight(synapse: nn.Module) -> torch.Tensor:
    from neurofed.models.quantize import effective_weight

    return effective_weight(synapse).float()  # fused for a factorized synapse, weight norm applied


def _norm_affine(norm: nn.Module, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    from neurofed.models.norm import ChannelBatchNorm

    if isinstance(norm, ChannelBatchNorm):
        return norm.affine()
    return torch.ones(channels), torch.zeros(channels)


def _set_weight(synapse: nn.Module, weight: torch.Tensor) -> None:
    if any(type(h).__name__ == "WeightNorm" for h in synapse._forward_pre_hooks.values()):
        synapse.disable_weight_norm()
    with torch.no_grad():
        synapse.weight.data = weight.reshape(synapse.weight.shape).clone()


def _set_bias(synapse: nn.Module, shift: torch.Tensor) -> None:
    """``shift`` as the synapse's bias on SLAYER's current grid (torch adds it to the current)."""
    synapse.bias = nn.Parameter(torch.round(shift.float() * CURRENT_SCALE) / CURRENT_SCALE, requires_grad=False)


def integer_bias(synapse: nn.Module) -> "torch.Tensor | None":
    """The synapse's bias in Lava's input units (the same units as its integer weights)."""
    bias = getattr(synapse, "bias", None)
    return None if bias is None else torch.round(bias.detach() * CURRENT_SCALE).long()


def _refuse_shift_on_leaky_current(model, i: int) -> None:
    decay = float(model.model_cfg.get("current_decay", 1.0))
    if decay != 1.0:
        raise DeployError(f"layer {i} ({model.layers[i].kind}): batch norm's shift is a constant current, which "
                          f"a Lava neuron holds only as a voltage bias; the two agree when the current decays fully "
                          f"each step (model.current_decay: 1), got {decay:g}; train with model.norm: none or "
                          f"model.current_decay: 1")


def _deployable_layers(model) -> tuple[list, int]:
    """The layer list without an analog global pool (and factorized options), and H·W of the
    map that pool averaged (1 without one)."""
    from neurofed.models.snn import AnalogGlobalPool

    layers, expand = [], 1
    for i, (layer, block) in enumerate(zip(model.layers, model.blocks)):
        if isinstance(block, AnalogGlobalPool):
            rest = [l.kind for l in model.layers[i + 1:]]
            if rest != ["flatten", "dense"] or not model.is_voltage_layer(len(model.layers) - 1):
                raise DeployError(f"layer {i} (pool): an analog global pool maps to Lava only before a "
                                  f"flatten and the voltage readout (model.readout: voltage); here it is "
                                  f"followed by {', '.join(rest) or 'nothing'}")
            expand = layer.in_shape[1] * layer.in_shape[2]
            continue
        options = {k: v for k, v in layer.options.items() if k not in FACTORIZED_OPTIONS}
        layers.append(replace(layer, options=options))
    return layers, expand


def has_residual_joins(model) -> bool:
    return any(layer.options.get("residual") == "close" for layer in model.layers)


def deployable_copy(model, bias_on_current_ok: bool = False) -> nn.Module:
    """A new SpikingNet that computes what the exported network computes (see the module
    docstring); ``model`` is untouched. Raises DeployError for what cannot be folded.
    ``bias_on_current_ok``: the target adds a bias to the current as SLAYER does (NIR's
    synapse bias), so batch norm folds for any current decay (Lava's voltage bias needs 1)."""
    from neurofed.models.norm import BNTT_EXPORT_REFUSAL, ChannelBatchNorm, StepBatchNorm
    from neurofed.models.residual import ResidualJoin
    from neurofed.models.snn import AnalogGlobalPool, SpikingNet
    from neurofed.models.spec import resolve

    if getattr(model, "deploy_expand", None) is not None:
        return model  # already one
    if any(isinstance(m, StepBatchNorm) for m in model.modules()):
        raise DeployError(BNTT_EXPORT_REFUSAL)  # before the shape pass below, which runs 2 steps
    src = fresh_copy(model)
    with torch.no_grad():  # SLAYER blocks learn their shapes on the first forward pass
        src(torch.zeros(1, *model.layers[0].in_shape, 2))
    layers, expand = _deployable_layers(src)
    cfg = {**src.model_cfg, "norm": "none", "global_pool": "spikes"}
    out = SpikingNet(resolve([replace(l, in_shape=(), out_shape=()) for l in layers], src.layers[0].in_shape),
                     cfg, logit_scale=src.logit_scale)
    kept = [(i, b) for i, b in enumerate(src.blocks) if not isinstance(b, AnalogGlobalPool)]
    with torch.no_grad():
        out(torch.zeros(1, *model.layers[0].in_shape, 2))
        for (i, block), target in zip(kept, out.blocks):
            if not hasattr(block, "synapse") or block.synapse is None or src.layers[i].kind == "pool":
                target.load_state_dict(block.state_dict())  # pools and flatten: nothing folds
                continue
            channels = block.synapse.out_channels
            scale, shift = _norm_affine(getattr(block, "norm", None), channels)
            weight = _synapse_weight(block.synapse) * scale.view(-1, *([1] * 4))
            if expand > 1 and src.is_voltage_layer(i):  # the readout reads the map the pool averaged
                weight = weight.repeat_interleave(expand, dim=1)
            _set_weight(target.synapse, weight)
            if isinstance(block, ResidualJoin) and block.shortcut is not None:
                s_scale, s_shift = _norm_affine(block.shortcut_norm, channels)
                _set_weight(target.shortcut, _synapse_weight(block.shortcut) * s_scale.view(-1, *([1] * 4)))
                shift = shift + s_shift
            if isinstance(getattr(block, "norm", None), ChannelBatchNorm):
                if not bias_on_current_ok:
                    _refuse_shift_on_leaky_current(src, i)
                _set_bias(target.synapse, shift)
    if model.model_cfg.get("quantize", True) is not True:
        from neurofed.models.quantize import first_layer_reserve, set_export_grid

        set_export_grid(out, reserve_first=first_layer_reserve())
    out.deploy_expand = expand  # the readout's voltage is this many times the model's
    return out.eval()
