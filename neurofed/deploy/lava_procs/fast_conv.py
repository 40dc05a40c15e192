"""A process model for Lava's own ``Conv`` process that gives Lava's fixed_pt result, faster.

lava-nc 0.10 computes a ``Conv`` synapse on the CPU with ``lava.proc.conv.utils.conv_scipy``
(its torch path is switched off: torch calls hang inside Lava's forked processes): one
``scipy.signal.convolve2d`` call per (output channel, input channel) pair and step, 16,384
calls for a 128-to-128-channel layer. That sets the pace of every paper network on Lava (the
S-VGG9 took 79 CPU-seconds a sample).

:class:`PyConvModelFixedIm2col` is the same computation as one matrix product per group
(the input's windows against the flipped kernel, numpy only, so nothing of torch runs in
Lava's processes): the same output shape, the same integer sums (float64 products of
integers below 2^53 are exact, as scipy's), the same cast to the weight's dtype and the same
24-bit clamp. The Process, its ports, its variables, the runtime and every other process
model stay Lava's; the run configuration selects this model for ``Conv`` through Lava's own
``exception_proc_model_map`` (:func:`neurofed.deploy.lava_run.run_config`).
``neurofed lava --stock-conv`` runs Lava's model instead; ``tests/test_lava_fast_conv.py``
checks the two give identical arrays and identical network spikes.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from neurofed.compat import lava as _lava
from neurofed.deploy.lava_procs.api import implements, protocol as _protocol, requires, resources as _resources, tag

_conv_proc = _lava("lava.proc.conv.process")
_conv_models = _lava("lava.proc.conv.models")
_conv_utils = _lava("lava.proc.conv.utils")


def conv_im2col(input_: np.ndarray, weight: np.ndarray, kernel_size, stride, padding, dilation,
                groups: int) -> np.ndarray:
    """``lava.proc.conv.utils.conv`` (its scipy path) as one product per group: ``input_``
    (X, Y, C), ``weight`` (K, kx, ky, C / groups) in Lava's XYC layout; a true convolution
    (the kernel flipped), strided; returned in ``weight``'s dtype as Lava returns it."""
    (kx, ky), (sx, sy), (px, py), (dx, dy) = (tuple(int(v) for v in a) for a in
                                              (kernel_size, stride, padding, dilation))
    out_c, c_in = weight.shape[0], input_.shape[-1]
    if c_in % groups or out_c % groups:
        raise ValueError(f"Conv: {c_in} input and {out_c} output channels do not divide into {groups} groups")
    padded = np.pad(np.asarray(input_, dtype=np.float64), ((px, px), (py, py), (0, 0)))
    span_x, span_y = dx * (kx - 1) + 1, dy * (ky - 1) + 1
    windows = sliding_window_view(padded, (span_x, span_y), axis=(0, 1))[::sx, ::sy, :, ::dx, ::dy]
    ox, oy = windows.shape[:2]  # = utils.output_shape: the valid positions, strided
    flipped = np.asarray(weight, dtype=np.float64)[:, ::-1, ::-1, :]  # convolution, as convolve2d
    c_grp, k_grp = c_in // groups, out_c // groups
    output = np.empty((ox, oy, out_c), dtype=np.float64)
    for g in range(groups):
        cols = windows[:, :, g * c_grp:(g + 1) * c_grp].reshape(ox * oy, c_grp * kx * ky)  # (pos, c·kx·ky)
        kern = flipped[g * k_grp:(g + 1) * k_grp].transpose(0, 3, 1, 2).reshape(k_grp, c_grp * kx * ky)
        output[:, :, g * k_grp:(g + 1) * k_grp] = (cols @ kern.T).reshape(ox, oy, k_grp)
    return output.astype(weight.dtype)


@implements(proc=_conv_proc.Conv, protocol=_protocol.LoihiProtocol)
@requires(_resources.CPU)
@tag("fixed_pt")
class PyConvModelFixedIm2col(_conv_models.PyConvModelFixed):
    """Lava's ``PyConvModelFixed`` with its convolution computed by :func:`conv_im2col`."""

    def run_spk(self) -> None:
        if self.a_buf is None:
            self.a_buf = np.zeros_like(self.a_out.shape)
        self.a_out.send(self.a_buf)  # last step's currents: the synapse's one-step delay, as Lava's
        s_in = self.s_in.recv()
        if self.num_message_bits.item() == 0:
            s_in = s_in.astype(bool)
        a_out = conv_im2col(s_in, self.weight, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.groups[0])
        self.a_buf = _conv_utils.signed_clamp(a_out, bits=24)


def exception_map(conv_model: str = "im2col") -> dict:
    """The ``exception_proc_model_map`` that selects this model for Lava's ``Conv`` (none
    for ``stock``: Lava's own)."""
    return {} if conv_model == "stock" else {_conv_proc.Conv: PyConvModelFixedIm2col}
