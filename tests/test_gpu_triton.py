"""The fused CUBA neuron in Triton, run on the CPU by Triton's interpreter
(TRITON_INTERPRET=1): bit for bit the CPU kernel's (hence stock SLAYER's) spikes,
last states and gradients, and a digits-CNN training step through the patched blocks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is imported: set it before anything imports it
_TRITON_PRELOADED = "triton" in sys.modules
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from neurofed import kernels  # noqa: E402
from neurofed.compat import slayer  # noqa: E402
from neurofed.gpu import cuba_triton  # noqa: E402
from neurofed.kernels import ops, replacements  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not cuba_triton.available(), reason="Triton is not installed"),
    pytest.mark.skipif(not kernels.enable(), reason="neurofed's CPU kernels are unavailable"),
]


@pytest.fixture
def interpret(request):
    """Triton's interpreter (numpy on the CPU) runs the kernels; if Triton was imported
    earlier in this session without it, the test runs in a fresh interpreter instead."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a CUDA GPU is present: the kernels run on it (tests marked gpu)")
    if _TRITON_PRELOADED and not os.environ.get("NF_TRITON_SUBPROCESS"):
        env = dict(os.environ, TRITON_INTERPRET="1", NF_TRITON_SUBPROCESS="1")
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
                             capture_output=True, text=True, env=env, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:]
        pytest.skip("passed in a fresh interpreter (Triton was imported before TRITON_INTERPRET)")


def _neuron(threshold=1.25, cdecay=0.25, vdecay=0.03, scale=1 << 6):
    cuba = slayer().neuron.cuba
    return cuba.Neuron(threshold=threshold, current_decay=cdecay, voltage_decay=vdecay, scale=scale)


def _inputs(shape, seed, grid=64):
    """Synaptic sums as 8-bit weights give them (multiples of 1/grid), many landing the
    voltage on theta."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-40, 120, shape, generator=g).float() / grid


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("vdecay", [0.0, 0.03])
def test_forward_and_backward_equal_the_cpu_kernel(interpret, shift, vdecay):
    neuron = _neuron(vdecay=vdecay)
    z = _inputs((3, 50, 37), seed=1)  # R = 150 rows: two Triton programs, one partly masked
    p = replacements.cuba_constants(neuron)
    state = torch.zeros(z.shape[:-1])
    grad = torch.randn(z.shape, generator=torch.Generator().manual_seed(2))
    outs = {}
    for name, fn in (("cpu", ops._FusedCuba), ("triton", cuba_triton.FusedCuba)):
        x = z.clone().requires_grad_(True)
        spike, _, _ = fn.apply(x, state, state, p, False, True, shift)
        spike.backward(grad)
        outs[name] = spike.detach(), x.grad
    (s_cpu, g_cpu), (s_tr, g_tr) = outs["cpu"], outs["triton"]
    assert s_cpu.sum() > 100 and (g_cpu != 0).sum() > 1000  # spiking, with gradients
    assert torch.equal(s_tr, s_cpu)
    assert torch.equal(g_tr, g_cpu)  # bitwise, incl. the sign of zeros: torch.equal on floats
    assert torch.equal(torch.signbit(g_tr), torch.signbit(g_cpu))


@pytest.mark.parametrize("scale", [1 << 6, 48])  # w_scale 4096, and 3072 (divisions, not products)
def test_last_states_and_nonzero_initial_states_equal_the_cpu_kernel(interpret, scale):
    neuron = _neuron(cdecay=0.5, vdecay=0.1, scale=scale)
    z = _inputs((2, 70, 9), seed=4)
    g = torch.Generator().manual_seed(5)
    cstate = torch.randint(-64, 64, z.shape[:-1], generator=g).float() / 64
    vstate = torch.randint(-64, 80, z.shape[:-1], generator=g).float() / 64
    p = replacements.cuba_constants(neuron)
    ref = ops._FusedCuba.apply(z, cstate, vstate, p, True, False, False)
    got = cuba_triton.FusedCuba.apply(z, cstate, vstate, p, True, False, False)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


def test_forward_equals_stock_slayer_with_threshold_landings(interpret):
    """Against stock SLAYER's own code (no neurofed kernel): spikes and the voltage at
    theta not reset (Loihi's v > theta)."""
    neuron = _neuron(threshold=1.0, cdecay=1.0, vdecay=0.0)  # current = input; voltage integrates
    z = torch.full((1, 4, 6), 0.5)
    with kernels.enabled(False):
        stock = neuron(z)
    got, _, _ = cuba_triton.FusedCuba.apply(z, torch.zeros(1, 4), torch.zeros(1, 4),
                                            replacements.cuba_constants(neuron), False, False, False)
    # v = 0.5, 1.0 (= theta: no spike, no reset), 1.5 (spike, reset), 0.5, 1.0, 1.5 (spike)
    assert stock[0, 0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert torch.equal(got, stock)


def test_digits_cnn_training_step_through_the_triton_path_equals_stock(interpret, monkeypatch):
    """The patched blocks with CUDA's choice of kernel taken on CPU tensors: every CUBA
    neuron of the digits CNN (8-bit weights, one-step delay) runs the Triton kernels; the
    output spikes, loss and every parameter gradient equal stock SLAYER's bit for bit."""
    from neurofed.config import load_config
    from neurofed.models import build_model

    cfg = load_config("examples/digits_fedavg.yaml", [("data.timesteps", 8)])
    calls = []

    class Counted:
        @staticmethod
        def apply(*args):
            calls.append(tuple(args[0].shape))
            return cuba_triton.FusedCuba.apply(*args)

    def step(fast: bool):
        torch.manual_seed(0)
        model = build_model(cfg["model"], (1, 8, 8), 10)
        x = (torch.rand(4, 1, 8, 8, 8, generator=torch.Generator().manual_seed(3)) < 0.5).float()
        with kernels.enabled(fast):
            outs = [x]
            for block in model.blocks:
                outs.append(block(outs[-1]))
            loss = torch.nn.functional.cross_entropy(outs[-1].mean(-1) * 4, torch.arange(4))
            loss.backward()
        return outs[1:], loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]

    stock = step(False)
    monkeypatch.setattr(replacements, "_fused_cuba_fn", lambda _input: Counted)
    fast = step(True)
    assert len(calls) >= 3, "the Triton kernel was not used"
    assert stock[0][0].sum() > 1000 and stock[0][2].sum() > 100  # the conv layers spike
    assert all(torch.equal(a, b) for a, b in zip(stock[0], fast[0])) and torch.equal(stock[1], fast[1])
    assert len(stock[2]) == len(fast[2]) > 0 and all(torch.equal(a, b) for a, b in zip(stock[2], fast[2]))
    assert any(g.abs().sum() > 0 for g in stock[2][:-1])  # gradients reach the first layers


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [False, True])
def test_on_the_gpu_triton_equals_the_cpu_kernel(shift):
    """Compiled for this GPU: spikes and last states bit for bit; gradients equal up to
    CUDA's expf (the only operation not the CPU's: an ulp, carried through the sums)."""
    neuron = _neuron()
    z = _inputs((8, 300, 24), seed=7)
    p = replacements.cuba_constants(neuron)
    state = torch.zeros(z.shape[:-1])
    grad = torch.randn(z.shape, generator=torch.Generator().manual_seed(8))
    xc = z.clone().requires_grad_(True)
    sc, _, _ = ops._FusedCuba.apply(xc, state, state, p, False, True, shift)
    sc.backward(grad)
    xg = z.cuda().requires_grad_(True)
    sg, _, _ = cuba_triton.FusedCuba.apply(xg, state.cuda(), state.cuda(), p, False, True, shift)
    sg.backward(grad.cuda())
    assert torch.equal(sg.cpu(), sc.detach())
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-6)
    ref = ops._FusedCuba.apply(z, state + 0.5, state - 0.25, p, True, False, False)
    got = cuba_triton.FusedCuba.apply(z.cuda(), (state + 0.5).cuda(), (state - 0.25).cuda(), p, True, False, False)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(ref, got))


COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from neurofed.gpu import _triton_kernels as K

fwd_sig = {n: "*fp32" for n in ("z", "cstate", "vstate", "spike", "earg", "clast", "vlast")}
fwd_sig.update({n: "i32" for n in ("R", "T", "cd", "vd")}, **{n: "fp32" for n in ("ws", "iws", "rth", "sth", "tf")})
fwd_sig.update({n: "constexpr" for n in ("POW2", "RESET", "SHIFT", "EARG", "LAST", "BLOCK")})
bwd_sig = {"ex": "*fp32", "g": "*fp32", "out": "*fp32", "R": "i32", "T": "i32", "a": "fp32", "fv": "fp32", "fc": "fp32",
           "SHIFT": "constexpr", "BLOCK": "constexpr"}
out = []
for cap in (90, 120):
    for fusion in (False, True):
        for kernel, sig, const in (
            (K.cuba_fwd, fwd_sig, dict(POW2=False, RESET=True, SHIFT=True, EARG=True, LAST=True, BLOCK=128)),
            (K.cuba_fwd, fwd_sig, dict(POW2=True, RESET=True, SHIFT=False, EARG=True, LAST=False, BLOCK=128)),
            (K.cuba_bwd, bwd_sig, dict(SHIFT=1, BLOCK=128)),
        ):
            k = triton.compile(ASTSource(kernel, sig, constexprs=const), target=GPUTarget("cuda", cap, 32),
                               options={"enable_fp_fusion": fusion})
            ptx = k.asm["ptx"]
            out.append({"cap": cap, "fusion": fusion, "kernel": kernel.__name__, "pow2": const.get("POW2"),
                        "fma": "fma." in ptx, "div_rn": "div.rn.f32" in ptx,
                        "div_approx": "div.approx" in ptx or "div.full" in ptx, "cubin": len(k.asm.get("cubin", b""))})
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90_and_sm120_without_fma_and_with_ieee_division(tmp_path):
    """Compiled (not interpreted) by Triton for Hopper and Blackwell on this CPU machine, as
    launched: no contracted multiply-add (the CPU rounds each product and sum; with fusion
    allowed Triton does contract them, so the option matters) and IEEE division."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile now, not from an earlier cache
    res = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0 and "ptxas" in res.stderr and "not found" in res.stderr.lower():
        pytest.skip("Triton's ptxas is unavailable here")
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    launched = [r for r in rows if not r["fusion"]]
    assert len(launched) == 6 and all(r["cubin"] > 0 for r in rows)  # ptxas accepted sm_90 and sm_120
    assert not any(r["fma"] for r in launched)
    assert any(r["fma"] for r in rows if r["fusion"] and r["kernel"] == "cuba_bwd")
    assert all(r["div_rn"] and not r["div_approx"] for r in launched if r["pow2"] is False)
