"""Residual networks on Lava: the process graph built from the model, joins included.

netx's HDF5 reader loads feed-forward chains only (lava-dl 0.6: its ``concat`` is a stub),
so a model with residual joins (:mod:`neurofed.models.residual`) is wired here from the
same parts netx uses. Every layer is written to an in-memory HDF5 group exactly as
``neurofed export`` writes it and made into a netx block by netx's own ``create_conv`` /
``create_dense`` (the same fixed-point weights, thresholds, decays and reset phases as a
``model.net`` run). A join is a netx conv block for its 3×3 synapse and neuron; its
shortcut is a second Lava ``Conv`` synapse (the 1×1 convolution, or the identity as a
1×1 conv of weight 1.0) whose output is connected into the same neuron's ``a_in``: a Lava
InPort sums every connection made into it, as the join sums the currents. The shortcut
reads the block's input through a one-step :class:`~neurofed.deploy.lava_procs.relay.StepDelay`,
SLAYER's shortcut delay (each Lava synapse adds the other step, as each SLAYER block does).

The result has the interface :func:`neurofed.deploy.lava_run._stream` drives (``layers``,
``inp``, ``create_runtime``, ``run``, ``stop``), so samples stream and spikes are counted
per layer exactly as for a netx file.

:func:`neurofed.deploy.constraints.hardware_use` sizes the graph on a hardware profile: the constraint check's
per-layer use (:mod:`neurofed.deploy.constraints`), a join's fan-in and synapses counting
its shortcut's too.
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np

from neurofed.deploy import DeployError


def _netx():
    from neurofed.compat import lava, netx

    return netx().hdf5.Network, netx().utils.NetDict, lava("lava.proc.conv.process").Conv


def graph_refusal(model) -> str | None:
    """Why this graph builder cannot map ``model``, a deployable copy (None when it can)."""
    from neurofed.models.residual import ResidualJoin

    for i, (layer, block) in enumerate(zip(model.layers, model.blocks)):
        if not isinstance(block, ResidualJoin) and not model.is_voltage_layer(i) and \
                getattr(block, "export_refusal", None):
            return f"layer {i} ({layer.kind}): {block.export_refusal}"
    return None


def shortcut_weight(block, in_channels: int) -> np.ndarray:
    """The join's shortcut as Lava conv weights (out, kx, ky, in): the 1×1 conv's integer
    weights, or the identity's 1.0 (64 in SLAYER's integer units)."""
    from neurofed.models.quantize import weight_exponent

    if block.shortcut is None:  # on the join's grid: 1.0 is 64 x 2^k (neurofed.models.quantize)
        one = int(64 * 2.0 ** weight_exponent(block.synapse))
        return (one * np.eye(in_channels, dtype=np.int64)).reshape(in_channels, 1, 1, in_channels)
    from neurofed.deploy.constraints import integer_weight

    w = integer_weight(block.shortcut).cpu().numpy()  # (out, in, 1, 1, 1)
    return w.reshape(w.shape[:4])[:, :, ::-1, ::-1].transpose(0, 3, 2, 1)  # as netx's create_conv


class ResidualLavaNet:
    """The Lava processes of one residual model, in the shape ``_stream`` expects."""

    def __init__(self, layers: list, inp, shortcuts: list):
        self.layers, self.inp, self.shortcuts = layers, inp, shortcuts

    def create_runtime(self, **kwargs):
        return self.layers[0].create_runtime(**kwargs)

    def run(self, **kwargs):
        return self.layers[0].run(**kwargs)

    def stop(self):
        return self.layers[0].stop()


@dataclass(frozen=True)
class GraphLayer:
    """One layer of the graph as the Lava side needs it (numpy only)."""

    index: int  # the model's layer index: its entry's name in the HDF5 image
    kind: str  # dense | conv (pools are grouped convs)
    flatten_before: bool
    opens_residual: bool
    graded: bool  # the first layer, taking graded spikes
    shortcut: tuple | None = None  # a join's (weight (out, kx, ky, in), stride)


@dataclass(frozen=True)
class GraphEntries:
    """A residual model's layers written as ``neurofed export`` writes them, in an in-memory
    HDF5 image, plus how they are wired: everything :func:`wire_graph` needs, computed once
    by :func:`graph_entries` in the process that holds the model. Workers forked from it
    (:mod:`neurofed.deploy.lava_shards`) wire Lava from these arrays and never call torch: a
    worker forked after the parent's torch ran its OpenMP pool hangs in torch's next
    parallel call."""

    image: bytes
    layers: tuple
    in_shape: tuple  # Lava's (x, y, c)
    input_bits: int | None


def graph_entries(model, input_bits: int | None = None) -> GraphEntries:
    """The entries of ``model`` (a deployable copy, :func:`neurofed.deploy.deployable.deployable_copy`;
    residual joins allowed). With ``input_bits`` the first layer takes graded spikes and its
    state is 2^input_bits finer (:mod:`neurofed.deploy.lava_plan`), as in a ``model.net`` export."""
    import io

    from neurofed.deploy.deployable import deployable_copy
    from neurofed.deploy.lava_plan import first_neuron_layer
    from neurofed.deploy.lava_readout import MAX_BIAS_EXP, NETX_BIAS_EXP
    from neurofed.deploy.netx_entries import write_layer
    from neurofed.models.residual import ResidualJoin

    copy = deployable_copy(model)  # folded and quantized as export writes it; the caller's model untouched
    why = graph_refusal(copy)
    if why:
        raise DeployError(f"the model cannot be wired on Lava: {why}")
    first = first_neuron_layer(copy)
    layers, flatten = [], False
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as h:
        for i, (layer, block) in enumerate(zip(copy.layers, copy.blocks)):
            if layer.kind == "flatten":
                flatten = True
                continue
            entry = h.create_group(str(i))
            graded = i == first and input_bits is not None
            # as `neurofed export` writes it; a graded first layer's bias at Lava's exponent 7, twice netx's range
            write_layer(entry, i, layer, block, copy.is_voltage_layer(i), input_bits if graded else 0,
                        MAX_BIAS_EXP if graded else NETX_BIAS_EXP)
            shortcut = None
            if isinstance(block, ResidualJoin):  # an identity shortcut has the join's own channels
                stride = block.shortcut.stride[0] if block.shortcut is not None else 1
                shortcut = (shortcut_weight(block, layer.out_shape[0]), stride)
            layers.append(GraphLayer(i, "dense" if layer.kind == "dense" else "conv", flatten,
                                     layer.options.get("residual") == "open", graded, shortcut))
            flatten = False
    return GraphEntries(buffer.getvalue(), tuple(layers), tuple(model.layers[0].in_shape[::-1]), input_bits)


def build_graph(model, timesteps: int, reset_offset: int = 1, input_bits: int | None = None) -> ResidualLavaNet:
    """The Lava process graph of ``model`` (see :func:`graph_entries`), its neurons reset every
    ``timesteps`` steps at netx's phases (``hdf5.Network(reset_interval, reset_offset)``:
    layer j at step ``reset_offset + 1 + j`` of each window)."""
    return wire_graph(graph_entries(model, input_bits), timesteps, reset_offset)


def wire_graph(entries: GraphEntries, timesteps: int, reset_offset: int = 1) -> ResidualLavaNet:
    """The Lava processes of ``entries``: netx's ``create_conv`` / ``create_dense`` per layer,
    each join's shortcut a second connection into its neurons. Lava and h5py only."""
    import io

    from neurofed.deploy.lava_plan import MESSAGE_BITS
    from neurofed.deploy.lava_readout import MAX_BIAS_EXP
    from neurofed.deploy.lava_procs.relay import StepDelay

    Network, NetDict, ConvSynapse = _netx()
    reset = {"reset_interval": timesteps, "reset_offset": reset_offset + 1}
    procs, shortcuts = [], []
    prev_out, prev_shape, skip = None, entries.in_shape, None
    with h5py.File(io.BytesIO(entries.image), "r") as h:
        for spec in entries.layers:
            entry = h[str(spec.index)]
            graded = {"input_message_bits": MESSAGE_BITS} if spec.graded else {}
            group = NetDict(f=entry)  # netx's view: arrays, not h5py datasets
            if spec.opens_residual:
                skip = (prev_out, prev_shape)
            if spec.kind == "dense":
                proc, _ = Network.create_dense(group, **reset, **graded)
            else:
                proc, _ = Network.create_conv(group, input_shape=prev_shape, **reset, **graded)
            if spec.graded and "bias" in entry:
                proc.neuron.bias_exp.init = np.full(proc.neuron.bias_exp.shape, MAX_BIAS_EXP)
            if prev_out is not None:
                flat = spec.flatten_before and len(prev_shape) == 3
                (prev_out.transpose([2, 1, 0]).flatten() if flat else prev_out).connect(proc.inp)
            if spec.shortcut is not None:
                shortcuts.append(_shortcut(spec.shortcut, skip, proc, ConvSynapse, StepDelay))
            reset["reset_offset"] += 1
            procs.append(proc)
            prev_out, prev_shape = proc.out, tuple(proc.out.shape)
    return ResidualLavaNet(procs, procs[0].inp, shortcuts)


def _shortcut(shortcut: tuple, skip, join, ConvSynapse, StepDelay) -> tuple:
    """Wire the join's shortcut: skip -> one-step delay -> Conv synapse -> join neuron's a_in."""
    if skip is None or skip[0] is None:
        raise DeployError("a residual join's block starts at the network input; the graph needs a layer before it")
    (weight, stride), (src, shape) = shortcut, skip
    delay = StepDelay(shape=shape)
    syn = ConvSynapse(input_shape=shape, weight=weight, stride=np.array([stride, stride]),
                      padding=np.array([0, 0]), dilation=np.array([1, 1]), groups=1, num_message_bits=0)
    if tuple(syn.a_out.shape) != tuple(join.neuron.a_in.shape):
        raise DeployError(f"residual shortcut gives {syn.a_out.shape}, the join's neurons are {join.neuron.a_in.shape}")
    src.connect(delay.s_in)
    delay.s_out.connect(syn.s_in)
    syn.a_out.connect(join.neuron.a_in)  # a second connection: the InPort sums it with the 3x3 synapse's
    return delay, syn


def simulate_graph(model, spikes: np.ndarray, seed: int, backend: str = "fixed_pt", progress=True, chunk: int = 10,
                   plan=None):
    """:func:`neurofed.deploy.lava_run.simulate` for a model wired by :func:`wire_graph`
    instead of read from ``model.net`` (``model``: a deployable copy, or its
    :func:`graph_entries`, which shard workers are given): (SpikeStats, timing).
    ``plan``: :func:`neurofed.deploy.lava_plan.plan_for` of ``model`` (default: binary input)."""
    from neurofed.deploy.lava_plan import plan_for
    from neurofed.deploy.lava_stream import _stream, run_config

    run_cfg = run_config(backend)
    if plan is None and isinstance(model, GraphEntries):
        raise DeployError("simulate_graph: graph entries need their plan (lava_plan.plan_for of the model)")
    plan = plan or plan_for(model, spikes.shape[-1])  # binary input; each layer's lag as in a model.net
    plan.check_backend(backend)
    entries = model if isinstance(model, GraphEntries) else graph_entries(model, plan.input_bits)
    if entries.input_bits != plan.input_bits:
        raise DeployError(f"graph entries written for {entries.input_bits} input bits, the plan has {plan.input_bits}")
    net = wire_graph(entries, plan.window)
    return _stream(net, spikes, seed, backend, run_cfg, progress, chunk, plan)
