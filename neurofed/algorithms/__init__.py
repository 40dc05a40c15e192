"""Algorithm registry: every module here defines an :class:`Algorithm` subclass.

Algorithms are found by name (``algorithm.name`` in the config). A module is
imported on first use, so a new algorithm is one new file plus one line below.
"""

from __future__ import annotations

import importlib

from neurofed.algorithms.base import Algorithm
from neurofed.config import Section, deep_merge, register_section
from neurofed.registry import Registry

# name -> "module:Class", imported on first use
ALGORITHMS = Registry("algorithm.name", "algorithm", {
    "fedavg": "neurofed.algorithms.fedavg:FedAvg",
    "fedprox": "neurofed.algorithms.fedprox:FedProx",
    "scaffold": "neurofed.algorithms.scaffold:Scaffold",
    "fednova": "neurofed.algorithms.fednova:FedNova",
    "fedlc": "neurofed.algorithms.fedlc:FedLC",
    "fedrs": "neurofed.algorithms.fedrs:FedRS",
    "fedlec": "neurofed.algorithms.fedlec:FedLEC",
    "sfedca": "neurofed.algorithms.sfedca:SFedCA",
    "divfl": "neurofed.algorithms.divfl:DivFL",
    "fedmos": "neurofed.algorithms.fedmos:FedMoS",
    "sfedhifi": "neurofed.algorithms.sfedhifi:SFedHIFI",
    "hetero_fedavg": "neurofed.algorithms.sfedhifi:HeteroFedAvg",
    "hetero_fedprox": "neurofed.algorithms.sfedhifi:HeteroFedProx",
    "hetero_fednova": "neurofed.algorithms.sfedhifi:HeteroFedNova",
})


def register(name: str, target: str) -> None:
    """Register the algorithm class ``target`` ("module:Class") as ``name``."""
    ALGORITHMS.register(name, target)


def algorithm_names() -> list[str]:
    return ALGORITHMS.names()


def get_algorithm_class(name: str) -> type[Algorithm]:
    module, cls = ALGORITHMS.lookup(name).split(":")
    return getattr(importlib.import_module(module), cls)


def _resolve(algo: dict) -> dict:
    """The chosen algorithm's defaults under what the config gives."""
    name = algo.get("name")
    if name not in ALGORITHMS:
        return algo
    return deep_merge({"name": name, **get_algorithm_class(name).config_defaults}, algo)


def _validate(algo: dict, cfg: dict) -> list[str]:
    """Keys are the chosen algorithm's: it validates them (``Algorithm.validate_config``)."""
    name = algo.get("name")
    if name not in ALGORITHMS:
        return [f"algorithm.name: got {name!r}; allowed: {', '.join(algorithm_names())}"]
    return get_algorithm_class(name).validate_config(algo, cfg)


def _keys_for(algo: dict) -> set[str] | None:
    """The keys the chosen algorithm reads (None for an unknown name: validation reports it)."""
    name = algo.get("name")
    return {"name", *get_algorithm_class(name).config_defaults} if name in ALGORITHMS else None


register_section(Section("algorithm", {"name": "fedavg"}, resolve=_resolve, validate=_validate, keys_for=_keys_for))

__all__ = ["Algorithm", "algorithm_names", "get_algorithm_class", "register"]
