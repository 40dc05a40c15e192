"""Where local training and the global evaluation run: ``federation.device``.

``auto`` (default): the first CUDA GPU torch sees, else the CPU. ``cpu``, ``cuda``
(torch's current GPU) and ``cuda:N`` are taken literally: a GPU asked for that this
machine cannot use is a :class:`~neurofed.config.ConfigError`, never a silent CPU run.

Only models and batches go to the device. Parameter messages, aggregation,
checkpoints, export, Lava and energy counting stay on the CPU (``ParamSpec.get``
returns CPU arrays; ``forward_dataset`` returns CPU tensors), and the input encoding
draws its spikes on the CPU, so every device sees the same input spikes.

On CUDA, SLAYER's kernels are fixed by :mod:`neurofed.gpu.slayer_cuda` (built for the
devices present; the CPU's threshold): 8-bit networks (``model.quantize: true``) with
spike inputs give the CPU's spikes exactly. Float-weight networks do not, in general:
see :func:`configure_cuda` (``federation.tf32``).
"""

from __future__ import annotations

import os

import torch

from neurofed.config.checks import DEVICE_HELP, ConfigError, check_device

def _no_gpu_reason() -> str:
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU{hint}"


def resolve_device(value: str = "auto") -> torch.device:
    """The ``torch.device`` that ``federation.device: value`` means on this machine."""
    if check_device(value):
        raise ConfigError(f"federation.device: got {value!r}; {DEVICE_HELP}")
    if value == "cpu" or (value == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"federation.device: got {value!r}; {_no_gpu_reason()}; use cpu or auto")
    index = torch.cuda.current_device() if value in ("auto", "cuda") else int(value.split(":")[1])
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"federation.device: got {value!r}; this machine has {count} CUDA device(s): "
                          f"cuda:0..cuda:{count - 1}")
    device = torch.device("cuda", index)
    try:
        torch.zeros(1, device=device).add_(1)
    except RuntimeError as exc:  # driver/toolkit mismatch, GPU busy in exclusive mode, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"federation.device: got {value!r}; {device} is not usable: {first}") from None
    return device


def configure_cuda(tf32="auto", gpu_kernels=False) -> None:
    """``federation.gpu_kernels`` (see :mod:`neurofed.gpu.cuba_triton`; a ``true`` that
    cannot be honoured on a GPU is a :class:`ConfigError`) and ``federation.tf32``.

    ``tf32``: how CUDA computes float32 convolutions and matmuls (process-wide).

    ``auto`` leaves torch's defaults (cuDNN convolutions in TF32, matmuls in float32);
    ``false`` makes both IEEE float32; ``true`` both TF32. TF32 rounds each operand to an
    11-bit significand, so a float-weight network's synaptic sums, and from there its
    spikes, differ from the CPU's; in float32 too the GPU sums in another order (cuDNN
    and cuBLAS choose their algorithms), so float-weight spikes can still differ where a
    sum's rounding decides a threshold crossing. 8-bit weights (``model.quantize``) are
    integers of at most 9 significant bits times a power of two and spikes are 0 or 1:
    TF32 holds them exactly and float32 sums them exactly in any order (below 2^24), so
    their spikes are the CPU's with any setting, as long as cuDNN sums directly (GEMM or
    direct convolution; a Winograd or FFT algorithm transforms the operands and rounds):
    ``scripts/gpu_check.sh`` counts the differing spikes on the GPU."""
    from neurofed.gpu import cuba_triton

    if gpu_kernels is True and torch.cuda.is_available() and not cuba_triton.available():
        raise ConfigError("federation.gpu_kernels: got true; Triton does not import with torch "
                          f"{torch.__version__}; allowed here: auto, false")
    cuba_triton.configure(gpu_kernels)
    if tf32 != "auto":
        torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
        torch.backends.cudnn.allow_tf32 = bool(tf32)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _fused_cuba() -> str:
    from neurofed import kernels
    from neurofed.gpu import cuba_triton

    if not cuba_triton.enabled():
        return "stock SLAYER"
    return "neurofed Triton" if kernels.is_enabled() else "stock SLAYER (federation.fast_kernels is off)"


def describe_device(device: torch.device) -> dict:
    """What ran, for the run log and ``summary.json``: device, name, torch (and CUDA)."""
    device = torch.device(device)
    info = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        from neurofed.compat import slayer
        from neurofed.gpu.slayer_cuda import current_arch_list

        slayer()  # its CUDA fixes: the arch list its kernels are built for
        info.update(name=props.name, cuda=torch.version.cuda, capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1), slayer_cuda_arch=current_arch_list(),
                    tf32_conv=torch.backends.cudnn.allow_tf32, tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                    fused_cuba=_fused_cuba())
    else:
        info.update(name=cpu_name(), threads=torch.get_num_threads())
    return info


def device_line(info: dict) -> str:
    """One line for a log: ``cuda:0 (NVIDIA H100 80GB HBM3, CUDA 13.0, SLAYER kernels for 9.0+PTX, TF32
    conv on, matmul off)``."""
    if info.get("cuda"):
        onoff = {True: "on", False: "off"}
        extra = (f", CUDA {info['cuda']}, SLAYER kernels for {info.get('slayer_cuda_arch')}, TF32 conv "
                 f"{onoff.get(info.get('tf32_conv'), '?')}, matmul {onoff.get(info.get('tf32_matmul'), '?')}, CUBA neurons: "
                 f"{info.get('fused_cuba', '?')}")
    else:
        extra = f", {info.get('threads')} threads"
    return f"{info['device']} ({info.get('name', '?')}{extra})"


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
