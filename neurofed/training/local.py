"""The one local training loop and the one evaluation pass.

Algorithms never copy this loop; their client half plugs into it through hooks
(see :class:`neurofed.algorithms.base.Client`): ``loss`` (local objective),
``before_step`` (gradient corrections such as SCAFFOLD's), ``after_step``.
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from neurofed.data.encoding import encode_for
from neurofed.device import model_device
from neurofed.models.norm import as_training_starts, precise_statistics
from neurofed import progress


def make_optimizer(parameters, fed_cfg: dict) -> torch.optim.Optimizer:
    name = fed_cfg["optimizer"]
    lr = fed_cfg["lr"]
    wd = fed_cfg.get("weight_decay", 0.0)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=fed_cfg.get("momentum", 0.0), weight_decay=wd)
    raise ValueError(f"federation.optimizer: got {name!r}; allowed: adam, sgd")


def batches(n: int, batch_size: int, generator: torch.Generator | None = None):
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for i in range(0, n, batch_size):
        yield order[i:i + batch_size]


def encoded_batches(model, x: torch.Tensor, y: torch.Tensor | None, data_cfg: dict, batch_size: int,
                    gen: torch.Generator, epochs: int = 1, shuffle: bool = True, device=None):
    """``(idx, encoded x[idx] on device, y[idx] on device)`` per batch, epoch after epoch.

    Shuffling and encoding draw from ``gen`` on the CPU, in this order: one permutation
    per epoch, then each batch's spikes; so every device sees the same input spikes.
    """
    for _ in range(epochs):
        for idx in batches(len(x), batch_size, gen if shuffle else None):
            xb = encode_for(model, x[idx], data_cfg, gen).to(device)
            yield idx, xb, (None if y is None else y[idx].to(device))


_END = object()


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


def ahead(items, depth: int = 2):
    """Iterate ``items`` produced by a helper thread up to ``depth`` items ahead: on a GPU,
    the next batches are encoded on the CPU and copied while the current one trains.
    The producer is the only user of its random generator, so the draws are the same."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work():
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Raised(exc))
            return
        put(_END)

    thread = threading.Thread(target=work, name="neurofed-batches", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()


def device_batches(items, device: torch.device):
    """``items`` as they are on the CPU (the reference order of work), ahead of the
    consumer elsewhere."""
    return items if device.type == "cpu" else ahead(items)


def train_local(model, x: torch.Tensor, y: torch.Tensor, cfg: dict, hooks, seed: int) -> dict:
    """Train ``model`` in place on (x, y) for ``federation.local_epochs``.

    All randomness (shuffling, Poisson encoding, dropout) comes from ``seed``, so a
    client's update is a pure function of (global parameters, shard, seed).
    """
    fed, data_cfg = cfg["federation"], cfg["data"]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout uses the global stream
    device = model_device(model)
    model.train()
    opt = hooks.make_optimizer(model, fed)
    # float64 on the model's device: the same sums as Python floats, without a sync per step
    total = torch.zeros((), dtype=torch.float64, device=device)
    steps, seen = 0, 0
    shown = progress.bar(-(-len(x) // fed["batch_size"]) * fed["local_epochs"], "batches", level=2, unit="batch")
    # encoded on the CPU (same spikes on every device) and moved batch by batch
    for idx, xb, yb in device_batches(encoded_batches(model, x, y, data_cfg, fed["batch_size"], gen,
                                                      fed["local_epochs"], device=device), device):
        out = model(xb)
        loss = hooks.loss(model, out, yb, xb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        hooks.before_step(model, opt)
        opt.step()
        hooks.after_step(model, opt)
        total += loss.detach().double() * len(idx)
        seen += len(idx)
        steps += 1
        shown.update(1)
    shown.close()
    if cfg.get("model", {}).get("norm_statistics", "running") == "precise":
        precise_statistics(model, (xb for _, xb, _ in device_batches(
            encoded_batches(model, x, None, data_cfg, fed["batch_size"], gen, shuffle=False, device=device), device)))
    return {"train_loss": float(total) / max(seen, 1), "steps": steps}


@contextmanager
def evaluating(model):
    """``model`` in evaluation mode, then back in the caller's mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def forward_dataset(model, x: torch.Tensor, data_cfg: dict, seed: int, batch_size: int = 256,
                    record: bool = True, batch_statistics: bool = False):
    """Run ``model`` over ``x`` without training; return logits and per-layer spike counts.

    Returns ``(logits (N, K), layer_spikes (N, L) or None)``, on the CPU whatever the
    model's device (batches go to the model's device one by one). Leaves parameters,
    optimizer and buffers as they were (eval mode is restored to the caller's mode).
    ``batch_statistics``: batch norms normalize with each batch's own statistics, as training
    does (:func:`neurofed.models.norm.as_training_starts`), not their running ones.
    """
    gen = torch.Generator().manual_seed(seed)
    device = model_device(model)
    model.record = record
    logits, spikes = [], []
    with as_training_starts(model) if batch_statistics else evaluating(model):
        try:
            for _, xb, _ in device_batches(encoded_batches(model, x, None, data_cfg, batch_size, gen, shuffle=False,
                                                           device=device), device):
                out = model(xb)
                logits.append(model.readout(out))
                if record and model.layer_spikes:
                    spikes.append(torch.stack(model.layer_spikes, 1))
        finally:
            model.record = False
    return torch.cat(logits).cpu(), (torch.cat(spikes).cpu() if spikes else None)


def layer_firing_rates(model, spikes: torch.Tensor, timesteps: int) -> torch.Tensor:
    """Each spiking layer's firing rate (spikes per neuron per step, float64, shape (L,)),
    averaged over the samples of ``spikes`` ((N, L) counts from :func:`forward_dataset`)."""
    neurons = torch.tensor(model.neurons_per_layer, dtype=torch.float64)
    return spikes.double().mean(0) / (neurons * timesteps)


def evaluate(model, x: torch.Tensor, y: torch.Tensor, cfg: dict, seed: int) -> dict:
    """Test accuracy, loss and firing rates of ``model`` on (x, y)."""
    logits, spikes = forward_dataset(model, x, cfg["data"], seed)
    result = {
        # the exact fraction: a float32 mean makes 1,900 of 2,000 0.94999999, short of a 95 % target
        "accuracy": int((logits.argmax(1) == y).sum()) / max(len(y), 1),
        "loss": float(F.cross_entropy(logits, y)),
    }
    if spikes is not None:
        timesteps = cfg["data"]["timesteps"]
        neurons = torch.tensor(model.neurons_per_layer, dtype=torch.float64)
        rates = layer_firing_rates(model, spikes, timesteps).numpy()
        result["layer_firing_rates"] = [round(float(r), 6) for r in rates]
        # Mean over all neurons of the network (what an energy estimate weights by).
        result["firing_rate"] = float(spikes.double().sum(1).mean() / (neurons.sum() * timesteps))
    return result
