"""Model zoo: SLAYER-block SNNs and their ANN twins, built from one topology spec."""

from __future__ import annotations

from dataclasses import replace

from neurofed.config import Section, boolean, choice, number, register_section
from neurofed.models.init import ANN_INIT_MODES, INIT_MODES
from neurofed.models.reset_gradient import NEURON_GRADIENTS
from neurofed.models.quantize import quantize_value
from neurofed.models.spec import ZOO, Layer, register_topology, topology
from neurofed.models import hifi_cnn as _hifi_cnn  # noqa: F401,E402  registers SFedHIFI's CNN (issue 7)
from neurofed.models import paper_nets as _paper_nets  # noqa: F401,E402  SFedCA's nets, spiking ResNet-18

MODEL_KINDS = ("snn", "ann")
READOUTS = ("spikes", "voltage")
TIE_BREAKS = ("lowest_label", "voltage")  # neurofed.models.snn.SpikingNet.readout
POOLS = ("sum", "max", "avg")  # neurofed.models.snn.pool_neuron
NORMS = ("none", "batch", "bntt")  # neurofed.models.norm
NORM_STATISTICS = ("running", "precise")  # neurofed.models.norm.precise_statistics
GLOBAL_POOLS = ("spikes", "analog")  # neurofed.models.snn.AnalogGlobalPool
ANN_INPUTS = ("image", "encoded")  # neurofed.data.encoding.encode_for


def rate_band(v):
    """[lo, hi] firing rates (spikes per neuron per step) with 0 < lo <= hi <= 1."""
    in_unit = number(0, 1, lo_open=True)
    if isinstance(v, (list, tuple)) and len(v) == 2 and not any(in_unit(x) for x in v) and v[0] <= v[1]:
        return None
    return f"got {v!r}; allowed: [lo, hi] with 0 < lo <= hi <= 1 (spikes per neuron per step)"


def model_names() -> list[str]:
    return sorted(ZOO)


def build_model(model_cfg: dict, input_shape: tuple, num_classes: int, logit_scale: float = 1.0):
    """Build the zoo model named in ``model_cfg`` (``kind`` snn or ann) for this input."""
    from neurofed.models.snn import AnnNet, SpikingNet

    layers = topology(model_cfg["name"], model_cfg.get("width", 1.0), num_classes, input_shape)
    # A layer option the model config also names takes the config's value (e.g. model.bank_fraction).
    layers = [replace(l, options={k: model_cfg.get(k, v) for k, v in l.options.items()}) if l.options else l
              for l in layers]
    cls = AnnNet if model_cfg.get("kind", "snn") == "ann" else SpikingNet
    return cls(layers, model_cfg, logit_scale=logit_scale)


def build_run_model(cfg: dict, dataset, width: float | None = None):
    """The model of a run's config for its data set (at ``width`` instead of
    ``cfg["model"]["width"]`` when given: heterogeneous-width runs keep one per width)."""
    model_cfg = cfg["model"] if width is None else {**cfg["model"], "width": width}
    return build_model(model_cfg, dataset.input_shape, dataset.num_classes, cfg["federation"]["logit_scale"])


MODEL_DEFAULTS: dict = {
    "name": "cnn",
    "kind": "snn",  # snn | ann (the ANN twin: same topology, ReLU)
    "width": 1.0,
    "threshold": 1.25,
    "current_decay": 0.25,
    "voltage_decay": 0.03,
    "tau_grad": 0.1,
    "scale_grad": 1.0,
    "weight_norm": False,
    # true: 8-bit weights as on Loihi (SLAYER's quantize_8bit hook); false: float; R: float, then
    # quantization-aware training on export's 8-bit grid from round R; "last K" / "last P%": that
    # training over the run's last K rounds / P % of its rounds (neurofed.models.quantize)
    "quantize": True,
    "dropout": 0.0,
    "delay_shift": True,  # SLAYER's one-step delay per block (Lava's timing); false: the papers' T
    # logits from the output layer's spikes (rate x logit_scale) or its non-spiking accumulated
    # voltage (FedSNN Eq. 7; the FedLEC authors' S-VGG9): neurofed.models.snn.SpikingNet.readout
    "readout": "spikes",
    # a spike-count readout's ties at evaluation: lowest_label (torch.argmax's rule, the papers'
    # code) | voltage (among the labels tied for the most spikes, the output neuron with the
    # highest voltage after the last counted step: nearest its next spike; read on Lava too)
    "tie_break": "lowest_label",
    "pool": "sum",  # sum (SLAYER's) | max (exact spike max) | avg (IF rate average): snn.pool_neuron
    # a residual net's global average pool: spikes (an IF pool; exports) | analog (the mean
    # passed on as a value, the authors' AdaptiveAvgPool2d; folded into the voltage readout at
    # export, neurofed.deploy.deployable): snn.AnalogGlobalPool
    "global_pool": "spikes",
    # none | batch (batch norm before each hidden layer's neurons; the SFedHIFI authors' ResNet;
    # folded into weights and biases at export) | bntt (FedSNN's BNTT: one γ and one set of
    # statistics per step, training only: no export): neurofed.models.norm
    "norm": "none",
    # bntt's number of steps: null takes data.timesteps (_bntt_steps); a number must equal it
    "norm_steps": None,
    # running: the norm's running statistics as training tracks them (PyTorch's exponential
    # average, momentum 0.1); precise: recomputed after each client's local training as the
    # mean over its data under the trained weights (PreciseBN): neurofed.models.norm
    "norm_statistics": "running",
    # slayer: SLAYER's weights; firing: each layer rescaled on a training batch to fire within
    # init_rates (neurofed.models.init, LSUV on firing rates)
    "init": "slayer",
    # the ANN twin's (model.kind: ann): torch (PyTorch's default, what the ANN rows were
    # measured with) | lsuv (each layer rescaled on a training batch to unit output std, the
    # ANN form of init: firing): neurofed.models.init
    "ann_init": "torch",
    # what the ANN twin reads: image (the normalized image, the default) | encoded (the time
    # average of the input the SNN reads, the same encoding and draws: a rate-coded SNN's Poisson
    # noise reaches its twin too, so the twin gap leaves out what the encoding loses)
    "ann_input": "image",
    # slayer: SLAYER's backward (tau_grad, scale_grad; reset not differentiated); spikingjelly:
    # SpikingJelly's node, arctan surrogate of atan_alpha and the reset differentiated (SFedCA
    # Eq. 10; forward unchanged): neurofed.models.reset_gradient
    "neuron_gradient": "slayer",
    "atan_alpha": 2.0,
    "init_rates": [0.02, 0.2],
    "init_samples": 64,
    # factorized convolutions (hifi_cnn; SFedHIFI Eq. 4, output channels grouped): bank
    # elements and output channels per group, per width-1 output channel (the authors' values)
    "bank_fraction": 0.25,
    "group_fraction": 0.125,
}


def _bntt_steps(cfg: dict) -> None:
    """BNTT's γ and statistics hold one entry per time step of the data: a null
    ``model.norm_steps`` takes ``data.timesteps`` (an invalid one is left for its own check)."""
    m, steps = cfg["model"], cfg["data"].get("timesteps")
    if m.get("norm") == "bntt" and m.get("norm_steps") is None and number(1, integer=True)(steps) is None:
        m["norm_steps"] = steps


def _norm_steps_checks(cfg: dict) -> list[str]:
    """BNTT keeps one γ per step: its steps are the data's, and it does not export (refused here,
    before training, rather than at the export that follows it)."""
    m, steps = cfg["model"], cfg["data"]["timesteps"]
    if m["norm"] == "bntt" and m["norm_steps"] != steps:
        return [f"model.norm_steps: got {m['norm_steps']!r} with model.norm bntt; expected data.timesteps "
                f"({steps}): BNTT keeps one γ and one set of statistics per time step"]
    if m["norm"] == "bntt" and cfg.get("export"):
        return ["export: true with model.norm bntt; its per-step γ cannot fold into a synapse that is the "
                "same at every step: set export: false, or train with model.norm: batch to export"]
    if m["norm"] != "bntt" and m["norm_steps"] is not None:
        return [f"model.norm_steps: got {m['norm_steps']!r}; it is read only with model.norm bntt (got "
                f"{m['norm']!r}): leave it null"]
    return []


def _tie_break_checks(cfg: dict) -> list[str]:
    """The voltage tie-break orders spike counts: a voltage readout has none to order."""
    m = cfg["model"]
    if m["tie_break"] == "voltage" and m["readout"] != "spikes":
        return [f"model.tie_break: voltage with model.readout {m['readout']!r}; it breaks ties between spike "
                f"counts: use it with model.readout: spikes, or leave tie_break at lowest_label"]
    return []


register_section(Section("model", MODEL_DEFAULTS, lambda: {
    "model.name": choice(model_names()),
    "model.kind": choice(MODEL_KINDS),
    "model.width": number(0, 1, lo_open=True),
    "model.threshold": number(0, lo_open=True),
    "model.current_decay": number(0, 1),
    "model.voltage_decay": number(0, 1),
    "model.tau_grad": number(0, lo_open=True),
    "model.scale_grad": number(0, lo_open=True),
    "model.weight_norm": boolean,
    "model.quantize": quantize_value,
    "model.dropout": number(0, 1),
    "model.delay_shift": boolean,
    "model.readout": choice(READOUTS),
    "model.tie_break": choice(TIE_BREAKS),
    "model.pool": choice(POOLS),
    "model.global_pool": choice(GLOBAL_POOLS),
    "model.norm": choice(NORMS),
    "model.norm_statistics": choice(NORM_STATISTICS),
    "model.norm_steps": number(1, integer=True, nullable=True),
    "model.init": choice(INIT_MODES),
    "model.ann_init": choice(ANN_INIT_MODES),
    "model.ann_input": choice(ANN_INPUTS),
    "model.neuron_gradient": choice(NEURON_GRADIENTS),
    "model.atan_alpha": number(0, lo_open=True),
    "model.init_rates": rate_band,
    "model.init_samples": number(1, integer=True),
    "model.bank_fraction": number(0, 1, lo_open=True),
    "model.group_fraction": number(0, 1, lo_open=True),
}, cross_checks=lambda cfg: _norm_steps_checks(cfg) + _tie_break_checks(cfg), derive=_bntt_steps))


__all__ = ["MODEL_DEFAULTS", "Layer", "ZOO", "register_topology", "topology", "build_model", "build_run_model", "model_names",
           "MODEL_KINDS"]
