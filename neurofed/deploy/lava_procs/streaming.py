"""Stream many samples through one compiled netx network and count spikes per sample.

``SpikeSource`` replays input spikes from a ``.npy`` file laid out as
(samples, window, *lava_shape) — memory-mapped by the process model, so the
input never travels through Lava Vars and any number of samples streams at O(1)
memory. ``SpikeCounter`` sits on one layer's output and keeps, per sample, the
spike count and a checksum of the spike raster (Σ spikes × a fixed random
integer per (neuron, step)); the output layer's counter also keeps per-neuron
counts (the prediction). One Var per counter, read once at the end: reading
RingBuffer sinks back costs ≈ 30 µs per element (minutes for a 10k-neuron net).

Timing (see :mod:`neurofed.deploy.lava_run`): a sample occupies ``window`` steps;
a layer's first ``skip`` steps of each window still carry the previous sample's
tail, so the counter ignores them — SLAYER's block output at those steps is zero.
"""

from __future__ import annotations

import numpy as np

from neurofed.deploy.lava_procs.api import (LavaPyType, implements, process as _process, ports as _ports,
                                            protocol as _protocol, pymodel as _pymodel, pyports as _pyports,
                                            requires, resources as _resources, tag, variable as _variable)


PyInPort, PyOutPort = _pyports.PyInPort, _pyports.PyOutPort
CPU, LoihiProtocol = _resources.CPU, _protocol.LoihiProtocol

CHECKSUM_HIGH = 1 << 16  # raster weights in [1, 2^16): one differing spike always changes the sum


def raster_weights(seed: int, torch_shape: tuple, window: int) -> np.ndarray:
    """The checksum weight of every (neuron, step) in torch's order, (C, H, W, window).

    The Lava counter transposes it to Lava's (W, H, C) order (:func:`to_lava_order`),
    so both sides weight the same neuron alike.
    """
    return np.random.default_rng(seed).integers(1, CHECKSUM_HIGH, size=(*torch_shape, window), dtype=np.int64)


def to_lava_order(a: np.ndarray) -> np.ndarray:
    """(C, H, W, ...) -> (W, H, C, ...): torch's neuron layout to Lava's (x, y, z)."""
    return np.moveaxis(a, (0, 1, 2), (2, 1, 0)) if a.ndim >= 4 else a


class SpikeSource(_process.AbstractProcess):
    """Sends sample ``t // window``'s input of phase ``p = t % window`` at step t+1: ``data[sample,
    min(p, frames - 1)]`` for the first ``steps`` phases of the window (the torch model's T), zeros
    after them and after the last sample. ``frames`` is the file's second axis: T, or 1 for an image
    shown at every step (direct input) — stored once, not T times."""

    def __init__(self, *, path: str, shape: tuple, window: int, samples: int, steps: int | None = None):
        super().__init__(path=str(path), shape=tuple(shape), window=int(window), samples=int(samples),
                         steps=int(window if steps is None else steps))
        self.s_out = _ports.OutPort(shape=tuple(shape))


class SpikeCounter(_process.AbstractProcess):
    """Per-sample spike count and raster checksum of one layer over the phases ``skip ..
    stop - 1`` of each window (plus per-neuron counts when ``per_neuron``): Var ``stats``
    (samples, 2 [+ neurons]); and each neuron's spikes summed over all samples: Var
    ``totals`` (the layer's shape)."""

    def __init__(self, *, shape: tuple, window: int, skip: int, samples: int, seed: int,
                 per_neuron: bool = False, stop: int | None = None):
        super().__init__(shape=tuple(shape), window=int(window), skip=int(skip), samples=int(samples),
                         seed=int(seed), per_neuron=bool(per_neuron),
                         stop=int(window if stop is None else stop))
        width = 2 + (int(np.prod(shape)) if per_neuron else 0)
        self.s_in = _ports.InPort(shape=tuple(shape))
        self.stats = _variable.Var(shape=(int(samples), width), init=np.zeros((int(samples), width)))
        self.totals = _variable.Var(shape=tuple(shape), init=np.zeros(tuple(shape)))


@implements(proc=SpikeSource, protocol=LoihiProtocol)
@requires(CPU)
@tag("fixed_pt", "floating_pt")
class PySpikeSourceModel(_pymodel.PyLoihiProcessModel):
    s_out: PyOutPort = LavaPyType(PyOutPort.VEC_DENSE, np.int32, precision=24)

    def __init__(self, proc_params):
        super().__init__(proc_params)
        self.data = np.load(proc_params["path"], mmap_mode="r")
        self.window = proc_params["window"]
        self.samples = proc_params["samples"]
        self.steps = proc_params["steps"]
        self.last_frame = self.data.shape[1] - 1
        self.zeros = np.zeros(proc_params["shape"], dtype=np.int32)

    def run_spk(self):
        sample, phase = divmod(self.time_step - 1, self.window)
        if sample < self.samples and phase < self.steps:
            self.s_out.send(np.asarray(self.data[sample, min(phase, self.last_frame)], dtype=np.int32))
        else:
            self.s_out.send(self.zeros)


@implements(proc=SpikeCounter, protocol=LoihiProtocol)
@requires(CPU)
@tag("fixed_pt", "floating_pt")
class PySpikeCounterModel(_pymodel.PyLoihiProcessModel):
    s_in: PyInPort = LavaPyType(PyInPort.VEC_DENSE, np.int32, precision=24)
    stats: np.ndarray = LavaPyType(np.ndarray, np.float64)
    totals: np.ndarray = LavaPyType(np.ndarray, np.float64)

    def __init__(self, proc_params):
        super().__init__(proc_params)
        self.window = proc_params["window"]
        self.skip = proc_params["skip"]
        self.stop = proc_params["stop"]
        self.samples = proc_params["samples"]
        self.per_neuron = proc_params["per_neuron"]
        shape = proc_params["shape"]
        w = to_lava_order(raster_weights(proc_params["seed"], tuple(reversed(shape)), self.window))
        self.weights = np.ascontiguousarray(w).reshape(-1, self.window)  # (neurons, window), Lava order
        self.count = np.zeros(self.weights.shape[0], dtype=np.int64)
        self.checksum = 0

    def run_spk(self):
        s = self.s_in.recv()
        sample, phase = divmod(self.time_step - 1, self.window)
        if sample >= self.samples:
            return
        if self.skip <= phase < self.stop:
            s = (s.reshape(-1) != 0)
            self.count += s
            self.checksum += int(self.weights[s, phase].sum())
        if phase == self.window - 1:  # sample complete: store and clear (Vars are written once)
            self.stats[sample, 0] = self.count.sum()
            self.stats[sample, 1] = self.checksum
            if self.per_neuron:
                self.stats[sample, 2:] = self.count
            self.totals += self.count.reshape(self.totals.shape)
            self.count[:] = 0
            self.checksum = 0
