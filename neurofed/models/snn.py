"""Spiking networks built from lava-dl SLAYER CUBA blocks, and their ANN twins."""

from __future__ import annotations

import torch
from torch import nn

from neurofed.compat import slayer as _slayer
from neurofed.models.factorized import factorized_conv_block
from neurofed.models.residual import residual_join_block
from neurofed.models.spec import Layer

slayer = _slayer()


def quantize_8bit(x: torch.Tensor, descale: bool = False) -> torch.Tensor:
    """SLAYER's 8-bit weight quantization hook (weights as they run on Loihi).

    A module-level function, not a lambda, so models pickle across processes.
    """
    return slayer.utils.quantize_hook_fx(x, scale=1 << 6, num_bits=8, descale=descale)


def neuron_params(model_cfg: dict) -> dict:
    return {
        "threshold": model_cfg.get("threshold", 1.25),
        "current_decay": model_cfg.get("current_decay", 0.25),
        "voltage_decay": model_cfg.get("voltage_decay", 0.03),
        "tau_grad": model_cfg.get("tau_grad", 0.1),
        "scale_grad": model_cfg.get("scale_grad", 1.0),
        "requires_grad": False,  # decays stay fixed: they are hardware settings, not shared weights
        "shared_param": True,
    }


def _synapse_kwargs(model_cfg: dict) -> dict:
    return {
        "weight_norm": bool(model_cfg.get("weight_norm", False)),
        "pre_hook_fx": quantize_8bit if model_cfg.get("quantize", True) else None,
        "weight_scale": model_cfg.get("weight_scale", 1),
        # SLAYER's one-step delay per block (as every Lava layer adds one step); off: all layers
        # see step t at step t, the papers' T (a net of L blocks otherwise loses L-1 steps)
        "delay_shift": bool(model_cfg.get("delay_shift", True)),
    }


def _conv_block(layer: Layer, params: dict, syn: dict) -> nn.Module:
    return slayer.block.cuba.Conv(
        params, layer.in_shape[0], layer.out, layer.kernel,
        stride=layer.stride, padding=layer.padding, **syn,
    )


def _pool_block(layer: Layer, params: dict, syn: dict) -> nn.Module:
    # Pool weights are fixed by SLAYER; only the hook matters for export fidelity.
    return slayer.block.cuba.Pool(params, layer.kernel, stride=layer.stride, pre_hook_fx=syn["pre_hook_fx"],
                                  delay_shift=syn["delay_shift"])


def _flatten_block(layer: Layer, params: dict, syn: dict) -> nn.Module:
    return slayer.block.cuba.Flatten()


def _dense_block(layer: Layer, params: dict, syn: dict) -> nn.Module:
    return slayer.block.cuba.Dense(params, layer.in_shape[0], layer.out, **syn)


# Keyed by Layer.kind, or by Layer.options["block"] when a layer names its builder. The
# block modules import SLAYER from neurofed.compat, never this module (no import circle).
SNN_BLOCKS = {"conv": _conv_block, "pool": _pool_block, "flatten": _flatten_block, "dense": _dense_block,
              "factorized_conv": factorized_conv_block, "residual_join": residual_join_block}


def _builder(layer: Layer) -> str:
    if layer.options.get("residual") == "close":  # its synapse may be factorized (options["block"])
        return "residual_join"
    return layer.options.get("block", layer.kind)


class SpikingNet(nn.Module):
    """A feed-forward SNN of SLAYER blocks.

    ``forward`` takes (N, C, H, W, T) input (spikes, or analog currents for direct
    encoding) and returns the output layer's spikes (N, K, T). With ``record = True``
    it keeps, per spiking block, the spike count of each sample in
    ``layer_spikes`` (list of (N,) tensors) — what firing-rate selection, the energy
    module and the Lava comparison read.
    """

    kind = "snn"

    def __init__(self, layers: list[Layer], model_cfg: dict, logit_scale: float = 1.0):
        super().__init__()
        self.layers = layers
        self.logit_scale = float(logit_scale)
        self.model_cfg = dict(model_cfg)  # to rebuild a fresh copy (export: never deepcopy SLAYER blocks)
        params = neuron_params(model_cfg)
        syn = _synapse_kwargs(model_cfg)
        self.blocks = nn.ModuleList(SNN_BLOCKS[_builder(layer)](layer, dict(params), syn) for layer in layers)
        dropout = model_cfg.get("dropout", 0.0)
        self.dropout = nn.Dropout(dropout) if dropout else None
        self.record = False
        self.layer_spikes: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layer_spikes = []
        skip = None  # a residual block's input (neurofed.models.residual)
        for layer, block in zip(self.layers, self.blocks):
            role = layer.options.get("residual")
            if role == "open":
                skip = x
            x = block(x, skip) if role == "close" else block(x)
            if self.record and layer.has_neurons:
                self.layer_spikes.append(x.detach().flatten(1).sum(1))
            if self.dropout is not None and self.training and layer.kind != "flatten" and block is not self.blocks[-1]:
                x = self.dropout(x)
        return x

    def readout(self, output: torch.Tensor) -> torch.Tensor:
        """Logits: output spike rate over time, scaled."""
        return output.mean(-1) * self.logit_scale

    def readout_per_step(self, output: torch.Tensor) -> torch.Tensor:
        """Per-time-step logits (N, K, T), for time-step-wise losses such as TET."""
        return output * self.logit_scale

    @property
    def neurons_per_layer(self) -> list[int]:
        return [layer.num_neurons for layer in self.layers if layer.has_neurons]


class AnnNet(nn.Module):
    """The ANN twin: the same topology with ReLU units, fed analog (N, C, H, W) input."""

    kind = "ann"

    def __init__(self, layers: list[Layer], model_cfg: dict, logit_scale: float = 1.0):
        super().__init__()
        if any(layer.options.get("residual") for layer in layers):
            raise ValueError("model.kind: ann is not built for residual models (resnet18); "
                             "their energy report prices the ANN twin's MACs from the layer list")
        self.layers = layers
        mods: list[nn.Module] = []
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            if layer.kind == "conv":
                mods += [nn.Conv2d(layer.in_shape[0], layer.out, layer.kernel, layer.stride, layer.padding), nn.ReLU()]
            elif layer.kind == "pool":
                mods.append(nn.AvgPool2d(layer.kernel, layer.stride))
            elif layer.kind == "flatten":
                mods.append(nn.Flatten())
            elif layer.kind == "dense":
                mods.append(nn.Linear(layer.in_shape[0], layer.out))
                if i != last:
                    mods.append(nn.ReLU())
        self.net = nn.Sequential(*mods)
        dropout = model_cfg.get("dropout", 0.0)
        self.record = False
        self.layer_spikes: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 5:  # (N, C, H, W, T) spike/event input: the ANN sees its time average
            x = x.mean(-1)
        return self.net(x)

    def readout(self, output: torch.Tensor) -> torch.Tensor:
        return output

    def readout_per_step(self, output: torch.Tensor) -> torch.Tensor:
        return output.unsqueeze(-1)
