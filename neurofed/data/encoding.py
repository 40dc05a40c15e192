"""Input encoders: images (N, C, H, W) -> network input (N, C, H, W, T), per batch.

Data sets keep their samples as stored: file image sets as uint8 pixels 0-255 (one
memory-mapped copy shared by every client), ``digits`` as float32 in [0, 1], event
sets as uint8 spike frames. Everything below runs on one batch at a time, so no
float copy of a whole training set (or of a client's shard) is ever made.

- ``rate``: Poisson (Bernoulli per step) spikes with probability ``max_rate * pixel``;
  the spikes are what the Lava network receives too.
- ``direct``: the analog pixel value (optionally normalised with ``data.mean`` /
  ``data.std`` per channel) repeated as input current at every step.
- ``events``: the data already are spike tensors (N, C, H, W, T); passed through.
The ANN twin takes images as they are (``encode_for(model)`` handles that).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


def as_tensor(x) -> torch.Tensor:
    """A data set array as a tensor sharing its memory: uint8 stays uint8, nothing is copied."""
    if isinstance(x, torch.Tensor):
        return x
    x = np.asarray(x) if not isinstance(x, np.ndarray) else x
    with warnings.catch_warnings():
        # read-only memory maps (cached event frames): the tensors are never written to
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


def pixels(x: torch.Tensor) -> torch.Tensor:
    """Image pixels as float32 in [0, 1]: uint8 (0-255) is scaled, floats pass as they are."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    return x.float()


def normalize(x: torch.Tensor, mean=None, std=None) -> torch.Tensor:
    """(x - mean) / std per channel (dim 1) when ``data.mean`` / ``data.std`` are set."""
    if mean is None and std is None:
        return x
    shape = (1, -1) + (1,) * (x.dim() - 2)
    m = torch.as_tensor(mean if mean is not None else 0.0, dtype=x.dtype).reshape(shape)
    s = torch.as_tensor(std if std is not None else 1.0, dtype=x.dtype).reshape(shape)
    return (x - m) / s


def encode(x: torch.Tensor, encoding: str, timesteps: int, generator: torch.Generator | None = None,
           max_rate: float = 1.0, mean=None, std=None) -> torch.Tensor:
    if encoding == "events":
        return x.float()
    if encoding == "direct":
        x = normalize(pixels(x), mean, std)
        return x.unsqueeze(-1).expand(*x.shape, timesteps).contiguous()
    if encoding == "rate":
        prob = (pixels(x) * max_rate).clamp(0, 1).unsqueeze(-1).expand(*x.shape, timesteps)
        return torch.bernoulli(prob, generator=generator)
    raise ValueError(f"data.encoding: got {encoding!r}; allowed: rate, direct, events")


def encode_for(model, x: torch.Tensor, data_cfg: dict, generator: torch.Generator | None = None) -> torch.Tensor:
    """Encode a batch for ``model``: SNNs get time-expanded input, the ANN twin the image, or
    under ``model.ann_input: encoded`` the SNN's own encoded input (the twin averages it over T)."""
    if getattr(model, "kind", "snn") == "ann" and getattr(model, "input", "image") == "image":
        if data_cfg["encoding"] == "events":
            return x.float()
        return normalize(pixels(x), data_cfg.get("mean"), data_cfg.get("std"))
    return encode(x, data_cfg["encoding"], data_cfg["timesteps"], generator, data_cfg.get("max_rate", 1.0),
                  data_cfg.get("mean"), data_cfg.get("std"))
