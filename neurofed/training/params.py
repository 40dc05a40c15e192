"""The shared parameters of a model: named, ordered, and packed into one flat vector.

Clients and server exchange ``dict[str, np.ndarray]`` messages; the server packs
them into flat float32 vectors so that aggregation is a few vectorized operations
over a (clients × parameters) matrix rather than a loop over layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Untrained parameters the server averages as any other: batch norm's running statistics
# (neurofed.models.norm), so that the global model evaluates and exports with them.
FEDERATED_STATISTICS = ("running_mean", "running_var")


@dataclass(frozen=True)
class ParamSpec:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    # (name, axis) of parameters that hold one copy per SNN time step (e.g. per-step
    # BN/threshold); a model declares them as ``param_time_axes = {name: axis}``.
    # FedLEC's Aggregation Through Time averages over that axis; SLAYER blocks have none.
    time_axes: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "ParamSpec":
        """Trainable parameters, and the statistics kept as untrained parameters so that
        the server averages them (:data:`FEDERATED_STATISTICS`), in registration order
        (buffers are not shared)."""
        named = [(n, tuple(p.shape)) for n, p in model.named_parameters()
                 if p.requires_grad or n.rsplit(".", 1)[-1] in FEDERATED_STATISTICS]
        declared = dict(getattr(model, "param_time_axes", None) or {})
        axes = tuple((n, int(declared[n])) for n, _ in named if n in declared)
        return cls(tuple(n for n, _ in named), tuple(s for _, s in named), axes)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([int(np.prod(s)) for s in self.shapes], dtype=np.int64)

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.sizes)])

    @property
    def size(self) -> int:
        return int(self.sizes.sum())

    @property
    def nbytes(self) -> int:
        return self.size * 4

    def slices(self) -> dict[str, slice]:
        off = self.offsets
        return {n: slice(int(off[i]), int(off[i + 1])) for i, n in enumerate(self.names)}

    # -- dict <-> flat ---------------------------------------------------------------
    def pack(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        missing = [n for n in self.names if n not in arrays]
        if missing:
            raise KeyError(f"parameter message lacks {len(missing)} tensors, e.g. {missing[0]!r}")
        for n, s in zip(self.names, self.shapes):
            if tuple(np.shape(arrays[n])) != s:
                raise ValueError(f"parameter {n!r}: got shape {np.shape(arrays[n])}, expected {s}")
        return np.concatenate([np.asarray(arrays[n], dtype=np.float32).ravel() for n in self.names])

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        if flat.shape != (self.size,):
            raise ValueError(f"flat parameter vector has shape {flat.shape}, expected ({self.size},)")
        off = self.offsets
        return {n: flat[off[i]:off[i + 1]].reshape(s) for i, (n, s) in enumerate(zip(self.names, self.shapes))}

    # -- model <-> flat ----------------------------------------------------------------
    def get(self, model: torch.nn.Module) -> np.ndarray:
        params = dict(model.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.names]).cpu().numpy().astype(np.float32)

    def set(self, model: torch.nn.Module, flat: np.ndarray) -> None:
        params = dict(model.named_parameters())
        t = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.float32))
        off = self.offsets
        with torch.no_grad():
            for i, n in enumerate(self.names):
                params[n].copy_(t[off[i]:off[i + 1]].view_as(params[n]))
