"""lava-dl's CUDA path fixed without a GPU: the JIT arch list derived from the device
(fake capabilities), and the leaky integrator's threshold checked on the kernel's own
source compiled for the host."""

from __future__ import annotations

import ctypes
import importlib
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from neurofed.compat import slayer
from neurofed.gpu import slayer_cuda

slayer()  # installs the fixes
LI = importlib.import_module(slayer_cuda.LEAKY_INTEGRATOR)
JITCONFIG = importlib.import_module("lava.lib.dl.slayer.jitconfig")
TORCH_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]  # torch 2.11+cu130


# --------------------------------------------------------------------------- arch list
@pytest.fixture
def fake_gpu(monkeypatch):
    """torch reports CUDA devices of the given capabilities (nothing is run on them)."""

    def make(*caps, archs=TORCH_ARCHS):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i if isinstance(i, int) else 0])
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: f"Fake GPU sm_{''.join(map(str, caps[i]))}")
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(archs))

    return make


def _stock_pin() -> str | None:
    """What lava-dl's jitconfig.py sets, executed from its installed source."""
    scope: dict = {}
    with open(JITCONFIG.__file__, encoding="utf-8") as fh:
        exec(compile(fh.read(), JITCONFIG.__file__, "exec"), scope)
    return scope["TORCH_CUDA_ARCH_LIST"]


@pytest.mark.parametrize("cap, expected", [((9, 0), "9.0+PTX"), ((12, 0), "12.0+PTX"), ((10, 0), "10.0+PTX"),
                                           ((8, 6), "8.6+PTX"), ((7, 5), "7.5+PTX")])
def test_arch_list_is_the_devices_own_with_ptx(fake_gpu, cap, expected):
    fake_gpu(cap)
    assert slayer_cuda.device_arch_list() == expected


def test_sm90_and_sm120_builds_get_their_own_code_not_lava_dls_80(fake_gpu, monkeypatch):
    """SLAYER's build reads jitconfig right before torch's load(): capture the arch list
    in the environment at that moment, through the real Accelerated property."""
    seen = []

    def fake_load(name, sources, **kw):
        seen.append(os.environ["TORCH_CUDA_ARCH_LIST"])
        return object()

    shift = importlib.import_module("lava.lib.dl.slayer.utils.time.shift")
    for cap, expected in (((9, 0), "9.0+PTX"), ((12, 0), "12.0+PTX")):
        fake_gpu(cap)
        assert _stock_pin() == "8.0"  # lava-dl's own pin for this device: sm_80 code only
        monkeypatch.setattr(slayer_cuda, "_installed", False)
        monkeypatch.setattr(JITCONFIG, "TORCH_CUDA_ARCH_LIST", "8.0")
        monkeypatch.setattr(shift, "load", fake_load)  # install() wraps it again, as on a GPU machine
        monkeypatch.setattr(shift.Accelerated, "module", None)
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
        assert slayer_cuda.install() == expected
        shift.Accelerated.shift  # the JIT build of one of SLAYER's CUDA modules
        assert seen[-1] == expected
    assert seen == ["9.0+PTX", "12.0+PTX"]


def test_arch_list_of_several_devices_and_newer_than_torch(fake_gpu):
    fake_gpu((8, 0), (9, 0), (8, 0))
    assert slayer_cuda.device_arch_list() == "8.0;9.0+PTX"
    # a device newer than torch's build: torch's newest arch, as PTX the driver compiles
    fake_gpu((13, 0), archs=["sm_80", "sm_90", "sm_90a"])
    assert slayer_cuda.device_arch_list() == "9.0+PTX"


def test_failed_build_is_one_line_naming_gpu_arch_and_what_to_do(fake_gpu, monkeypatch):
    fake_gpu((9, 0))

    def broken_load(name, sources, **kw):
        raise RuntimeError("Error building extension 'dynamics'\nnvcc fatal : Unsupported gpu architecture")

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0+PTX")
    with pytest.raises(RuntimeError) as err:
        slayer_cuda._checked_load(broken_load, "9.0+PTX")(name="dynamics", sources=["x.cu"])
    msg = str(err.value)
    assert "\n" not in msg
    assert "Fake GPU sm_90 (capability 9.0)" in msg and "TORCH_CUDA_ARCH_LIST=9.0+PTX" in msg
    assert "'dynamics'" in msg and "nvcc" in msg and "federation.device: cpu" in msg


def test_fixes_are_installed_by_compat_slayer():
    assert all(getattr(importlib.import_module(m).load, "_nf_checked", False) for m in slayer_cuda.JIT_MODULES)
    assert LI.Accelerated._nf_stock is not None


# --------------------------------------------------------------------------- threshold
HARNESS = r"""
// LIDynamicsFwdKernel from lava-dl's leaky_integrator.cu, compiled for the host: one
// "thread" per neuron. (1.0l: long double here, double on the GPU; both exact for
// |v| * decay < 2^53.)
#define __global__
struct nf_dim3 { unsigned x; };
static nf_dim3 blockIdx, blockDim, threadIdx;
@KERNEL@
extern "C" void li_fwd(float* output, const float* input, const float* decay, const float* state,
                       float threshold, int w_scale, int num_neurons, int neurons_per_batch,
                       int num_decays, int decay_block, int num_steps) {
    @HOST@
    blockDim.x = 1; threadIdx.x = 0;
    for (int i = 0; i < num_neurons; ++i) {
        blockIdx.x = i;
        LIDynamicsFwdKernel<float>(output, input, decay, state, threshold, w_scale, num_neurons,
                                   neurons_per_batch, num_decays, decay_block, num_steps);
    }
}
"""


def _kernel_source() -> tuple[str, str]:
    """The forward kernel and LIDynamicsFwd's threshold line, from the installed .cu."""
    path = os.path.join(os.path.dirname(LI.__file__), "leaky_integrator.cu")
    with open(path, encoding="utf-8") as fh:
        src = fh.read()
    start = src.index("template <class T>\n__global__ void LIDynamicsFwdKernel(")
    end = src.index("template <class T>", start + 1)
    host = re.search(r"variable_list LIDynamicsFwd\((.*?)\)\s*\{(.*?)LIDynamicsFwdKernel", src, re.S)
    assert host and "float threshold" in host.group(1), "LIDynamicsFwd no longer takes a float threshold"
    scale_line = re.search(r"^\s*threshold \*= w_scale;\s*$", host.group(2), re.M)
    assert scale_line, "LIDynamicsFwd no longer scales the threshold as `threshold *= w_scale;`"
    return src[start:end], scale_line.group(0).strip()


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    kernel, host = _kernel_source()
    d = tmp_path_factory.mktemp("li_kernel")
    (d / "li.cpp").write_text(HARNESS.replace("@KERNEL@", kernel).replace("@HOST@", host))
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(d / "li.so"), str(d / "li.cpp")], check=True)
    lib = ctypes.CDLL(str(d / "li.so"))
    f = ctypes.c_float
    lib.li_fwd.argtypes = [ctypes.c_void_p] * 4 + [f] + [ctypes.c_int] * 6
    return lib


class HostLeakyIntegrator:
    """SLAYER's compiled CUDA module as ``Accelerated.leaky_integrator`` returns it, with
    ``dynamics`` running the kernel's host build on CPU tensors (LIDynamicsFwd's launch
    arguments; pybind11 passes the Python float threshold as a C float, as ctypes does)."""

    def __init__(self, lib):
        self.lib = lib
        self.thresholds = []

    def dynamics(self, input, decay, state, threshold, w_scale):
        self.thresholds.append(threshold)
        input, decay, state = (t.contiguous().float() for t in (input, decay, state))
        out = torch.zeros_like(input)
        neurons = input.numel() // input.shape[-1]
        self.lib.li_fwd(out.data_ptr(), input.data_ptr(), decay.data_ptr(), state.data_ptr(), threshold, w_scale,
                        neurons, neurons // input.shape[0], decay.numel(), neurons // decay.numel() // input.shape[0],
                        input.shape[-1])
        return out


def _on_theta_inputs(theta: float, w_scale: int, shape=(6, 40, 24), seed=0):
    """Integer-grid currents (as pools give) that bring many voltages exactly onto theta."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(1, 5, shape, generator=g).float()
    x = theta / steps  # theta split into 1..4 equal parts: v hits theta after that many steps
    x = torch.round(x * w_scale) / w_scale
    noise = torch.randint(-2, 3, shape, generator=g).float() / w_scale * (torch.rand(shape, generator=g) < 0.3)
    return x + noise


@pytest.mark.parametrize("decay", [0.0, 1024.0])
def test_cuda_leaky_integrator_resets_as_the_cpu_path(host_kernel, monkeypatch, decay):
    """cuba's voltage integrator: threshold theta + threshold_eps. The CUDA kernel (its
    host build) with SLAYER's call resets on v == theta without a spike; through neurofed's
    fix it equals the CPU path bit for bit."""
    cuba = slayer().neuron.cuba.Neuron(threshold=1.25, current_decay=0.0, voltage_decay=decay / 4096)
    w_scale, th = cuba.s_scale, cuba.threshold + cuba.threshold_eps
    assert float(cuba.threshold * w_scale).is_integer()  # the case the issue names
    x = _on_theta_inputs(cuba.threshold, w_scale)
    d, state = torch.tensor([decay]), torch.zeros(x.shape[:-1])
    cpu = LI._li_dynamics_fwd(x, d, state, th, w_scale, dtype=torch.int64)
    assert (cpu * w_scale == cuba.threshold * w_scale).sum() > 100  # voltages land on theta, and stay (no reset)

    host = HostLeakyIntegrator(host_kernel)
    monkeypatch.setattr(LI.Accelerated, "module", host)  # as if built
    stock = LI.Accelerated._nf_stock.__dict__["leaky_integrator"].fget().dynamics(x, d, state, th, w_scale)
    fixed = LI.Accelerated.leaky_integrator.dynamics(x, d, state, th, w_scale)  # what dynamics() calls on CUDA
    assert host.thresholds == [th, slayer_cuda.exact_threshold(th, w_scale)]
    assert not torch.equal(stock, cpu)  # the old behaviour: resets where the CPU path does not
    assert torch.equal(fixed, cpu)


def test_cuda_leaky_integrator_without_reset_and_small_thresholds(host_kernel, monkeypatch):
    host = HostLeakyIntegrator(host_kernel)
    monkeypatch.setattr(LI.Accelerated, "module", host)
    w_scale = 4096
    x = _on_theta_inputs(0.5, w_scale, seed=3)
    d, state = torch.tensor([512.0]), torch.zeros(x.shape[:-1])
    # threshold -1 (SLAYER's "no reset", the current integrator), and a threshold below one
    # integer step (CPU: reset from 1; CUDA's truncation made it 0: reset on every v >= 0)
    for th in (-1, 0.1 / w_scale, 0.5 + 0.01 / w_scale, 3.0):
        cpu = LI._li_dynamics_fwd(x, d, state, th, w_scale, dtype=torch.int64)
        assert torch.equal(LI.Accelerated.leaky_integrator.dynamics(x, d, state, th, w_scale), cpu), th


@pytest.mark.parametrize("theta_int", [1, 64, 5120, 81920, 2**23 - 1])
def test_exact_threshold_passes_the_kernels_float32_as_the_cpus_integer(theta_int):
    for w_scale in (64, 4096):
        th = theta_int / w_scale + 0.01 / w_scale
        value = slayer_cuda.exact_threshold(th, w_scale)
        kernel_int = int(np.float32(np.float32(value) * np.float32(w_scale)))
        assert kernel_int == theta_int + 1  # the CPU's first resetting integer: v > theta


# --------------------------------------------------------------------------- on a CUDA GPU
@pytest.mark.gpu
def test_on_the_gpu_slayer_builds_for_this_device_and_resets_as_the_cpu():
    """The real JIT build (sm_XY of this GPU + PTX) and the real CUDA kernel, fed voltages
    landing on theta: equal to the CPU path bit for bit."""
    major, minor = torch.cuda.get_device_capability(0)
    arch = slayer_cuda.current_arch_list()
    assert arch is not None and arch.endswith("+PTX") and arch != "8.0"
    if (major, minor) <= max(divmod(int(a[3:].rstrip("a")), 10) for a in torch.cuda.get_arch_list() if a.startswith("sm_")):
        assert f"{major}.{minor}" in arch
    w_scale, theta = 4096, 1.25
    th = theta + 0.01 / w_scale
    x = _on_theta_inputs(theta, w_scale)
    d, state = torch.tensor([0.0]), torch.zeros(x.shape[:-1])
    cpu = LI._li_dynamics_fwd(x, d, state, th, w_scale, dtype=torch.int64)
    gpu = LI.dynamics(x.cuda(), d.cuda(), state.cuda(), w_scale, th).cpu()
    assert torch.equal(gpu, cpu)
