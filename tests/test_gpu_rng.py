"""The counter-based spike generator: a pure function of (key, index), equal to a
plain-Python reference of its integer arithmetic, and the same on CUDA as on the CPU."""

from __future__ import annotations

import pytest
import torch

from neurofed.gpu import rng

M = 0xFFFFFFFF


def _ref_mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    return x ^ (x >> 16)


def _ref_u(key: int, i: int) -> float:
    """Python ints (unbounded): no wrap-around to get wrong."""
    h = _ref_mix32((i & M) ^ (key & M))
    h = _ref_mix32(h ^ (((i >> 32) + ((key >> 32) & M) + 0x9E3779B9) & M))
    return (h >> 8) / 2**24


@pytest.mark.parametrize("key, offset", [(0, 0), (12345, 7), (2**63 - 1, 2**32 - 5), (0xDEADBEEF12345678, 3 * 2**40)])
def test_uniform_equals_the_reference(key, offset):
    u = rng.uniform24(key, (3, 5, 7), offset)
    ref = torch.tensor([_ref_u(key, offset + i) for i in range(105)], dtype=torch.float32).reshape(3, 5, 7)
    assert u.dtype == torch.float32 and torch.equal(u, ref)


def test_spikes_depend_on_key_and_index_only():
    prob = torch.rand(4, 3, 8, 8, 20, generator=torch.Generator().manual_seed(0))
    s = rng.bernoulli(prob, key=99)
    assert torch.equal(s, rng.bernoulli(prob, key=99))
    assert not torch.equal(s, rng.bernoulli(prob, key=100))
    # a batch drawn in two halves (offsets) is the batch drawn at once
    half = prob[:2].numel()
    assert torch.equal(torch.cat([rng.bernoulli(prob[:2], 99), rng.bernoulli(prob[2:], 99, offset=half)]), s)
    assert set(s.unique().tolist()) <= {0.0, 1.0}


def test_rates_follow_the_probabilities():
    for p in (0.0, 0.05, 0.5, 0.9, 1.0):
        s = rng.bernoulli(torch.full((200_000,), p), key=3)
        assert abs(s.mean().item() - p) < 0.005
    u = rng.uniform24(5, (1 << 16,))
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean().item() - 0.5) < 0.01


@pytest.mark.gpu
def test_cuda_spikes_equal_cpu_spikes():
    prob = torch.rand(64, 3, 32, 32, 20, generator=torch.Generator().manual_seed(1))
    assert torch.equal(rng.bernoulli(prob.cuda(), key=2024).cpu(), rng.bernoulli(prob, key=2024))
