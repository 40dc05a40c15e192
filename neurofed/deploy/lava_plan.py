"""What runs where and when: the input both sides receive, each Lava layer's time lag
behind torch, and the torch reference the Lava run is compared with.

**Time.** Every Lava layer adds one step (its synapse buffer). A SLAYER block with
``delay_shift`` adds the same step, so Lava layer j's output at phase p is that block's
output at step p. A block without it (the papers' presets, ``model.delay_shift: false``,
and the non-spiking voltage readout) does not, so Lava runs one step behind it from that
layer on. Layer j's lag is the number of such blocks up to and including it: Lava's phase
p is torch's step p - lag_j. The window of a sample is lengthened by the last layer's lag
(T + lag), the source sends the T input steps first and zeros after them, and layer j is
counted over phases lag_j .. lag_j + T - 1 (a pure time shift: nothing is retrained).

**Direct input.** The host quantizes the image the torch model sees each step (``data.
encoding: direct``: the normalized pixel, the same at every step) to ``bits`` fractional
bits and sends the integers as graded spikes (``input_message_bits``); everything from
the first synapse on runs on the chip. Lava's neuron adds its input at 6 fractional bits
(``act_shift``), SLAYER's at 12, so the first layer's neuron runs with its state scaled by
2^bits on both sides (the threshold mantissa scaled alike): the chip then computes exactly
what SLAYER computes for the quantized image, with a current finer than the trained one's
(the prediction agreement with the float model is reported).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from neurofed.deploy import DeployError
from neurofed.models.quantize import GRADED_INPUT_BITS, set_state_exponent, weight_exponent
from neurofed.seeds import seed_for

ENCODINGS = ("rate", "events", "direct")
INPUT_BITS = GRADED_INPUT_BITS  # fractional bits of a graded input value: pixel steps of 1/64
MESSAGE_BITS = 16  # graded-spike payload width given to netx (signed): |value| < 2^(16 - 1 - INPUT_BITS)


@dataclass(frozen=True)
class LavaPlan:
    timesteps: int  # the torch model's T
    lags: tuple[int, ...]  # per Lava (spiking) layer: steps Lava runs behind torch
    input_bits: int | None  # graded input's fractional bits; None: binary spikes
    voltage: bool  # the output layer is read as its voltage at the last step
    tie_voltage: bool = False  # model.tie_break voltage: the spiking output's voltage is read there too

    @property
    def window(self) -> int:
        return self.timesteps + self.lags[-1]

    def counted(self, j: int) -> tuple[int, int]:
        """Phases [skip, stop) of layer j's counter: from its reset (phase j + 1, before which
        it still holds the previous sample) to torch's last step."""
        return j + 1, self.lags[j] + self.timesteps

    @property
    def read_phase(self) -> int:
        """The phase at which the output layer's neurons hold torch's last (counted) step:
        the voltage readout's value, or the tie-break's voltage after that step's reset."""
        return self.timesteps - 1 + self.lags[-1]

    def to_meta(self) -> dict:
        return {"lags": list(self.lags), "input_bits": self.input_bits, "voltage": self.voltage,
                "tie_voltage": self.tie_voltage}

    def same_network(self, meta: dict | None) -> bool:
        """Whether a file written with ``meta`` (its ``lava_plan``) holds this plan's network:
        the tie-break is a way of reading the output, not part of the network."""
        mine = self.to_meta()
        return meta is not None and all(meta.get(k) == v for k, v in mine.items() if k != "tie_voltage")

    @classmethod
    def from_meta(cls, timesteps: int, meta: dict) -> "LavaPlan":
        return cls(int(timesteps), tuple(meta["lags"]), meta.get("input_bits"), bool(meta.get("voltage")),
                   bool(meta.get("tie_voltage")))

    def check_backend(self, backend: str) -> None:
        """A voltage is read by a host process's RefPort: the simulator's neurons, not a chip's."""
        if (self.voltage or self.tie_voltage) and backend == "loihi2":
            what = "model.readout voltage" if self.voltage else "model.tie_break voltage"
            raise DeployError(f"{what}: the voltage is read by a host process's RefPort, which reaches the "
                              f"simulator's neurons but not a chip's (that needs lava-loihi's probes); use "
                              f"--backend fixed_pt")


@dataclass
class SpikeStats:
    counts: np.ndarray  # (N, L) spikes per sample per spiking layer
    checksums: np.ndarray  # (N, L) raster checksum per sample per layer
    output: np.ndarray  # (N, K) output-layer spikes per neuron
    neuron_totals: list[np.ndarray]  # per layer, each neuron's spikes over all samples, torch shape (C, H, W)
    tie_voltage: np.ndarray | None  # (N, K) under model.tie_break voltage: the output's voltage at the last step

    @property
    def predictions(self) -> np.ndarray:
        return predict(self.output, self.tie_voltage)


def predict(output_counts: np.ndarray, tie_voltage: np.ndarray | None = None) -> np.ndarray:
    """Label = most output spikes; ties go to the lowest index, as ``torch.argmax``
    on the model's readout (rate x logit_scale, a positive multiple of the counts), or,
    with ``tie_voltage``, to the highest voltage among the tied, then the lowest index
    (:meth:`neurofed.models.snn.SpikingNet.readout`)."""
    counts = np.asarray(output_counts)
    if tie_voltage is None:
        return np.argmax(counts, axis=1)
    at_top = counts == counts.max(1, keepdims=True)
    return np.argmax(np.where(at_top, np.asarray(tie_voltage, dtype=np.float64), -np.inf), axis=1)


def plan_for(model, timesteps: int, encoding: str = "rate", input_bits: int = INPUT_BITS) -> LavaPlan:
    lags, lag = [], 0
    for i, (layer, block) in enumerate(zip(model.layers, model.blocks)):
        if layer.has_neurons:
            lag += 0 if getattr(block, "delay_shift", False) is True else 1
            lags.append(lag)
    voltage = bool(getattr(model, "is_voltage_layer", lambda _: False)(len(model.layers) - 1))
    tie_voltage = getattr(model, "tie_break", "lowest_label") == "voltage" and not voltage
    return LavaPlan(int(timesteps), tuple(lags), input_bits if encoding == "direct" else None, voltage, tie_voltage)


def fitting_input_bits(model, bias_exp: int = 6) -> int:
    """The most fractional bits (at most :data:`INPUT_BITS`) of graded input for which the first
    layer's folded batch-norm bias, on a state kept 2^bits finer, still fits Lava's 13-bit bias
    mantissa at exponent ``bias_exp`` (netx's 6; the residual graph's 7): a stem whose norm
    shift is large gets a coarser input grid instead of a refusal (both sides see that grid)."""
    from neurofed.deploy.deployable import integer_bias
    from neurofed.deploy.lava_readout import MAX_BIAS_MANTISSA, NETX_BIAS_EXP, graded_bias

    synapse = getattr(first_block(model), "synapse", None)
    bias = integer_bias(synapse) if synapse is not None else None
    if bias is None or not bias.numel():
        return INPUT_BITS
    k = weight_exponent(synapse)  # the layer's own exponent and the input's bits scale its bias in one shift
    worst = int(bias.abs().max())
    for bits in range(INPUT_BITS, 0, -1):
        if bits + k >= bias_exp - NETX_BIAS_EXP and graded_bias(worst, bits + k, bias_exp) <= MAX_BIAS_MANTISSA:
            return bits
    return INPUT_BITS  # nothing fits: export refuses, naming the layer


def graded_state_warning(first_layer_current: float, data_cfg: dict, bits: int = INPUT_BITS) -> str | None:
    """A warning when the first layer's worst-case current (every input at its largest |x|)
    can pass Lava's 24-bit state, kept 2^bits finer for graded input; None when not.
    ``first_layer_current``: the constraint check's worst case for inputs of 1 (SLAYER units)."""
    mean, std = np.atleast_1d(data_cfg.get("mean") or 0.0), np.atleast_1d(data_cfg.get("std") or 1.0)
    largest = float(np.max(np.maximum(np.abs(mean / std), np.abs((1.0 - mean) / std))))  # pixels 0 and 1
    worst, bound = first_layer_current * largest, (1 << 23) / (4096 << bits)
    if worst <= bound:
        return None
    return (f"layer 0: worst-case current {worst:.0f} (every input at |x| = {largest:.2f}) passes {bound:.0f}, "
            f"the 24-bit bound of a state kept 2^{bits} finer for graded input; Lava would wrap it "
            f"(`neurofed lava` reports any differing spike)")


def check_encoding(data_cfg: dict) -> None:
    if data_cfg["encoding"] not in ENCODINGS:
        raise DeployError(f"data.encoding: got {data_cfg['encoding']!r}; Lava runs take {', '.join(ENCODINGS)}")


def input_spikes(x: np.ndarray, data_cfg: dict, seed: int, input_bits: int = INPUT_BITS) -> tuple[np.ndarray, dict]:
    """What both torch and Lava receive, (N, C, H, W, T), and notes.

    Rate coding draws binary spikes once from ``seed``; event data are binarized (Lava's
    spike input is unary; a bin holding several events becomes one spike, and the torch
    reference sees the same). Direct input is the normalized image in fixed point: int32
    graded values ``round(x * 2^input_bits)`` (:func:`graded_values`).
    """
    from neurofed.data.encoding import as_tensor, encode

    check_encoding(data_cfg)
    encoding = data_cfg["encoding"]
    notes: dict = {"encoding": encoding}
    x = as_tensor(np.asarray(x))  # uint8 pixels are scaled by the encoder
    if encoding == "direct":
        s = encode(x, "direct", data_cfg["timesteps"], mean=data_cfg.get("mean"), std=data_cfg.get("std"))
        values = graded_values(s, input_bits)
        notes.update(input_bits=input_bits, input_range=[int(values.min()), int(values.max())])
        return values, notes
    if encoding == "rate":
        gen = torch.Generator().manual_seed(seed)
        s = encode(x, "rate", data_cfg["timesteps"], gen, data_cfg.get("max_rate", 1.0))
        notes["input_seed"] = seed
    else:  # events
        s = encode(x, "events", data_cfg["timesteps"])
        notes["event_bins_clipped"] = float((s > 1).sum()) / max(int((s > 0).sum()), 1)
    return (s > 0).to(torch.uint8).numpy(), notes


def graded_values(x: torch.Tensor, bits: int) -> np.ndarray:
    """``x`` in fixed point with ``bits`` fractional bits (int32), refused when a value
    does not fit the graded spike's :data:`MESSAGE_BITS`."""
    values = torch.round(x.double() * (1 << bits)).to(torch.int64).numpy()
    bound = 1 << (MESSAGE_BITS - 1)
    if values.size and (values.min() < -bound or values.max() >= bound):
        raise DeployError(f"direct input spans {values.min() / (1 << bits):g} .. {values.max() / (1 << bits):g}; "
                          f"a {MESSAGE_BITS}-bit graded spike with {bits} fractional bits holds "
                          f"|x| < {bound >> bits}: normalize the input (data.mean / data.std)")
    return values.astype(np.int32)


def to_lava_layout(spikes: np.ndarray, inp_shape: tuple) -> np.ndarray:
    """(N, C, H, W, T) -> (N, T, *inp_shape): Lava's (W, H, C), or flat in torch order
    when the network starts with a dense layer (netx flattens as C, H, W). Input the same
    at every step (direct) keeps one frame, (N, 1, ...)."""
    n, t = spikes.shape[0], spikes.shape[-1]
    if t > 1 and np.array_equal(spikes[..., :1].repeat(t, -1), spikes):
        spikes, t = spikes[..., :1], 1
    if len(inp_shape) == 3:
        out = spikes.transpose(0, 4, 3, 2, 1)
    else:
        out = spikes.reshape(n, -1, t).transpose(0, 2, 1)
    if tuple(out.shape[2:]) != tuple(inp_shape):
        raise DeployError(f"input spikes of shape {spikes.shape[1:-1]} do not fit the network input {inp_shape}")
    dtype = np.int8 if spikes.dtype == np.uint8 else np.int32
    return np.ascontiguousarray(out, dtype=dtype)


def to_torch_order(a: np.ndarray) -> np.ndarray:
    """Lava's (W, H, C) neuron layout back to torch's (C, H, W)."""
    return np.ascontiguousarray(a.transpose(2, 1, 0)) if a.ndim == 3 else a


def layer_seeds(seed: int, num_layers: int) -> list[int]:
    """Seeds of the raster-checksum weights of each spiking layer."""
    return [seed_for(seed, "lava-raster", j) for j in range(num_layers)]


def first_neuron_layer(model) -> int:
    """Index of the first layer with neurons: the one graded input reaches."""
    return next(i for i, layer in enumerate(model.layers) if layer.has_neurons)


def first_block(model):
    return model.blocks[first_neuron_layer(model)]


@contextmanager
def graded_first_layer(model, bits: int | None):
    """The first layer as the chip runs it for graded input (see the module docstring): its
    neuron's fixed-point state scaled by 2^bits; as it was afterwards. (Its float32 synapse
    sums are exact while they stay below 2^24 units of 2^-(6 + bits).)"""
    if bits is None:
        yield model
        return
    block = first_block(model)
    k = weight_exponent(block.synapse)  # the layer's own exponent, graded input's bits on top
    set_state_exponent(block.neuron, k + bits)
    try:
        yield model
    finally:
        set_state_exponent(block.neuron, k)


# ----------------------------------------------------------------------------- torch


@torch.no_grad()
def torch_reference(model, spikes: np.ndarray, seed: int, plan: LavaPlan | None = None, batch_size: int = 256):
    """What the torch model does on ``spikes`` as the Lava counters see it: per layer the
    counts and raster checksums over each layer's counted phases (:meth:`LavaPlan.counted`),
    and the output (spike counts per neuron, or the readout voltage in Lava's fixed point)."""
    from neurofed.deploy.lava_procs.streaming import raster_weights

    model.eval()
    t = spikes.shape[-1]
    plan = plan or plan_for(model, t)  # binary spikes; graded input needs its plan
    w = plan.window
    spiking = [i for i, layer in enumerate(model.layers) if layer.has_neurons]
    weights = [torch.from_numpy(raster_weights(s, tuple(model.layers[i].out_shape), w)).double().reshape(-1, w)
               for s, i in zip(layer_seeds(seed, len(spiking)), spiking)]
    scale = 1.0 if plan.input_bits is None else float(1 << plan.input_bits)
    counts, sums, outputs, tie_voltages = [], [], [], []
    totals = [torch.zeros(tuple(model.layers[i].out_shape), dtype=torch.float64) for i in spiking]
    with graded_first_layer(model, plan.input_bits):
        for start in range(0, len(spikes), batch_size):
            x = torch.from_numpy(spikes[start:start + batch_size]).double().div(scale).float()
            c, s = [], []
            for i, layer in enumerate(model.layers):
                inp, x = x, model.run_block(i, x)
                if plan.tie_voltage and i == len(model.layers) - 1:  # in SLAYER's state units, as the readout's
                    tie_voltages.append(model.last_voltage(inp, x).double() * model.blocks[i].neuron.s_scale)
                if not layer.has_neurons:
                    continue
                j = len(c)
                if model.is_voltage_layer(i):
                    out = (x[..., -1].double() * model.blocks[i].neuron.s_scale).round()
                    x = torch.zeros_like(x)  # it never spikes
                y = torch.zeros(len(x), weights[j].shape[0], w, dtype=torch.float64)
                y[..., plan.lags[j]:plan.lags[j] + t] = (x.reshape(len(x), -1, t) != 0).double()
                skip, stop = plan.counted(j)
                y[..., :skip] = 0
                y[..., stop:] = 0
                c.append(y.sum((1, 2)))
                totals[j] += y.sum((0, 2)).reshape(totals[j].shape)
                s.append(torch.einsum("nmt,mt->n", y, weights[j]))
            counts.append(torch.stack(c, 1))
            sums.append(torch.stack(s, 1))
            outputs.append(out if plan.voltage else y.sum(-1))
    return SpikeStats(torch.cat(counts).long().numpy(), torch.cat(sums).long().numpy(),
                      torch.cat(outputs).long().numpy(), [tot.long().numpy() for tot in totals],
                      torch.cat(tie_voltages).numpy() if tie_voltages else None)
