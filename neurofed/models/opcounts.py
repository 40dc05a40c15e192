"""Operation counts per layer: the ANN twin's MACs and the SNN's synaptic operations.

Counts are per inference (one test sample, all T time steps), computed from a
topology (``model.layers``) and the measured input spikes of each layer.

- **MACs** (the ANN twin; NeuroBench's *Dense* count of one ANN forward): conv
  ``M²·I·k²·O`` (M the output size, taps on zero padding included, as FedSNN's
  formula), dense ``I·O``. A pool layer is counted as the depthwise conv it is
  (``M²·C·k²``): FedSNN and SFedCA leave pooling out of their sums (their VGG9 counts
  only weight layers), but SLAYER's pool is a real synapse + neuron layer that runs
  on Loihi, so neurofed counts it on both sides; it is a separate row per layer.
- **Synaptic operations** (NeuroBench *Effective_ACs*): every input spike costs one
  accumulate per output neuron it reaches through a nonzero weight. Computed exactly
  by applying the layer's binary connectivity (nonzero mask of the 8-bit quantized
  weights that actually run) to the per-position spike-count map summed over
  samples and time steps: ``sum(conv2d(S, mask))`` counts every (input spike, output
  neuron) pair, with stride, padding and edges exact (a spike at the border reaches
  fewer outputs). Linear in S, so summing over samples first is exact.
  ``synaptic_ops_all_weights`` keeps zero-weight synapses (the structural fan-out).
- **The papers' approximation** ``MACs × r_in × T`` (FedSNN Sec. IV-F, SFedCA Eq. 13,
  SFedHIFI Eq. 16), r_in the layer's input spike rate per neuron and step. It equals
  the all-weights exact count when spikes are spread uniformly and no tap falls on
  padding; dense layers always match; padded conv layers overcount by the padded taps.
- **Analog input** (direct encoding) to the first layer is priced as MACs, once per
  inference as SFedHIFI Eq. 16 does: the input is the same at every step, so W·x is
  computed once and held (SLAYER recomputes it every step; that would be T× more).
- **MembraneUpdates**: neurons × T (every compartment is updated at every step, as on
  Loihi). NeuroBench counts only updates that change the membrane, so its number is
  at most this one.

NeuroBench (``neurobench.metrics.workload``) names, per inference, and where neurofed
differs: *SynapticOperations* ``Effective_ACs`` = Σ synaptic_ops (same rule: nonzero
input × nonzero weight, bias not counted; neurofed counts the 8-bit quantized weights
SLAYER runs, while NeuroBench's hooks read SLAYER synapses as Conv3d and miscount
under weight norm); ``Effective_MACs`` = analog first-layer MACs, counted once (see
above; NeuroBench would count them at every step); ``Dense`` = Σ MACs × T (every
synapse at every step). *ActivationSparsity* = 1 − spikes / (neurons × T) over all
spiking layers. neurofed does not depend on NeuroBench.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from neurofed.models.spec import Layer, shortcut_layer
from neurofed.registry import Registry

# --------------------------------------------------------------------------- per kind
# Each counter: (layer, in_map | None, mask | None) -> (macs, synaptic_ops)
#   in_map: input spike counts summed over samples and steps, shape layer.in_shape
#   mask:   binary connectivity (1 = nonzero weight) in the synapse's own layout;
#           None means all synapses (the structural fan-out).


def _conv(layer: Layer, in_map, mask):
    c, _, _ = layer.in_shape
    o, m_h, m_w = layer.out_shape
    macs = m_h * m_w * c * layer.kernel ** 2 * o
    if in_map is None:
        return macs, 0.0
    if mask is None:
        mask = torch.ones(o, c, layer.kernel, layer.kernel, dtype=torch.float64)
    reached = F.conv2d(in_map.double()[None], mask.double(), stride=layer.stride, padding=layer.padding)
    return macs, float(reached.sum())


def _pool(layer: Layer, in_map, mask):
    c, _, _ = layer.in_shape
    _, m_h, m_w = layer.out_shape
    k = layer.kernel
    macs = m_h * m_w * c * k * k
    if in_map is None:
        return macs, 0.0
    if mask is None:
        mask = torch.ones(1, 1, k, k, dtype=torch.float64)
    # SLAYER pools each channel with the same fixed kernel: a depthwise conv.
    reached = F.conv2d(in_map.double()[:, None], mask.double(), stride=layer.stride)
    # resolve() floors the output size; conv2d does too, so edges agree.
    return macs, float(reached.sum())


def _dense(layer: Layer, in_map, mask):
    (i,), (o,) = layer.in_shape, layer.out_shape
    macs = i * o
    if in_map is None:
        return macs, 0.0
    fan_out = torch.full((i,), float(o), dtype=torch.float64) if mask is None else mask.double().sum(0)
    return macs, float(in_map.double().reshape(-1) @ fan_out)


def _flatten(layer: Layer, in_map, mask):
    return 0, 0.0


FACTORIZED_KEYS = ("full_in", "full_out", "bank_fraction", "group_fraction")
COUNTERS = Registry("layer kind", "layer kind", {"conv": _conv, "pool": _pool, "dense": _dense, "flatten": _flatten})
NAMES = {"conv": "conv", "pool": "pool", "dense": "fc"}


def register_counter(kind: str, fn: Callable) -> None:
    """Count a new layer kind (e.g. a factorized conv): ``fn(layer, in_map, mask)
    -> (macs, synaptic_ops)`` as the counters above."""
    COUNTERS.register(kind, fn)


def layer_names(layers: list[Layer]) -> list[str | None]:
    """FedSNN-style names (conv1, pool1, conv2, fc1, ...); None for flatten."""
    seen: dict[str, int] = {}
    names = []
    for layer in layers:
        if not layer.has_neurons:
            names.append(None)
            continue
        prefix = NAMES.get(layer.kind, layer.kind)
        seen[prefix] = seen.get(prefix, 0) + 1
        names.append(f"{prefix}{seen[prefix]}")
    return names


def count_macs(layers: list[Layer]) -> list[int]:
    return [_counter(layer)(layer, None, None)[0] for layer in layers]


def _counter(layer: Layer) -> Callable:
    try:
        return COUNTERS[layer.kind]
    except KeyError:
        raise ValueError(f"energy: no op counter for layer kind {layer.kind!r}; known: "
                         f"{', '.join(COUNTERS)} (register one with neurofed.models.opcounts.register_counter)") from None


# --------------------------------------------------------------------------- weights


def synapse_masks(model) -> list[torch.Tensor | None]:
    """Per layer, the nonzero mask of the weights that run (after the 8-bit hook).

    Conv: (O, I, k, k); pool: (1, 1, k, k); dense: (O, I); flatten: None. Call after
    at least one forward pass when weight norm is on (SLAYER recomputes ``weight``
    from ``weight_g``/``weight_v`` in a forward pre-hook).
    """
    masks: list[torch.Tensor | None] = []
    for layer, block in zip(model.layers, model.blocks):
        syn = getattr(block, "synapse", None)
        if syn is None or not layer.has_neurons:
            masks.append(None)
            continue
        with torch.no_grad():
            hook = getattr(syn, "_pre_hook_fx", None)
            w = hook(syn.weight) if hook is not None else syn.weight
            w = w.detach()[..., 0]  # SLAYER weights carry a trailing time-kernel axis of 1
        if layer.kind == "dense":
            w = w.reshape(w.shape[0], w.shape[1])
        masks.append((w != 0).to(torch.float64))
    return masks


# --------------------------------------------------------------------------- the count


def first_synaptic(layers: list[Layer]) -> int:
    """Index of the first layer with synapses (a leading flatten passes input through)."""
    return next(i for i, layer in enumerate(layers) if layer.has_neurons)


def _shortcut(layer: Layer, skip_shape: tuple, skip_map) -> tuple[str, int, float | None]:
    """A residual join's shortcut: (kind, MACs, synaptic ops or None without a map). A 1×1
    conv is counted as any conv over all its weights; the identity adds each shortcut spike to
    one neuron's current (one accumulate, no MAC: the ANN adds, it does not multiply)."""
    sc = shortcut_layer(layer, skip_shape)
    if sc is None:
        return "identity", 0, None if skip_map is None else float(skip_map.double().sum())
    macs, ops = _conv(sc, skip_map, None)
    return "conv1x1", macs, None if skip_map is None else ops


def count_layers(layers: list[Layer], input_maps: list, output_spikes: list[float], samples: int,
                 timesteps: int, masks: list | None = None, analog_input: bool = False,
                 skip_maps: list | None = None) -> list[dict]:
    """Per-layer op counts per inference (one sample, T steps).

    ``input_maps[i]``: layer i's input spike counts summed over ``samples`` and steps
    (shape ``in_shape``), or None where unknown; ``output_spikes[i]``: its output
    spikes summed likewise. With ``analog_input`` the first layer's input is analog
    (priced as MACs), as is the input of the layer after an analog global pool
    (``model.global_pool: analog``), whose output is a value, not spikes (its row's
    ``output`` says so). Layers without synapses (flatten) are left out.
    """
    masks = masks or [None] * len(layers)
    skip_maps = skip_maps or [None] * len(layers)
    names = layer_names(layers)
    first = first_synaptic(layers)
    rows = []
    skip_shape = None  # input of the open residual block (neurofed.models.residual)
    after_analog = False  # the previous synaptic layer was an analog global pool
    for i, layer in enumerate(layers):
        if layer.options.get("residual") == "open":
            skip_shape = layer.in_shape
        if names[i] is None:
            continue
        counter = _counter(layer)
        in_map = input_maps[i]
        analog = (analog_input and i == first) or after_analog
        analog_out = after_analog = layer.options.get("global_pool") == "analog"
        spikes_in = None if analog else in_map
        macs, syn_all = counter(layer, spikes_in, None)
        _, syn_eff = counter(layer, spikes_in, masks[i])
        in_spikes = float(spikes_in.double().sum()) / samples if spikes_in is not None else None
        in_rate = in_spikes / (math.prod(layer.in_shape) * timesteps) if in_spikes is not None else None
        unknown = None if in_spikes is None and not analog else 0.0  # analog input: no ACs
        neurons = layer.num_neurons
        out_spikes = float(output_spikes[i]) / samples if output_spikes[i] is not None else None
        rate = out_spikes / (neurons * timesteps) if out_spikes is not None else None
        row_extra = {}
        if layer.options.get("residual") == "close" and skip_shape is not None:
            kind, sc_macs, sc_ops = _shortcut(layer, skip_shape, skip_maps[i])
            skip_in = None if skip_maps[i] is None else float(skip_maps[i].double().sum()) / samples
            macs += sc_macs
            if sc_ops is not None and in_spikes is not None:
                syn_eff += sc_ops
                syn_all += sc_ops
            row_extra = {"shortcut": kind, "shortcut_macs": int(sc_macs), "shortcut_input_spikes": skip_in,
                         "shortcut_synaptic_ops": sc_ops / samples if sc_ops is not None else None}
            if kind == "conv1x1" and skip_in is not None and in_rate is not None:
                sc_rate = skip_in / (math.prod(skip_shape) * timesteps)
                row_extra["_approx_extra"] = sc_macs * sc_rate * timesteps
            elif kind == "identity" and skip_in is not None:
                row_extra["_approx_extra"] = skip_in
        approx_extra = row_extra.pop("_approx_extra", 0.0)
        rows.append({
            **row_extra,
            "index": i,
            "name": names[i],
            "kind": layer.kind,
            "in_shape": list(layer.in_shape),
            "out_shape": list(layer.out_shape),
            "input": "analog" if analog else "spikes",
            "output": "analog" if analog_out else "spikes",
            "macs": int(macs),
            "analog_macs": int(macs) if analog else 0,
            "synaptic_ops": syn_eff / samples if in_spikes is not None else unknown,
            "synaptic_ops_all_weights": syn_all / samples if in_spikes is not None else unknown,
            "synaptic_ops_approx": ((macs - row_extra.get("shortcut_macs", 0)) * in_rate * timesteps + approx_extra
                                    if in_rate is not None else unknown),
            "input_spikes": in_spikes,
            "input_rate": in_rate,
            "output_spikes": out_spikes,
            "firing_rate": rate,
            "activation_sparsity": 1.0 - rate if rate is not None else None,
            "neurons": int(neurons),
            "membrane_updates": int(neurons * timesteps),
            "zero_weight_fraction": (float(1 - masks[i].mean()) if masks[i] is not None else None),
        })
        if layer.options.get("block") == "factorized_conv":  # its geometry, for SFedHIFI's own count
            rows[-1]["factorized"] = {k: layer.options[k] for k in FACTORIZED_KEYS}
    return rows


def neurobench_summary(rows: list[dict], timesteps: int) -> dict:
    """The SNN's workload in NeuroBench's names (per inference); see module docstring."""
    neurons = sum(r["neurons"] for r in rows)
    spikes = [r["output_spikes"] for r in rows]
    known = all(s is not None for s in spikes)
    return {
        "SynapticOperations": {
            "Effective_MACs": float(sum(r["analog_macs"] for r in rows)),
            "Effective_ACs": float(sum(r["synaptic_ops"] or 0.0 for r in rows)),
            "Dense": float(sum(r["macs"] for r in rows) * timesteps),
        },
        "ActivationSparsity": (1.0 - sum(spikes) / (neurons * timesteps)) if known and neurons else None,
        "MembraneUpdates": int(neurons * timesteps),
    }


def uniform_maps(layers: list[Layer], totals: list[float | None]) -> list[torch.Tensor | None]:
    """Input maps that spread each layer's total input spikes evenly over its inputs.

    The approximation used when only per-layer totals are known (e.g. from Lava).
    """
    out = []
    for layer, total in zip(layers, totals):
        if total is None:
            out.append(None)
            continue
        n = math.prod(layer.in_shape)
        out.append(torch.full(tuple(layer.in_shape), float(total) / n, dtype=torch.float64))
    return out


def input_totals_from_outputs(layers: list[Layer], output_totals: list[float | None],
                              first_input: float | None) -> list[float | None]:
    """Layer i's input spikes = layer i-1's output spikes (flatten passes them through)."""
    totals = []
    prev = first_input
    for layer, out in zip(layers, output_totals):
        totals.append(prev)
        if layer.kind != "flatten":
            prev = out
    return totals
