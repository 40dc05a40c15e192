"""Where the spike counts come from: a torch pass over the test set, or Lava's run.

Both return :class:`SpikeMaps`: per layer of ``model.layers``, the input spike
counts summed over samples and time steps at every input position (shape
``layer.in_shape``) and the total output spikes. The torch pass records exact
per-position maps. From Lava, per-position maps come from the per-neuron totals
``neurofed lava`` writes beside ``lava.json``; with per-layer totals only, each
layer's input is spread uniformly (``spread = "uniform"``, said in the report).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from neurofed.models.opcounts import first_synaptic, input_totals_from_outputs, uniform_maps
from neurofed.training.local import forward_dataset


@dataclass
class SpikeMaps:
    samples: int
    timesteps: int
    input_maps: list  # per layer: (in_shape) float64 tensor summed over samples and steps, or None
    output_spikes: list  # per layer: total output spikes over samples (0 for flatten)
    skip_maps: list | None = None  # per layer: a residual join's shortcut input, summed likewise (else None)
    source: str = "torch"  # torch | lava
    spread: str = "exact"  # exact | uniform
    analog_input: bool = False
    accuracy: float | None = None
    notes: list = field(default_factory=list)


@torch.no_grad()
def measure_torch(model, x: torch.Tensor, data_cfg: dict, seed: int, y: torch.Tensor | None = None,
                  batch_size: int = 256) -> SpikeMaps:
    """Run ``model`` over ``x`` (as :func:`neurofed.training.local.evaluate` does, same
    encoding seed) and sum every block's input per position and its output spikes."""
    n_layers = len(model.layers)
    in_sum: list = [None] * n_layers
    skip_sum: list = [None] * n_layers
    out_sum = [0.0] * n_layers

    def make_hook(i):
        def hook(module, inputs, output):
            x_in = inputs[0].detach()
            s = x_in.double().sum(dim=(0, x_in.dim() - 1))  # over samples and time steps
            in_sum[i] = s if in_sum[i] is None else in_sum[i] + s
            if len(inputs) > 1:  # a residual join's shortcut input
                k = inputs[1].detach().double().sum(dim=(0, inputs[1].dim() - 1))
                skip_sum[i] = k if skip_sum[i] is None else skip_sum[i] + k
            out_sum[i] += float(output.detach().double().sum())
        return hook

    handles = [block.register_forward_hook(make_hook(i)) for i, block in enumerate(model.blocks)]
    try:
        logits, _ = forward_dataset(model, x, data_cfg, seed, batch_size=batch_size, record=False)
    finally:
        for h in handles:
            h.remove()
    for i, layer in enumerate(model.layers):
        in_sum[i] = in_sum[i].reshape(tuple(layer.in_shape))
        if layer.kind == "flatten" or not getattr(model, "emits_spikes", lambda _: True)(i):
            out_sum[i] = 0.0  # a voltage readout or an analog pool passes values, not spikes
    accuracy = float((logits.argmax(1) == y).float().mean()) if y is not None else None
    return SpikeMaps(samples=len(x), timesteps=int(data_cfg["timesteps"]), input_maps=in_sum,
                     output_spikes=out_sum, skip_maps=skip_sum, source="torch", spread="exact",
                     analog_input=data_cfg.get("encoding") == "direct", accuracy=accuracy)


# --------------------------------------------------------------------------- Lava

LAVA_FILE = "lava.json"


def _per_layer_totals(record: dict, n_spiking: int) -> tuple[list[float], int] | None:
    """Per spiking layer total spikes and the sample count, from the known layouts of
    lava.json: a (samples, layers) list of counts, or per-layer totals with a count."""
    for key in ("layer_spikes", "layer_spike_counts", "spikes_per_layer"):
        value = record.get(key)
        if value is None:
            continue
        t = torch.as_tensor(value, dtype=torch.float64)
        if t.dim() == 2 and t.shape[1] == n_spiking:  # per sample, per layer
            return t.sum(0).tolist(), int(t.shape[0])
        if t.dim() == 1 and t.shape[0] == n_spiking:  # totals
            n = record.get("samples")
            if isinstance(n, int) and n > 0:
                return t.tolist(), n
    return None


def read_lava_record(run_dir: str | Path) -> dict:
    path = Path(run_dir) / LAVA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--spikes lava: {path} not found; run `neurofed lava {run_dir}` first "
                                f"or use --spikes torch")
    return json.loads(path.read_text())


def read_lava(run_dir: str | Path, model, data_cfg: dict, first_map: torch.Tensor | None = None) -> SpikeMaps:
    """Spike counts from ``RUN_DIR/lava.json`` (written by ``neurofed lava``).

    Lava reports spikes per layer and sample, not per position: each hidden layer's
    input is spread uniformly over its input positions. ``first_map`` is the exact
    per-position count of the input spikes Lava received (summed over samples and
    steps); without it the first layer is spread uniformly too, from ``input_spikes``
    in lava.json if recorded.
    """
    record = read_lava_record(run_dir)
    spiking = lava_layers(model)
    found = _per_layer_totals(record, len(spiking))
    if found is None:
        raise ValueError(f"--spikes lava: {Path(run_dir) / LAVA_FILE} has no per-layer spike counts for the "
                         f"model's {len(spiking)} spiking layers (keys tried: layer_spikes, layer_spike_counts, "
                         f"spikes_per_layer); use --spikes torch")
    totals, samples = found
    out = [0.0] * len(model.layers)
    for i, t in zip(spiking, totals):
        out[i] = float(t)
    first = record.get("input_spikes")
    if isinstance(first, (list, tuple)):
        first = float(sum(first))
    if first_map is not None:
        first = float(first_map.sum())
    analog = data_cfg.get("encoding") == "direct"
    in_totals = input_totals_from_outputs(model.layers, out, None if analog else first)
    maps = uniform_maps(model.layers, in_totals)
    neuron_maps = _neuron_maps(Path(run_dir), record, model, spiking)
    exact = neuron_maps is not None and (first_map is not None or analog)
    if first_map is not None and not analog:
        for i in range(first_synaptic(model.layers) + 1):  # through a leading flatten
            maps[i] = first_map.double().reshape(tuple(model.layers[i].in_shape))
    if neuron_maps is not None:
        # layer i's input is the previous spiking layer's output (a flatten only reshapes)
        prev = None
        for i, layer in enumerate(model.layers):
            if prev is not None:
                maps[i] = prev.reshape(tuple(layer.in_shape))
            if i in neuron_maps:
                prev = neuron_maps[i]
            elif layer.has_neurons:  # an analog global pool, folded into the readout on Lava: the map's mean
                prev = prev.mean(dim=(1, 2), keepdim=True)
        notes = [f"per-position input spikes from Lava's per-neuron totals ({record['neuron_spikes_file']})"]
    else:
        notes = ["lava.json gives spikes per layer and sample, not per position: each hidden layer's input "
                 "spikes are spread uniformly over its input positions (conv edge effects approximated)"]
    if first_map is not None:
        notes.append("first-layer input map: the exact input spikes Lava received")
    acc = record.get("accuracy")
    return SpikeMaps(samples=samples, timesteps=int(record.get("timesteps", data_cfg["timesteps"])),
                     input_maps=maps, output_spikes=out, source="lava", spread="exact" if exact else "uniform",
                     analog_input=analog, accuracy=float(acc) if isinstance(acc, (int, float)) else None,
                     notes=notes)


def lava_layers(model) -> list[int]:
    """The model's layers that are Lava layers: every layer with neurons but an analog global
    pool (folded into the readout at export, :mod:`neurofed.deploy.deployable`)."""
    from neurofed.models.snn import AnalogGlobalPool

    blocks = getattr(model, "blocks", None)
    return [i for i, layer in enumerate(model.layers) if layer.has_neurons
            and not (blocks is not None and isinstance(blocks[i], AnalogGlobalPool))]


def _neuron_maps(run_dir: Path, record: dict, model, spiking: list[int]) -> dict | None:
    """Per spiking layer, each neuron's spikes over all samples (torch (C, H, W) order),
    from the file ``neurofed lava`` writes beside lava.json; None when absent."""
    name = record.get("neuron_spikes_file")
    if not name or not (run_dir / name).is_file():
        return None
    import numpy as np

    with np.load(run_dir / name, allow_pickle=False) as z:
        if sorted(z.files) != sorted(f"layer{j}" for j in range(len(spiking))):
            return None
        maps = {}
        for j, i in enumerate(spiking):
            arr = torch.from_numpy(np.asarray(z[f"layer{j}"], dtype=np.float64))
            if arr.numel() != model.layers[i].num_neurons:
                return None
            maps[i] = arr.reshape(tuple(model.layers[i].out_shape))
    return maps
