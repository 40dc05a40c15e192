"""The global model as a NIR graph (``RUN_DIR/model.nir``): the Neuromorphic
Intermediate Representation that snnTorch, Norse, Rockpool, Sinabs, Spyx and
SpiNNaker2's tools read.

One node per synapse and one per neuron layer, in a chain:
``input -> conv1 -> conv1_lif -> pool1 -> pool1_lif -> ... -> flatten -> fc1 -> fc1_lif -> ... -> output``.

- **Synapses**: ``Conv2d`` (zero bias: SLAYER synapses have none) and ``Linear``
  with the 8-bit weights at their real scale (the integer weight netx receives
  divided by the neuron's weight scale, 64: the values SLAYER's forward pass uses).
- **Pools** as the convolutions the netx export writes
  (:func:`neurofed.deploy.export.pool_as_conv_weight`): exact, each output channel
  sees only its own input channel through the pool weight. Written with one group
  (the block-diagonal weight, zeros between channels): nir 1.0.8 takes a Conv2d's
  input channels from ``weight.shape[1]`` whatever ``groups`` says, so a grouped
  convolution fails NIR's own type check and ``nir.read``.
- **Flatten** over all non-batch dimensions (``start_dim=0``: NIR types carry no
  batch dimension), C, H, W order as SLAYER's.
- **CubaLIF** for SLAYER's CUBA neurons, parameters from the device parameters
  (``iDecay``, ``vDecay``, ``vThMant``) and the fixed-point scales. SLAYER (and
  Loihi) step, with ``c = iDecay/4096`` and ``d = vDecay/4096``:

      i[t] = (1 - c) i[t-1] + x[t]          x = W s, the weighted input spikes
      v[t] = (1 - d) v[t-1] + i[t]
      s[t] = v[t] > θ,  then v[t] = 0       θ = vThMant / 64

  NIR's CubaLIF is continuous: τ_syn dI/dt = -I + w_in S, τ_mem dv/dt = (v_leak - v) + R I,
  spike when v > v_threshold, then v = v_reset. One forward-Euler step of length Δt
  gives  I += Δt/τ_syn (w_in S - I)  and  v += Δt/τ_mem (R I - v),  which is SLAYER's
  step exactly when

      τ_syn = Δt / c,   w_in = τ_syn / Δt = 1 / c    (the input enters at weight 1)
      τ_mem = Δt / d,   R    = τ_mem / Δt = 1 / d    (the current enters v at weight 1)
      v_threshold = θ,  v_reset = 0,  v_leak = 0.

  Δt, one SLAYER step, is :data:`STEP_SECONDS` = 0.1 ms: NIR's times are seconds,
  and snnTorch's importer steps at 0.1 ms (hard-coded); Norse's takes ``dt``, given
  the same. The graph's metadata records it (``dt``). Both importers integrate with
  this Euler step, so they run SLAYER's dynamics up to arithmetic: float32 there,
  SLAYER's 64-bit fixed point (decays applied with truncation toward zero at 1/4096
  resolution) here. An importer that discretises exactly (decay exp(-Δt/τ)) would
  see decays of 0.221 and 0.0296 instead of 0.25 and 0.0300.
- **Latency**: a SLAYER block delays its output by one step (``delay_shift``, the
  synapse buffer of Loihi); NIR simulators pass spikes through the whole graph
  within a step. The graph has no delay nodes (neither importer loads NIR's
  ``Delay``): it runs the same dynamics, and SLAYER's output of the k-th neuron
  layer (k = 1, 2, ...) is the graph's k steps later. The metadata records that lag
  per neuron layer (``latency_steps``) so that a reader can line the two up
  (``neurofed nir`` does).

- **The network the chip runs** (:func:`neurofed.deploy.deployable.deployable_copy`):
  batch norm folded (scale into the weights, shift as the synapse's bias on the 1/64
  current grid: NIR's ``Conv2d`` bias, or an ``Affine`` for a dense layer; NIR adds it to
  the synapse output, i.e. to the current, as SLAYER does, so it is exact for any current
  decay), an analog global pool folded into the voltage readout, factorized kernels fused.
- **Voltage readout** (``model.readout: voltage``: SLAYER's Affine block, current decay 1,
  no leak, never fires): a ``CubaLIF`` with τ_syn = Δt (the input is the current), an
  unreachable threshold (``inf``) and τ_mem = Δt·2^24: NIR's no-leak τ_mem = ∞ makes Norse
  multiply by r = ∞ (NaN), neither importer loads ``LI`` (snnTorch maps ``IF`` to a leak of
  0.9), and a leak of 2^-24 per step is float32's resolution. Metadata ``readout: voltage``.

Refused, with the reason (:func:`nir_problems`): ANN models; residual joins (the
main path reaches the join a step after the shortcut in SLAYER, in the same step in
a graph without Delay nodes); blocks other than SLAYER's CUBA Conv/Pool/Flatten/Dense
(ALIF, sigma-delta ...); learned axonal delays (Delay nodes, which the importers do not
load); what :func:`deployable_copy` cannot fold; graded spikes; pools that do not tile
their input; zero decays (no finite τ) outside the voltage readout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from neurofed.deploy import DeployError

NIR_FILE = "model.nir"
FORMAT = "neurofed-nir-1"
STEP_SECONDS = 1e-4  # one SLAYER step in NIR's seconds: the step snnTorch's importer assumes
SUPPORTED_KINDS = ("conv", "pool", "flatten", "dense")
READOUT_LEAK_BITS = 24  # the voltage readout's τ_mem = Δt·2^24 (module docstring)


def _nir():
    try:
        import nir
    except ModuleNotFoundError:
        raise DeployError("the NIR export needs the 'nir' package (pip install nir==1.0.8; `make setup` installs it)") \
            from None
    return nir


# ----------------------------------------------------------------------------- what NIR cannot hold


def slayer_affine():
    from neurofed.models.snn import slayer

    return slayer.block.cuba.Affine


def nir_model(model):
    """The network the graph holds: ``model``'s deployable copy (module docstring); batch
    norm's shift is NIR's synapse bias, added to the current, so any current decay folds."""
    from neurofed.deploy.deployable import deployable_copy

    return deployable_copy(model, bias_on_current_ok=True)


def nir_problems(model) -> list[str]:
    """Why this model cannot be written as the NIR graph above (empty when it can)."""
    return checked_nir_model(model)[1]


def checked_nir_model(model) -> tuple:
    """(the network the graph would hold, why it cannot be written: empty when it can). The
    fold is made once here, for the check and the writer both."""
    if getattr(model, "kind", "snn") != "snn":
        return model, [f"model.kind is {model.kind!r}: only spiking models export to NIR"]
    from neurofed.deploy.constraints import _slayer_classes, exports_as
    from neurofed.deploy.deployable import has_residual_joins

    if not has_residual_joins(model):  # (a residual model is refused below, block by block)
        try:
            model = nir_model(model)
        except DeployError as exc:
            return model, [str(exc)]
        except RuntimeError:  # blocks its config does not rebuild (swapped by hand): checked as they are
            pass

    classes, neuron_cls = _slayer_classes()
    problems = []
    lag = 0  # delay_shift blocks before this one: the steps SLAYER's input to it runs late
    for i, (layer, block) in enumerate(zip(model.layers, model.blocks)):
        where = f"layer {i} ({layer.kind})"
        bias = getattr(getattr(block, "synapse", None), "bias", None)
        if lag and bias is not None and bias.detach().any():
            problems.append(f"{where}: its folded batch-norm shift is a current from step 0, while SLAYER's "
                            f"delay_shift brings its input {lag} step(s) late; a graph without Delay nodes (the "
                            f"importers load none) cannot hold both; train with model.delay_shift: false")
        lag += int(getattr(block, "delay_shift", False) is True)
        if getattr(block, "export_refusal", None) and "residual" in type(block).__name__.lower():
            problems.append(f"{where}: residual connection: SLAYER's main path reaches the join one step after the "
                            f"shortcut (one block's delay); a NIR graph without Delay nodes would add them in the "
                            f"same step, and the simulators' NIR importers (snnTorch, Norse) do not load Delay")
            continue
        if getattr(block, "export_refusal", None):  # a batch norm, an analog pool
            problems.append(f"{where}: {block.export_refusal}")
            continue
        if layer.kind not in SUPPORTED_KINDS:
            problems.append(f"{where}: no NIR mapping for this layer kind; supported: {', '.join(SUPPORTED_KINDS)}")
            continue
        voltage = model.is_voltage_layer(i)
        if not exports_as(block, classes[layer.kind]) and not (voltage and type(block) is slayer_affine()):
            problems.append(f"{where}: block {type(block).__name__} is not SLAYER's cuba.{classes[layer.kind].__name__}; "
                            f"the NIR export maps feed-forward CUBA blocks only (a residual block's skip path, "
                            f"ALIF's adaptive threshold, sigma-delta units have no CubaLIF equivalent)")
            continue
        if layer.kind == "flatten":
            continue
        neuron = block.neuron
        if not exports_as(neuron, neuron_cls):
            problems.append(f"{where}: neuron {type(neuron).__name__} is not CUBA-LIF; NIR's CubaLIF is the only "
                            f"neuron this export writes")
            continue
        if getattr(block, "delay", None) is not None:
            problems.append(f"{where}: learned axonal delays would need NIR Delay nodes, which the simulators' NIR "
                            f"importers (snnTorch, Norse) do not load; train without delays")
        if getattr(neuron, "norm", None) is not None:
            problems.append(f"{where}: batch norm of the current has no NIR CubaLIF parameter; train without it")
        if getattr(neuron, "graded_spike", False):
            problems.append(f"{where}: graded spikes: NIR neurons emit binary spikes")
        params = neuron.device_params
        if voltage:
            continue  # current decay 1, no leak, never fires: the readout node (module docstring)
        for key, name in (("iDecay", "current_decay"), ("vDecay", "voltage_decay")):
            if np.any(np.asarray(params[key]) <= 0):
                problems.append(f"{where}: {name} 0 (no decay) has no finite NIR time constant "
                                f"(τ = Δt / decay); use a decay > 0")
        if layer.kind == "pool":
            c, h, w = layer.in_shape
            k, s = layer.kernel, layer.stride
            if s != k or layer.padding or h % k or w % k:
                problems.append(f"{where}: kernel {k}, stride {s}, padding {layer.padding} on {h}x{w}: the "
                                f"grouped-convolution form of a pool is exact only when it tiles its input "
                                f"(stride == kernel, no padding, sizes a multiple of the kernel)")
    return model, problems


# ----------------------------------------------------------------------------- parameters


def _per_neuron(value, shape: tuple) -> np.ndarray:
    """A neuron parameter (shared scalar, or one per channel) as an array of ``shape``."""
    a = np.asarray(value, dtype=np.float64).reshape(-1)
    if a.size == 1:
        return np.full(shape, float(a[0]))
    return np.broadcast_to(a.reshape((-1,) + (1,) * (len(shape) - 1)), shape).copy()


def cuba_lif_params(neuron, shape: tuple, dt: float = STEP_SECONDS) -> dict[str, np.ndarray]:
    """NIR CubaLIF parameters (arrays of ``shape``) of a SLAYER CUBA neuron; derivation
    in the module docstring."""
    p = neuron.device_params
    c = _per_neuron(p["iDecay"], shape) / neuron.p_scale  # decays are 12-bit fractions
    d = _per_neuron(p["vDecay"], shape) / neuron.p_scale
    return {
        "tau_syn": dt / c,
        "tau_mem": dt / d,
        "r": 1.0 / d,
        "v_leak": np.zeros(shape),
        "v_threshold": _per_neuron(p["vThMant"], shape) / neuron.w_scale,
        "v_reset": np.zeros(shape),
        "w_in": 1.0 / c,
    }


def readout_params(neuron, shape: tuple, dt: float = STEP_SECONDS) -> dict[str, np.ndarray]:
    """The voltage readout as a CubaLIF (module docstring): the input is the current, the
    voltage sums it (leak 2^-24 per step) and never reaches the threshold."""
    d = 2.0 ** -READOUT_LEAK_BITS
    return {"tau_syn": np.full(shape, dt), "tau_mem": np.full(shape, dt / d), "r": np.full(shape, 1.0 / d),
            "v_leak": np.zeros(shape), "v_threshold": np.full(shape, np.inf), "v_reset": np.zeros(shape),
            "w_in": np.ones(shape)}


def _bias(block, channels: int) -> np.ndarray:
    """The synapse's bias (a folded batch norm's shift, on the 1/64 grid), zeros without one."""
    from neurofed.deploy.deployable import CURRENT_SCALE, integer_bias

    b = integer_bias(block.synapse)
    return np.zeros(channels) if b is None else b.double().numpy().reshape(-1) / CURRENT_SCALE


def _real_weight(block) -> np.ndarray:
    """The 8-bit weights as SLAYER's forward pass uses them (integer / 64), without
    SLAYER's trailing time-kernel axis."""
    from neurofed.deploy.constraints import integer_weight

    from neurofed.models.quantize import weight_exponent

    with torch.no_grad():  # a layer's exponent k: its integers are 2^k times finer steps (models.quantize)
        w = integer_weight(block.synapse).double() / block.neuron.w_scale / 2.0 ** weight_exponent(block.synapse)
    return w[..., 0].cpu().numpy()


# ----------------------------------------------------------------------------- the graph


def node_names(model) -> list[tuple[str, str | None]]:
    """Per layer of ``model.layers``: (synapse node, neuron node); a flatten is one node."""
    from neurofed.models.opcounts import layer_names

    out = []
    flat = 0
    for name, layer in zip(layer_names(model.layers), model.layers):
        if layer.kind == "flatten":
            flat += 1
            out.append((f"flatten{flat}" if flat > 1 else "flatten", None))
        else:
            out.append((name, f"{name}_lif"))
    return out


def to_nir(model, dt: float = STEP_SECONDS, meta: dict | None = None):
    """The NIR graph of ``model`` (refuses what NIR cannot hold, :func:`nir_problems`)."""
    nir = _nir()
    from neurofed.deploy.netx_entries import pool_as_conv_weight

    model, problems = checked_nir_model(model)
    if problems:
        raise DeployError("\n".join(["the model cannot be written as NIR:"] + problems))
    # the check's fold comes back as it is (deployable_copy returns a deployable copy unchanged); where
    # the check could not fold (blocks swapped by hand), this fold raises its error, as before
    model = nir_model(model)
    nodes = {"input": nir.Input(input_type={"input": np.array(model.layers[0].in_shape)})}
    edges = []
    prev = "input"
    latency = 0
    latencies = []
    for i, ((syn_name, lif_name), layer, block) in enumerate(zip(node_names(model), model.layers, model.blocks)):
        if layer.kind == "flatten":
            nodes[syn_name] = nir.Flatten(input_type={"input": np.array(layer.in_shape)}, start_dim=0, end_dim=-1)
        elif layer.kind == "dense":
            w = _real_weight(block).reshape(layer.out_shape[0], -1)
            # nir.Linear has no bias: a folded shift makes it an Affine (both importers read its bias)
            has_bias = getattr(block.synapse, "bias", None) is not None
            nodes[syn_name] = nir.Affine(weight=w, bias=_bias(block, w.shape[0])) if has_bias else nir.Linear(weight=w)
        else:
            w = _real_weight(block)
            syn = block.synapse
            groups = int(getattr(syn, "groups", 1))
            if layer.kind == "pool":
                # groups=1: nir 1.0.8's Conv2d takes its input channels from weight.shape[1]
                # whatever ``groups`` says, so a grouped conv fails NIR's own type check.
                # The block-diagonal weight is the same pool (zeros between channels).
                groups = 1
                w = pool_as_conv_weight(w.reshape(w.shape[-2:]), layer.in_shape[0], groups)
            nodes[syn_name] = nir.Conv2d(
                input_shape=tuple(layer.in_shape[1:]), weight=w, stride=tuple(syn.stride[:2]),
                padding=tuple(syn.padding[:2]), dilation=tuple(syn.dilation[:2]), groups=groups,
                bias=_bias(block, w.shape[0]) if layer.kind == "conv" else np.zeros(w.shape[0]))
        edges.append((prev, syn_name))
        prev = syn_name
        if lif_name is not None:
            params = readout_params if model.is_voltage_layer(i) else cuba_lif_params
            nodes[lif_name] = nir.CubaLIF(**params(block.neuron, tuple(layer.out_shape), dt))
            edges.append((prev, lif_name))
            prev = lif_name
            latency += int(bool(getattr(block, "delay_shift", False)))
            latencies.append(latency)
    nodes["output"] = nir.Output(output_type={"output": np.array(model.layers[-1].out_shape)})
    edges.append((prev, "output"))
    metadata = {"format": FORMAT, "dt": float(dt), "latency_steps": json.dumps(latencies),
                "layers": json.dumps([l.kind for l in model.layers]),
                "readout": "voltage" if model.is_voltage_layer(len(model.layers) - 1) else "spikes",
                "deploy_expand": int(model.deploy_expand),  # the readout voltage is this many times the model's
                **{k: (v if isinstance(v, (int, float, str)) else json.dumps(v)) for k, v in (meta or {}).items()}}
    return nir.NIRGraph(nodes=nodes, edges=edges, metadata=metadata)


def write_nir(model, path: str | Path, meta: dict | None = None, dt: float = STEP_SECONDS) -> Path:
    """Write ``model``'s NIR graph to ``path`` (beside it, then moved into place)."""
    nir = _nir()
    graph = to_nir(model, dt=dt, meta=meta)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    nir.write(tmp, graph)
    os.replace(tmp, path)
    return path


def graph_meta(graph) -> dict:
    """The graph's metadata, strings decoded and JSON lists parsed."""
    out = {}
    for k, v in (getattr(graph, "metadata", None) or {}).items():
        if isinstance(v, bytes):
            v = v.decode("utf8")
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, str) and v[:1] in "[{":
            try:
                v = json.loads(v)
            except ValueError:
                pass
        out[k] = v
    return out


def read_nir(path: str | Path, model=None):
    """Read a graph written by :func:`write_nir`; with ``model``, check it holds that
    model's nodes with the right shapes (a stale or foreign file makes every
    comparison meaningless). Returns the ``nir.NIRGraph``."""
    nir = _nir()
    path = Path(path)
    if not path.is_file():
        raise DeployError(f"{path}: not found; write it with `neurofed export RUN_DIR --format nir`")
    try:
        graph = nir.read(path)
    except Exception as exc:  # h5py, missing keys, type check: all mean a damaged or foreign file
        raise DeployError(f"{path}: not a readable NIR graph ({type(exc).__name__}: {exc}); "
                          f"re-run `neurofed export RUN_DIR --format nir`") from None
    if graph_meta(graph).get("format") != FORMAT:
        raise DeployError(f"{path}: not written by `neurofed export --format nir` (no {FORMAT!r} format tag)")
    if model is not None:
        model = nir_model(model)
        for (syn, lif), layer in zip(node_names(model), model.layers):
            for name, shape in ((syn, None), (lif, tuple(layer.out_shape))):
                if name is None:
                    continue
                node = graph.nodes.get(name)
                got = None if node is None else tuple(int(x) for x in node.output_type["output"])
                if node is None or (shape is not None and got != shape):
                    raise DeployError(f"{path}: node {name!r} is {got or 'missing'}, the run's model has "
                                      f"{shape or layer.kind}; the file is stale or foreign — re-run "
                                      f"`neurofed export RUN_DIR --format nir`")
    return graph


# ----------------------------------------------------------------------------- a run


def export_nir_run(run_dir: str | Path, quiet: bool = False, model_round: str | int = "last") -> Path:
    """Write the global model of ``run_dir`` (of ``model_round``: best, last or a kept
    round's number) to ``run_dir/model.nir``; the graph's metadata records the round."""
    from neurofed.deploy.export import load_global_model

    run_dir = Path(run_dir)
    model, cfg, _, rnd = load_global_model(run_dir, model_round=model_round)
    data = cfg["data"]
    meta = {"model": cfg["model"]["name"], "width": float(cfg["model"]["width"]), "timesteps": int(data["timesteps"]),
            "encoding": data["encoding"], "dataset": data["name"], "round": int(rnd)}
    path = write_nir(model, run_dir / NIR_FILE, meta=meta)
    if not quiet:
        n = sum(1 for l in model.layers if l.has_neurons)
        print(f"NIR graph (global model of round {rnd}, {n} CubaLIF layers, one step = {STEP_SECONDS * 1e3:g} ms) "
              f"-> {path}")
    return path



__all__ = ["NIR_FILE", "STEP_SECONDS", "nir_model", "nir_problems", "cuba_lif_params", "readout_params", "to_nir", "write_nir", "read_nir",
           "graph_meta", "node_names", "export_nir_run"]
