"""Training on a GPU: stock SLAYER vs neurofed's step, one FedAvg round, CPU/GPU spikes.

Three measurements on ``--device`` (default ``cuda``):

1. **Spikes, device vs CPU.** The same zoo network (same weights) and the same Poisson
   input spikes run on the CPU and on the device: the digits example's CNN (8-bit
   weights), the FedSNN preset's S-VGG9 (float weights) and that S-VGG9 with 8-bit
   weights (both with SLAYER's weight scale 4, so that every layer spikes); per layer:
   how many spike values differ and the largest difference of a layer's spike count
   per sample. On CUDA this is done with PyTorch's default TF32 settings and again
   with TF32 off.
2. **Training throughput.** Samples/s of one training step (forward, backward, the
   config's optimizer) of the digits CNN (``examples/digits_fedavg.yaml``: 1x8x8, T=32,
   Adam, batch 32) and S-VGG9 (``examples/papers/fedsnn_cifar10_iid.yaml``: 3x32x32,
   T=20, SGD + momentum) at the papers' batch sizes (32, 64, 128):
   *stock*: the model's SLAYER blocks driven by a plain loop, its input spikes encoded
   beforehand and copied to the device per batch (a DataLoader's work), and again with
   the batches already on the device (the compute alone);
   *neurofed*: :func:`neurofed.training.local.train_local` on a client shard of images
   (Poisson encoding on the CPU per batch — on a GPU in a helper thread, up to two
   batches ahead — the copy, the hooks) with neurofed's kernels: on CUDA the fused
   Triton CUBA neuron (``--gpu-kernels``, default auto: where Triton imports; false:
   SLAYER's neurons, so the ratio is neurofed's loop overhead), on the CPU the C++ ones.
   The stock loop runs with every neurofed patch off (SLAYER's CUDA leaky integrator
   keeps neurofed's threshold fix: same speed, the CPU's spikes). The paths alternate,
   ``--repeat`` times; the medians are reported.
3. **One FedAvg round** of the FedSNN CIFAR-10 preset (``fedsnn_cifar10_iid.yaml``:
   S-VGG9, rate coding, T=20, 100 clients, 10 per round, 5 local epochs, batch 32, SGD
   lr 0.1 momentum 0.95) on a CIFAR-shaped stand-in: random uint8 images generated in
   memory and registered as a neurofed dataset (``cifar10_standin``), so the real
   runner (:class:`neurofed.fl.experiment.Experiment`) runs it. Time per round split into
   train / aggregate / evaluate (round 1 includes CUDA's warm-up; round 2 does not),
   and the parameter copy to and from the device per client.

Each figure is also printed as a ``RESULT`` line when it is measured.
``scripts/gpu_check.sh`` runs this benchmark part by part with the GPU tests.

    python benchmarks/gpu_throughput.py --save                  # on a GPU machine
    python benchmarks/gpu_throughput.py --skip round --save --out DIR   # parts; results in DIR
    python benchmarks/gpu_throughput.py --device cpu --small    # smoke test anywhere

Needs torch, numpy, pyyaml, tqdm and lava-dl (which imports matplotlib and h5py); not
lava-nc, tonic, flwr or scikit-learn. SLAYER compiles its CUDA kernels at first use
(ninja + nvcc; a minute or two, cached under ~/.cache/torch_extensions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import Report as _Report, machine_header, with_one_line_errors  # noqa: E402


class Report(_Report):
    def __init__(self) -> None:
        super().__init__()
        self.results: list[str] = []
        self.device = ""  # "[cuda:0: NVIDIA H100 ...]", set once the device is known

    def text(self) -> str:
        return self._buf.getvalue()

    def result(self, line: str) -> None:
        """A figure as a ``RESULT`` line, printed when measured (a later part may not finish)."""
        self.results.append(line)
        self.emit(f"RESULT {line} {self.device}")


STANDIN = "cifar10_standin"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tf32_state() -> str:
    try:
        return (f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
                f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
    except RuntimeError as exc:  # newer torch may refuse the legacy flags once the new API was used
        return f"TF32 flags unreadable ({exc})"


def get_tf32() -> tuple[bool, bool]:
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def set_tf32(conv: bool, matmul: bool) -> None:
    torch.backends.cudnn.allow_tf32 = conv
    torch.backends.cuda.matmul.allow_tf32 = matmul


def gpu_kernels_on(setting) -> bool:
    from neurofed.gpu import cuba_triton

    return setting is True or (setting == "auto" and cuba_triton.available())


class neurons:
    """Run the body with CUBA neurons on CUDA by neurofed's Triton kernel (``True``) or by
    SLAYER's own code (``False``); the CPU kernels are on in both (they touch CPU tensors
    only)."""

    def __init__(self, triton: bool):
        self.triton = triton

    def __enter__(self):
        from neurofed import kernels
        from neurofed.gpu import cuba_triton

        self.saved = cuba_triton._setting
        cuba_triton.configure(self.triton)
        self.ctx = kernels.enabled(True)
        self.ctx.__enter__()

    def __exit__(self, *exc):
        from neurofed.gpu import cuba_triton

        self.ctx.__exit__(*exc)
        cuba_triton.configure(self.saved)


# ----------------------------------------------------------------------------- configs
DIGITS = os.path.join(ROOT, "examples", "digits_fedavg.yaml")
FEDSNN = os.path.join(ROOT, "examples", "papers", "fedsnn_cifar10_iid.yaml")


def net_config(name: str, timesteps: int | None = None, width: float = 1.0, extra: tuple = (), **model) -> dict:
    """The validated run config of the digits example (``digits``) or of the FedSNN
    CIFAR-10 preset on the stand-in (``svgg9``); ``extra`` (key, value) overrides and
    ``model`` keys on top."""
    from neurofed.config import load_config

    over = [("export", False), ("energy.enabled", False), ("lava.samples", 0), ("model.width", width)]
    if name != "digits":
        over.append(("data.name", STANDIN))
    if timesteps:
        over.append(("data.timesteps", timesteps))
    over += [(f"model.{k}", v) for k, v in model.items()] + list(extra)
    return load_config(DIGITS if name == "digits" else FEDSNN, over)


def input_shape(name: str) -> tuple[int, int, int]:
    return (1, 8, 8) if name == "digits" else (3, 32, 32)


def build(name: str, cfg: dict, seed: int = 0):
    from neurofed.models import build_model

    torch.manual_seed(seed)
    return build_model(cfg["model"], input_shape(name), 10, cfg["federation"]["logit_scale"])


def images(n: int, shape: tuple, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8).float() / 255.0


# ----------------------------------------------------------------------------- 1. spikes
@torch.no_grad()
def layer_spikes(model, x: torch.Tensor, data_cfg: dict, seed: int) -> list[torch.Tensor]:
    """Every spiking layer's output (N, ..., T) on the CPU; input spikes drawn on the CPU."""
    from neurofed.data.encoding import encode_for
    from neurofed.device import model_device

    model.eval()
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(0, len(x), 64):
        y = encode_for(model, x[i:i + 64], data_cfg, gen).to(model_device(model))
        outs = []
        for layer, block in zip(model.layers, model.blocks):
            y = block(y)
            if layer.has_neurons:
                outs.append(y.cpu())
        batches.append(outs)
    return [torch.cat(layer) for layer in zip(*batches)]


def compare_spikes(name: str, device: torch.device, timesteps: int | None, n: int, rep: Report, scale: float,
                   label: str, args_gpu_kernels="auto", **model) -> dict:
    cfg = net_config(name, timesteps, **model)
    timesteps = cfg["data"]["timesteps"]
    # SLAYER's weight_scale: at 1, most of S-VGG9 is silent at initialization, which
    # would make the comparison trivial (as in train_throughput's svgg9-live)
    cfg["model"]["weight_scale"] = scale
    from neurofed import kernels

    cpu = build(name, cfg)
    dev = build(name, cfg, seed=1)
    dev.load_state_dict(cpu.state_dict())
    dev.to(device)
    x = images(n, input_shape(name), seed=7)
    with kernels.enabled(True):  # the CPU kernels: stock SLAYER's spikes bit for bit, faster
        ref = layer_spikes(cpu, x, cfg["data"], seed=3)
    saved = get_tf32()
    out = {}
    modes = [("default", None, False)]
    if device.type == "cuda":
        modes.append(("tf32-off", False, False))
        if gpu_kernels_on(args_gpu_kernels):
            modes.append(("triton", None, True))
    for mode, tf32, triton in modes:
        try:
            if tf32 is not None:
                set_tf32(tf32, tf32)
            with neurons(triton):
                got = layer_spikes(dev, x, cfg["data"], seed=3)
            note = f", {tf32_state()}" if device.type == "cuda" else ""
            note += ", neurofed's Triton CUBA kernel" if triton else ", SLAYER's CUDA neurons" if device.type == "cuda" else ""
        except RuntimeError as exc:
            if tf32 is None:
                raise
            rep.emit(f"  {label} ({mode}): not run: {str(exc).splitlines()[0]}")
            continue
        finally:
            set_tf32(*saved)
        rows = []
        for j, (a, b) in enumerate(zip(ref, got)):
            counts = (a.flatten(1).sum(1) - b.flatten(1).sum(1)).abs()
            rows.append({"layer": j, "values": a.numel(), "spikes_cpu": int(a.sum()), "spikes_dev": int(b.sum()),
                         "differ": int((a != b).sum()), "max_count_diff": int(counts.max())})
        total = sum(r["differ"] for r in rows)
        rep.result(f"spikes {label} [{mode}]: {total} spike values differ from the CPU's "
                   f"({'goal 0' if cfg['model']['quantize'] else 'float weights: no goal'})")
        out[mode] = {"layers": rows, "differing_values": total, "identical": total == 0, "timesteps": timesteps,
                     "model": {k: cfg["model"][k] for k in ("name", "quantize", "delay_shift") if k in cfg["model"]}}
        rep.emit(f"  {label} ({mode}{note}): {'IDENTICAL' if total == 0 else f'{total} spike values differ'} "
                 f"over {n} samples, T={timesteps}, weights x{scale:g}")
        for r in rows:
            rep.emit(f"    layer {r['layer']}: {r['spikes_cpu']} spikes on cpu, {r['spikes_dev']} on {device}; "
                     f"{r['differ']} of {r['values']} values differ; max |count diff| per sample {r['max_count_diff']}")
    return out


# ----------------------------------------------------------------------------- 2. throughput
def stock_steps(model, batches, device, fed_cfg: dict) -> float:
    """Seconds for a plain SLAYER training loop over ``batches`` (spike tensors), with
    the config's optimizer (Adam for digits, SGD + momentum for FedSNN)."""
    from neurofed.training.local import make_optimizer

    from neurofed import kernels

    blocks = list(model.blocks)
    logit_scale = fed_cfg["logit_scale"]
    opt = make_optimizer(model.parameters(), fed_cfg)
    with kernels.enabled(False):
        return _stock_loop(blocks, batches, device, opt, logit_scale)


def _stock_loop(blocks, batches, device, opt, logit_scale) -> float:
    sync(device)
    t0 = time.perf_counter()
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        for b in blocks:
            x = b(x)
        loss = F.cross_entropy(x.mean(-1) * logit_scale, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(device)
    return time.perf_counter() - t0


def neurofed_steps(model, x, y, cfg, device) -> float:
    """Seconds for :func:`train_local` over the shard (x, y), one epoch."""
    from neurofed.algorithms.base import Client
    from neurofed.training.params import ParamSpec
    from neurofed.training.local import train_local

    hooks = Client(cfg, ParamSpec.from_model(model), lambda: model)
    with neurons(gpu_kernels_on(cfg["federation"].get("gpu_kernels", False))):
        sync(device)
        t0 = time.perf_counter()
        train_local(model, x, y, cfg, hooks, seed=11)
        sync(device)
    return time.perf_counter() - t0


def throughput(name: str, batch: int, timesteps: int | None, steps: int, repeat: int, device, rep: Report,
               width: float, gpu_kernels="auto") -> dict:
    from neurofed.data.encoding import encode_for

    cfg = net_config(name, timesteps, width, extra=(("federation.gpu_kernels", gpu_kernels),))
    cfg["federation"].update(batch_size=batch, local_epochs=1)
    timesteps = cfg["data"]["timesteps"]
    fed = cfg["federation"]
    n = batch * steps
    x = images(n, input_shape(name), seed=5)
    y = torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(6))
    stock_model = build(name, cfg).to(device)
    nf_model = build(name, cfg).to(device)
    gen = torch.Generator().manual_seed(9)
    t0 = time.perf_counter()
    encoded = [(encode_for(stock_model, x[i:i + batch], cfg["data"], gen), y[i:i + batch]) for i in range(0, n, batch)]
    encode_s = (time.perf_counter() - t0) / len(encoded)
    # warm-up: CUDA kernels compiled/loaded, cuDNN algorithms chosen, allocator primed
    stock_steps(stock_model, encoded[:2], device, fed)
    neurofed_steps(nf_model, x[:2 * batch], y[:2 * batch], cfg, device)
    resident = [(xb.to(device), yb.to(device)) for xb, yb in encoded]  # the compute alone
    stock, stock_res, nf = [], [], []
    for _ in range(repeat):
        stock.append(stock_steps(stock_model, encoded, device, fed))
        stock_res.append(stock_steps(stock_model, resident, device, fed))
        nf.append(neurofed_steps(nf_model, x, y, cfg, device))
    s, r, f = statistics.median(stock), statistics.median(stock_res), statistics.median(nf)
    row = {"net": name, "batch": batch, "timesteps": timesteps, "width": width, "steps": steps,
           "optimizer": fed["optimizer"], "quantize": cfg["model"]["quantize"],
           "stock_samples_s": n / s, "stock_resident_samples_s": n / r, "neurofed_samples_s": n / f,
           "overhead": f / s - 1.0, "overhead_vs_resident": f / r - 1.0, "stock_runs_s": stock,
           "stock_resident_runs_s": stock_res, "neurofed_runs_s": nf, "cpu_encode_ms_per_batch": 1e3 * encode_s}
    rep.emit(f"  {name:7s} batch {batch:4d} T={timesteps:3d}: stock {n / s:9.1f} samples/s (batches already on "
             f"{device.type}: {n / r:9.1f}), neurofed {n / f:9.1f} samples/s, overhead {100 * (f / s - 1):+6.1f} % "
             f"({100 * (f / r - 1):+6.1f} % vs resident batches; medians of {repeat}; Poisson encoding on the CPU "
             f"{1e3 * encode_s:.2f} ms/batch)")
    goal = {"digits": " (goal >= 3x)", "svgg9": " (goal >= 4x at batch 64)"}.get(name, "")
    rep.result(f"throughput {name} batch {batch} T={timesteps}: stock SLAYER {n / s:.1f}, neurofed {n / f:.1f} "
               f"samples/s: {s / f:.2f}x{goal}; neurons: "
               f"{'Triton' if gpu_kernels_on(gpu_kernels) and device.type == 'cuda' else 'SLAYER'}")
    row["speedup"] = s / f
    return row


# ----------------------------------------------------------------------------- 3. one round
def register_standin(n_train: int, n_test: int) -> None:
    """CIFAR-10-shaped random uint8 images (N, 3, 32, 32), 10 balanced labels: kept as
    uint8 where neurofed's encoder scales uint8 pixels itself (as for CIFAR-10's files),
    else as float32 in [0, 1]."""
    from neurofed.data import encoding, register_dataset
    from neurofed.data.base import Dataset

    keep_uint8 = hasattr(encoding, "pixels")

    @register_dataset(STANDIN)
    def load(data_cfg: dict, seed: int = 0) -> Dataset:
        rng = np.random.default_rng(2024)

        def part(n):
            x = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
            return (x if keep_uint8 else x.astype(np.float32) / 255.0), np.arange(n) % 10

        x_tr, y_tr = part(n_train)
        x_te, y_te = part(n_test)
        return Dataset(STANDIN, x_tr, y_tr, x_te, y_te, num_classes=10, kind="image",
                       info={"note": "random stand-in for CIFAR-10"})


def fedavg_round(args, device: torch.device, rep: Report) -> dict:
    """One FedAvg round (two: the first warms up) of the FedSNN CIFAR-10 preset on the stand-in."""
    from neurofed.fl.experiment import Experiment

    over = [("federation.device", str(device)), ("federation.gpu_kernels", args.gpu_kernels)]
    if args.small:
        over += [("partition.num_clients", 4), ("federation.clients_per_round", 2), ("federation.local_epochs", 1)]
    cfg = net_config("svgg9", args.timesteps, 0.25 if args.small else 1.0, extra=tuple(over))
    fed, part = cfg["federation"], cfg["partition"]
    sizes = dict(clients=part["num_clients"], per_round=fed["clients_per_round"], epochs=fed["local_epochs"],
                 width=cfg["model"]["width"], timesteps=cfg["data"]["timesteps"])
    t0 = time.perf_counter()
    exp = Experiment(cfg)
    setup = time.perf_counter() - t0
    rep.emit(f"  config: {os.path.relpath(FEDSNN, ROOT)} on the stand-in: S-VGG9 width {sizes['width']}, "
             f"T={sizes['timesteps']}, quantize {cfg['model']['quantize']}, {len(exp.y_train)} train / "
             f"{len(exp.y_test)} test images ({exp.x_train.dtype}), {sizes['clients']} clients, {sizes['per_round']} "
             f"per round, {sizes['epochs']} local epochs, batch {fed['batch_size']}, {fed['optimizer']} lr {fed['lr']} "
             f"momentum {fed['momentum']}; {exp.spec.size} parameters; set-up {setup:.1f} s")
    rounds = []
    for rnd in (1, 2):
        rec = exp.run_round(rnd)
        if rec["failed"]:  # the runner drops clients that raise; a benchmark must not
            raise RuntimeError(f"round {rnd}: {len(rec['failed'])} clients failed, e.g. {rec['failed'][0]['error']}")
        wall = rec["wall_time_s"]
        row = {k: rec[k] for k in ("wall_time_s", "time_train_s", "time_aggregate_s", "time_eval_s", "accuracy")}
        row["samples_trained"] = int(sum(len(exp.parts[c]) for c in rec["trained"])) * sizes["epochs"]
        rounds.append(row)
        rep.emit(f"  round {rnd}: {wall:8.2f} s = train {rec['time_train_s']:8.2f} s "
                 f"({100 * rec['time_train_s'] / wall:5.1f} %) + aggregate {1e3 * rec['time_aggregate_s']:7.1f} ms "
                 f"({100 * rec['time_aggregate_s'] / wall:5.2f} %) + evaluate {rec['time_eval_s']:7.2f} s "
                 f"({100 * rec['time_eval_s'] / wall:5.1f} %); {row['samples_trained'] / rec['time_train_s']:.1f} "
                 f"training samples/s{' (includes warm-up)' if rnd == 1 else ''}")
    last = rounds[-1]
    rep.result(f"round {len(rounds)} (warm) FedSNN CIFAR-10 stand-in on {device}: {last['wall_time_s']:.2f} s "
               f"(goal <= 6 s on an H100/H200), evaluation {100 * last['time_eval_s'] / last['wall_time_s']:.1f} % "
               f"of it (goal <= 10 %)")
    # the parameter copy between the CPU messages and a device model, per client and round
    model = exp.new_train_model()
    flat = exp.server.params
    reps = 20
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        exp.spec.set(model, flat)
        exp.spec.get(model)
    sync(device)
    copy_s = (time.perf_counter() - t0) / reps
    per_round = copy_s * sizes["per_round"]
    rep.emit(f"  parameters to the device and back: {1e3 * copy_s:.2f} ms per client, {1e3 * per_round:.1f} ms "
             f"per round ({100 * per_round / rounds[-1]['wall_time_s']:.3f} % of round 2)")
    return {"config": sizes | {"params": exp.spec.size, "preset": os.path.relpath(FEDSNN, ROOT)}, "rounds": rounds,
            "param_copy_s_per_client": copy_s}


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="auto | cpu | cuda | cuda:N (default cuda)")
    ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU smoke test)")
    ap.add_argument("--timesteps", type=int, default=None,
                    help="T of S-VGG9 and the round (default: the FedSNN preset's, 20; --small: 4)")
    ap.add_argument("--batches", default=None, help="S-VGG9 batch sizes (default 32,64,128: FedSNN, FedLEC, SFedCA)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per timed run (default 20; --small 2)")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per path (default 5; --small 2)")
    ap.add_argument("--gpu-kernels", default="auto", type=lambda v: {"true": True, "false": False}.get(v, v),
                    choices=["auto", True, False],
                    help="neurofed's path: CUBA neurons on CUDA by the Triton kernel (federation.gpu_kernels; "
                         "default auto: where Triton imports)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: spikes,throughput,round")
    ap.add_argument("--save", action="store_true", help="write gpu_throughput_<device>[_<parts>].{txt,json} to --out")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gpu"),
                    help="folder for --save (default benchmarks/results/gpu)")
    args = ap.parse_args(argv)
    args.timesteps = args.timesteps or (4 if args.small else None)
    steps = args.steps or (2 if args.small else 20)
    repeat = args.repeat or (2 if args.small else 5)
    batches = [int(b) for b in (args.batches or ("2" if args.small else "32,64,128")).split(",")]
    skip = set(filter(None, args.skip.split(",")))

    from neurofed.config import ConfigError
    from neurofed.device import describe_device, device_line, resolve_device

    try:
        device = resolve_device(args.device)
    except ConfigError as exc:
        print(f"gpu_throughput: error: {exc}", file=sys.stderr)
        return 2
    register_standin(*((200, 100) if args.small else (50_000, 10_000)))
    if device.type == "cpu" and not args.small:
        print("gpu_throughput: note: full sizes on the CPU take hours; add --small", file=sys.stderr)
    info = describe_device(device)
    rep = Report()
    rep.device = f"[{info['device']}: {info['name']}]"
    rep.emit(machine_header("gpu_throughput"))
    rep.emit(f"# device: {device_line(info)}; {json.dumps(info)}")
    if device.type == "cuda":
        rep.emit(f"# cudnn {torch.backends.cudnn.version()}, {tf32_state()}, numpy {np.__version__}")
    results: dict = {"device": info, "args": vars(args)}

    if "spikes" not in skip:
        rep.emit("\n## spikes: same weights and input spikes, cpu vs " + str(device))
        n = 4 if args.small else 64
        results["spikes"] = {
            # the digits example: 8-bit weights (Loihi's), rate input, T = 32
            "digits": compare_spikes("digits", device, None, 16 if args.small else 256, rep, 1.0, "digits cnn",
                                     args.gpu_kernels),
            # the FedSNN preset's S-VGG9 (float weights, no per-block delay), and with 8-bit weights
            "svgg9": compare_spikes("svgg9", device, args.timesteps, n, rep, 4.0, "svgg9 (FedSNN preset)",
                                    args.gpu_kernels),
            "svgg9_q8": compare_spikes("svgg9", device, args.timesteps, n, rep, 4.0, "svgg9 8-bit", args.gpu_kernels,
                                       quantize=True),
        }
    if "throughput" not in skip:
        rep.emit(f"\n## training throughput on {device} (forward + backward + optimizer step; stock SLAYER loop vs "
                 f"train_local; digits example and FedSNN preset configs)")
        rows = [throughput("digits", 4 if args.small else 32, 8 if args.small else None, steps, repeat, device, rep,
                           1.0, args.gpu_kernels)]
        for b in batches:
            rows.append(throughput("svgg9", b, args.timesteps, steps, repeat, device, rep,
                                   0.25 if args.small else 1.0, args.gpu_kernels))
        results["throughput"] = rows
    if "round" not in skip:
        rep.emit(f"\n## one FedAvg round, FedSNN CIFAR-10-like, on {device} (random CIFAR-shaped stand-in)")
        results["round"] = fedavg_round(args, device, rep)
    if args.save:
        parts = [p for p in ("spikes", "throughput", "round") if p not in skip]
        name = f"gpu_throughput_{device.type}" + ("" if len(parts) == 3 else "_" + "-".join(parts))
        os.makedirs(args.out, exist_ok=True)
        for ext, text in (("txt", rep.text()), ("json", json.dumps(results, indent=1))):
            path = os.path.join(args.out, f"{name}.{ext}")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))