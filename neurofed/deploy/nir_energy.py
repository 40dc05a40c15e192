"""Energy of a NIR run: synaptic operations counted on the graph's own weights from the
simulator's spikes, beside neurofed's count from torch's (:mod:`neurofed.models.opcounts`)."""

from __future__ import annotations

import numpy as np
import torch

from neurofed.deploy import DeployError
from neurofed.deploy.lava_plan import SpikeStats


def synaptic_ops(graph, input_maps: dict) -> dict[str, float]:
    """Per synapse node of ``graph`` (Conv2d, Linear, Affine): the synaptic operations
    of ``input_maps[name]`` (the node's input spike counts summed over samples and
    steps, NIR's unbatched shape), counted from the graph's own weights: every input
    spike costs one accumulate per output neuron it reaches through a nonzero weight.
    The rule of :mod:`neurofed.models.opcounts`, applied to the NIR nodes (a pool is its
    grouped convolution here)."""
    import torch.nn.functional as F

    from neurofed.deploy.nir_export import _nir

    nir = _nir()
    out = {}
    for name, s in input_maps.items():
        node = graph.nodes[name]
        s = torch.as_tensor(np.asarray(s), dtype=torch.float64)
        mask = torch.as_tensor(np.asarray(node.weight) != 0, dtype=torch.float64)
        if isinstance(node, nir.Conv2d):
            reached = F.conv2d(s[None], mask, stride=tuple(node.stride), padding=tuple(node.padding),
                               dilation=tuple(node.dilation), groups=int(node.groups))
            out[name] = float(reached.sum())
        elif isinstance(node, (nir.Linear, nir.Affine)):
            out[name] = float(s.reshape(-1) @ mask.sum(0))
        else:
            raise DeployError(f"node {name!r} ({type(node).__name__}) has no synapses to count")
    return out


def energy_rows(model, graph, spikes: np.ndarray, stats: SpikeStats, torch_stats: SpikeStats,
                analog: bool = False) -> list[dict]:
    """Per synapse node: synaptic operations per sample counted on the NIR graph from
    the simulator's spikes, next to neurofed's count (:mod:`neurofed.models.opcounts`)
    from torch's spikes. Analog input (``analog``): the first synapse node does MACs, not
    synaptic operations; its row gives neurofed's MACs (the same on both sides)."""
    from neurofed.models.opcounts import count_layers, synapse_masks

    n = spikes.shape[0]
    first = torch.from_numpy(spikes.sum((0, -1)).astype(np.float64))
    from neurofed.deploy.nir_export import nir_model, node_names

    names = node_names(model)

    def maps(totals):
        prev, per_layer, nir_maps = first, [], {}
        j = 0
        for (syn, lif), layer in zip(names, model.layers):
            per_layer.append(prev.reshape(tuple(layer.in_shape)))
            if lif is not None:
                nir_maps[syn] = prev.reshape(tuple(layer.in_shape)).numpy()
                prev = torch.from_numpy(np.asarray(totals[j], dtype=np.float64))
                j += 1
        return per_layer, nir_maps

    _, nir_maps = maps(stats.neuron_totals)
    sim_ops = synaptic_ops(graph, nir_maps)
    torch_maps, _ = maps(torch_stats.neuron_totals)
    copy = nir_model(model)  # the deployable copy's weights are the 8-bit ones the graph holds
    rows = count_layers(model.layers, torch_maps, [None] * len(model.layers), n, spikes.shape[-1],
                        masks=synapse_masks(copy), analog_input=analog)
    by_index = {r["index"]: r for r in rows}
    out = []
    for i, ((syn, lif), layer) in enumerate(zip(names, model.layers)):
        if lif is None:
            continue
        if analog and not out:
            out.append({"node": syn, "macs": by_index[i]["macs"], "analog_input": True})
            continue
        out.append({"node": syn, "synaptic_ops": sim_ops[syn] / n,
                    "torch_synaptic_ops": by_index[i]["synaptic_ops"]})
    return out
