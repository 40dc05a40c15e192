"""The algorithm contract: a server half and a client half under one name.

Messages, not objects, cross the client/server line: the client
receives ``(params: dict[str, ndarray], config: dict)`` and returns
``(params: dict[str, ndarray], num_examples: int, metrics: dict)``. The in-process
runner and the Flower app pass exactly these, so every algorithm runs unchanged in
both.

An algorithm module subclasses :class:`Algorithm` (or the algorithm it extends)
and overrides only what differs: its ``Server`` (selection, aggregation, server
state) and its ``Client`` (local objective and state hooks into the one training
loop in :mod:`neurofed.training.local`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from neurofed.config import choice, shown
from neurofed.training.params import ParamSpec
from neurofed.algorithms.policies import round_lr, update_noise
from neurofed.seeds import seed_for
from neurofed.data.partition import label_counts
from neurofed.training.local import make_optimizer, train_local
from neurofed.models import quantize as quantization


@dataclass
class ClientData:
    """One client's shard, already in memory."""

    cid: int
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int

    @property
    def label_counts(self) -> list[int]:
        return label_counts(self.y, [np.arange(len(self.y))], self.num_classes)[0].tolist()


# ``algorithm.weighting`` of the algorithms that offer it, read by Server.aggregation_weights
weighting_check = choice(("samples", "uniform"))


@dataclass(frozen=True)
class ServerContext:
    """What a server half is built with, besides the config: the federation's clients and data.

    ``num_clients``: N, the clients it selects from; ``client_sizes``: n_k, each client's
    number of training samples (None: unknown, taken as equal); ``dataset``: the run's
    :class:`~neurofed.data.Dataset` (shapes, classes, samples) for servers that build
    models or compute on data themselves (None where no such server runs)."""

    num_clients: int
    client_sizes: np.ndarray | None = None
    dataset: Any = None


@dataclass
class FitResult:
    """A client's reply as the server sees it (params packed flat)."""

    cid: int
    params: np.ndarray
    num_examples: int
    metrics: dict = field(default_factory=dict)


@dataclass
class FitContext:
    """One call of :meth:`Client.fit`: what the client is asked to do this round, handed to
    every hook, so that the client object keeps no per-call state.

    ``params``: the download by name (:meth:`Server.message_for`: the model's arrays and any
    beyond them, e.g. SCAFFOLD's c); ``config``: the round's config (``seed``, ``round``,
    maybe ``lr``, ``width``); ``data``: this client's shard; ``state``: its dict across
    rounds, updated in place. :meth:`Client.fit` fills ``spec`` (the layout of this
    round's model) and ``global_flat`` (the downloaded model, flat in ``spec`` order);
    ``derived`` holds what an algorithm's ``begin`` derives for this round's later hooks
    (FedProx's anchor, SCAFFOLD's c and c_i, ...)."""

    params: dict[str, np.ndarray]
    config: dict
    data: ClientData
    state: dict = field(default_factory=dict)
    spec: ParamSpec | None = None
    global_flat: np.ndarray | None = None
    derived: SimpleNamespace = field(default_factory=SimpleNamespace)

    @property
    def seed(self) -> int:
        """The round's seed (encoding, shuffling and seeded noise)."""
        return int(self.config["seed"])

    @property
    def round(self) -> int | None:
        """The round number (None where the caller gave none)."""
        return None if "round" not in self.config else int(self.config["round"])


class _BoundHooks:
    """The client's training hooks with one call's context bound, in the form
    :func:`~neurofed.training.local.train_local` calls them."""

    def __init__(self, client: "Client", ctx: FitContext):
        self.client, self.ctx = client, ctx

    def make_optimizer(self, model, fed_cfg):
        return self.client.make_optimizer(model, fed_cfg)

    def loss(self, model, output, y, x):
        return self.client.loss(self.ctx, model, output, y, x)

    def before_step(self, model, optimizer):
        self.client.before_step(self.ctx, model, optimizer)

    def after_step(self, model, optimizer):
        self.client.after_step(self.ctx, model, optimizer)


class Client:
    """FedAvg client (McMahan et al., AISTATS 2017): local SGD/Adam on cross-entropy,
    upload the trained parameters.

    Hooks into :func:`neurofed.training.local.train_local`: ``make_optimizer``, ``loss``,
    ``before_step``, ``after_step``; around it: ``begin`` (derive this round's values into
    ``ctx.derived``) and ``finish`` (build the upload), then ``uploaded`` (update local
    state). Every hook but ``make_optimizer`` gets the call's :class:`FitContext` first;
    the client object holds only the run's config and models built once.
    """

    def __init__(self, cfg: dict, spec: ParamSpec, model_factory: Callable[[], torch.nn.Module]):
        """``cfg``: the run's validated config; ``spec``: the model's parameter layout;
        ``model_factory``: builds a fresh model on the training device (called once)."""
        self.cfg = cfg
        self.spec = spec
        self.model_factory = model_factory
        self._model = None

    # -- the message interface ------------------------------------------------------
    def fit(self, ctx: FitContext) -> tuple[dict[str, np.ndarray], int, dict]:
        """Train on ``ctx.data`` from the downloaded ``ctx.params`` with the round's
        ``ctx.config``; ``ctx.state`` is updated in place. Returns ``(params by name,
        num_examples, metrics)``."""
        data, config = ctx.data, ctx.config
        ctx.spec = self.spec_for(ctx)
        ctx.global_flat = ctx.spec.pack(ctx.params)
        model = quantization.for_round(self.model(ctx), ctx.round, self.cfg["federation"]["rounds"])  # model.quantize
        ctx.spec.set(model, ctx.global_flat)
        self.begin(ctx, model)
        if len(data.y) == 0:
            raise ValueError(f"client {data.cid} has no training samples")  # would divide FedAvg by zero
        run_cfg = self.cfg
        if "lr" in config:  # the server's per-round learning rate (round_lr)
            run_cfg = {**self.cfg, "federation": {**self.cfg["federation"], "lr": float(config["lr"])}}
        metrics = train_local(model, data.x, data.y, run_cfg, _BoundHooks(self, ctx), seed=ctx.seed)
        local_flat = ctx.spec.get(model)
        upload = self.finish(ctx, model, local_flat, metrics)
        upload = self.add_update_noise(ctx, upload)
        upload = self.add_privacy_noise(ctx, upload)
        self.uploaded(ctx, upload, metrics)
        if not self.cfg["federation"].get("ldp_laplace"):  # under LDP the class histogram stays home
            metrics["label_counts"] = data.label_counts
        return ctx.spec.unpack(upload), int(len(data.y)), metrics

    def spec_for(self, ctx: FitContext) -> ParamSpec:
        """The parameter layout of the model this call trains (one layout by default)."""
        return self.spec

    def model(self, ctx: FitContext | None = None) -> torch.nn.Module:
        """The working model, built once and reloaded each round (SLAYER blocks with
        weight norm cannot be deep-copied, so we never copy models)."""
        if self._model is None:
            self._model = self.model_factory()
        return self._model

    def param_tensors(self, ctx: FitContext, model, flat: np.ndarray) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """``flat`` (a vector in ``ctx.spec`` order) cut into tensors, each paired with the
        model parameter it belongs to: for terms such as w − w_global or c − c_i."""
        params = dict(model.named_parameters())
        arrays = ctx.spec.unpack(np.asarray(flat, dtype=np.float32))
        return [(params[n], torch.from_numpy(np.array(arrays[n])).to(params[n].device)) for n in ctx.spec.names]

    # -- hooks -------------------------------------------------------------------------
    def begin(self, ctx: FitContext, model) -> None:
        """Before local training: ``model`` holds the global parameters; derive this
        round's values into ``ctx.derived``."""

    def make_optimizer(self, model, fed_cfg: dict):
        """The local optimizer over ``model``'s parameters (``fed_cfg``: the federation section,
        with this round's lr)."""
        return make_optimizer(model.parameters(), fed_cfg)

    def loss(self, ctx: FitContext, model, output: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The local objective of one batch: ``output`` the model's spikes for input ``x``,
        ``y`` the labels; returns a scalar tensor."""
        return F.cross_entropy(model.readout(output), y)

    def before_step(self, ctx: FitContext, model, optimizer) -> None:
        """After the backward pass, before ``optimizer.step()`` (e.g. gradient corrections)."""

    def after_step(self, ctx: FitContext, model, optimizer) -> None:
        """After ``optimizer.step()`` (e.g. counting steps)."""

    def finish(self, ctx: FitContext, model, local_flat: np.ndarray, metrics: dict) -> np.ndarray:
        """The upload (flat, ``ctx.spec`` order) from the trained parameters ``local_flat``;
        ``metrics`` may be extended in place."""
        return local_flat

    def uploaded(self, ctx: FitContext, upload: np.ndarray, metrics: dict) -> None:
        """After the upload is final (noise included): update ``ctx.state`` from what
        the server will see, so client and server state agree (SCAFFOLD's c_i)."""

    def noise(self, ctx: FitContext, stream: str, *keys: int) -> "Noise":
        """This round's noise source for ``stream`` (:mod:`neurofed.training.privacy`): OS
        entropy, or — ``federation.privacy_noise: seeded_not_private`` — the round seed."""
        from neurofed.training.privacy import OS_ENTROPY, Noise

        source = self.cfg["federation"].get("privacy_noise", OS_ENTROPY)
        return Noise(source, ctx.seed, stream, *keys)

    def add_update_noise(self, ctx: FitContext, upload: np.ndarray) -> np.ndarray:
        """``upload`` with FedSNN's update noise of this round (:func:`~neurofed.algorithms.policies.update_noise`)."""
        return update_noise(upload, ctx.global_flat, ctx.spec, self.cfg["federation"], ctx.seed)

    def add_privacy_noise(self, ctx: FitContext, upload: np.ndarray) -> np.ndarray:
        """Laplace local differential privacy (:mod:`neurofed.training.privacy`): the update
        y − x clipped to L1 norm ``federation.ldp_clip`` = C, then Laplace(0, b) on
        every uploaded value, b = ``federation.ldp_laplace`` (E|noise| = b, std = √2·b);
        ε = 2C/b per upload. ``ldp_clip: null`` is FedLEC Eq. 16 (Yu et al., IJCAI
        2025): θ^m ← θ^m + Laplace(0, δ), no clipping, no ε bound. Works with every
        algorithm because every client half uploads its parameters."""
        from neurofed.training.privacy import privatize_update

        fed = self.cfg["federation"]
        if not fed.get("ldp_laplace", 0.0):
            return upload
        return privatize_update(upload, ctx.global_flat, fed, self.noise(ctx, "ldp_laplace"))


class Server:
    """The server half; as written here, FedAvg's: random selection of P of N clients and
    the sample-weighted average (McMahan et al. 2017, Alg. 1) w ← Σ_k n_k w_k / Σ_k n_k
    over the clients that replied (or the plain mean: :meth:`aggregation_weights`).

    ``params`` (flat float32, in ``spec`` order) is the global model that is evaluated,
    checkpointed and exported.
    """

    models_by = "model"  # what labels global_models()'s keys (SFedHIFI: "width")

    def __init__(self, cfg: dict, spec: ParamSpec, initial: np.ndarray, context: ServerContext):
        """``cfg``: the run's validated config; ``spec``: the model's parameter layout;
        ``initial``: the initial global parameters (flat, ``spec`` order); ``context``:
        the clients and data (:class:`ServerContext`)."""
        self.cfg = cfg
        self.spec = spec
        self.params = np.asarray(initial, dtype=np.float32).copy()
        self.context = context
        self.num_clients = context.num_clients

    # -- selection ------------------------------------------------------------------
    def num_to_sample(self) -> int:
        """P, the number of clients selected per round."""
        return self.cfg["federation"]["clients_per_round"]

    def configure(self, rnd: int) -> list[tuple[int, dict]]:
        """The clients to train in round ``rnd`` (1-based), sorted by id, each with the config
        it receives (``round``, its ``seed`` and, when scheduled, ``lr``): ``[(cid, config)]``."""
        rng = np.random.default_rng(seed_for(self.cfg["seed"], "select", rnd))
        chosen = np.sort(rng.choice(self.num_clients, size=self.num_to_sample(), replace=False))
        return [(int(c), self.client_config(rnd, int(c))) for c in chosen]

    def client_config(self, rnd: int, cid: int) -> dict:
        """The round config of client ``cid``: round, fit seed, the scheduled lr (:func:`round_lr`)."""
        config = {"round": rnd, "seed": seed_for(self.cfg["seed"], "fit", rnd, cid)}
        fed = self.cfg["federation"]
        if fed.get("lr_decay", 1.0) != 1.0 or fed.get("lr_milestones"):
            lr = round_lr(fed, rnd)
            if lr != fed["lr"]:
                config["lr"] = lr
        return config

    def message(self) -> dict[str, np.ndarray]:
        """What every selected client downloads this round: the global parameters by
        name, plus any server state the clients need (e.g. SCAFFOLD's variate c)."""
        return self.spec.unpack(self.params)

    def message_for(self, cid: int, config: dict) -> dict[str, np.ndarray]:
        """What client ``cid``, configured with ``config``, downloads: ``message()``,
        unless the server keeps several global models (SFedHIFI: one per width)."""
        return self.message()

    def spec_for(self, config: dict) -> ParamSpec:
        """The parameter layout of the reply of a client configured with ``config``."""
        return self.spec

    # -- aggregation ----------------------------------------------------------------
    def aggregate(self, rnd: int, results: list[FitResult]) -> dict:
        """Fold round ``rnd``'s replies (at least one; already screened by
        :func:`screen_update`) into ``self.params``; return metrics for the round's line."""
        self.params = weighted_average(results, self.aggregation_weights(results))
        return {}

    def aggregation_weights(self, results: list[FitResult]) -> np.ndarray:
        """Each reply's weight in the average: its n_k, or 1 each under ``algorithm.weighting:
        uniform`` (FedLab's ``SyncServerHandler``, the server the SFedCA authors' baselines run
        on, averages so). Algorithms that declare no ``weighting`` key keep n_k."""
        if self.cfg["algorithm"].get("weighting") == "uniform":
            return np.ones(len(results))
        return np.array([r.num_examples for r in results], dtype=np.float64)

    def global_models(self) -> dict[str, tuple[dict, np.ndarray]] | None:
        """Every global model this server keeps, ``{label: (model config, flat params)}``,
        when it keeps several (each is evaluated and kept); None when ``params`` is the only one."""
        return None

    # -- state for checkpoints (plain numpy / python values) ---------------------------
    def state_dict(self) -> dict[str, Any]:
        """The server state a checkpoint holds (numpy arrays, numbers, strings, lists, dicts)."""
        return {"params": self.params}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (resuming a run)."""
        self.params = np.asarray(state["params"], dtype=np.float32)


def screen_update(spec: ParamSpec, params: dict[str, np.ndarray]) -> np.ndarray:
    """A client's reply packed flat in ``spec`` order; FloatingPointError when it holds a
    NaN or an infinity. Both transports (in process, Flower) screen every reply with it,
    so a broken update never reaches the global model."""
    flat = spec.pack(params)
    if not np.all(np.isfinite(flat)):
        raise FloatingPointError("update has non-finite values")
    return flat


# Parameters per block of weighted_average: the clients' slices of one block (5 clients:
# 5 MB) are stacked and reduced while still in cache, so each client vector is read
# once; stacking whole vectors first copies them all (2.4x slower at S-VGG9 size).
_AVERAGE_BLOCK = 1 << 18


def weighted_average(results: list[FitResult], weights: np.ndarray | None = None) -> np.ndarray:
    """Σ_k w_k x_k / Σ_k w_k, a matrix-vector product per block of parameters
    (weights default to n_k)."""
    if not results:
        raise ValueError("cannot aggregate an empty round")
    vectors = [r.params for r in results]
    w = np.asarray([r.num_examples for r in results] if weights is None else weights, dtype=np.float64)
    w = (w / w.sum()).astype(np.float32)
    out = np.empty(vectors[0].shape, np.float32)
    for start in range(0, out.size, _AVERAGE_BLOCK):
        block = slice(start, start + _AVERAGE_BLOCK)
        np.dot(w, np.stack([v[block] for v in vectors], dtype=np.float32), out=out[block])
    return out


class Algorithm:
    """A federated algorithm: ``Server`` and ``Client`` halves plus its config keys.

    ``config_defaults`` are the keys it reads from the ``algorithm`` section;
    ``config_checks`` validate them (see :mod:`neurofed.config`).
    """

    name = "fedavg"
    Server = Server
    Client = Client
    config_defaults: dict[str, Any] = {}
    config_checks: dict[str, Callable[[Any], str | None]] = {}
    needs_client_state = False  # True: the loop keeps each client's ``state`` dict across rounds

    @classmethod
    def privacy_mechanisms(cls, cfg: dict, num_classes: int) -> list[dict]:
        """Noised releases of this algorithm's clients beyond the model update
        (:func:`neurofed.training.privacy.mechanisms`), e.g. SFedCA's firing-rate report."""
        return []

    @classmethod
    def validate_config(cls, algo_cfg: dict, cfg: dict) -> list[str]:
        """One line per problem of the ``algorithm`` section ``algo_cfg`` (unknown keys, failed
        ``config_checks``), given the whole config ``cfg``; empty when it is valid."""
        problems = []
        for key, value in algo_cfg.items():
            if key == "name":
                continue
            if key not in cls.config_defaults:
                allowed = ", ".join(sorted(cls.config_defaults)) or "none"
                near = difflib.get_close_matches(str(key), list(cls.config_defaults), n=1, cutoff=0.75)
                hint = f" did you mean algorithm.{near[0]}?" if near else ""
                problems.append(f"algorithm.{key}: unknown key for {cls.name};{hint} allowed: {allowed}")
                continue
            check = cls.config_checks.get(key)
            msg = check(value) if check else None
            if msg:
                problems.append(f"algorithm.{key}: got {shown(value)}; {msg}")
        return problems
