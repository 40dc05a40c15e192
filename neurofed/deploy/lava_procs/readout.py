"""Read a neuron population's membrane voltage at one phase of every sample's window.

``VoltageReader`` holds a RefPort on a Lava LIF's ``v`` Var and copies it in the
management phase of the chosen step (after that step's neuron update): the voltage
readout of ``model.readout: voltage``, whose output layer never spikes. One Var,
read once at the end (as the spike counters do).
"""

from __future__ import annotations

import numpy as np

from neurofed.deploy.lava_procs.api import (LavaPyType, implements, process as _process, ports as _ports,
                                            protocol as _protocol, pymodel as _pymodel, pyports as _pyports,
                                            requires, resources as _resources, tag, variable as _variable)


PyRefPort = _pyports.PyRefPort


class VoltageReader(_process.AbstractProcess):
    """Var ``values`` (samples, neurons): the referenced voltage at phase ``phase`` of each
    sample's window of ``window`` steps (Lava's neuron order)."""

    def __init__(self, *, shape: tuple, window: int, phase: int, samples: int):
        super().__init__(shape=tuple(shape), window=int(window), phase=int(phase), samples=int(samples))
        neurons = int(np.prod(shape))
        self.ref = _ports.RefPort(shape=tuple(shape))
        self.values = _variable.Var(shape=(int(samples), neurons), init=np.zeros((int(samples), neurons)))


@implements(proc=VoltageReader, protocol=_protocol.LoihiProtocol)
@requires(_resources.CPU)
@tag("fixed_pt", "floating_pt")
class PyVoltageReaderModel(_pymodel.PyLoihiProcessModel):
    ref: PyRefPort = LavaPyType(PyRefPort.VEC_DENSE, np.int32)
    values: np.ndarray = LavaPyType(np.ndarray, np.float64)

    def __init__(self, proc_params):
        super().__init__(proc_params)
        self.window = proc_params["window"]
        self.read_at = proc_params["phase"]  # not self.phase: PyLoihiProcessModel's protocol phase
        self.samples = proc_params["samples"]

    def run_spk(self):
        pass

    def post_guard(self):
        sample, phase = divmod(self.time_step - 1, self.window)
        return sample < self.samples and phase == self.read_at

    def run_post_mgmt(self):
        self.values[(self.time_step - 1) // self.window] = np.asarray(self.ref.read()).reshape(-1)
