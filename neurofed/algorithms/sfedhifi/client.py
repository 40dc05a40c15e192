"""The client half of the heterogeneous-width algorithms: the model of the round's
width, trained with SFedHIFI's local objective (Eq. 13–14)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from neurofed.algorithms.base import Client
from neurofed.algorithms.fednova import FedNovaClient
from neurofed.algorithms.fedprox import FedProxClient
from neurofed.device import model_device
from neurofed.training.params import ParamSpec


class HeteroClient(Client):
    """Trains the model of the width in the round's config, with the local objective of
    Eq. 13–14; reports ``metrics["width"]``.

    Models are built once per width (and kept) from the run's model config with that
    width; the input shape and class count come from the factory's (reference-width)
    model, so the same client half works in process and on a Flower node.
    """

    def __init__(self, cfg: dict, spec: ParamSpec, model_factory):
        super().__init__(cfg, spec, model_factory)
        self._widths: dict[float, tuple[ParamSpec, torch.nn.Module]] = {}

    def fit(self, ctx):
        params, n, metrics = super().fit(ctx)
        metrics["width"] = float(ctx.config["width"])
        return params, n, metrics

    def width_model(self, ctx) -> tuple[ParamSpec, torch.nn.Module]:
        """The layout and model of the round's width, built on first use and kept."""
        width = float(ctx.config["width"])
        if width not in self._widths:
            self._widths[width] = self.build_width(width)
        return self._widths[width]

    def spec_for(self, ctx) -> ParamSpec:
        return self.width_model(ctx)[0]

    def model(self, ctx=None):
        return self.width_model(ctx)[1]

    def build_width(self, width: float) -> tuple[ParamSpec, torch.nn.Module]:
        from neurofed.models import build_model

        ref = self.model_factory()
        if float(self.cfg["model"]["width"]) != width:
            ref = build_model({**self.cfg["model"], "width": width}, tuple(ref.layers[0].in_shape),
                              int(ref.layers[-1].out_shape[0]),
                              self.cfg["federation"]["logit_scale"]).to(model_device(ref))
        return ParamSpec.from_model(ref), ref

    def loss(self, ctx, model, output, y, x):
        a = self.cfg["algorithm"]
        if a["loss"] == "tet":
            logits = model.readout_per_step(output)  # (N, K, T)
            loss = F.cross_entropy(logits, y[:, None].expand(-1, logits.shape[-1]))  # mean over samples and steps
        else:
            loss = super().loss(ctx, model, output, y, x)
        if a["orth_lambda"]:
            from neurofed.models.factorized import orthogonality_penalty

            loss = loss + a["orth_lambda"] * orthogonality_penalty(model, a["orth_norm"])
        return loss


class HeteroFedProxClient(FedProxClient, HeteroClient):
    """FedProx's proximal term on top of the heterogeneous local objective."""


class HeteroFedNovaClient(FedNovaClient, HeteroClient):
    """FedNova's ‖a_i‖₁ report from a heterogeneous client."""
