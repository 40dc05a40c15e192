"""Can this model be mapped to the hardware? Checked before every export.

Two kinds of problems:

- **Structure** (always refused): only SLAYER CUBA ``Conv``, ``Pool`` (written as a
  depthwise conv), ``Flatten`` and ``Dense`` blocks load in netx; residual
  connections, ``Average``, ``ConvT``, ``Unpool``, ``KWTA``, ALIF neurons, batch
  norm and graded spikes do not (lava-dl 0.6), and a pool must tile its input
  exactly (SLAYER zero-pads odd sizes, a netx conv does not).
- **Limits** from the ``limits:`` section of ``hw_profiles/<name>.yaml``: weight
  precision, threshold and decay widths, neurons and synapses per core, fan-in,
  cores per chip. A limit with a ``source`` that is exceeded refuses the export; a
  limit marked ``assumption`` only warns — we do not refuse a model on a number
  nobody published.

The report also says how many cores the network needs: each layer gets whole
cores, enough for its neurons and its synapses (connections, the upper bound for
a convolution whose weights are shared).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from neurofed.deploy import DeployError
from neurofed.models.quantize import effective_weight, settle_steps
from neurofed.resources import profiles_dir

PROFILE_DIR = profiles_dir()  # the shipped profiles (neurofed.resources)
DEFAULT_PROFILE = "loihi2"
SUPPORTED_KINDS = ("conv", "pool", "flatten", "dense")
LIMIT_KEYS = ("cores_per_chip", "neurons_per_core", "synapses_per_core", "synapses_per_chip",
              "max_fan_in", "chips", "weight_bits", "threshold_bits", "decay_bits", "state_bits")
ACT_SHIFT = 6  # Lava's LIF adds a_in << 6 to the 24-bit current (lava/proc/lif/models.py)


@dataclass(frozen=True)
class Limit:
    value: float
    sourced: bool  # True: published figure (violations refuse); False: an assumption (warns)
    note: str = ""


@dataclass
class Profile:
    name: str
    limits: dict[str, Limit]

    def get(self, key: str) -> Limit | None:
        return self.limits.get(key)


def load_profile(profile: str | Path | dict | Profile = DEFAULT_PROFILE) -> Profile:
    """A profile by name (``hw_profiles/<name>.yaml``), path, or dict ``{name, limits}``."""
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, dict):
        data, where = profile, "profile dict"
    else:
        path = Path(profile)
        if not path.suffix:
            path = PROFILE_DIR / f"{profile}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")
                           if "limits" in (yaml.safe_load(p.read_text()) or {}))
            raise DeployError(f"hardware profile {str(profile)!r} not found; profiles with limits: {', '.join(known)}")
        data, where = yaml.safe_load(path.read_text()) or {}, str(path)
    raw = data.get("limits")
    if not isinstance(raw, dict) or not raw:
        raise DeployError(f"{where}: no 'limits:' section; the constraint check needs one "
                          f"(e.g. hw_profiles/{DEFAULT_PROFILE}.yaml)")
    limits = {}
    for key, entry in raw.items():
        if key not in LIMIT_KEYS:
            raise DeployError(f"{where}: limits.{key}: unknown limit; allowed: {', '.join(LIMIT_KEYS)}")
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), (int, float)):
            raise DeployError(f"{where}: limits.{key}: expected {{value: number, source: ...}} "
                              f"or {{value: number, assumption: ...}}")
        if "source" not in entry and "assumption" not in entry:
            raise DeployError(f"{where}: limits.{key}: give a 'source' or mark it an 'assumption'")
        limits[key] = Limit(entry["value"], "source" in entry, str(entry.get("source") or entry.get("assumption")))
    return Profile(str(data.get("name", Path(str(profile)).stem)), limits)


@dataclass
class LayerUse:
    index: int  # position among the network's spiking layers (Lava layer index)
    kind: str
    shape: tuple
    neurons: int
    fan_in: int
    synapses: int
    cores: int
    weight_range: tuple[int, int]  # integer weights as exported (SLAYER's 8-bit units x 64)
    max_current: float  # worst-case synaptic current in the layer's state units: SLAYER units x 2^k (its exponent)

    def row(self) -> str:
        return (f"{self.index:>3} {self.kind:<6} {'x'.join(map(str, self.shape)):>12} {self.neurons:>9,} "
                f"{self.fan_in:>7,} {self.synapses:>13,} {self.cores:>5}")


@dataclass
class ConstraintReport:
    profile: str
    layers: list[LayerUse] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cores_per_chip: int | None = None

    @property
    def cores(self) -> int:
        return sum(layer.cores for layer in self.layers)

    @property
    def chips(self) -> int | None:
        return math.ceil(self.cores / self.cores_per_chip) if self.cores_per_chip else None

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        if not self.layers:  # refused on structure before any layer was counted: no table to show
            return "\n".join([f"hardware check ({self.profile}): not mapped"] +
                             [f"  VIOLATION: {v}" for v in self.violations])
        lines = [f"hardware check ({self.profile}):",
                 "  #  kind          shape   neurons  fan-in      synapses cores"]
        lines += ["  " + layer.row() for layer in self.layers]
        chips = f" on {self.chips} chip(s) of {self.cores_per_chip} cores" if self.cores_per_chip else ""
        lines.append(f"  needs {self.cores} cores{chips}; "
                     f"{sum(l.neurons for l in self.layers):,} neurons, "
                     f"{sum(l.synapses for l in self.layers):,} synapses")
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        return "\n".join(lines)

    def raise_for_violations(self) -> None:
        if len(self.violations) == 1:  # one line: the layer and the reason
            raise DeployError(f"the model cannot be mapped to {self.profile}: {self.violations[0]}")
        if self.violations:
            raise DeployError("\n".join([f"the model cannot be mapped to {self.profile}:"] + self.violations))

    def to_dict(self) -> dict:
        return {"profile": self.profile, "cores": self.cores, "chips": self.chips,
                "violations": self.violations, "warnings": self.warnings,
                "layers": [{"kind": l.kind, "shape": list(l.shape), "neurons": l.neurons, "fan_in": l.fan_in,
                            "synapses": l.synapses, "cores": l.cores} for l in self.layers]}


# ----------------------------------------------------------------------------- helpers


def integer_weight(synapse: torch.nn.Module) -> torch.Tensor:
    """Weights as netx receives them: SLAYER's 8-bit quantization, descaled (x64).

    Models trained without the hook are quantized at export the same way."""
    from neurofed.models.quantize import quantize_8bit

    hook = synapse.pre_hook_fx or quantize_8bit
    return hook(effective_weight(synapse), descale=True)


def _slayer_classes():
    from neurofed.models.snn import slayer

    cuba = slayer.block.cuba
    blocks = {"conv": cuba.Conv, "pool": cuba.Pool, "flatten": cuba.Flatten, "dense": cuba.Dense}
    return blocks, slayer.neuron.cuba.Neuron


def exports_as(obj, cls) -> bool:
    """Whether netx and NIR write ``obj`` (a block or a neuron) as a ``cls``: it is one, or a
    subclass that says its forward is one's (``exports_as_base``: the factorized conv writes its
    fused kernel, the SpikingJelly-gradient neuron differs only in its backward)."""
    return type(obj) is cls or bool(getattr(obj, "exports_as_base", False))


def structure_problems(model) -> list[str]:
    """Why netx cannot express this model (empty when it can)."""
    if getattr(model, "kind", "snn") != "snn":
        return [f"model.kind is {model.kind!r}: only spiking models (kind snn) export to netx"]
    classes, neuron_cls = _slayer_classes()
    problems = []
    refused: dict[str, list[str]] = {}  # one line per reason, naming every layer it applies to
    for i, (layer, block) in enumerate(zip(model.layers, model.blocks)):
        where = f"layer {i} ({layer.kind})"
        if getattr(model, "is_voltage_layer", lambda _: False)(i):
            continue  # SLAYER's Affine: exported as a dense layer whose neuron never fires (deploy.lava_readout)
        refusal = getattr(block, "export_refusal", None)  # e.g. a residual join
        if refusal:
            refused.setdefault(refusal, []).append(str(i))
            continue
        if layer.kind not in SUPPORTED_KINDS:
            problems.append(f"{where}: netx cannot express this layer kind; supported: {', '.join(SUPPORTED_KINDS)}")
            continue
        if not exports_as(block, classes[layer.kind]):
            problems.append(f"{where}: block {type(block).__module__}.{type(block).__name__} does not load in netx; "
                            f"use slayer.block.cuba.{classes[layer.kind].__name__} (residual, Average, ConvT, "
                            f"Unpool, KWTA and ALIF blocks do not load)")
            continue
        if layer.kind == "flatten":
            continue
        neuron = block.neuron
        if not exports_as(neuron, neuron_cls):
            problems.append(f"{where}: neuron {type(neuron).__name__} is not CUBA-LIF; netx runs CUBA neurons")
        if getattr(neuron, "norm", None) is not None:
            problems.append(f"{where}: batch norm does not map exactly to netx (it becomes a bias Lava applies "
                            f"one step early); train without it")
        if getattr(neuron, "graded_spike", False):
            problems.append(f"{where}: graded spikes are not supported by the spike counters; use binary spikes")
        if layer.kind in ("conv", "pool") and block.delay is not None:
            problems.append(f"{where}: netx ignores axonal delays on conv layers")
        if layer.kind == "pool":
            c, h, w = layer.in_shape
            k, s = layer.kernel, layer.stride
            if s != k or layer.padding:
                problems.append(f"{where}: pool kernel {k}, stride {s}, padding {layer.padding}; "
                                f"export needs stride == kernel and no padding")
            if h % k or w % k:
                problems.append(f"{where}: input {h}x{w} is not a multiple of the pool kernel {k} "
                                f"(SLAYER pads odd sizes, netx does not); use even spatial sizes")
    return [f"layer{'s' * (len(idx) > 1)} {', '.join(idx)}: {reason}" for reason, idx in refused.items()] + problems


def _layer_use(index: int, layer, block, timesteps: int) -> LayerUse:
    neurons = layer.num_neurons
    if layer.kind == "dense":
        w = integer_weight(block.synapse).reshape(layer.out, -1)
        fan_in = w.shape[1]
        pos = w.clamp(min=0).sum(1).max()
    elif layer.kind == "conv":
        w = integer_weight(block.synapse)  # (out, in/groups, kh, kw, 1)
        fan_in = int(np.prod(w.shape[1:]))
        pos = w.clamp(min=0).flatten(1).sum(1).max()
    else:  # pool: one shared weight per kernel position
        w = integer_weight(block.synapse)
        fan_in = layer.kernel * layer.kernel
        pos = w.clamp(min=0).sum()
    # Worst case: every input spikes every step; the current decays by current_decay
    # per step, so it settles at (sum of positive weights) / current_decay.
    settle = settle_steps(block.neuron, timesteps)
    return LayerUse(index, layer.kind, tuple(layer.out_shape), neurons, fan_in, neurons * fan_in, 0,
                    (int(w.min()), int(w.max())), float(pos) / 64.0 * settle)


def check_model(model, profile=DEFAULT_PROFILE, timesteps: int = 32) -> ConstraintReport:
    """Check ``model`` against the profile's limits; never raises for limits (see
    :meth:`ConstraintReport.raise_for_violations`)."""
    prof = load_profile(profile)
    report = ConstraintReport(prof.name)
    report.violations += structure_problems(model)
    if report.violations:
        return report

    def flag(key: str, message: str) -> None:
        limit = prof.get(key)
        (report.violations if limit.sourced else report.warnings).append(
            message + ("" if limit.sourced else f" (limits.{key} is an assumption: {limit.note})"))

    def lim(key: str):
        limit = prof.get(key)
        return None if limit is None else limit.value

    spiking = [(layer, block) for layer, block in zip(model.layers, model.blocks) if layer.has_neurons]
    for j, (layer, block) in enumerate(spiking):
        use = _layer_use(j, layer, block, timesteps)
        where = f"layer {j} ({layer.kind} {'x'.join(map(str, layer.out_shape))})"
        npc, spc = lim("neurons_per_core"), lim("synapses_per_core")
        use.cores = max(1, math.ceil(use.neurons / npc) if npc else 1, math.ceil(use.synapses / spc) if spc else 1)
        report.layers.append(use)

        bits = lim("weight_bits")
        if bits is not None:
            lo, hi = -(1 << (int(bits) - 1)) * 2, ((1 << (int(bits) - 1)) - 1) * 2  # SLAYER steps of 2
            if use.weight_range[0] < lo or use.weight_range[1] > hi:
                flag("weight_bits", f"{where}: integer weights span {use.weight_range[0]}..{use.weight_range[1]}, "
                                    f"{int(bits)}-bit weights hold {lo}..{hi} (|w| <= {hi / 64:.2f} in SLAYER "
                                    f"units); netx would clip them")
        fan = lim("max_fan_in")
        if fan is not None and use.fan_in > fan:
            flag("max_fan_in", f"{where}: fan-in {use.fan_in:,} exceeds {int(fan):,}")
        if spc is not None and use.fan_in > spc:
            flag("synapses_per_core", f"{where}: one neuron's {use.fan_in:,} synapses exceed a core's {int(spc):,}")
        if model.is_voltage_layer(len(model.layers) - 1) and j == len(spiking) - 1:
            bound = ((1 << 17) - 1) / 64  # the readout neuron's threshold (deploy.lava_readout), SLAYER units
            if use.max_current * timesteps > bound:
                report.warnings.append(f"{where}: the voltage readout may reach {use.max_current * timesteps:.0f} "
                                       f"(all inputs spiking for {timesteps} steps), past {bound:.0f} where the "
                                       f"Lava neuron would fire and reset")
            continue
        params = block.neuron.device_params
        tb = lim("threshold_bits")
        if tb is not None and not 0 < params["vThMant"] < (1 << int(tb)):
            flag("threshold_bits", f"{where}: threshold mantissa {params['vThMant']} does not fit {int(tb)} bits")
        db = lim("decay_bits")
        if db is not None:
            for key in ("iDecay", "vDecay"):
                if not 0 <= params[key] <= (1 << int(db)):
                    flag("decay_bits", f"{where}: {key} {params[key]} outside 0..{1 << int(db)}")
        sb = lim("state_bits")
        if sb is not None:
            bound = (1 << (int(sb) - 1)) / (64 << ACT_SHIFT)  # 24-bit current in SLAYER units: ~2048
            if use.max_current > bound:
                report.warnings.append(f"{where}: worst-case current {use.max_current:.0f} (all inputs spiking) "
                                       f"passes the {int(sb)}-bit state bound {bound:.0f}; Lava would wrap it")

    total_neurons = sum(l.neurons for l in report.layers)
    total_synapses = sum(l.synapses for l in report.layers)
    cpc, chips = lim("cores_per_chip"), lim("chips")
    report.cores_per_chip = int(cpc) if cpc else None
    if cpc and chips and report.cores > cpc * chips:
        flag("chips", f"the network needs {report.cores} cores; {int(chips)} chip(s) have {int(cpc * chips)}")
    # totals over the board: a refusal only where its chip count is sourced too (else they warn, as chips does)
    board = "chips" if chips and not prof.get("chips").sourced else None
    spchip = lim("synapses_per_chip")
    if spchip and chips and total_synapses > spchip * chips:
        flag(board or "synapses_per_chip",
             f"{total_synapses:,} synapses exceed {int(spchip * chips):,} on {int(chips)} chip(s)")
    if npc and cpc and chips and total_neurons > npc * cpc * chips:
        flag(board or "neurons_per_core", f"{total_neurons:,} neurons exceed {int(npc * cpc * chips):,} on {int(chips)} chip(s)")
    return report


def hardware_use(model, profile=None, timesteps: int = 32) -> dict:
    """Cores and chips the residual Lava graph (:mod:`neurofed.deploy.lava_graph`) needs on ``profile`` (default loihi2): per spiking layer
    the constraint check's neurons and synapses (a join's shortcut synapses added), each
    layer on whole cores."""
    from neurofed.models.residual import ResidualJoin

    prof = load_profile(profile or DEFAULT_PROFILE)
    lim = {k: (v.value if (v := prof.get(k)) else None) for k in ("neurons_per_core", "synapses_per_core",
                                                                    "cores_per_chip")}
    rows = []
    for layer, block in zip(model.layers, model.blocks):
        if not layer.has_neurons:
            continue
        use = _layer_use(len(rows), layer, block, timesteps)
        if isinstance(block, ResidualJoin):
            use.fan_in += block.shortcut.in_channels if block.shortcut is not None else 1
            use.synapses = use.neurons * use.fan_in
        use.cores = max(1, math.ceil(use.neurons / lim["neurons_per_core"]) if lim["neurons_per_core"] else 1,
                        math.ceil(use.synapses / lim["synapses_per_core"]) if lim["synapses_per_core"] else 1)
        rows.append(use)
    cores = sum(r.cores for r in rows)
    cpc = lim["cores_per_chip"]
    return {"profile": prof.name, "cores": cores, "chips": math.ceil(cores / cpc) if cpc else None,
            "neurons": sum(r.neurons for r in rows), "synapses": sum(r.synapses for r in rows), "layers": rows}
