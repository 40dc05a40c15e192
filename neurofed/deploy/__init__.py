"""Deployment: the global model to netx HDF5 (``export``), a hardware constraint
check against ``hw_profiles/`` (``constraints``), and Lava runs that stream test
samples through one compiled network and compare its spikes with torch
(``lava_run``), the model as a NIR graph (``nir_export``) and its runs in other
simulators' NIR importers (``nir_run``). ``neurofed export`` / ``lava`` / ``nir`` drive
them (``cli``).
"""

from __future__ import annotations

from neurofed.config import ConfigError


class DeployError(ConfigError):
    """A model or run cannot be exported or run on Lava as asked; one line per problem."""


__all__ = ["DeployError"]
