"""What an algorithm is: a server half and a client half under one name.

Messages, not objects, cross the client/server line (DESIGN.md): the client
receives ``(params: dict[str, ndarray], config: dict)`` and returns
``(params: dict[str, ndarray], num_examples: int, metrics: dict)``. The in-process
runner and the Flower app pass exactly these, so every algorithm runs unchanged in
both.

An algorithm module subclasses :class:`Algorithm` (or the algorithm it extends)
and overrides only what differs: its ``Server`` (selection, aggregation, server
state) and its ``Client`` (local objective and state hooks into the one training
loop in :mod:`neurofed.fl.train`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from neurofed.config import shown
from neurofed.fl.params import ParamSpec
from neurofed.fl.seeds import seed_for
from neurofed.fl.train import label_counts, make_optimizer, train_local
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
        return label_counts(self.y, self.num_classes)


@dataclass
class FitResult:
    """A client's reply as the server sees it (params packed flat)."""

    cid: int
    params: np.ndarray
    num_examples: int
    metrics: dict = field(default_factory=dict)


class Client:
    """FedAvg client (McMahan et al., AISTATS 2017): local SGD/Adam on cross-entropy,
    upload the trained parameters.

    Hooks into :func:`neurofed.fl.train.train_local`: ``make_optimizer``, ``loss``,
    ``before_step``, ``after_step``; around it: ``begin`` (read the round's config,
    set up per-round state) and ``finish`` (build the upload, update local state).
    ``state`` is this client's persistent dict across rounds (kept by the runner or
    the Flower node); algorithms that need no client state leave it empty.
    """

    def __init__(self, cfg: dict, spec: ParamSpec, model_factory: Callable[[], torch.nn.Module]):
        self.cfg = cfg
        self.spec = spec
        self.model_factory = model_factory
        self._model = None

    # -- the message interface ------------------------------------------------------
    def fit(self, params: dict[str, np.ndarray], config: dict, data: ClientData, state: dict):
        global_flat = self.spec.pack(params)
        model = quantization.for_round(self.model(), int(config["round"]))  # model.quantize: R
        self.spec.set(model, global_flat)
        self.global_flat = global_flat
        self.message = params  # the whole download, incl. arrays beyond the model's (Server.message)
        self.round_config = config
        self.data = data
        self.state = state
        self.begin(model)
        if len(data.y) == 0:
            raise ValueError(f"client {data.cid} has no training samples")  # would divide FedAvg by zero
        run_cfg = self.cfg
        if "lr" in config:  # the server's per-round learning rate (round_lr)
            run_cfg = {**self.cfg, "federation": {**self.cfg["federation"], "lr": float(config["lr"])}}
        metrics = train_local(model, data.x, data.y, run_cfg, self, seed=int(config["seed"]))
        local_flat = self.spec.get(model)
        upload = self.finish(model, local_flat, metrics)
        upload = self.add_update_noise(upload, global_flat)
        upload = self.add_privacy_noise(upload)
        self.uploaded(upload, metrics)
        if not self.cfg["federation"].get("ldp_laplace"):  # under LDP the class histogram stays home
            metrics["label_counts"] = data.label_counts
        return self.spec.unpack(upload), int(len(data.y)), metrics

    def model(self) -> torch.nn.Module:
        """The working model, built once and reloaded each round (SLAYER blocks with
        weight norm cannot be deep-copied, so we never copy models)."""
        if self._model is None:
            self._model = self.model_factory()
        return self._model

    def param_tensors(self, model, flat: np.ndarray) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """``flat`` (a vector in ``spec`` order) cut into tensors, each paired with the
        model parameter it belongs to: for terms such as w − w_global or c − c_i."""
        params = dict(model.named_parameters())
        arrays = self.spec.unpack(np.asarray(flat, dtype=np.float32))
        return [(params[n], torch.from_numpy(np.array(arrays[n])).to(params[n].device)) for n in self.spec.names]

    # -- hooks -------------------------------------------------------------------------
    def begin(self, model) -> None:
        pass

    def make_optimizer(self, model, fed_cfg: dict):
        return make_optimizer(model.parameters(), fed_cfg)

    def loss(self, model, output: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model.readout(output), y)

    def before_step(self, model, optimizer) -> None:
        pass

    def after_step(self, model, optimizer) -> None:
        pass

    def finish(self, model, local_flat: np.ndarray, metrics: dict) -> np.ndarray:
        return local_flat

    def uploaded(self, upload: np.ndarray, metrics: dict) -> None:
        """After the upload is final (noise included): update local state from what
        the server will see, so client and server state agree (SCAFFOLD's c_i)."""

    def noise(self, stream: str, *keys: int) -> "Noise":
        """This round's noise source for ``stream`` (:mod:`neurofed.fl.privacy`): OS
        entropy, or — ``federation.privacy_noise: seeded_not_private`` — the round seed."""
        from neurofed.fl.privacy import OS_ENTROPY, Noise

        source = self.cfg["federation"].get("privacy_noise", OS_ENTROPY)
        return Noise(source, int(self.round_config["seed"]), stream, *keys)

    def add_update_noise(self, upload: np.ndarray, global_flat: np.ndarray) -> np.ndarray:
        """FedSNN's gradient-noise study (Venkatesha et al. 2021, Sec. IV-E, Fig. 8b):
        N(0, 1) · strength added to the uploaded update, seeded from the round's client seed.

        ``federation.update_noise_mode: relative`` (default, the authors' code): per tensor
        the strength s = ``federation.update_noise`` is scaled by the mean magnitude of this
        client's update of that tensor, noise_t = N(0, 1) · s · mean|w_t − w_t^global|
        (Fig. 8b's strengths 0…4); ``absolute``: noise = N(0, 1) · s on every value."""
        strength = self.cfg["federation"].get("update_noise", 0.0)
        if not strength:
            return upload
        rng = np.random.default_rng(seed_for(int(self.round_config["seed"]), "update_noise"))
        noise = rng.normal(0.0, 1.0, size=upload.shape) * strength
        if self.cfg["federation"].get("update_noise_mode", "relative") == "relative":
            delta = np.abs(upload.astype(np.float64) - global_flat)
            offsets = self.spec.offsets
            scale = np.add.reduceat(delta, offsets[:-1]) / self.spec.sizes  # mean |Δ| per tensor
            noise *= np.repeat(scale, self.spec.sizes)
        return upload + noise.astype(np.float32)

    def add_privacy_noise(self, upload: np.ndarray) -> np.ndarray:
        """Laplace local differential privacy (:mod:`neurofed.fl.privacy`): the update
        y − x clipped to L1 norm ``federation.ldp_clip`` = C, then Laplace(0, b) on
        every uploaded value, b = ``federation.ldp_laplace`` (E|noise| = b, std = √2·b);
        ε = 2C/b per upload. ``ldp_clip: null`` is FedLEC Eq. 16 (Yu et al., IJCAI
        2025): θ^m ← θ^m + Laplace(0, δ), no clipping, no ε bound. Works with every
        algorithm because every client half uploads its parameters."""
        from neurofed.fl.privacy import privatize_update

        fed = self.cfg["federation"]
        if not fed.get("ldp_laplace", 0.0):
            return upload
        return privatize_update(upload, self.global_flat, fed, self.noise("ldp_laplace"))


class Server:
    """FedAvg server: random selection of P of N clients; sample-weighted average
    (McMahan et al. 2017, Alg. 1): w ← Σ_k n_k w_k / Σ_k n_k over the clients that
    replied.
    """

    def __init__(self, cfg: dict, spec: ParamSpec, initial: np.ndarray, num_clients: int):
        self.cfg = cfg
        self.spec = spec
        self.params = np.asarray(initial, dtype=np.float32).copy()
        self.num_clients = num_clients

    # -- selection ------------------------------------------------------------------
    def num_to_sample(self) -> int:
        return self.cfg["federation"]["clients_per_round"]

    def configure(self, rnd: int) -> list[tuple[int, dict]]:
        """The clients to train this round and the config each one receives."""
        rng = np.random.default_rng(seed_for(self.cfg["seed"], "select", rnd))
        chosen = np.sort(rng.choice(self.num_clients, size=self.num_to_sample(), replace=False))
        return [(int(c), self.client_config(rnd, int(c))) for c in chosen]

    def client_config(self, rnd: int, cid: int) -> dict:
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
        """Replace ``self.params`` with the aggregate; return metrics to log."""
        self.params = weighted_average(results)
        return {}

    # -- state for checkpoints (plain numpy / python values) ---------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.params = np.asarray(state["params"], dtype=np.float32)


def round_lr(fed: dict, rnd: int) -> float:
    """The learning rate of round ``rnd`` (1-based): lr · lr_decay^(r−1) · lr_gamma^k,
    k = the number of ``federation.lr_milestones`` m with m < r.

    ``lr_decay`` is an exponential decay per round; ``lr_milestones``/``lr_gamma`` the step
    schedule (as torch's MultiStepLR, counted in rounds): FedSNN Sec. IV-A reduces its SNN
    lr (0.1, SGD) "by a factor of 5 after 40, 60, and 80 epochs" of its 100 rounds, i.e.
    ``lr_milestones: [40, 60, 80], lr_gamma: 0.2``."""
    steps = sum(1 for m in fed.get("lr_milestones") or () if m < rnd)
    return fed["lr"] * fed.get("lr_decay", 1.0) ** (rnd - 1) * fed.get("lr_gamma", 1.0) ** steps


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
    needs_client_state = False

    @classmethod
    def privacy_mechanisms(cls, cfg: dict, num_classes: int) -> list[dict]:
        """Noised releases of this algorithm's clients beyond the model update
        (:func:`neurofed.fl.privacy.mechanisms`), e.g. SFedCA's firing-rate report."""
        return []

    @classmethod
    def validate_config(cls, algo_cfg: dict, cfg: dict) -> list[str]:
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
