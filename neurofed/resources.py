"""The files neurofed ships beside its code, found through :mod:`importlib.resources`.

- ``hw_profiles/*.yaml``: the hardware profiles (energy prices, chip limits);
- ``examples/``: the example jobs, the paper presets (``examples/papers/``) and sweeps;
- ``kernels/csrc/``: the fast kernels' C++ (``neurofed.kernels.variants`` compiles it).

``hw_profiles/`` and ``examples/`` stay at the top of the repository (people edit them
there; the Flower app ships them from there). ``neurofed/_data/`` holds one symlink to
each, so the same ``importlib.resources.files("neurofed") / "_data"`` finds them in every
way neurofed is loaded: from a checkout (``PYTHONPATH`` or an editable install, through
the links) and from a wheel or sdist, where setuptools has copied the linked files into
``neurofed/_data/`` (``pyproject.toml``: package-data; ``MANIFEST.in``). No code builds a
path from the checkout's layout.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PROFILES = "hw_profiles"
EXAMPLES = "examples"


def _data(name: str) -> Path:
    # files() of a regular (not zipped) package is a pathlib.Path: compilers and yaml need real files
    linked = Path(str(files("neurofed") / "_data" / name))
    if linked.is_dir():
        return linked
    # A Flower app bundle (FAB) carries no symlinks: it ships hw_profiles/ and examples/ beside
    # the neurofed/ package (pyproject.toml: fab-include), where the app's processes find them.
    beside = Path(str(files("neurofed"))).parent / name
    return beside if beside.is_dir() else linked


def profiles_dir() -> Path:
    """The folder of the shipped hardware profiles (``<name>.yaml``)."""
    return _data(PROFILES)


def examples_dir() -> Path:
    """The folder of the shipped examples: jobs, ``papers/`` presets, ``sweeps/``."""
    return _data(EXAMPLES)


def kernel_sources() -> Path:
    """The fast kernels' C++ sources (``module.cpp`` and its headers)."""
    return Path(str(files("neurofed.kernels") / "csrc"))
