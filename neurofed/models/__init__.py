"""Model zoo: SLAYER-block SNNs and their ANN twins, built from one topology spec."""

from __future__ import annotations

from dataclasses import replace

from neurofed.models.spec import ZOO, Layer, register_topology, topology
from neurofed.models import hifi_cnn as _hifi_cnn  # noqa: F401,E402  registers SFedHIFI's CNN (issue 7)
from neurofed.models import paper_nets as _paper_nets  # noqa: F401,E402  SFedCA's nets, spiking ResNet-18

MODEL_KINDS = ("snn", "ann")


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


__all__ = ["Layer", "ZOO", "register_topology", "topology", "build_model", "build_run_model", "model_names",
           "MODEL_KINDS"]
