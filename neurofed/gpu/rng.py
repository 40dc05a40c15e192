"""Rate-coded input spikes from a counter-based generator: the same spikes on any device.

``torch.bernoulli`` with a generator draws from a device-specific stream (CPU Mersenne
Twister, CUDA Philox with a launch-dependent layout), so spikes drawn on a GPU differ from
the CPU's. Here each spike is a pure function of ``(key, element index)``: a 32-bit hash
(Chris Wellons' "lowbias32", two rounds keyed by the two halves of ``key`` and of the
64-bit index), its top 24 bits as a float32 ``u`` in [0, 1) (exact), spike where
``u < p``. Only integer operations modulo 2^32 (held in int64: a product of two 32-bit
values wraps modulo 2^64 in two's complement on every device, and its low 32 bits are
the exact product modulo 2^32) and one exact float32 comparison: bit-identical on the CPU,
on CUDA and in the pure-Python reference of the tests.

Not yet wired into the input encoding (``neurofed.data.encoding`` draws with
``torch.bernoulli`` on the CPU): a run that used it would draw other spikes than today's.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
_GOLDEN = 0x9E3779B9  # separates the two rounds' keys


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * _M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def uniform24(key: int, shape, offset: int = 0, device=None) -> torch.Tensor:
    """float32 ``u`` in [0, 1) on a 2^-24 grid for elements ``offset .. offset + numel - 1``
    (row-major over ``shape``), a function of ``key`` (any int; its low 64 bits) and the
    index only."""
    n = 1
    for s in shape:
        n *= int(s)
    idx = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    k0, k1 = key & MASK32, (key >> 32) & MASK32
    h = _mix32((idx & MASK32) ^ k0)
    h = _mix32(h ^ (((idx >> 32) + k1 + _GOLDEN) & MASK32))
    return ((h >> 8).to(torch.float32) * 2.0**-24).reshape(tuple(shape))


def bernoulli(prob: torch.Tensor, key: int, offset: int = 0) -> torch.Tensor:
    """Spikes (0.0/1.0, ``prob``'s dtype) where ``uniform24 < prob``, on ``prob``'s device."""
    u = uniform24(key, prob.shape, offset, prob.device)
    return (u < prob.to(torch.float32)).to(prob.dtype)
