"""The server halves of the heterogeneous-width algorithms: one global model per
width (:class:`HeteroServer`), and SFedHIFI's bank sharing and HIFI fusion on top
(:class:`SFedHIFIServer`, Eq. 5–12)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from neurofed.algorithms.base import FitResult, Server, ServerContext, weighted_average
from neurofed.algorithms.fednova import FedNovaServer
from neurofed.algorithms.sfedhifi.fusion import choose_layer, fixed_ranks, tucker_fuse
from neurofed.algorithms.sfedhifi.options import BANK_SUFFIX, MAX_DRAWS, MIX_SUFFIX
from neurofed.seeds import rng_for, seed_for
from neurofed.training.params import ParamSpec


class HeteroServer(Server):
    """One global model per width; each width aggregated by the base algorithm's own
    server half (``inner``), run on that width's parameters and replies only.

    ``params`` is the global model of ``model.width`` (what export, Lava and the energy
    report use); ``global_models()`` gives all of them (the runner evaluates each).
    """

    inner = Server  # the base algorithm's server half
    models_by = "width"

    def __init__(self, cfg: dict, spec: ParamSpec, initial: np.ndarray, context: ServerContext):
        self.cfg, self.spec, self.context, self.num_clients = cfg, spec, context, context.num_clients
        a = cfg["algorithm"]
        self.widths = [float(w) for w in a["widths"]]
        self.ref = float(cfg["model"]["width"])
        self._models: dict[float, torch.nn.Module] = {}
        self.specs: dict[float, ParamSpec] = {}
        init: dict[float, np.ndarray] = {}
        for i, p in enumerate(self.widths):
            if p == self.ref:
                self.specs[p], init[p] = spec, np.asarray(initial, dtype=np.float32).copy()
                continue
            torch.manual_seed(seed_for(cfg["seed"], "init_width", i))
            model = self.width_model(p)
            self.specs[p] = ParamSpec.from_model(model)
            init[p] = self.specs[p].get(model)
        self.banks = [n for n in spec.names if n.endswith(BANK_SUFFIX)]
        for p in self.widths:  # every width starts from the same filter banks (the authors' sync_at_init)
            bad = [n for n in self.banks if self.specs[p].shapes[self.specs[p].names.index(n)]
                   != spec.shapes[spec.names.index(n)]]
            if bad:
                raise ValueError(f"filter bank {bad[0]} has a different shape at width {p}; banks must be "
                                 f"width-independent")
            init[p] = self.with_arrays(p, init[p], {n: spec.unpack(init[self.ref])[n] for n in self.banks})
        from neurofed.models.init import calibrates, initialize

        if calibrates(cfg):  # every width starts calibrated as the reference does (neurofed.models.init)
            from neurofed.data.encoding import as_tensor

            for p in self.widths:
                if p != self.ref:  # the runner calibrated the reference width's model
                    model = self.width_model(p)
                    self.specs[p].set(model, init[p])
                    initialize(model, cfg, as_tensor(self.dataset.x_train))
                    init[p] = self.specs[p].get(model)
        self.servers = {p: self.inner(cfg, self.specs[p], init[p], context) for p in self.widths}
        self.assigned = self.assign_clients() if a["assign"] == "fixed" else None

    # -- the reference model ----------------------------------------------------------
    @property
    def params(self) -> np.ndarray:
        return self.servers[self.ref].params

    @params.setter
    def params(self, value: np.ndarray) -> None:
        self.servers[self.ref].params = np.asarray(value, dtype=np.float32)

    def global_models(self) -> dict[str, tuple[dict, np.ndarray]]:
        return {f"{p:g}": ({**self.cfg["model"], "width": p}, self.servers[p].params) for p in self.widths}

    # -- models and data the server builds itself ----------------------------------------
    @property
    def dataset(self):
        """The run's data set, from the server's context (its models' shapes, the rate batch)."""
        if self.context.dataset is None:
            raise ValueError(f"{self.cfg['algorithm']['name']}'s server builds models of other widths: its "
                             f"ServerContext must hold the run's dataset")
        return self.context.dataset

    def width_model(self, width: float) -> torch.nn.Module:
        """A (cached) model of ``width``: the run's model config at that width."""
        if width not in self._models:
            from neurofed.models import build_run_model

            self._models[width] = build_run_model(self.cfg, self.dataset, width)
        return self._models[width]

    def with_arrays(self, width: float, flat: np.ndarray, arrays: dict) -> np.ndarray:
        """``flat`` (width's layout) with the named tensors replaced."""
        spec = self.specs[width]
        out = np.array(flat, dtype=np.float32, copy=True)
        cuts = spec.slices()
        for name, value in arrays.items():
            out[cuts[name]] = np.asarray(value, dtype=np.float32).ravel()
        return out

    # -- selection ------------------------------------------------------------------------
    def assign_clients(self) -> np.ndarray:
        """Each client's width for assign fixed: ``client_widths``, or a seeded balanced draw."""
        given = self.cfg["algorithm"]["client_widths"]
        if given is not None:
            return np.asarray(given, dtype=np.float64)
        rng = rng_for(self.cfg["seed"], "client_widths")
        cycle = np.resize(np.asarray(self.widths), self.num_clients)
        return cycle[rng.permutation(self.num_clients)]

    def configure(self, rnd: int) -> list[tuple[int, dict]]:
        """``algorithm.selection: random`` (the paper: "5 active clients are randomly
        selected" of 10): P of N uniformly, FedAvg's draw, whatever their widths — a width
        none of them has keeps its model that round. ``cover_widths``: redrawn until every
        width is among them (at most ``MAX_DRAWS`` tries)."""
        rng = rng_for(self.cfg["seed"], "select", rnd)
        k = self.num_to_sample()
        chosen = np.sort(rng.choice(self.num_clients, size=k, replace=False))
        cover = self.cfg["algorithm"]["selection"] == "cover_widths"
        for _ in range(MAX_DRAWS):  # with cover_widths, redraw until every width is among the participants
            if self.assigned is not None:
                widths = self.assigned[chosen]
            else:
                widths = rng.choice(np.asarray(self.widths), size=k)
            if not cover or set(widths.tolist()) == set(self.widths):
                break
            if self.assigned is not None:
                chosen = np.sort(rng.choice(self.num_clients, size=k, replace=False))
        else:
            raise RuntimeError(f"round {rnd}: no draw of {k} clients covered all widths {self.widths} "
                               f"in {MAX_DRAWS} tries")
        return [(int(c), {**self.client_config(rnd, int(c)), "width": float(w)}) for c, w in zip(chosen, widths)]

    # -- messages ---------------------------------------------------------------------------
    def message(self) -> dict[str, np.ndarray]:
        raise RuntimeError(f"{self.cfg['algorithm']['name']} sends each client the model of its width "
                           f"(Server.message_for); this runner sends one message to all clients and cannot run it")

    def message_for(self, cid: int, config: dict) -> dict[str, np.ndarray]:
        return self.servers[float(config["width"])].message()

    def spec_for(self, config: dict) -> ParamSpec:
        return self.specs[float(config["width"])]

    # -- aggregation --------------------------------------------------------------------------
    def by_width(self, results: list[FitResult]) -> dict[float, list[FitResult]]:
        groups: dict[float, list[FitResult]] = {p: [] for p in self.widths}
        for r in results:
            groups[float(r.metrics["width"])].append(r)
        return groups

    def aggregate(self, rnd: int, results: list[FitResult]) -> dict:
        groups = self.by_width(results)
        metrics: dict[str, Any] = {"clients_per_width": {f"{p:g}": len(g) for p, g in groups.items()}}
        for p, group in groups.items():
            if group:  # a width without replies this round keeps its model
                for k, v in self.servers[p].aggregate(rnd, group).items():
                    metrics[f"{k}@{p:g}"] = v
        return metrics

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params, "widths": {f"{p:g}": s.state_dict() for p, s in self.servers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for p, s in self.servers.items():
            s.load_state_dict(state["widths"][f"{p:g}"])


class HeteroFedNovaServer(HeteroServer):
    inner = FedNovaServer


class SFedHIFIServer(HeteroServer):
    r"""SFedHIFI's server (Eq. 5–12).

    1. B̄ = mean of every participant's banks (Eq. 5); every other tensor (M^p and the
       plain layers) is averaged within its width (Eq. 6). Means are uniform
       (``weighting: samples``: weighted by n_k). A width without replies keeps its
       model but takes the new B̄.
    2. HIFI, every ``fusion_every`` rounds up to ``fusion_until``: pick a factorized
       layer L̂ (``fusion``), Tucker-decompose M_{L̂}^p of every width with one core shape,
       average the cores, rebuild each M_{L̂}^p from the mean core and its own factors
       (:func:`tucker_fuse`). With ``fusion: mode``, r_L^p (Eq. 7) is measured on each
       width's just-aggregated global model by one no-grad pass over the server's rate
       batch; L^p = argmax_L r_L^p (Eq. 9; ties: the lower layer) and L̂ = mode (Eq. 8,
       :func:`choose_layer`).

    Metrics logged per round: ``hifi_layer`` (index among the factorized layers, or
    None), ``hifi_rates`` (width -> r_L per factorized layer) and ``hifi_choices``.
    """

    def __init__(self, cfg, spec, initial, context):
        super().__init__(cfg, spec, initial, context)
        self.mixes = [n for n in spec.names if n.endswith(MIX_SUFFIX)]
        a = cfg["algorithm"]
        if a["fusion"] == "fixed" and not -len(self.mixes) <= a["fusion_layer"] < len(self.mixes):
            raise ValueError(f"algorithm.fusion_layer: got {a['fusion_layer']}; the model has {len(self.mixes)} "
                             f"factorized layers (index 0..{len(self.mixes) - 1}, or negative from the end)")
        if isinstance(a["tucker_ranks"], list):  # fail before training, not at the first fusion
            r = a["tucker_ranks"]
            for p in self.widths:
                for n in self.mixes:
                    shape = self.view(self.specs[p].unpack(self.servers[p].params)[n]).shape
                    if len(r) != len(shape) or any(x > d for x, d in zip(r, shape)):
                        raise ValueError(f"algorithm.tucker_ranks: {r} does not fit {n} as a {a['tucker_view']} "
                                         f"of shape {shape} (width {p:g}); give one rank per mode, each <= that "
                                         f"mode's size at every width")

    def aggregate(self, rnd: int, results: list[FitResult]) -> dict:
        a = self.cfg["algorithm"]
        groups = self.by_width(results)
        bank = {}
        if a["share_banks"] and self.banks:
            w = self.aggregation_weights(results)
            stacked = {n: np.stack([self.specs[float(r.metrics["width"])].unpack(r.params)[n] for r in results])
                       for n in self.banks}
            bank = {n: np.tensordot(w / w.sum(), s, axes=1) for n, s in stacked.items()}
        for p, group in groups.items():
            flat = weighted_average(group, self.aggregation_weights(group)) if group else self.servers[p].params
            self.servers[p].params = self.with_arrays(p, flat, bank)
        metrics: dict[str, Any] = {"clients_per_width": {f"{p:g}": len(g) for p, g in groups.items()},
                                   "hifi_layer": None}
        if self.fusion_due(rnd):
            layer, info = self.choose(rnd)
            self.fuse(layer)
            metrics.update(hifi_layer=layer, **info)
        return metrics

    def fusion_due(self, rnd: int) -> bool:
        a = self.cfg["algorithm"]
        return (a["fusion"] != "none" and bool(self.mixes) and rnd % a["fusion_every"] == 0
                and (a["fusion_until"] is None or rnd <= a["fusion_until"]))

    def choose(self, rnd: int) -> tuple[int, dict]:
        """L̂ (index among the factorized layers) and what it was chosen from."""
        a = self.cfg["algorithm"]
        if a["fusion"] == "fixed":
            return a["fusion_layer"] % len(self.mixes), {}
        if a["fusion"] == "random":
            return int(rng_for(self.cfg["seed"], "hifi_layer", rnd).integers(len(self.mixes))), {}
        rates = {p: self.layer_rates(p) for p in self.widths}
        choices = {p: int(np.argmax(r)) for p, r in rates.items()}  # argmax: the first of equal rates
        layer = choose_layer(choices, {p: rates[p][choices[p]] for p in self.widths})
        return layer, {"hifi_rates": {f"{p:g}": [round(float(x), 6) for x in r] for p, r in rates.items()},
                       "hifi_choices": {f"{p:g}": c for p, c in choices.items()}}

    def rate_batch(self) -> torch.Tensor:
        ds, a = self.dataset, self.cfg["algorithm"]
        x = ds.x_test if a["rate_data"] == "test" else ds.x_train
        from neurofed.data.encoding import as_tensor

        return as_tensor(np.asarray(x[:a["rate_samples"]]))

    def layer_rates(self, width: float) -> np.ndarray:
        """r_L (Eq. 7) of each factorized layer of ``width``'s global model: spikes per
        neuron and time step over the rate batch (same encoding draw for every width)."""
        from neurofed.training.local import forward_dataset, layer_firing_rates

        model = self.width_model(width)
        self.specs[width].set(model, self.servers[width].params)
        data_cfg = self.cfg["data"]
        _, spikes = forward_dataset(model, self.rate_batch(), data_cfg, seed_for(self.cfg["seed"], "hifi_rates"))
        spiking = [i for i, layer in enumerate(model.layers) if layer.has_neurons]
        per_layer = layer_firing_rates(model, spikes, data_cfg["timesteps"]).numpy()
        out = []
        for i, layer in enumerate(model.layers):
            if layer.options.get("block") != "factorized_conv":
                continue
            j = spiking.index(i) - (self.cfg["algorithm"]["rate_source"] == "input")
            if j < 0:
                raise ValueError("algorithm.rate_source: input needs a spiking layer before every factorized layer; "
                                 "use output")
            out.append(per_layer[j])
        return np.asarray(out)

    def view(self, mix: np.ndarray) -> np.ndarray:
        """M^p as Tucker sees it: ``tensor``, its three modes (Eq. 10: Eq. 4's
        a2 × C^p/a1 × D^p), or ``matrix``, its first mode × the rest (the authors' code
        decomposes their 1×1 convolution's weight, ``conv.1.weight``, as a matrix)."""
        return mix.reshape(mix.shape[0], -1) if self.cfg["algorithm"]["tucker_view"] == "matrix" else mix

    def fuse(self, layer: int) -> None:
        name = self.mixes[layer]
        mixes = {p: self.specs[p].unpack(self.servers[p].params)[name] for p in self.widths}
        views = {p: self.view(m) for p, m in mixes.items()}
        setting = self.cfg["algorithm"]["tucker_ranks"]
        ranks = setting if setting == "per_width" else fixed_ranks([v.shape for v in views.values()], setting)
        fused = tucker_fuse(views, ranks)
        for p in self.widths:
            self.servers[p].params = self.with_arrays(p, self.servers[p].params, {name: fused[p].reshape(mixes[p].shape)})
