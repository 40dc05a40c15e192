"""SFedHIFI (Tao et al., "SFedHIFI: Fire Rate-Based Heterogeneous Information Fusion
for Spiking Federated Learning", 2025; ``shared/papers/sfedhifi-tao2025.md``) and the
heterogeneous-width baselines it is compared with.

Clients train models of different widths p ∈ ``algorithm.widths`` (the model named
in ``model.name`` at each width; SFedHIFI needs factorized convolutions, ``hifi_cnn``).
The server keeps one global model per width; each selected client gets its width in
the round's config (``config["width"]``), downloads that width's model
(``Server.message_for``), trains it and reports ``metrics["width"]``.

- ``hetero_fedavg`` / ``hetero_fedprox`` / ``hetero_fednova``: the base algorithm run
  separately within each width (the paper's baselines: "aggregation only among models
  of the same scale"). The base algorithm's own server half aggregates each width;
  the client half is the base algorithm's, with the local objective below.
- ``sfedhifi``: the filter banks B (width-independent) are averaged over all
  participating clients (Eq. 5), everything else — the mixing factors M^p (Eq. 6) and
  the plain layers — within each width; then the HIFI module (Eq. 7–12) fuses the M of
  one layer across widths. ``algorithm.fusion`` selects the layer: ``mode`` (SFedHIFI:
  firing rates), ``none`` (HIFI_w/o), ``fixed`` (HIFI_fixed, ``fusion_layer``) or
  ``random`` (HIFI_rand).

Local objective of every variant (Eq. 13–14; the authors' code uses it for the
baselines too): the TET loss, mean over time steps of the per-step cross-entropy of
``model.readout_per_step(output)`` (``algorithm.loss: rate`` gives the spike-rate
cross-entropy instead), plus λ·Σ_L ‖B_L B_Lᵀ − I‖ (λ = ``algorithm.orth_lambda``; the
norm ``algorithm.orth_norm``: ``l2``, Eq. 13's printed ‖·‖_2 (entry-wise), or ``mse``, the
authors' ``nn.MSELoss``, the form their λ values were tuned for; zero without banks).

Width assignment (``algorithm.assign``): ``fixed`` (the paper's text: clients are
clustered by their resources) — client i has ``client_widths[i]``, or, when that is
null, a seeded balanced draw (every width on ⌊N/|p|⌋ or ⌈N/|p|⌉ clients). ``round``
(the authors' code) — the P selected clients draw widths uniformly. Selection
(``algorithm.selection``): ``random`` (the paper: "5 active clients are randomly
selected" of 10) — a width no participant has keeps its model that round (SFedHIFI
still gives it the new banks and fuses its M); ``cover_widths`` — the draw (and, with
``assign: round``, the widths) is repeated until every width is among the participants,
so every width's global model is updated every round.

Server-side choices (see :class:`SFedHIFIServer`): averages are uniform over
clients as in Eq. 5–6 (``weighting: samples`` weights by n_k); firing rates for Eq. 7
are measured on the first ``rate_samples`` test images (the authors measure them on
the test set, during their evaluation of each width's global model); ``rate_source:
output`` is Eq. 7 (the spikes of layer L's neurons), ``input`` the authors' code (the
spikes entering layer L). The tie rule of Eq. 8's mode is in :func:`choose_layer`.
The server's firing-rate batch is data the server may hold: by default the first
``rate_samples`` images of the test set (as the authors, who measure during their
evaluation), ``rate_data: train`` the training set's — a deployment whose server holds
no data needs a public or synthetic batch here, and the rates reveal nothing of a
client's data (they are measured on the global models).
Tucker (Eq. 10–12), defaults measured on digits (examples/digits_sfedhifi.yaml under
Dir(0.3), widths fixed per client, Eq. 13's printed norm; mean final accuracy over the four
widths, seed 1, and seed 2 where given; same-width FedAvg, ``hetero_fedavg``: 50.9 / 49.2 %):

- ``tucker_view: matrix`` (default): M^p as a matrix, its first mode (the a2 bank
  elements) × the rest. The authors decompose their mixing 1×1 convolution's 4-way weight,
  two of whose modes have size 1 — a matrix — and Eq. 10's four factor matrices A1..A4
  are those of that 4-way weight. A matrix's Tucker core (HOOI from an SVD start) is its
  diagonal of singular values, so Eq. 11 averages the widths' spectra and Eq. 12 gives
  each width that mean spectrum on its own singular vectors: 50.9 / 49.8 %, width 0.25 at
  50.0 / 45.3 % (FedAvg's: 54.4 / 44.0 %).
  ``tensor``: M^p's three modes (Eq. 6's a2 × C^p/a1 × D^p, and Eq. 10's b1 × b2 × b3
  core); the cores are dense, and averaging dense cores of independently decomposed
  widths mixes entries that mean different things in each width's factor basis: 35.6 %
  at the fixed ranks below (the former default, per-width ranks with the authors' mean of
  squares in Eq. 13, 38.1 %).
- ``tucker_ranks: min`` (default): Eq. 10's "pre-defined Tucker ranks", one core shape
  that "retains the same shape when decomposed from all model scale factors" — the
  element-wise minimum of the widths' shapes (:func:`fixed_ranks`), the largest core the
  narrowest width has; in the matrix view (a2, a2) wherever the narrowest width's G·D ≥ a2
  (hifi_cnn_digits, hifi_cnn), which truncates no width, as M's rank is at most a2. A fraction gives the authors' rule, ``0.25`` × that minimum on the first two
  modes (their ``--n_basis``): 44.7 %, every width cut to a rank-2 M each round. A list
  gives the ranks; ``per_width`` (the former default, not the paper's form: each width at
  its own full rank, the mean over the core block all share) is :func:`tucker_fuse`'s.

Each decomposition gets one sign convention (:func:`canonical_signs`) before the cores are
averaged — without it, tensorly's per-mode SVD signs make the average cancel (measured on
trained digits models: cosine 0.999 between a full-rank width's M before and after fusion
with the convention, −0.13 without). The authors fuse only in their first 45 % of rounds
(``fusion_until``).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from neurofed.algorithms.base import Client, FitResult, Server, weighted_average
from neurofed.algorithms.fedavg import FedAvg
from neurofed.algorithms.fednova import FedNova, FedNovaClient, FedNovaServer
from neurofed.algorithms.fedprox import FedProx, FedProxClient
from neurofed.config import boolean, choice, number
from neurofed.device import model_device
from neurofed.fl.params import ParamSpec
from neurofed.fl.seeds import rng_for, seed_for

BANK_SUFFIX = ".bank"  # neurofed.models.factorized: the width-independent filter bank B
MIX_SUFFIX = ".mix"  # ... and the width-specific mixing factor M^p
FUSIONS = ("mode", "none", "fixed", "random")
MAX_DRAWS = 10_000  # redraws of a round's selection/widths before giving up

# --------------------------------------------------------------------------- HIFI pieces


def choose_layer(choices: dict, rates: dict) -> int:
    """Eq. 8: L̂ = mode of the per-width choices L^p (Eq. 9).

    ``choices``: width -> the layer it picked; ``rates``: width -> the firing rate of
    that layer. Tie rule: among the most frequent layers, the one with the highest
    rate r_{L^p} of a width that picked it (the authors' code, which falls back to the
    layer of the width with the highest rate when no single mode exists); if the rates
    tie too, the lowest layer index.
    """
    counts: dict[int, int] = {}
    for layer in choices.values():
        counts[int(layer)] = counts.get(int(layer), 0) + 1
    top = max(counts.values())
    modes = [layer for layer, c in counts.items() if c == top]
    best = {layer: max(float(rates[p]) for p, l in choices.items() if int(l) == layer) for layer in modes}
    return min(modes, key=lambda layer: (-best[layer], layer))


def canonical_signs(core: np.ndarray, factors: list) -> tuple[np.ndarray, list]:
    """The Tucker decomposition with one sign convention: mode by mode, each factor
    column is flipped (with its core slice) so that the slice's largest-magnitude entry
    is positive. Factors are only defined up to sign (tensorly's SVDs pick them per
    mode), and averaging cores of differently signed decompositions would cancel them;
    for a matrix (a diagonal core) this makes the singular values positive, a unique
    form; for more modes it is one deterministic convention among several."""
    core, factors = np.array(core, copy=True), [np.array(f, copy=True) for f in factors]
    for mode in range(core.ndim):
        slices = np.moveaxis(core, mode, 0)  # a view: flipping it flips the core
        for i in range(slices.shape[0]):
            if slices[i].flat[np.argmax(np.abs(slices[i]))] < 0:
                slices[i] *= -1
                factors[mode][:, i] *= -1
    return core, factors


def default_ranks(shapes: list[tuple]) -> list[int]:
    """The element-wise minimum of the shapes, each rank capped at the product of the
    others (a larger one only adds zero core entries). For one shape: its full
    multilinear rank bound, at which Tucker is exact."""
    ranks = [min(s[i] for s in shapes) for i in range(len(shapes[0]))]
    return [min(r, int(np.prod([x for j, x in enumerate(ranks) if j != i]))) for i, r in enumerate(ranks)]


def fixed_ranks(shapes: list[tuple], setting) -> list[int]:
    """Eq. 10's pre-defined Tucker ranks (b1, b2, ...), one core shape for every width.

    ``setting`` (``algorithm.tucker_ranks``): ``"min"`` — :func:`default_ranks` of all the
    widths' shapes, the largest core every width can be decomposed to (the narrowest width
    exactly); a fraction f in (0, 1] — the authors' rule, round(f × that minimum) (at least
    1) on the first two modes and the minimum on the rest (their ``tucker_sync``:
    ``--n_basis 0.25`` on the two modes of their 1×1 convolution's weight); a list — the
    ranks as given."""
    if isinstance(setting, list):
        return [int(r) for r in setting]
    low = default_ranks(shapes)
    if setting == "min":
        return low
    return [max(1, int(round(float(setting) * r))) if i < 2 else r for i, r in enumerate(low)]


def tucker_fuse(tensors: dict, ranks) -> dict:
    """Eq. 10–12: Tucker-decompose each width's tensor, average the cores (Eq. 11),
    rebuild each tensor from the mean core and its own factors (Eq. 12).

    ``ranks`` a list (one per mode): Eq. 10's pre-defined ranks (b1, b2, b3), the same
    core shape for every width (see :func:`fixed_ranks`), the whole cores averaged; a
    width's tensor keeps only what its factors span at those ranks. ``"per_width"``
    (``algorithm.tucker_ranks: per_width``, not the paper's form): each width is decomposed
    at its own full multilinear rank (:func:`default_ranks` of its shape alone, so its
    decomposition is exact), and Eq. 11's mean is taken over the core block every width
    has, the leading b = element-wise minimum of the widths' ranks (HOSVD orders each
    mode's components by decreasing singular value); a wider width keeps the rest of its
    own core. Decomposition: tensorly's HOOI from an SVD init (deterministic), in
    float64, with :func:`canonical_signs`.
    """
    import tensorly as tl
    from tensorly.decomposition import tucker

    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    shapes = [a.shape for a in arrays.values()]
    if len({len(s) for s in shapes}) != 1:
        raise ValueError(f"tucker_fuse: tensors of different orders {shapes}")
    own = {k: (default_ranks([a.shape]) if ranks == "per_width" else list(ranks)) for k, a in arrays.items()}
    for k, a in arrays.items():
        r = own[k]
        if len(r) != a.ndim or any(x < 1 or x > d for x, d in zip(r, a.shape)):
            raise ValueError(f"algorithm.tucker_ranks: {r} does not fit a tensor of shape {a.shape} (width {k}); "
                             f"each rank must be between 1 and that mode's size")
    parts = {}
    for k, a in arrays.items():
        core, factors = tucker(tl.tensor(a), rank=own[k], init="svd", n_iter_max=100, tol=1e-10)
        parts[k] = canonical_signs(np.asarray(core), [np.asarray(f) for f in factors])
    shared = tuple(slice(0, min(r[i] for r in own.values())) for i in range(len(shapes[0])))
    mean = np.mean([c[shared] for c, _ in parts.values()], axis=0)  # Eq. 11 (over the shared block)
    out = {}
    for k, (core, factors) in parts.items():
        core = core.copy()
        core[shared] = mean
        out[k] = np.asarray(tl.tucker_to_tensor((core, factors)), dtype=np.float32)
    return out


# --------------------------------------------------------------------------- config


def _widths(v):
    if (isinstance(v, list) and v and all(isinstance(x, numbers.Real) and not isinstance(x, bool) and 0 < x <= 1
                                          for x in v) and len(set(v)) == len(v)):
        return None
    return "expected a non-empty list of distinct widths in (0, 1]"


def _client_widths(v):
    if v is None or (isinstance(v, list) and v and all(isinstance(x, numbers.Real) and not isinstance(x, bool)
                                                       for x in v)):
        return None
    return "expected null (a balanced seeded draw) or one width per client"


def _ranks(v):
    if v in ("min", "per_width"):
        return None
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v <= 1:
        return None
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v):
        return None
    return ("expected min (the widths' smallest shape), a fraction in (0, 1] of it on the first two modes "
            "(the authors' 0.25), a list of positive integers (one per mode), or per_width")


HETERO_DEFAULTS: dict[str, Any] = {
    "widths": [0.25, 0.5, 0.75, 1.0],
    "assign": "fixed",  # fixed (a client keeps its width) | round (drawn every round, as the authors' code)
    "client_widths": None,  # assign fixed: one width per client; null: a balanced seeded draw
    "loss": "tet",  # tet (Eq. 14) | rate (cross-entropy of the spike-rate logits)
    "orth_lambda": 0.1,  # λ of Eq. 13 (the authors' Fashion-MNIST runs, baselines included)
    "orth_norm": "l2",  # Eq. 13's printed ‖B Bᵀ − I‖_2 (entry-wise 2-norm) | mse (the authors' nn.MSELoss)
    "selection": "random",  # random (the paper: 5 of 10 at random) | cover_widths (redraw until every width)
}
HETERO_CHECKS = {
    "widths": _widths,
    "assign": choice(("fixed", "round")),
    "client_widths": _client_widths,
    "loss": choice(("tet", "rate")),
    "orth_lambda": number(0),
    "orth_norm": choice(("l2", "mse")),
    "selection": choice(("random", "cover_widths")),
}
SFEDHIFI_DEFAULTS: dict[str, Any] = {
    **HETERO_DEFAULTS,
    "fusion": "mode",  # mode (SFedHIFI) | none (HIFI_w/o) | fixed (HIFI_fixed) | random (HIFI_rand)
    "fusion_layer": -1,  # HIFI_fixed: index among the factorized layers (-1: the last, the authors' choice)
    "fusion_every": 1,  # fuse every k-th round (the authors' --merger_epoch)
    "fusion_until": None,  # last round with fusion (the authors' --tucker_epochs); null: every round
    "tucker_view": "matrix",  # matrix: M's first mode × the rest (authors' code) | tensor: M's 3 modes
    "tucker_ranks": "min",  # Eq. 10's fixed ranks, one core shape: min | a fraction (authors 0.25) | a list | per_width
    "rate_data": "test",  # test | train: where the server's firing-rate batch comes from
    "rate_samples": 256,
    "rate_source": "output",  # output (Eq. 7) | input (the authors' code)
    "weighting": "uniform",  # uniform (Eq. 5-6) | samples (n_k)
    "share_banks": True,  # Eq. 5; false keeps B within each width too (a check of what B sharing adds)
}
SFEDHIFI_CHECKS = {
    **HETERO_CHECKS,
    "fusion": choice(FUSIONS),
    "fusion_layer": number(integer=True),
    "fusion_every": number(1, integer=True),
    "fusion_until": number(1, integer=True, nullable=True),
    "tucker_view": choice(("matrix", "tensor")),
    "tucker_ranks": _ranks,
    "rate_data": choice(("test", "train")),
    "rate_samples": number(1, integer=True),
    "rate_source": choice(("output", "input")),
    "weighting": choice(("uniform", "samples")),
    "share_banks": boolean,
}


def factorized_layers(model_name: str) -> list[int]:
    """Indices (in the topology) of the factorized conv layers of a zoo model."""
    from neurofed.models.spec import ZOO

    return [i for i, layer in enumerate(ZOO[model_name](1.0, 2)) if layer.options.get("block") == "factorized_conv"]


class HeteroConfig:
    """The cross-key checks every heterogeneous-width algorithm shares."""

    needs_banks = False

    @classmethod
    def validate_config(cls, algo_cfg: dict, cfg: dict) -> list[str]:
        problems = super().validate_config(algo_cfg, cfg)
        if problems:
            return problems
        a, fed, part, model = algo_cfg, cfg["federation"], cfg["partition"], cfg["model"]
        widths = [float(w) for w in a["widths"]]
        if float(model["width"]) not in widths:
            problems.append(f"model.width: got {model['width']!r}; with {cls.name} it names the global model that is "
                            f"exported and measured, so it must be one of algorithm.widths {a['widths']}")
        if a["selection"] == "cover_widths" and fed["clients_per_round"] < len(widths):
            problems.append(f"federation.clients_per_round: got {fed['clients_per_round']}; with selection "
                            f"cover_widths every width must be among each round's clients, so at least "
                            f"len(algorithm.widths) = {len(widths)}")
        if a["assign"] == "fixed":
            cw = a["client_widths"]
            if cw is None and part["num_clients"] < len(widths):
                problems.append(f"partition.num_clients: got {part['num_clients']}; assign fixed needs a client for "
                                f"each of the {len(widths)} widths")
            if cw is not None:
                if len(cw) != part["num_clients"]:
                    problems.append(f"algorithm.client_widths: got {len(cw)} widths; expected one per client "
                                    f"(partition.num_clients = {part['num_clients']})")
                elif any(float(w) not in widths for w in cw) or {float(w) for w in cw} != set(widths):
                    problems.append(f"algorithm.client_widths: every value must be one of algorithm.widths "
                                    f"{a['widths']}, and every width must have a client")
        elif a["client_widths"] is not None:
            problems.append("algorithm.client_widths: only used with algorithm.assign: fixed; set it to null")
        if cls.needs_banks:
            if not factorized_layers(model["name"]):
                problems.append(f"model.name: got {model['name']!r}; {cls.name} shares filter banks, so it needs a "
                                f"model with factorized convolutions (hifi_cnn)")
            if model["kind"] != "snn":
                problems.append(f"model.kind: got {model['kind']!r}; {cls.name} measures firing rates and shares "
                                f"the banks of the spiking model; use snn")
        return problems


# --------------------------------------------------------------------------- client


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

    def fit(self, params, config, data, state):
        width = float(config["width"])
        if width not in self._widths:
            self._widths[width] = self.build_width(width)
        self.spec, self._model = self._widths[width]
        params, n, metrics = super().fit(params, config, data, state)
        metrics["width"] = width
        return params, n, metrics

    def build_width(self, width: float) -> tuple[ParamSpec, torch.nn.Module]:
        from neurofed.models import build_model

        ref = self.model_factory()
        if float(self.cfg["model"]["width"]) != width:
            ref = build_model({**self.cfg["model"], "width": width}, tuple(ref.layers[0].in_shape),
                              int(ref.layers[-1].out_shape[0]),
                              self.cfg["federation"]["logit_scale"]).to(model_device(ref))
        return ParamSpec.from_model(ref), ref

    def model(self):
        return self._model

    def loss(self, model, output, y, x):
        a = self.cfg["algorithm"]
        if a["loss"] == "tet":
            logits = model.readout_per_step(output)  # (N, K, T)
            loss = F.cross_entropy(logits, y[:, None].expand(-1, logits.shape[-1]))  # mean over samples and steps
        else:
            loss = super().loss(model, output, y, x)
        if a["orth_lambda"]:
            from neurofed.models.factorized import orthogonality_penalty

            loss = loss + a["orth_lambda"] * orthogonality_penalty(model, a["orth_norm"])
        return loss


class HeteroFedProxClient(FedProxClient, HeteroClient):
    """FedProx's proximal term on top of the heterogeneous local objective."""


class HeteroFedNovaClient(FedNovaClient, HeteroClient):
    """FedNova's ‖a_i‖₁ report from a heterogeneous client."""


# --------------------------------------------------------------------------- server


class HeteroServer(Server):
    """One global model per width; each width aggregated by the base algorithm's own
    server half (``inner``), run on that width's parameters and replies only.

    ``params`` is the global model of ``model.width`` (what export, Lava and the energy
    report use); ``global_models()`` gives all of them (the runner evaluates each).
    """

    inner = Server  # the base algorithm's server half
    models_by = "width"

    def __init__(self, cfg: dict, spec: ParamSpec, initial: np.ndarray, num_clients: int):
        self.cfg, self.spec, self.num_clients = cfg, spec, num_clients
        a = cfg["algorithm"]
        self.widths = [float(w) for w in a["widths"]]
        self.ref = float(cfg["model"]["width"])
        self._dataset = None
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
        if cfg["model"].get("init") == "firing":  # every width fires from the first step (neurofed.models.init)
            from neurofed.data.encoding import as_tensor
            from neurofed.models.init import initialize

            for p in self.widths:
                if p != self.ref:  # the runner calibrated the reference width's model
                    model = self.width_model(p)
                    self.specs[p].set(model, init[p])
                    initialize(model, cfg, as_tensor(self.dataset.x_train))
                    init[p] = self.specs[p].get(model)
        self.servers = {p: self.inner(cfg, self.specs[p], init[p], num_clients) for p in self.widths}
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
        if self._dataset is None:
            from neurofed.data import load_dataset

            self._dataset = load_dataset(self.cfg["data"], self.cfg["seed"])
        return self._dataset

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

    def __init__(self, cfg, spec, initial, num_clients):
        super().__init__(cfg, spec, initial, num_clients)
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
        weights = (lambda rs: [r.num_examples for r in rs]) if a["weighting"] == "samples" else \
            (lambda rs: [1.0] * len(rs))
        bank = {}
        if a["share_banks"] and self.banks:
            w = np.asarray(weights(results), dtype=np.float64)
            stacked = {n: np.stack([self.specs[float(r.metrics["width"])].unpack(r.params)[n] for r in results])
                       for n in self.banks}
            bank = {n: np.tensordot(w / w.sum(), s, axes=1) for n, s in stacked.items()}
        for p, group in groups.items():
            flat = weighted_average(group, weights(group)) if group else self.servers[p].params
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
        from neurofed.fl.train import forward_dataset, layer_firing_rates

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


# --------------------------------------------------------------------------- algorithms


class HeteroFedAvg(HeteroConfig, FedAvg):
    """FedAvg within each width (the paper's FedAVG baseline)."""

    name = "hetero_fedavg"
    Server = HeteroServer
    Client = HeteroClient
    config_defaults = HETERO_DEFAULTS
    config_checks = HETERO_CHECKS


class HeteroFedProx(HeteroConfig, FedProx):
    """FedProx within each width (reads ``algorithm.mu`` as FedProx does)."""

    name = "hetero_fedprox"
    Server = HeteroServer
    Client = HeteroFedProxClient
    config_defaults = {**FedProx.config_defaults, **HETERO_DEFAULTS}
    config_checks = {**FedProx.config_checks, **HETERO_CHECKS}


class HeteroFedNova(HeteroConfig, FedNova):
    """FedNova within each width."""

    name = "hetero_fednova"
    Server = HeteroFedNovaServer
    Client = HeteroFedNovaClient
    config_defaults = HETERO_DEFAULTS
    config_checks = HETERO_CHECKS


class SFedHIFI(HeteroConfig, FedAvg):
    """Server: :class:`SFedHIFIServer`; client: :class:`HeteroClient` (Eq. 13–14)."""

    name = "sfedhifi"
    Server = SFedHIFIServer
    Client = HeteroClient
    config_defaults = SFEDHIFI_DEFAULTS
    config_checks = SFEDHIFI_CHECKS
    needs_banks = True
