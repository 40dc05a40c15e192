"""A one-step spike delay for a residual shortcut (:mod:`neurofed.deploy.lava_graph`).

SLAYER's residual join delays the shortcut by one step to meet the conv path, which went
through one more block (:mod:`neurofed.models.residual`). In Lava every synapse adds one
step already; ``StepDelay`` adds the one more that the shortcut needs: it sends at step t
what it received at step t-1. On Loihi 2 this is the shortcut synapse's axonal delay of
one step; in the fixed_pt simulator it is this small host process.
"""

from __future__ import annotations

import numpy as np

from neurofed.deploy.lava_procs.api import (LavaPyType, implements, process as _process, ports as _ports,
                                            protocol as _protocol, pymodel as _pymodel, pyports as _pyports,
                                            requires, resources as _resources, tag)


PyInPort, PyOutPort = _pyports.PyInPort, _pyports.PyOutPort


class StepDelay(_process.AbstractProcess):
    """Spikes of ``shape`` out one step after they came in."""

    def __init__(self, *, shape: tuple):
        super().__init__(shape=tuple(shape))
        self.s_in = _ports.InPort(shape=tuple(shape))
        self.s_out = _ports.OutPort(shape=tuple(shape))


@implements(proc=StepDelay, protocol=_protocol.LoihiProtocol)
@requires(_resources.CPU)
@tag("fixed_pt", "floating_pt")
class PyStepDelayModel(_pymodel.PyLoihiProcessModel):
    s_in: PyInPort = LavaPyType(PyInPort.VEC_DENSE, np.int32, precision=24)
    s_out: PyOutPort = LavaPyType(PyOutPort.VEC_DENSE, np.int32, precision=24)

    def __init__(self, proc_params):
        super().__init__(proc_params)
        self.held = np.zeros(proc_params["shape"], dtype=np.int32)

    def run_spk(self):
        self.s_out.send(self.held)  # before the receive: last step's spikes
        self.held = np.asarray(self.s_in.recv(), dtype=np.int32)
