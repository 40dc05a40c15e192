"""The NIR simulators a run's ``model.nir`` is run in (snnTorch, Norse): how each loads a
graph, steps it and resets it."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

import numpy as np

from neurofed.deploy import DeployError


@dataclass
class Simulator:
    name: str
    package: str
    load: Callable  # (graph, dt) -> torch module
    step: Callable  # (module, x, state) -> state
    reset: Callable  # (module) -> initial state
    voltage: Callable  # (neuron module, its forward output) -> its membrane voltage after the step


def _load_snntorch(graph, dt):
    # snnTorch steps at 0.1 ms whatever the graph's dt; refuse a graph written for another step
    if not np.isclose(dt, 1e-4):
        raise DeployError(f"snnTorch's NIR importer steps at 0.1 ms; this graph's dt is {dt} s")
    with contextlib.redirect_stdout(io.StringIO()):  # the importer prints its progress
        from snntorch.import_nir import import_from_nir

        return import_from_nir(graph)


def _reset_snntorch(net):
    from snntorch.utils import reset

    reset(net)  # init_hidden neurons keep their state inside the module
    return None


def _step_snntorch(net, x, state):
    net(x)
    return None


def _voltage_snntorch(module, output):
    return module.mem  # init_hidden neurons (as the importer builds them) return spikes, keep the voltage


def _voltage_norse(module, output):
    return output[1][1].v  # norse's CubaLIF returns (z, (synapse state, LIF state))


def _load_norse(graph, dt):
    import warnings

    from norse.torch import from_nir

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # from_nir uses nirtorch.load
        return from_nir(graph, dt=dt)


def _step_norse(net, x, state):
    return net(x, state)[1]


SIMULATORS = {
    "snntorch": Simulator("snntorch", "snntorch", _load_snntorch, _step_snntorch, _reset_snntorch,
                          _voltage_snntorch),
    "norse": Simulator("norse", "norse", _load_norse, _step_norse, lambda net: None, _voltage_norse),
}


def get_simulator(name: str) -> Simulator:
    if name not in SIMULATORS:
        raise DeployError(f"--sim: got {name!r}; allowed: {', '.join(SIMULATORS)}")
    sim = SIMULATORS[name]
    try:
        __import__(sim.package)
    except ModuleNotFoundError:
        raise DeployError(f"--sim {name}: the package {sim.package!r} is not installed (`make setup` installs it)") \
            from None
    return sim


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
