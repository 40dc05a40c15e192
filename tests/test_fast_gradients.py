"""neurofed.kernels' "fast" gradient mode: same spikes as stock SLAYER, gradients within a
stated float32 rounding tolerance.

The tolerance is checked against a float64 reference (the mode must be at least as
accurate as a float32 sum can be) and against stock SLAYER itself. For scale: stock
SLAYER's own weight gradients change by ~2e-6 (relative to the largest entry)
between 1 and 2 torch threads, because oneDNN's reduction order depends on the
thread count.
"""

from __future__ import annotations

import pytest
import torch

from neurofed.compat import slayer as _slayer_import

slayer = _slayer_import()
kernels = pytest.importorskip("neurofed.kernels")
from neurofed.kernels import ops, variants  # noqa: E402

if not kernels.is_available():  # pragma: no cover - no C++ toolchain
    pytest.skip(f"kernel extension unavailable: {variants.error()}", allow_module_level=True)

from test_fast_cuba import (EXT, KERNELS, NEURON, _CountingExt, bits, needs, quantize_8bit,  # noqa: E402
                            spikes, variant_ext)  # noqa: F401 (variant_ext: a fixture)

# Relative to the largest |entry| of the stock gradient tensor. Measured: <= 5e-7
# for the network below (stock itself moves by ~2e-6 between thread counts).
STOCK_TOLERANCE = 1e-5


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (bits(a).long() - bits(b).long()).abs()


def conv_weight_grad(x, g, w, stride, padding, dtype=torch.float32):
    return torch.ops.aten.convolution_backward(
        g.to(dtype), x.to(dtype), w.to(dtype), None, (stride, stride, 1), (padding, padding, 0), (1, 1, 1),
        False, (0, 0, 0), 1, (False, True, False))[1]


# --------------------------------------------------------------------------- kernels


def test_surrogate_exp_within_one_ulp_of_torch_exp(variant_ext):
    x = torch.cat([torch.linspace(-87.33, 0.0, 1_000_003), torch.tensor([0.0, -0.0, -1e-30, -87.33])])
    ours = variant_ext.surrogate_exp_tensor(x)
    assert ulps(ours, torch.exp(x)).max().item() <= 1
    # below the normal range torch.exp returns subnormals; the kernel returns 0
    tiny = torch.linspace(-300.0, -87.34, 10_001)
    assert torch.exp(tiny).max().item() < torch.finfo(torch.float32).tiny
    assert torch.equal(variant_ext.surrogate_exp_tensor(tiny), torch.zeros_like(tiny))


WGRAD_CASES = [  # N, Ci, Co, H, W, T, kernel, padding, spike probability (stride 1)
    (2, 3, 5, 6, 7, 5, 3, 1, 0.3),  # 5 output channels in a block of 16, T below 16
    (3, 16, 32, 4, 4, 16, 3, 1, 0.3),  # the digits CNN's second convolution
    (2, 40, 150, 6, 5, 8, 3, 0, 0.1),  # five output-channel blocks of 32 (the last 22 wide), no padding
    (5, 33, 20, 7, 7, 19, 5, 2, 0.05),  # 5x5; T over 16; a chunk of one sample
    (2, 64, 64, 16, 16, 16, 3, 1, 0.1),
]


@needs("spike_weight_grad")
@pytest.mark.parametrize("N, Ci, Co, H, W, T, k, pad, p", WGRAD_CASES)
def test_spike_weight_grad_is_a_correctly_ordered_float32_sum(N, Ci, Co, H, W, T, k, pad, p, variant_ext):
    x = spikes(N, Ci, H, W, T, p=p, seed=N * Ci)
    w = torch.randn(Co, Ci, k, k, 1)
    stride = 1
    Ho, Wo = H + 2 * pad - k + 1, W + 2 * pad - k + 1
    g = torch.randn(N, Co, Ho, Wo, T, generator=torch.Generator().manual_seed(Co))
    ours = variant_ext.spike_weight_grad(x, g, k, k, stride, stride, pad, pad, 1.0).view(w.shape)
    exact = conv_weight_grad(x, g, w, stride, pad, torch.float64)
    magnitude = conv_weight_grad(x, g.abs(), w, stride, pad, torch.float64)  # sum of |terms|
    stock = conv_weight_grad(x, g, w, stride, pad)
    # float32 summation bound with a per-sample partial sum of n terms: ~n u sum|terms|;
    # in practice far below it: 2e-7 of sum|terms| leaves a margin of ~10x here
    err = (ours.double() - exact).abs()
    assert (err <= 2e-7 * magnitude + 1e-30).all(), (err / magnitude.clamp_min(1e-30)).max().item()
    assert (ours - stock).abs().max() <= STOCK_TOLERANCE * stock.abs().max()


@pytest.mark.parametrize("kernel, Ci, Co, p, extra", [
    pytest.param("spike_weight_grad", 48, 40, 0.1, (1.0,), marks=needs("spike_weight_grad")),
    pytest.param("tlane_weight_grad", 2, 24, 0.3, (), marks=needs("tlane_weight_grad"))])
def test_weight_grad_kernels_do_not_depend_on_the_thread_count(kernel, Ci, Co, p, extra, variant_ext):
    x, g = spikes(8, Ci, 12, 12, 16, p=p), torch.randn(8, Co, 12, 12, 16)
    weight_grad = getattr(variant_ext, kernel)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = weight_grad(x, g, 3, 3, 1, 1, 1, 1, *extra)
        torch.set_num_threads(2)
        two = weight_grad(x, g, 3, 3, 1, 1, 1, 1, *extra)
    finally:
        torch.set_num_threads(threads)
    assert one is not None and torch.equal(bits(one), bits(two))


@needs("spike_weight_grad")
def test_spike_weight_grad_declines_graded_and_dense_inputs_and_other_shapes(variant_ext):
    g = torch.randn(2, 8, 5, 5, 4)
    graded = spikes(2, 32, 5, 5, 4) * 0.5
    assert variant_ext.spike_weight_grad(graded, g, 3, 3, 1, 1, 1, 1, 1.0) is None
    dense = spikes(2, 32, 5, 5, 4, p=0.5)
    assert variant_ext.spike_weight_grad(dense, g, 3, 3, 1, 1, 1, 1, 0.2) is None
    sparse = spikes(2, 32, 5, 5, 4, p=0.1)  # stride 2 and 4x4 kernels are left to oneDNN
    assert variant_ext.spike_weight_grad(sparse, g[:, :, :3, :3], 3, 3, 2, 2, 1, 1, 1.0) is None
    assert variant_ext.spike_weight_grad(sparse, g[:, :, :4, :4], 4, 4, 1, 1, 1, 1, 1.0) is None
    silent = torch.zeros(2, 32, 5, 5, 4)
    assert torch.equal(variant_ext.spike_weight_grad(silent, g, 3, 3, 1, 1, 1, 1, 0.2),
                       torch.zeros(8, 32, 3, 3))


TLANE_CASES = [  # N, Ci, Co, H, W, T, kernel, stride, padding; graded (non-spike) inputs too
    (32, 1, 16, 8, 8, 16, 3, 1, 1),  # the digits CNN's first layer
    (2, 3, 7, 9, 7, 19, 3, 2, 1),  # odd output-channel count, stride 2, T not a multiple of 16
    (3, 2, 4, 6, 6, 5, 5, 1, 2),
    (2, 7, 6, 5, 5, 33, 3, 1, 0),  # fan-in 63: six tap chunks
    (32, 512, 10, 1, 1, 16, 1, 1, 0),  # the digits CNN's dense head: 4 + 4 + 2 output channels
]


@needs("tlane_weight_grad")
@pytest.mark.parametrize("N, Ci, Co, H, W, T, k, stride, pad", TLANE_CASES)
@pytest.mark.parametrize("graded", [False, True])
def test_time_lane_weight_grad_is_a_correctly_ordered_float32_sum(N, Ci, Co, H, W, T, k, stride, pad, graded,
                                                                 variant_ext):
    x = spikes(N, Ci, H, W, T, p=0.3, seed=Ci)
    if graded:
        x = x * torch.rand(x.shape, generator=torch.Generator().manual_seed(3))
    w = torch.randn(Co, Ci, k, k, 1)
    Ho, Wo = (H + 2 * pad - k) // stride + 1, (W + 2 * pad - k) // stride + 1
    g = torch.randn(N, Co, Ho, Wo, T, generator=torch.Generator().manual_seed(Co))
    ours = variant_ext.tlane_weight_grad(x, g, k, k, stride, stride, pad, pad).view(w.shape)
    exact = conv_weight_grad(x, g, w, stride, pad, torch.float64)
    magnitude = conv_weight_grad(x.abs(), g.abs(), w, stride, pad, torch.float64)
    stock = conv_weight_grad(x, g, w, stride, pad)
    # float32 partial sums of at most 64 vectors per lane, then float64: measured <= 4.1e-8
    # of sum |terms| on these cases, where oneDNN's own float32 result is off by up to 1.2e-7
    err = (ours.double() - exact).abs()
    assert (err <= 2e-7 * magnitude + 1e-30).all(), (err / magnitude.clamp_min(1e-30)).max().item()
    assert (ours - stock).abs().max() <= STOCK_TOLERANCE * stock.abs().max()


@pytest.mark.parametrize("N, Ci, Co, H, W, T, k, pad", [
    (32, 512, 10, 1, 1, 16, 1, 0),  # the digits CNN's dense head (tlane_input_grad_1x1)
    (3, 40, 70, 3, 2, 21, 1, 0),
    (32, 16, 32, 4, 4, 16, 3, 1),  # the digits CNN's second convolution (tlane_input_grad)
    (2, 21, 9, 5, 6, 19, 3, 1),  # input channels beyond one block of 16, T over 16
    (2, 5, 7, 6, 6, 8, 5, 1),  # 5x5, padding below (k - 1) / 2
    (2, 4, 3, 4, 5, 16, 3, 0),  # no padding
])
def test_time_lane_input_grad(N, Ci, Co, H, W, T, k, pad, variant_ext):
    kernel = "tlane_input_grad_1x1" if k == 1 else "tlane_input_grad"
    if kernel not in KERNELS:
        pytest.skip(f"{kernel} is not in the {kernels.variant()} build")
    Ho, Wo = H + 2 * pad - k + 1, W + 2 * pad - k + 1
    g = torch.randn(N, Co, Ho, Wo, T, generator=torch.Generator().manual_seed(1))
    w = torch.randn(Co, Ci, k, k, 1, generator=torch.Generator().manual_seed(2))
    if k == 1:
        ours = variant_ext.tlane_input_grad_1x1(g, w.reshape(Co, Ci).contiguous())
    else:
        ours = variant_ext.tlane_input_grad(g, w.reshape(Co, Ci, k, k).contiguous(), pad, pad)

    def input_grad(dtype, gg=g, ww=w):
        return torch.ops.aten.convolution_backward(
            gg.to(dtype), torch.zeros(N, Ci, H, W, T, dtype=dtype), ww.to(dtype), None, (1, 1, 1), (pad, pad, 0),
            (1, 1, 1), False, (0, 0, 0), 1, (True, False, False))[0]
    exact = input_grad(torch.float64)
    magnitude = input_grad(torch.float64, g.abs(), w.abs())  # sum of |terms|
    # a float32 sum of the Co * k * k products in order: within that many units of
    # rounding of sum |terms|
    assert ((ours.double() - exact).abs() <= Co * k * k * 6e-8 * magnitude + 1e-30).all()
    stock = input_grad(torch.float32)
    assert (ours - stock).abs().max() <= STOCK_TOLERANCE * stock.abs().max()


# --------------------------------------------------------------------------- network


def make_net():
    cuba = slayer.block.cuba

    def conv(i, o):
        return cuba.Conv(NEURON, i, o, 3, padding=1, weight_scale=3, weight_norm=False, pre_hook_fx=quantize_8bit)

    return torch.nn.Sequential(conv(2, 32), conv(32, 48), cuba.Pool(NEURON, 2), conv(48, 32), cuba.Flatten(),
                               cuba.Dense(NEURON, 32 * 4 * 4, 10, weight_scale=3, pre_hook_fx=quantize_8bit))


def step(gradients: str | None):
    """One forward/backward pass of make_net() on fixed spikes; stock SLAYER if None."""
    torch.manual_seed(0)
    net = make_net()
    x = spikes(3, 2, 8, 8, 16, p=0.3, seed=5).requires_grad_(True)
    with kernels.enabled(gradients is not None, gradients=gradients):
        out = net(x)
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
        (out * weight).sum().backward()
    grads = {name: p.grad for name, p in net.named_parameters() if p.grad is not None}
    grads["input"] = x.grad
    return out.detach(), grads


def test_network_step_same_spikes_and_gradients_within_tolerance(monkeypatch):
    counter = _CountingExt(EXT)
    monkeypatch.setattr(ops, "ext", counter)
    stock_out, stock = step(None)
    exact_out, exact = step("exact")
    calls_before, ran_before = len(counter.calls), len(counter.ran)
    fast_out, fast = step("fast")
    fast_calls, fast_ran = counter.calls[calls_before:], counter.ran[ran_before:]
    # the fast mode really ran its kernels: spike weight gradients for the 32- and
    # 48-channel convolutions, the time-lane weight gradient for the 2-channel one and the
    # 10-output dense layer, the dense layer's input gradient and the three
    # convolutions' (8x8 and 4x4 images) input gradients (the neuron backward's inline
    # exp is tested above), each returning a result at least once
    # (with AVX2's 8 vector registers the head's weight gradient and the convolutions'
    # input gradients stay with oneDNN, measured faster there: see ops._WIDE_REGS)
    wide = EXT.regs() >= ops._WIDE_REGS
    expected = {"spike_weight_grad": 2, "tlane_weight_grad": 2 if wide else 1, "tlane_input_grad_1x1": 1,
                "tlane_input_grad": 3 if wide else 0}
    for kernel, n in expected.items():
        assert fast_calls.count(kernel) == n and (fast_ran.count(kernel) > 0) == (n > 0), kernel
    assert kernels.gradients() == "exact"  # enabled() restored the mode
    assert stock_out.sum() > 0
    assert torch.equal(bits(stock_out), bits(fast_out)) and torch.equal(bits(stock_out), bits(exact_out))
    assert stock.keys() == fast.keys() == exact.keys()
    assert any(not torch.equal(bits(stock[n]), bits(fast[n])) for n in stock)  # another summation did run
    for name in stock:
        assert torch.equal(bits(stock[name]), bits(exact[name])), name  # the exact mode is exact
        scale = stock[name].abs().max()
        assert scale > 0, name
        assert (fast[name] - stock[name]).abs().max() <= STOCK_TOLERANCE * scale, name


def test_gradient_mode_is_validated():
    with pytest.raises(ValueError, match="gradients='approx'; allowed: exact, fast"):
        kernels.enable(gradients="approx")
    assert kernels.gradients() in kernels.GRADIENTS


def test_run_with_fast_gradients_trains_through_the_fast_kernels(tiny_cfg, tmp_path, monkeypatch):
    import json

    from neurofed.pipeline import run

    counter = _CountingExt(EXT)
    monkeypatch.setattr(ops, "ext", counter)
    cfg = tiny_cfg(**{"model.name": "vgg5", "model.width": 0.5, "federation.fast_gradients": True})
    try:
        run(cfg, tmp_path, progress=False)
        assert kernels.gradients() == "fast"
    finally:
        kernels.enable(gradients="exact")
    # vgg5 at width 0.5: convs with 32+ input channels
    assert counter.calls.count("spike_weight_grad") > 0
    assert (counter.ran.count("spike_weight_grad") > 0) == ("spike_weight_grad" in KERNELS)
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 2 and all(0.0 <= r["accuracy"] <= 1.0 for r in rounds)
