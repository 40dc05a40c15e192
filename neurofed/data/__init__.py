"""Dataset registry: ``load_dataset(cfg["data"], seed)`` by name.

A dataset loader is a function ``(data_cfg: dict, seed: int) -> Dataset`` registered
with :func:`register_dataset`. Datasets that are not embedded read from
``data.root`` and never download. ``data.train_subset`` / ``data.test_subset`` cut
any of them to a stratified, seeded slice (:mod:`neurofed.data.subset`).
"""

from __future__ import annotations

from typing import Callable

from neurofed.data.base import Dataset

_REGISTRY: dict[str, Callable[[dict, int], Dataset]] = {}


def register_dataset(name: str):
    def deco(fn):
        _REGISTRY[name] = fn
        return fn

    return deco


def _ensure_builtin():
    # Importing the modules registers their datasets.
    from neurofed.data import digits, images  # noqa: F401

    try:
        from neurofed.data import events  # noqa: F401
    except ImportError:  # event support is optional until tonic is present
        pass


def dataset_names() -> list[str]:
    _ensure_builtin()
    return sorted(_REGISTRY)


def load_dataset(data_cfg: dict, seed: int = 0) -> Dataset:
    _ensure_builtin()
    name = data_cfg.get("name")
    if name not in _REGISTRY:
        raise ValueError(f"data.name: unknown dataset {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    from neurofed.data.subset import apply_subsets

    return apply_subsets(_REGISTRY[name](data_cfg, seed), data_cfg, seed)


__all__ = ["Dataset", "register_dataset", "dataset_names", "load_dataset"]
