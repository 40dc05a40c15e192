"""The fast CPU kernels (neurofed.kernels) reproduce stock SLAYER exactly.

Every comparison is bit for bit (float32 bit patterns, so even the sign of zero
must agree): output spikes, current and voltage, persistent states and the
gradients with respect to inputs, weights and (where trainable) neuron decays.
Each case builds two identical blocks, runs one with stock lava-dl and one with
the fast path, and compares.
"""

from __future__ import annotations

import pytest
import torch

from neurofed.compat import slayer as _slayer_import

slayer = _slayer_import()
kernels = pytest.importorskip("neurofed.kernels")
from neurofed.kernels import ops, patches, variants  # noqa: E402

if not kernels.is_available():  # pragma: no cover - no C++ toolchain
    pytest.skip(f"kernel extension unavailable: {variants.error()}", allow_module_level=True)
EXT = kernels.build()

# The optional synapse / gradient kernels of the variant built for this CPU (today: all
# of them on AVX-512, the VNNI one with VNNI, none below). A kernel outside the build
# returns None everywhere and the caller takes the stock call; the tests below check
# that each kernel in the build ran, and that the others declined.
VARIANT = kernels.variant()
KERNELS = frozenset(EXT.kernels())
OPTIONAL_KERNELS = ("spike_conv_fwd", "spike_weight_grad", "tlane_conv_fwd", "tlane_input_grad_1x1",
                    "tlane_weight_grad", "tlane_input_grad", "vnni_conv_fwd")


def needs(kernel: str):
    return pytest.mark.skipif(kernel not in KERNELS, reason=f"{kernel} is not in the {VARIANT} build")


@pytest.fixture(params=kernels.runnable_variants() + variants.emulated_variants())
def variant_ext(request, monkeypatch):
    """Every instruction-set variant this CPU runs, and the AVX-512 ones it cannot run
    with their intrinsics emulated (built once, cached): the test runs with that build
    in place of the default one."""
    ext = kernels.build_variant(request.param)
    monkeypatch.setattr(ops, "ext", ext)
    return ext

NEURON = dict(threshold=1.25, current_decay=0.25, voltage_decay=0.03, tau_grad=0.1, scale_grad=1.0,
              requires_grad=False)


def quantize_8bit(x, descale=False):
    return slayer.utils.quantize_hook_fx(x, scale=64, num_bits=8, descale=descale)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def assert_identical(a, b, what):
    assert a is not None and b is not None, what
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    if a.dtype == torch.float32:
        same = torch.equal(bits(a), bits(b))
    else:
        same = torch.equal(a, b)
    assert same, f"{what}: max |diff| {(a.double() - b.double()).abs().max().item():.3e}"


def spikes(*shape, p=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) < p).float()


def run(make, inputs, fast: bool, calls=1, seed=0, loss_seed=1):
    """Build a block (same init for both paths), run `calls` forward/backward passes."""
    torch.manual_seed(seed)
    block = make()
    out = {}
    with kernels.enabled(fast):
        assert kernels.is_enabled() is fast
        for c in range(calls):
            x = inputs[c].clone().requires_grad_(True)
            y = block(x)
            g = torch.Generator().manual_seed(loss_seed + c)
            weight = torch.randn(y.shape, generator=g)
            (y * weight).sum().backward()
            out[f"out{c}"] = y.detach()
            out[f"grad_x{c}"] = x.grad
            for name, p in block.named_parameters():
                if p.grad is not None:
                    out[f"grad_{name}{c}"] = p.grad.clone()
                    p.grad = None
            neuron = getattr(block, "neuron", None)
            if neuron is not None and getattr(neuron, "persistent_state", False):
                out[f"current_state{c}"] = neuron.current_state.clone()
                out[f"voltage_state{c}"] = neuron.voltage_state.clone()
                if getattr(block, "delay_buffer", None) is not None:
                    out[f"delay_buffer{c}"] = block.delay_buffer.clone()
    return out


def compare(make, inputs, calls=1, expect_grads=("grad_x0",)):
    stock = run(make, inputs, fast=False, calls=calls)
    fast = run(make, inputs, fast=True, calls=calls)
    assert stock.keys() == fast.keys()
    for key in expect_grads:
        assert key in stock, key
    for key in stock:
        assert_identical(stock[key], fast[key], key)
    return stock


def cuba():
    return slayer.block.cuba


class _CountingExt:
    """Wraps the extension to record which kernels ran."""

    def __init__(self, ext):
        self._ext, self.calls, self.ran = ext, [], []  # ran: calls that returned a result

    def __getattr__(self, name):
        fn = getattr(self._ext, name)

        def wrapped(*args):
            self.calls.append(name)
            result = fn(*args)
            if result is not None:
                self.ran.append(name)
            return result

        return wrapped


# --------------------------------------------------------------------------- blocks


def test_dense_block():
    def make():
        return cuba().Dense(NEURON, 20, 12, pre_hook_fx=quantize_8bit, weight_scale=4)

    out = compare(make, [spikes(4, 20, 10)], expect_grads=("grad_x0", "grad_synapse.weight0"))
    assert out["out0"].sum() > 0  # the case exercises spikes and resets


def test_conv_block():
    def make():
        return cuba().Conv(NEURON, 2, 4, 3, padding=1, weight_scale=2, weight_norm=False,
                           pre_hook_fx=quantize_8bit)

    out = compare(make, [spikes(2, 2, 6, 6, 8)], expect_grads=("grad_x0", "grad_synapse.weight0"))
    assert out["out0"].sum() > 0


@pytest.mark.parametrize("weight_scale, kernel", [
    (4, "vnni_conv_fwd"),  # 8-bit weights: integer products
    (60, "spike_conv_fwd"),  # weights beyond int8 (|w| >= 4 on SLAYER's 2^-5 grid), sparse input: spike-driven
])
def test_conv_and_dense_blocks_with_large_fan_in(monkeypatch, weight_scale, kernel):
    # fan-in >= 64 and 0/1 input: the synapse forward runs the first of these kernels the
    # build has (the 8-bit one declines weights beyond int8), else F.conv3d
    chain = ("vnni_conv_fwd", "spike_conv_fwd") if kernel == "vnni_conv_fwd" else ("spike_conv_fwd",)
    expected = next((k for k in chain if k in KERNELS), None)
    counter = _CountingExt(EXT)
    monkeypatch.setattr(ops, "ext", counter)

    def make_conv():
        return cuba().Conv(NEURON, 8, 20, 3, padding=1, weight_scale=weight_scale, weight_norm=False,
                           pre_hook_fx=quantize_8bit)

    out = compare(make_conv, [spikes(2, 8, 7, 5, 19, p=0.1)], expect_grads=("grad_x0", "grad_synapse.weight0"))
    assert out["out0"].sum() > 0

    def make_dense():
        return cuba().Dense(NEURON, 100, 24, pre_hook_fx=quantize_8bit, weight_scale=weight_scale)

    out = compare(make_dense, [spikes(3, 100, 11, p=0.1)], expect_grads=("grad_x0", "grad_synapse.weight0"))
    assert out["out0"].sum() > 0
    # the forward ran the expected kernel (not F.conv3d): it returned a tensor, twice
    assert counter.ran.count("vnni_conv_fwd") + counter.ran.count("spike_conv_fwd") == (2 if expected else 0)
    if expected:
        assert counter.ran.count(expected) == 2


@needs("spike_conv_fwd")
@pytest.mark.parametrize("N, Ci, Co, H, W, T, k, stride, pad, p", [
    (2, 8, 20, 7, 5, 19, 3, 1, 1, 0.1),
    (1, 40, 33, 6, 6, 16, 3, 2, 1, 0.05),
    (3, 70, 16, 4, 4, 5, 1, 1, 0, 0.1),
    (1, 17, 300, 5, 3, 33, 3, 1, 0, 0.12),
    (2, 64, 8, 3, 3, 7, 3, 1, 1, 0.0),
])
def test_spike_conv_kernel_equals_conv3d(N, Ci, Co, H, W, T, k, stride, pad, p, variant_ext):
    x = spikes(N, Ci, H, W, T, p=p, seed=Ci)
    g = torch.Generator().manual_seed(Co)
    w = quantize_8bit(torch.randn(Co, Ci, k, k, 1, generator=g) * 3)
    ref = torch.nn.functional.conv3d(x, w, None, (stride, stride, 1), (pad, pad, 0))
    z = variant_ext.spike_conv_fwd(x, w.reshape(w.shape[:4]).contiguous(), stride, stride, pad, pad, 1.0)
    assert_identical(ref, z, "conv output")
    # declines (caller falls back to F.conv3d) when the result might not be exact
    assert variant_ext.spike_conv_fwd(x * 0.5 + (x == 0) * 0.25, w.reshape(w.shape[:4]).contiguous(),
                                         stride, stride, pad, pad, 1.0) is None
    assert variant_ext.spike_conv_fwd(x, (w * (1 + 1e-6)).reshape(w.shape[:4]).contiguous(),
                                         stride, stride, pad, pad, 1.0) is None


@needs("tlane_conv_fwd")
@pytest.mark.parametrize("N, Ci, Co, H, W, T, k, stride, pad", [
    (2, 1, 16, 8, 8, 16, 3, 1, 1),  # the digits CNN's first layer
    (3, 3, 12, 7, 9, 19, 3, 2, 1),  # RGB, stride 2, T not a multiple of 16, 4-channel blocks
    (2, 2, 5, 6, 6, 33, 5, 1, 2),  # 5x5 kernel, odd channel count (one channel at a time)
    (1, 7, 8, 5, 4, 5, 3, 1, 0),  # fan-in 63, no padding
])
def test_time_lane_conv_kernel_equals_conv3d(N, Ci, Co, H, W, T, k, stride, pad, variant_ext):
    x = spikes(N, Ci, H, W, T, p=0.4, seed=Ci)
    w = quantize_8bit(torch.randn(Co, Ci, k, k, 1, generator=torch.Generator().manual_seed(Co)) * 3)
    ref = torch.nn.functional.conv3d(x, w, None, (stride, stride, 1), (pad, pad, 0))
    w4 = w.reshape(w.shape[:4]).contiguous()
    z = variant_ext.tlane_conv_fwd(x, w4, stride, stride, pad, pad)
    assert_identical(ref, z, "conv output")
    # declines (caller falls back to F.conv3d) when the result might not be exact
    assert variant_ext.tlane_conv_fwd(x * 0.5 + (x == 0) * 0.25, w4, stride, stride, pad, pad) is None
    assert variant_ext.tlane_conv_fwd(x, w4 * (1 + 1e-6), stride, stride, pad, pad) is None


@needs("vnni_conv_fwd")
@pytest.mark.parametrize("N, Ci, Co, H, W, T, k, stride, pad", [
    (4, 16, 32, 4, 4, 16, 3, 1, 1),  # the digits CNN's second layer
    (3, 70, 20, 5, 4, 19, 3, 2, 1),  # stride 2, channels not a multiple of 4, T not a multiple of 16
    (2, 512, 10, 1, 1, 16, 1, 1, 0),  # a dense layer (1x1): 10 outputs = blocks of 8 + 2
    (1, 9, 37, 6, 5, 33, 5, 1, 2),  # 5x5 kernel; 37 outputs = 16 + 16 + 4 + 1
])
def test_8bit_conv_kernel_equals_conv3d(N, Ci, Co, H, W, T, k, stride, pad, variant_ext):
    x = spikes(N, Ci, H, W, T, p=0.3, seed=Ci)
    w = quantize_8bit((torch.randn(Co, Ci, k, k, 1, generator=torch.Generator().manual_seed(Co)) * 1.5).clamp(-3.95, 3.95))
    assert 64 <= w.abs().max() * 32 < 128  # SLAYER's grid is 2^-5: int8 weights, the full range used
    ref = torch.nn.functional.conv3d(x, w, None, (stride, stride, 1), (pad, pad, 0))
    w4 = w.reshape(w.shape[:4]).contiguous()
    z = variant_ext.vnni_conv_fwd(x, w4, stride, stride, pad, pad, 0.0)
    assert_identical(ref, z, "conv output")
    # declines (the caller tries the next kernel) when 8-bit products cannot give the exact sum
    assert variant_ext.vnni_conv_fwd(x * 0.5 + (x == 0) * 0.25, w4, stride, stride, pad, pad, 0.0) is None
    assert variant_ext.vnni_conv_fwd(x, w4 * (1 + 1e-6), stride, stride, pad, pad, 0.0) is None
    beyond_int8 = w4.clone()
    beyond_int8.view(-1)[0] = 128 / 32  # 128 on the 2^-5 grid
    assert variant_ext.vnni_conv_fwd(x, beyond_int8, stride, stride, pad, pad, 0.0) is None
    # and leaves inputs sparser than min_density (30 % active here) to the spike-driven kernel
    assert variant_ext.vnni_conv_fwd(x, w4, stride, stride, pad, pad, 0.4) is None
    assert variant_ext.vnni_conv_fwd(x, w4, stride, stride, pad, pad, 0.2) is not None


def _optional_kernel_call(kernel, ext):
    """One call of an optional kernel on inputs every implementation accepts."""
    x = spikes(2, 16, 4, 4, 16, p=0.1)
    # 8-bit weights (|w| * 64 <= 127): every kernel, the int8 one included, accepts them
    w = quantize_8bit(torch.randn(32, 16, 3, 3, generator=torch.Generator().manual_seed(0)).clamp(-1.5, 1.5))
    g = torch.randn(2, 32, 4, 4, 16)
    return {
        "spike_conv_fwd": lambda: ext.spike_conv_fwd(x, w, 1, 1, 1, 1, 1.0),
        "vnni_conv_fwd": lambda: ext.vnni_conv_fwd(x, w, 1, 1, 1, 1, 0.0),
        "tlane_conv_fwd": lambda: ext.tlane_conv_fwd(x[:, :4], w[:, :4].contiguous(), 1, 1, 1, 1),
        "spike_weight_grad": lambda: ext.spike_weight_grad(x, g, 3, 3, 1, 1, 1, 1, 1.0),
        "tlane_weight_grad": lambda: ext.tlane_weight_grad(x, g, 3, 3, 1, 1, 1, 1),
        "tlane_input_grad": lambda: ext.tlane_input_grad(g, w, 1, 1),
        "tlane_input_grad_1x1": lambda: ext.tlane_input_grad_1x1(g, w[:, :, 0, 0].contiguous()),
    }[kernel]()


@pytest.mark.parametrize("kernel", OPTIONAL_KERNELS)
def test_each_variant_runs_exactly_the_kernels_it_lists(kernel, variant_ext):
    # kernels() is what the other tests trust: a listed kernel returns a result on a
    # valid input, one left out declines (the caller falls back to the stock call)
    listed = kernel in variant_ext.kernels()
    assert (_optional_kernel_call(kernel, variant_ext) is not None) == listed


def test_every_avx512_variant_is_tested_here_natively_or_emulated():
    # an x86-64 CPU without AVX-512 still runs the AVX-512 source (its intrinsics
    # emulated by SIMDe): each AVX-512 variant is in this run's variant_ext list, and
    # an emulated build compiled the AVX-512 half of simd.h (32 zmm-sized registers)
    if not set(kernels.runnable_variants()) & {"x86-64-v2", "x86-64-v3"}:
        pytest.skip("not an x86-64 CPU with the psABI levels")
    tested = set(kernels.runnable_variants())
    for name in variants.emulated_variants():
        assert kernels.build_variant(name).regs() == 32, name
        tested.add(variants.EMULATED[name][0])
    assert {"x86-64-v4", "x86-64-v4+vnni"} <= tested
    assert kernels.build_variant("generic").regs() < 32  # the two-halves form


def test_kernels_leave_the_x87_state_as_they_found_it(variant_ext):
    # code that leaves MMX state behind (no emms) turns later long double arithmetic in
    # the process into NaN: an emulated build once did (GCC spilled to MMX registers),
    # and numpy's SVD in a later test failed. One thread: the kernels run on this one.
    import numpy as np

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        neuron_case(NEURON, torch.randn(4, 6, 9, 20) * 2, fast=True)
        cuba().Conv(NEURON, 3, 5, 3, padding=1)(spikes(2, 3, 6, 6, 20)).sum().backward()
    finally:
        torch.set_num_threads(threads)
    with np.errstate(all="raise"):
        assert np.ldexp(np.longdouble(1), 128) == np.longdouble(2) ** 128


def test_hooks_on_neurons_still_run():
    # the fused block path bypasses neuron.__call__, so it must step aside for hooks
    seen = {}
    for fast in (False, True):
        torch.manual_seed(0)
        block = cuba().Conv(NEURON, 2, 4, 3, padding=1, weight_scale=2, pre_hook_fx=quantize_8bit)
        outs = []
        block.neuron.register_forward_hook(lambda m, i, o: outs.append(o.detach().clone()))
        with kernels.enabled(fast):
            y = block(spikes(2, 2, 5, 5, 6))
        seen[fast] = (y, outs)
    assert len(seen[True][1]) == len(seen[False][1]) == 1
    assert_identical(seen[False][1][0], seen[True][1][0], "hooked neuron output")
    assert_identical(seen[False][0], seen[True][0], "block output")


@pytest.mark.parametrize("scale, num_bits, descale", [(64, 8, False), (64, 8, True), (100, 6, False), (3, 8, True)])
def test_quantize_hook(scale, num_bits, descale, variant_ext):
    """The weight hook, forward and backward, on values at and between the steps,
    beyond the clamp bounds, signed zeros, NaN and inf (scale 100: a step that is not
    a power of two; 3: a non-integer bound)."""
    g = torch.Generator().manual_seed(scale + num_bits)
    step = 2 / scale
    edges = torch.tensor([0.0, -0.0, step / 2, -step / 2, 1.5 * step, -2.5 * step, 1e-30, -1e-30,
                          10.0, -10.0, 1e9, float("nan"), float("inf"), -float("inf")])
    w = torch.cat([torch.randn(4099, generator=g) * 4, edges, torch.arange(-600, 600) * step / 2])
    outs = {}
    for fast in (False, True):
        x = w.clone().requires_grad_(True)
        with kernels.enabled(fast):
            y = slayer.utils.quantize_hook_fx(x, scale=scale, num_bits=num_bits, descale=descale)
        assert (type(y.grad_fn).__name__ == "_QuantizeHookBackward") is fast  # the kernel ran
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(7)))
        outs[fast] = (y.detach(), x.grad)
    assert_identical(outs[True][0], outs[False][0], "hook output")
    assert_identical(outs[True][1], outs[False][1], "hook gradient")


def test_pool_block():
    def make():
        return cuba().Pool(NEURON, 2)

    out = compare(make, [spikes(2, 3, 6, 8, 8, p=0.6)])
    assert out["out0"].sum() > 0


def test_pool_block_with_odd_input_falls_back_exactly():
    def make():
        return cuba().Pool(NEURON, 2)

    compare(make, [spikes(2, 3, 5, 7, 6, p=0.6)])


def test_persistent_state_over_three_calls():
    # (stock SLAYER cannot backpropagate through persistent state *with* the one-step
    # delay: step_delay writes in place into a custom-Function view; so gradients are
    # checked with delay_shift=False and the delayed variant runs without autograd)
    params = dict(NEURON, persistent_state=True)

    def make():
        return cuba().Dense(params, 16, 8, pre_hook_fx=quantize_8bit, weight_scale=4, delay_shift=False)

    xs = [spikes(3, 16, 7, seed=s) for s in range(3)]
    out = compare(make, xs, calls=3, expect_grads=("grad_x2", "current_state2", "voltage_state2"))
    assert out["voltage_state2"].abs().sum() > 0


def test_persistent_state_streaming_with_delay_no_grad():
    params = dict(NEURON, persistent_state=True)
    xs = [spikes(3, 16, 5, seed=s) for s in range(4)]
    results = []
    for fast in (False, True):
        torch.manual_seed(0)
        block = cuba().Dense(params, 16, 8, pre_hook_fx=quantize_8bit, weight_scale=4)
        got = []
        with kernels.enabled(fast), torch.no_grad():
            for x in xs:
                got += [block(x), block.neuron.current_state.clone(), block.neuron.voltage_state.clone(),
                        block.delay_buffer.clone()]
        results.append(got)
    for i, (a, b) in enumerate(zip(*results)):
        assert_identical(a, b, f"streaming item {i}")
    assert sum(r.sum() for r in results[0][0::4]) > 0


def test_affine_block_dynamics_only():
    # Affine uses neuron.dynamics (the patched leaky integrator) without spikes.
    def make():
        return cuba().Affine(NEURON, 10, 6, pre_hook_fx=quantize_8bit, weight_scale=4)

    compare(make, [spikes(3, 10, 9)], expect_grads=("grad_x0", "grad_synapse.weight0"))


def test_trainable_decays_and_graded_spikes_use_exact_fallbacks():
    for extra in (dict(requires_grad=True), dict(graded_spike=True), dict(shared_param=False)):
        params = dict(NEURON, **extra)

        def make():
            return cuba().Dense(params, 12, 7, pre_hook_fx=quantize_8bit, weight_scale=4)

        grads = ("grad_x0", "grad_neuron.current_decay0") if extra.get("requires_grad") else ("grad_x0",)
        compare(make, [spikes(3, 12, 9)], expect_grads=grads)


def test_digits_cnn_training_step(monkeypatch, variant_ext):
    kernels = set(variant_ext.kernels())
    counter = _CountingExt(variant_ext)
    monkeypatch.setattr(ops, "ext", counter)
    pool_calls = []
    monkeypatch.setattr(ops._PoolFn, "backward", _recording(ops._PoolFn.backward, pool_calls))

    def make():
        return torch.nn.Sequential(
            cuba().Conv(NEURON, 1, 16, 3, padding=1, weight_scale=3, weight_norm=False, pre_hook_fx=quantize_8bit),
            cuba().Pool(NEURON, 2),
            cuba().Conv(NEURON, 16, 32, 3, padding=1, weight_scale=3, weight_norm=False, pre_hook_fx=quantize_8bit),
            cuba().Flatten(),
            cuba().Dense(NEURON, 32 * 4 * 4, 10, weight_scale=3, pre_hook_fx=quantize_8bit),
        )

    out = compare(make, [spikes(4, 1, 8, 8, 16, p=0.5, seed=s) for s in range(2)], calls=2,
                  expect_grads=("grad_x1", "grad_0.synapse.weight1", "grad_4.synapse.weight1"))
    assert out["out1"].sum() > 0
    # the fast run really used the fused kernels (4 neuron layers x 2 calls), the time-lane
    # synapse of the one-channel first layer and the pool backward
    assert counter.calls.count("cuba_fwd") == 8 and counter.calls.count("cuba_bwd") == 8
    assert counter.ran.count("tlane_conv_fwd") == (2 if "tlane_conv_fwd" in kernels else 0)
    # the second convolution and the dense layer in 8-bit integers
    assert counter.ran.count("vnni_conv_fwd") == (4 if "vnni_conv_fwd" in kernels else 0)
    assert len(pool_calls) == 2


def _recording(fn, calls):
    def wrapped(ctx, *args):
        calls.append(1)
        return fn(ctx, *args)

    return staticmethod(wrapped)


# --------------------------------------------------------------------------- neuron edge cases


def neuron_case(params, x, fast):
    torch.manual_seed(0)
    with kernels.enabled(fast):
        neuron = slayer.neuron.cuba.Neuron(**params)
        xi = x.clone().requires_grad_(True)
        current, voltage = neuron.dynamics(xi)
        (voltage * torch.linspace(-1, 1, voltage.shape[-1])).sum().backward()
        gd = xi.grad
        xs = x.clone().requires_grad_(True)
        s = neuron(xs)
        (s * torch.linspace(1, -2, s.shape[-1])).sum().backward()
    return dict(current=current.detach(), voltage=voltage.detach(), grad_dyn=gd, spikes=s.detach(), grad=xs.grad)


@pytest.mark.parametrize(
    "name, params, scale",
    [
        ("default", NEURON, 1.0),
        ("large values (float32 rounding of int64 states)", NEURON, 4000.0),
        ("non-power-of-two scale", dict(NEURON, scale=48), 3.0),
        ("no decay, tau_grad=1, scale_grad=2", dict(NEURON, current_decay=0.0, voltage_decay=0.0,
                                                    tau_grad=1.0, scale_grad=2.0), 1.0),
        ("full decay", dict(NEURON, current_decay=1.0, voltage_decay=1.0), 2.0),
        # the kernel runs a tile group in int32 lanes only below a bound on its integers
        ("beyond int32: int64 lanes", NEURON, 3e6),
        ("int32 and int64 tile groups in one call", NEURON, "mixed"),
    ],
)
def test_neuron_dynamics_and_spikes(name, params, scale, variant_ext):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, 11, 13, generator=g)
    if scale == "mixed":  # every other 32-neuron group far beyond int32 (neurons are rows of 13 steps)
        rows = torch.arange(5 * 7 * 11).reshape(5, 7, 11, 1)
        x = x * torch.where((rows // 32) % 2 == 1, 3e6, 2.0)
    else:
        x = x * scale
    stock = neuron_case(params, x, fast=False)
    fast = neuron_case(params, x, fast=True)
    for key in stock:
        assert_identical(stock[key], fast[key], f"{name}: {key}")


def test_inputs_on_the_threshold_grid():
    # with full decay, voltage == input on the 1/4096 grid: hit the threshold exactly
    params = dict(NEURON, current_decay=1.0, voltage_decay=1.0)
    th = 1.25 + 0.01 / 4096
    offsets = torch.arange(-8, 9, dtype=torch.float32) / 4096
    x = (th + offsets).repeat(3, 2, 1)
    x = torch.cat([x, -x, x * 3], dim=-1)
    stock = neuron_case(params, x, fast=False)
    fast = neuron_case(params, x, fast=True)
    assert 0 < stock["spikes"].sum() < stock["spikes"].numel()
    for key in stock:
        assert_identical(stock[key], fast[key], key)


def test_single_time_step_and_no_grad():
    x = torch.randn(4, 6, 1) * 3
    stock = neuron_case(NEURON, x, fast=False)
    fast = neuron_case(NEURON, x, fast=True)
    for key in stock:
        assert_identical(stock[key], fast[key], key)
    with torch.no_grad():
        ref = slayer.neuron.cuba.Neuron(**NEURON)(x)
        with kernels.enabled():
            got = slayer.neuron.cuba.Neuron(**NEURON)(x)
    assert_identical(ref, got, "no_grad spikes")


@pytest.mark.parametrize("name, params, scale", [
    ("the SFedCA presets' IF neuron", dict(NEURON, threshold=1.0, current_decay=1.0, voltage_decay=0.0), 1.0),
    ("leaky", NEURON, 2.0),
    ("beyond int32: int64 lanes", NEURON, 3e6),
])
def test_reset_gradient_neuron_fused(name, params, scale, variant_ext):
    # model.neuron_gradient: spikingjelly: the fused kernels give the torch form's spikes and
    # input gradients bit for bit, and the fused backward is the one that ran
    from types import SimpleNamespace

    from neurofed.models.reset_gradient import use_reset_gradient

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 6, 9, 12, generator=g) * scale
    weight = torch.randn(x.shape, generator=g)
    out = {}
    for fast in (False, True):
        neuron = slayer.neuron.cuba.Neuron(**params)
        use_reset_gradient(SimpleNamespace(neuron=neuron), alpha=2.0)
        counting = _CountingExt(variant_ext)
        with kernels.enabled(fast), pytest.MonkeyPatch.context() as mp:
            mp.setattr(ops, "ext", counting)
            xi = x.clone().requires_grad_(True)
            y = neuron(xi)
            (y * weight).sum().backward()
        assert ("cuba_reset_bwd" in counting.ran) is fast, counting.calls
        out[fast] = (y.detach(), xi.grad)
    assert 0 < out[False][0].sum() < out[False][0].numel(), "spikes and silence both"
    assert_identical(out[False][0], out[True][0], f"{name}: spikes")
    assert_identical(out[False][1], out[True][1], f"{name}: grad_x")


# --------------------------------------------------------------------------- switches


def test_enable_disable_restore_stock_functions():
    was = kernels.is_enabled()
    kernels.disable()
    stock = [getattr(owner, attr) for owner, attr, _fn, _key in patches._patches()]
    assert kernels.enable() is True and kernels.is_enabled()
    for (owner, attr, fn, _key), orig in zip(patches._patches(), stock):
        assert getattr(owner, attr) is not orig, attr
    with kernels.enabled(False):
        assert not kernels.is_enabled()
        assert [getattr(o, a) for o, a, _f, _k in patches._patches()] == stock
    assert kernels.is_enabled()
    kernels.disable()
    assert [getattr(o, a) for o, a, _f, _k in patches._patches()] == stock
    if was:
        kernels.enable()


def test_every_patch_point_names_tests_that_exist_here():
    # the one list of patch points (neurofed.kernels.PATCHES) says which tests prove each
    # replacement bit-identical; they must be tests of this module
    assert {p.key for p in kernels.PATCHES} == {key for _o, _a, _f, key in patches._patches()}
    for p in kernels.PATCHES:
        assert p.proof, p.key
        for name in p.proof:
            assert callable(globals().get(name)) and name.startswith("test_"), (p.key, name)


@pytest.mark.slow
@pytest.mark.parametrize("variant, cxx, machine", [
    ("x86-64-v4+vnni", "g++", "x86-64"),  # AVX-512 + VNNI: compiles on any x86-64 machine, runs only there
    ("generic", "aarch64-linux-gnu-g++", "aarch64"),  # Debian's g++-aarch64-linux-gnu
    ("x86-64-v4+vnni-simde", "aarch64-linux-gnu-g++", "aarch64"),  # the AVX-512 source, emulated on NEON
])
def test_kernels_compile_for_other_cpus(variant, cxx, machine):
    import shutil
    import subprocess

    if shutil.which(cxx) is None:
        pytest.skip(f"{cxx} is not installed")
    obj = variants.compile_check(variant, cxx=cxx)
    header = subprocess.run(["readelf", "-h", obj], capture_output=True, text=True, check=True).stdout
    assert {"x86-64": "X86-64", "aarch64": "AArch64"}[machine] in header
