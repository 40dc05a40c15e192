"""Spiking networks built from lava-dl SLAYER CUBA blocks, and their ANN twins."""

from __future__ import annotations

import torch
from torch import nn

from neurofed.compat import slayer as _slayer
from neurofed.models.factorized import factorized_conv_block
from neurofed.models.norm import ChannelBatchNorm, StepBatchNorm, batch_normed
from neurofed.models.quantize import build_hook, quantize_8bit  # noqa: F401  (quantize_8bit: also read from here)
from neurofed.models.reset_gradient import use_reset_gradient
from neurofed.models.residual import AnnResidualJoin, residual_join_block
from neurofed.models.spec import Layer

slayer = _slayer()


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
        "pre_hook_fx": build_hook(model_cfg),  # model.quantize: neurofed.models.quantize
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


# One step of SLAYER's 8-bit weight grid (quantize_8bit: step 2 / 64), in weight units.
WEIGHT_STEP = 2 / 64


def pool_neuron(params: dict, kind: str, kernel: int) -> tuple[dict, float]:
    """(neuron params, weight) of a pool layer of ``kind`` (``model.pool``).

    - ``sum``: SLAYER's pool: weight 1 into a neuron of the network's own dynamics, which
      fires only once the window's spikes carry its voltage past threshold (at threshold
      >= 1, one spike of a window does not pass at once).
    - ``max``: max pooling of binary spikes, exactly: a spike anywhere in the window fires
      the pool neuron at that step (weight one grid step, threshold half of it, no current
      or voltage memory). FedLEC's and SFedHIFI's max pools.
    - ``avg``: average pooling as a spike rate: an integrate-and-fire pool neuron without
      leak fires once per k*k input spikes of its window (weight one grid step, threshold
      k*k - 1/2 steps, reset to 0). FedSNN's average pool; the rate form of Rueckauer et al.
      2017 (Front. Neurosci. 11:682) for average pools in spiking networks.
    Both of the latter are ordinary SLAYER pool blocks (netx ``pool`` entries with their
    own neuron), so they export to Lava like ``sum``.
    """
    if kind == "sum":
        return params, 1.0
    k2 = kernel * kernel
    own = {**params, "current_decay": 1.0, "voltage_decay": 1.0 if kind == "max" else 0.0,
           "threshold": WEIGHT_STEP / 2 if kind == "max" else WEIGHT_STEP * (k2 - 0.5)}
    return own, WEIGHT_STEP


def _pool_block(layer: Layer, params: dict, syn: dict, pool: str = "sum") -> nn.Module:
    # Pool weights are fixed (not trained); the hook keeps them on the 8-bit grid for export.
    params, weight = pool_neuron(params, pool, layer.kernel)
    return slayer.block.cuba.Pool(params, layer.kernel, stride=layer.stride, pre_hook_fx=syn["pre_hook_fx"],
                                  weight_scale=weight, delay_shift=syn["delay_shift"])


class AnalogGlobalPool(nn.Module):
    """``model.global_pool: analog``: the mean of each step's input spikes over the whole map,
    passed on as an analog value without a neuron: the SFedHIFI authors' ``AdaptiveAvgPool2d``
    before their fc (SpikingJelly's Spiking-ResNet). ``spikes`` (the default) is an
    integrate-and-fire pool that fires once per k*k input spikes (``pool_neuron``'s ``avg``);
    at T = 10 over layer4's 4x4 map a last block firing at 2 % gives it about 3 spikes, so it
    passes almost nothing. The layer after it is priced as MACs (its input is analog); export
    folds it into the voltage readout after it (:mod:`neurofed.deploy.deployable`)."""

    export_refusal = ("model.global_pool: analog passes the pool's mean as an analog value; export folds it "
                      "into a voltage readout after it (neurofed.deploy.deployable), not into a spiking layer")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W, T) -> (N, C, 1, 1, T)
        return x.mean(dim=(2, 3), keepdim=True)


def _flatten_block(layer: Layer, params: dict, syn: dict) -> nn.Module:
    return slayer.block.cuba.Flatten()


def _dense_block(layer: Layer, params: dict, syn: dict) -> nn.Module:
    return slayer.block.cuba.Dense(params, layer.in_shape[0], layer.out, **syn)


# The non-spiking output layer of ``model.readout: voltage``: no current decay and no leak,
# so its voltage at step t is the sum of its synaptic input up to t (FedSNN Eq. 6-7 with
# lambda = 1: "accumulated without the leak factor"); it never spikes or resets.
VOLTAGE_NEURON = {"current_decay": 1.0, "voltage_decay": 0.0}


def _voltage_block(layer: Layer, params: dict, syn: dict) -> nn.Module:
    syn = {k: v for k, v in syn.items() if k != "delay_shift"}  # Affine has no delay
    return slayer.block.cuba.Affine({**params, **VOLTAGE_NEURON}, layer.in_shape[0], layer.out, **syn)


# Keyed by Layer.kind, or by Layer.options["block"] when a layer names its builder (a
# residual join is built by SpikingNet itself: it takes model.norm). The block modules
# import SLAYER from neurofed.compat, never this module (no import circle).
SNN_BLOCKS = {"conv": _conv_block, "pool": _pool_block, "flatten": _flatten_block, "dense": _dense_block,
              "factorized_conv": factorized_conv_block}


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
        self.readout_kind = model_cfg.get("readout", "spikes")
        if self.readout_kind == "voltage" and layers[-1].kind != "dense":
            raise ValueError(f"model.readout: voltage needs a dense output layer; {model_cfg.get('name')!r} "
                             f"ends in a {layers[-1].kind} layer")
        self.tie_break = model_cfg.get("tie_break", "lowest_label")
        if self.tie_break == "voltage" and layers[-1].kind != "dense":
            raise ValueError(f"model.tie_break: voltage reads the output layer's neurons; {model_cfg.get('name')!r} "
                             f"ends in a {layers[-1].kind} layer, not a dense one")
        params = neuron_params(model_cfg)
        syn = _synapse_kwargs(model_cfg)
        pool = model_cfg.get("pool", "sum")
        norm = model_cfg.get("norm", "none")
        blocks = []
        for i, layer in enumerate(layers):
            if i == len(layers) - 1 and self.readout_kind == "voltage":
                blocks.append(_voltage_block(layer, dict(params), syn))
            elif layer.options.get("global_pool") == "analog":
                blocks.append(AnalogGlobalPool())
            elif _builder(layer) == "pool":  # a global pool averages (AdaptiveAvgPool2d) whatever the others do
                kind = "avg" if layer.options.get("global_pool") and pool == "max" else pool
                blocks.append(_pool_block(layer, dict(params), syn, kind))
            elif _builder(layer) == "residual_join":
                blocks.append(residual_join_block(layer, dict(params), syn, norm))
            else:
                block = SNN_BLOCKS[_builder(layer)](layer, dict(params), syn)
                # the output layer is never normed: its current is the logit (or its spikes')
                normed = norm != "none" and i != len(layers) - 1 and layer.kind in ("conv", "dense")
                blocks.append(batch_normed(block, model_cfg.get("norm_steps") if norm == "bntt" else None)
                              if normed else block)
        if model_cfg.get("neuron_gradient", "slayer") == "spikingjelly":
            for i, layer in enumerate(layers):
                if layer.kind in ("conv", "dense") and not self.is_voltage_layer(i):
                    use_reset_gradient(blocks[i], model_cfg.get("atan_alpha", 2.0))
        self.blocks = nn.ModuleList(blocks)
        # BNTT's per-step γ: the time axis FedLEC's Aggregation Through Time averages over
        self.param_time_axes = {f"blocks.{i}.norm.weight": 1 for i, b in enumerate(blocks)
                                if isinstance(getattr(b, "norm", None), StepBatchNorm)}
        dropout = model_cfg.get("dropout", 0.0)
        self.dropout = nn.Dropout(dropout) if dropout else None
        self.record = False
        self.layer_spikes: list[torch.Tensor] = []
        self.tie_voltage: torch.Tensor | None = None  # (N, K) at evaluation under tie_break: voltage
        self._skip = None  # a residual block's input (neurofed.models.residual)

    def is_voltage_layer(self, index: int) -> bool:
        """Whether layer ``index`` is the non-spiking voltage readout (``model.readout: voltage``)."""
        return self.readout_kind == "voltage" and index == len(self.layers) - 1

    def emits_spikes(self, index: int) -> bool:
        """False for the layers whose output is a value: the voltage readout and an analog
        global pool (their energy rows count no output spikes)."""
        return not (self.is_voltage_layer(index) or isinstance(self.blocks[index], AnalogGlobalPool))

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Block ``index`` on ``x`` (a residual block's skip input is kept between calls)."""
        role = self.layers[index].options.get("residual")
        if role == "open":
            self._skip = x
        return self.blocks[index](x, self._skip) if role == "close" else self.blocks[index](x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layer_spikes = []
        self.tie_voltage = None
        last = len(self.blocks) - 1
        for i, layer in enumerate(self.layers):
            if i == last and self.tie_break == "voltage" and not self.training:
                inp, x = x, self.run_block(i, x)
                self.tie_voltage = self.last_voltage(inp, x)
            else:
                x = self.run_block(i, x)
            if self.record and layer.has_neurons:
                # a voltage readout emits no spikes: it counts 0, so the layer list stays the same
                spikes = torch.zeros(len(x), device=x.device) if self.is_voltage_layer(i) else x.detach().flatten(1).sum(1)
                self.layer_spikes.append(spikes)
            if self.dropout is not None and self.training and layer.kind != "flatten" and i != last:
                x = self.dropout(x)
        self._skip = None
        return x

    @torch.no_grad()
    def last_voltage(self, inp: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The output neurons' voltage (N, K) after the last step their spikes are counted
        at, after its reset (0 where that step spiked), as a Lava neuron holds it then: the
        output block's input ``inp`` run again through its synapse and SLAYER's neuron
        dynamics (``out``: the block's output, for the last step's spikes)."""
        block = self.blocks[-1]
        _, voltage = block.neuron.dynamics(block.synapse(inp))
        # with SLAYER's delay_shift the block's output at step t is the neuron's spike at t - 1
        step = -2 if getattr(block, "delay_shift", False) is True and voltage.shape[-1] > 1 else -1
        spiked = out[..., -1] != 0
        return torch.where(spiked, torch.zeros_like(spiked, dtype=voltage.dtype), voltage[..., step]).flatten(1)

    def readout(self, output: torch.Tensor) -> torch.Tensor:
        """Logits. ``spikes``: the output spike rate over time, scaled (SFedCA Eq. 8 with
        logit_scale = T: the spike count). ``voltage``: the output layer's accumulated
        voltage at the last step over T, scaled (logit_scale = 1: the FedLEC authors'
        non-spiking layer averaged over T; logit_scale = T: FedSNN Eq. 7's U_L^T).

        ``tie_break: voltage`` (evaluation only; training's loss reads the rates): each label's
        logit gains less than half a count step, growing with how many labels' output voltages
        (:meth:`last_voltage`) are below its own, so ``argmax`` takes the most spikes first and,
        among labels tied on them, the highest voltage; equal voltages still go to the lowest label."""
        if self.readout_kind == "voltage":
            return output[..., -1] / output.shape[-1] * self.logit_scale
        logits = output.mean(-1) * self.logit_scale
        if self.tie_voltage is not None and not self.training and len(self.tie_voltage) == len(logits):
            v = self.tie_voltage.to(logits.device)
            below = (v[:, None, :] < v[:, :, None]).sum(-1).to(logits.dtype)  # labels whose voltage is lower
            logits = logits + below / (2 * v.shape[1]) * (self.logit_scale / output.shape[-1])
        return logits

    def readout_per_step(self, output: torch.Tensor) -> torch.Tensor:
        """Per-time-step logits (N, K, T), for time-step-wise losses such as TET (Deng et al.
        2022, SFedHIFI Eq. 14). ``voltage``: the output layer's input at each step (the
        increment of its leak-free voltage), which is TET's per-step output of a non-spiking
        head; their mean over T is ``readout``'s logits."""
        if self.readout_kind == "voltage":
            return torch.diff(output, dim=-1, prepend=torch.zeros_like(output[..., :1])) * self.logit_scale
        return output * self.logit_scale

    @property
    def neurons_per_layer(self) -> list[int]:
        return [layer.num_neurons for layer in self.layers if layer.has_neurons]


class AnnNet(nn.Module):
    """The ANN twin: the same topology with ReLU units, fed analog (N, C, H, W) input.

    ``net`` is the flat sequence of every layer's modules; ``parts[i]`` is layer i's run of
    them, so a residual block's open layer keeps its input and its close layer
    (:class:`~neurofed.models.residual.AnnResidualJoin`) adds it, as in :class:`SpikingNet`.
    A global pool (``kernel`` 0) is an adaptive average pool to 1×1."""

    kind = "ann"

    def __init__(self, layers: list[Layer], model_cfg: dict, logit_scale: float = 1.0):
        super().__init__()
        self.layers = layers
        # the twin of a normed SNN is normed alike: the same per-channel norm before each
        # hidden layer's units (running statistics averaged by the server as the SNN's)
        # (BNTT's per-step γ has no step to act on here: the twin of a bntt SNN takes the plain norm)
        normed = model_cfg.get("norm", "none") != "none"
        self.input = model_cfg.get("ann_input", "image")  # what encode_for gives it
        self.parts: list[list[nn.Module]] = []
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            mods: list[nn.Module] = []
            self.parts.append(mods)
            if layer.options.get("residual") == "close":
                mods.append(AnnResidualJoin(layer, normed))  # normed inside, before the sum
            elif layer.kind == "conv":
                mods.append(nn.Conv2d(layer.in_shape[0], layer.out, layer.kernel, layer.stride, layer.padding))
            elif layer.kind == "pool":
                mods.append(nn.AdaptiveAvgPool2d(1) if layer.kernel == 0 else nn.AvgPool2d(layer.kernel, layer.stride))
            elif layer.kind == "flatten":
                mods.append(nn.Flatten())
            elif layer.kind == "dense":
                mods.append(nn.Linear(layer.in_shape[0], layer.out))
            if layer.kind in ("conv", "dense") and i != last:
                if normed and layer.options.get("residual") != "close":
                    mods.append(ChannelBatchNorm(layer.out))
                mods.append(nn.ReLU())
        self.net = nn.Sequential(*(m for mods in self.parts for m in mods))
        self.record = False
        self.layer_spikes: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 5:  # (N, C, H, W, T) spike/event input: the ANN sees its time average
            x = x.mean(-1)
        skip = None
        for layer, parts in zip(self.layers, self.parts):
            if layer.options.get("residual") == "open":
                skip = x
            for m in parts:
                x = m(x, skip) if isinstance(m, AnnResidualJoin) else m(x)
        return x

    def readout(self, output: torch.Tensor) -> torch.Tensor:
        return output

    def readout_per_step(self, output: torch.Tensor) -> torch.Tensor:
        return output.unsqueeze(-1)
