"""Local training throughput: stock lava-dl SLAYER CPU path vs neurofed's fast path.

Trains (forward + backward + Adam step, cross-entropy on spike rates) networks
built directly from ``slayer.block.cuba`` blocks:

* digits CNN: 1x8x8 input, conv 1->16 3x3 pad 1, pool 2, conv 16->32 3x3 pad 1,
  flatten, dense 512->10; T=16, batch 32;
* S-VGG9 at 32x32: 3 input channels, 64,64,P,128,128,P,256,256,256,P, fc 1024, fc 10
  (a few batches, small batch), twice: weight scale 1 (the last seven blocks are
  silent at initialization) and "svgg9-live", weight scale 4 (every block spikes).

Inputs are Poisson (Bernoulli per time step) spike trains of random intensities.

Three paths run in worker processes started the same way (same seeds, same batches,
same thread settings): stock SLAYER, ``fast`` (neurofed.kernels, bit-exact) and ``fast-grad``
(neurofed.kernels with ``gradients="fast"``: same spikes, gradients equal up to float32
rounding). The parent rotates short rounds between them so all see the same machine
load. Samples/s come from each path's fastest training step (timeit's convention: on
a shared machine it is the least disturbed one); the medians are printed too.
The stock worker never imports neurofed.kernels; the others call
``kernels.enable()`` (which includes its allocator setting, ``tune_malloc``).
Before training, every worker computes the output spikes and weight gradients of the
first batch from the same initial parameters: fast-grad's must match stock's spikes
bit for bit and its gradients within float32 rounding (printed as the largest
relative difference, next to stock's own difference between 1 and 2 threads). After
the timed rounds stock and fast have taken the same optimizer steps on the same
data; the script compares their parameters bit for bit.
Then it profiles a few more digits steps of the fast path (torch.profiler; these come
after the comparison) and prints where a step's time goes.

    python benchmarks/train_throughput.py            # 1 thread, then torch's default; RESULT line last
    python benchmarks/train_throughput.py --save     # also writes benchmarks/results/train_throughput.txt
    python benchmarks/train_throughput.py --threads default --save     # torch's thread count only
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

from common import Report, machine_header, with_one_line_errors  # noqa: E402

NEURON = dict(threshold=1.25, current_decay=0.25, voltage_decay=0.03, tau_grad=0.1, scale_grad=1.0,
              requires_grad=False)


# ----------------------------------------------------------------------------- networks
def build_net(name: str):
    import torch

    from neurofed.compat import slayer as _slayer

    slayer = _slayer()
    cuba = slayer.block.cuba

    def q8(x, descale=False):
        return slayer.utils.quantize_hook_fx(x, scale=64, num_bits=8, descale=descale)

    # svgg9-live: weight_scale 4 instead of 1, so that every layer spikes at
    # initialization (as in a trained network); with 1 the last 7 blocks are silent
    scale = 4 if name == "svgg9-live" else 1

    def conv(i, o):
        return cuba.Conv(NEURON, i, o, 3, padding=1, weight_scale=scale, weight_norm=False, pre_hook_fx=q8)

    if name == "digits":
        blocks = [conv(1, 16), cuba.Pool(NEURON, 2), conv(16, 32), cuba.Flatten(),
                  cuba.Dense(NEURON, 32 * 4 * 4, 10, pre_hook_fx=q8)]
    elif name in ("svgg9", "svgg9-live"):
        blocks, c = [], 3
        for v in (64, 64, "P", 128, 128, "P", 256, 256, 256, "P"):
            if v == "P":
                blocks.append(cuba.Pool(NEURON, 2))
            else:
                blocks.append(conv(c, v))
                c = v
        blocks += [cuba.Flatten(), cuba.Dense(NEURON, c * 4 * 4, 1024, weight_scale=scale, pre_hook_fx=q8),
                   cuba.Dense(NEURON, 1024, 10, weight_scale=scale, pre_hook_fx=q8)]
    else:
        raise ValueError(name)
    return torch.nn.Sequential(*blocks)


def make_batches(name: str, batch: int, T: int, n: int):
    import torch

    g = torch.Generator().manual_seed(1234)
    shape = (1, 8, 8) if name == "digits" else (3, 32, 32)
    out = []
    for _ in range(n):
        rate = torch.rand(batch, *shape, 1, generator=g) * 0.5  # intensities -> spike probability
        x = (torch.rand(batch, *shape, T, generator=g) < rate).float()  # Poisson (Bernoulli) spikes
        y = torch.randint(0, 10, (batch,), generator=g)
        out.append((x, y))
    return out


# ----------------------------------------------------------------------------- worker
# stock SLAYER; neurofed.kernels with exact gradients; with gradients="fast"
MODES = ("stock", "fast", "fast-grad")


def max_rel_diff(a: dict, b: dict) -> tuple[float, str]:
    """Largest max|a - b| / max|a| over the tensors of two gradient dicts, and where."""
    import numpy as np

    worst = (0.0, "")
    for name, ga in a.items():
        scale = float(np.abs(ga).max())
        if scale > 0:
            worst = max(worst, (float(np.abs(ga.astype(np.float64) - b[name]).max()) / scale, name))
    return worst


def worker(conn, mode: str, name: str, batch: int, T: int, nbatches: int, threads: int | None):
    import torch

    if threads:
        torch.set_num_threads(threads)
    info = {}
    if mode != "stock":
        from neurofed import kernels

        info["fast_enabled"] = kernels.enable(gradients="fast" if mode == "fast-grad" else "exact")
        info["variant"] = kernels.variant()
    from neurofed.training.local import make_optimizer  # the clients' optimizer (no kernels import)

    torch.manual_seed(0)
    net = build_net(name)
    opt = make_optimizer(net.parameters(), {"optimizer": "adam", "lr": 1e-3})
    batches = make_batches(name, batch, T, nbatches)
    state = {"i": 0}

    # Spikes of every block and weight gradients for the first batch from the initial
    # parameters (the same in every worker), for the tolerance check of fast-grad. The
    # loss weighs every block's spikes (fixed random weights), so every layer gets a
    # gradient even where the layers above it are still silent at initialization.
    h, loss, digest = batches[0][0], 0.0, hashlib.sha256()
    gen = torch.Generator().manual_seed(99)
    for blk in net:
        h = blk(h)
        digest.update(h.detach().numpy().tobytes())
        loss = loss + (h * torch.randn(h.shape, generator=gen)).mean()
    loss.backward()
    info["out0"] = digest.hexdigest()[:16]
    info["grads0"] = {n: p.grad.numpy().copy() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad(set_to_none=True)

    def step():
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        out = net(x)  # (batch, 10, T) spikes
        loss = torch.nn.functional.cross_entropy(out.mean(-1) * 10, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    info["threads"] = torch.get_num_threads()
    conn.send(info)
    while True:
        cmd, arg = conn.recv()
        if cmd == "steps":
            times = []
            for _ in range(arg):
                t0, c0 = time.perf_counter(), time.process_time()
                step()
                times.append((time.perf_counter() - t0, time.process_time() - c0))  # (wall, process CPU)
            conn.send(times)
        elif cmd == "activity":  # fraction of active outputs per block, one batch
            with torch.no_grad():
                h, dens = batches[0][0], []
                for blk in net:
                    h = blk(h)
                    dens.append(float((h > 0).float().mean()))
            conn.send(dens)
        elif cmd == "profile":  # self CPU time per operator over `arg` steps (torch.profiler)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                for _ in range(arg):
                    step()
                wall = time.perf_counter() - t0
            conn.send(({e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}, wall))
        elif cmd == "digest":
            h = hashlib.sha256()
            for k, v in net.state_dict().items():
                h.update(k.encode())
                h.update(v.detach().contiguous().numpy().tobytes())
            conn.send((state["i"], h.hexdigest()[:16]))
        else:
            conn.send(None)
            return


# Where a fast-path step goes: profiler operator names -> what they are.
BREAKDOWN = [
    ("convolution backward (stock aten.convolution_backward, oneDNN)", ("aten::convolution_backward",)),
    ("convolution forward via F.conv3d (oneDNN)", ("aten::mkldnn_convolution",)),
    ("synapse forward: 8-bit / spike-driven / time-lane kernels (+ autograd glue)", ("_SpikeConv", "_SpikeConvBackward")),
    ("fused CUBA neuron forward (+ delay)", ("_FusedCuba",)),
    ("fused CUBA neuron backward", ("_FusedCubaBackward",)),
    ("surrogate-gradient exp (torch.exp, as stock)", ("aten::exp",)),
    ("pooling synapse fwd + bwd", ("_PoolFn", "_PoolFnBackward")),
    ("weight quantization hook fwd + bwd", ("_QuantizeClamp", "_QuantizeClampBackward", "_quantize",
                                            "_quantizeBackward", "aten::round", "aten::clamp", "ClampBackward1")),
    ("Adam step + zero_grad (incl. its elementwise ops)", ("Optimizer.step#Adam.step", "Optimizer.zero_grad#Adam.zero_grad",
                                                          "aten::lerp_", "aten::addcdiv_", "aten::sqrt", "aten::add_",
                                                          "aten::mul_", "aten::div_", "aten::zero_")),
]


def breakdown_lines(times: dict, wall: float, steps: int) -> list[str]:
    total = sum(times.values())
    lines, used = [], 0.0
    for label, keys in BREAKDOWN:
        t = sum(times.get(k, 0.0) for k in keys)
        used += t
        lines.append(f"    {1e3 * t / steps:6.2f} ms  {100 * t / total:5.1f} %  {label}")
    lines.append(f"    {1e3 * (total - used) / steps:6.2f} ms  {100 * (total - used) / total:5.1f} %  "
                 "other operators (loss, views, copies, allocation, autograd engine)")
    lines.append(f"    profiled step: {1e3 * total / steps:.2f} ms operator self time, {1e3 * wall / steps:.2f} ms wall "
                 "(profiler overhead included; the rest of the wall time is Python)")
    return lines


def measure(name: str, batch: int, T: int, rounds: int, steps: int, warmup: int, nbatches: int,
            threads: int | None, profile_steps: int = 0):
    ctx = mp.get_context("spawn")
    workers = {}
    for mode in MODES:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(child, mode, name, batch, T, nbatches, threads), daemon=True)
        proc.start()
        workers[mode] = (parent, proc)
    infos = {m: w[0].recv() for m, w in workers.items()}
    for mode, (conn, _) in workers.items():  # warm-up (first-call set-up, allocator, caches)
        conn.send(("steps", warmup))
        conn.recv()
    times = {m: [] for m in MODES}
    cpu = {m: [] for m in MODES}
    for r in range(rounds):  # rotate the order so all paths see the same machine load
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        for mode in order:
            conn = workers[mode][0]
            conn.send(("steps", steps))
            for wall, used in conn.recv():
                times[mode].append(wall)
                cpu[mode].append(used)
    workers["fast"][0].send(("activity", None))
    activity = workers["fast"][0].recv()
    digests = {}
    for mode, (conn, _) in workers.items():
        conn.send(("digest", None))
        digests[mode] = conn.recv()
    profiled = None
    if profile_steps:  # after the digests: these steps run on the fast path only
        workers["fast"][0].send(("profile", profile_steps))
        profiled = workers["fast"][0].recv()
    for mode, (conn, proc) in workers.items():
        conn.send(("stop", None))
        conn.recv()
        proc.join(timeout=30)
    return times, cpu, infos, digests, activity, profiled


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--digits-batch", type=int, default=32)
    ap.add_argument("--digits-T", type=int, default=16)
    ap.add_argument("--digits-rounds", type=int, default=12)
    # 10 consecutive steps per round, as in local training (a client's epoch is dozens of
    # steps): with 3, a fast step often ran right after another worker had flushed the
    # caches (a ~4 ms step pays for that; a 40 ms stock step hardly notices)
    ap.add_argument("--digits-steps", type=int, default=10, help="training steps per round")
    ap.add_argument("--svgg9-batch", type=int, default=4)
    ap.add_argument("--svgg9-T", type=int, default=16)
    ap.add_argument("--svgg9-rounds", type=int, default=4)
    ap.add_argument("--svgg9-steps", type=int, default=1)
    ap.add_argument("--threads", default="1,default",
                    help="comma-separated torch thread counts for both workers ('default' = torch's "
                         "own choice); the RESULT line reports the first. One thread is the default "
                         "because it is robust on a shared machine: with 2 threads on 2 busy cores "
                         "every small parallel op can stall, which distorts both paths")
    ap.add_argument("--profile-steps", type=int, default=10,
                    help="after timing, profile this many digits steps of the fast path (first thread setting) "
                         "and print where the time goes (0: skip)")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/train_throughput.txt")
    args = ap.parse_args(argv)
    if min(args.digits_rounds, args.svgg9_rounds, args.digits_steps, args.svgg9_steps) < 1:
        ap.error("rounds and steps must be >= 1")

    report = Report()
    emit = report.emit
    emit(machine_header("train_throughput",
                        "(shared machine: the paths take turns; samples/s from each path's best step)"))
    from neurofed.kernels import variants  # names the variant only; the workers build and load it

    cpu_flags = sorted({f for f in open("/proc/cpuinfo").read().split() if f.startswith(("avx512", "avx2"))}
                       if os.path.exists("/proc/cpuinfo") else [])
    emit(f"# kernels: variant {variants.default_variant()} (this CPU runs: {', '.join(variants.runnable_variants())}; "
         f"flags: {' '.join(cpu_flags) or 'no AVX2'})")
    emit("# baseline: stock lava-dl 0.6.0 SLAYER CPU path (Python time-step loop, int64 fixed point)")
    emit("# fast:     neurofed.kernels.enable(): fused C++ CUBA neuron kernels (+ one-step delay),")
    emit("#           8-bit integer (VNNI / AVX2), spike-driven and time-lane synapse forward, pooling kernels;")
    emit("#           bit-identical spikes and gradients")
    emit("# fast-grad: kernels.enable(gradients='fast'): the same, plus spike-driven / time-lane weight")
    emit("#           gradients, time-lane 1x1 input gradients and the surrogate exp inside the neuron backward;")
    emit("#           identical spikes, gradients within float32 rounding of stock (checked below on the first batch)")
    emit("")
    settings = [None if t.strip() in ("default", "0", "") else int(t) for t in args.threads.split(",")]
    cases = [
        ("digits", args.digits_batch, args.digits_T, args.digits_rounds, args.digits_steps),
        ("svgg9", args.svgg9_batch, args.svgg9_T, args.svgg9_rounds, args.svgg9_steps),
        ("svgg9-live", args.svgg9_batch, args.svgg9_T, args.svgg9_rounds, args.svgg9_steps),
    ]
    first = None
    by_threads = {}  # torch threads -> results of that setting (the RESULT line names them all)
    stock_grads = {}  # (network, threads) -> stock gradients of the first batch
    for threads in settings:
        results = {}
        for name, batch, T, rounds, steps in cases:
            prof_steps = args.profile_steps if (name == "digits" and first is None) else 0
            times, cpu, infos, digests, activity, profiled = measure(name, batch, T, rounds, steps, warmup=max(1, steps),
                                                                nbatches=4, threads=threads, profile_steps=prof_steps)
            # best step per path (timeit's convention: on a shared machine the fastest
            # step is the least disturbed one); medians are printed alongside
            best = {m: min(v) for m, v in times.items()}
            med = {m: statistics.median(v) for m, v in times.items()}
            sps = {m: batch / best[m] for m in best}
            ratio = {m: best["stock"] / best[m] for m in MODES}
            results[name] = (sps["stock"], sps["fast"], ratio["fast"], sps["fast-grad"], ratio["fast-grad"])
            same = digests["stock"] == digests["fast"]
            emit(f"{name}: batch {batch}, T={T}, {len(times['stock'])} timed steps per path, "
                 f"torch threads {infos['stock']['threads']}{'' if threads else ' (default)'}")
            for m in MODES:
                emit(f"  {m:9s}: {sps[m]:9.1f} samples/s   best step {1e3 * best[m]:8.1f} ms "
                     f"(median {1e3 * med[m]:.1f}, max {1e3 * max(times[m]):.1f})")
            for m in MODES[1:]:
                emit(f"  ratio {m}/stock: {ratio[m]:.2f}x (best steps)   {med['stock'] / med[m]:.2f}x (medians)")
            # CPU time of the process per step: less sensitive to other jobs on the cores
            # (with one thread it is the step's own compute time)
            cbest = {m: min(v) for m, v in cpu.items()}
            emit("  process CPU time per step, best: " + ", ".join(f"{m} {1e3 * cbest[m]:.1f} ms" for m in MODES)
                 + "; ratios " + ", ".join(f"{cbest['stock'] / cbest[m]:.2f}x" for m in MODES[1:]))
            emit(f"  fast: parameters after {digests['stock'][0]} identical training steps: "
                 f"{'bit-identical' if same else 'DIFFERENT'} to stock (sha256 {digests['stock'][1]} vs {digests['fast'][1]})")
            spikes_same = infos["stock"]["out0"] == infos["fast-grad"]["out0"]
            rel, where = max_rel_diff(infos["stock"]["grads0"], infos["fast-grad"]["grads0"])
            emit(f"  fast-grad: first batch from the initial parameters: spikes of every block "
                 f"{'bit-identical' if spikes_same else 'DIFFERENT'} to stock; weight gradients within "
                 f"{rel:.1e} of stock (max |diff| / max |stock| per tensor, worst: {where})")
            stock_grads[(name, infos["stock"]["threads"])] = infos["stock"]["grads0"]
            emit("  spike rate per block output (after the timed steps): "
                 + " ".join(f"{a:.3f}" for a in activity))
            if profiled is not None:
                emit(f"  where a fast-path step goes ({prof_steps} profiled steps, operator self CPU time):")
                for line in breakdown_lines(*profiled, prof_steps):
                    emit(line)
            emit(f"  kernel variant that ran: {infos['fast'].get('variant')}")
            if not infos["fast"].get("fast_enabled", False):
                emit("  WARNING: the fast path could not be enabled (extension build failed)")
            emit("")
        first = first or results
        by_threads[infos["stock"]["threads"]] = results
    for name, *_ in cases:  # the scale of the fast-grad tolerance: stock against itself
        runs = sorted((th, g) for (n, th), g in stock_grads.items() if n == name)
        if len(runs) == 2 and runs[0][0] != runs[1][0]:
            rel, where = max_rel_diff(runs[0][1], runs[1][1])
            emit(f"# stock SLAYER's own weight gradients, {name}, {runs[0][0]} vs {runs[1][0]} torch threads: "
                 f"within {rel:.1e} (worst: {where}; oneDNN's reduction order depends on the thread count)")
    if hasattr(os, "getloadavg"):
        emit("# load average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    d, s, v = first["digits"], first["svgg9"], first["svgg9-live"]
    emit(f"RESULT name=train_throughput digits_stock={d[0]:.1f} digits_fast={d[1]:.1f} digits_ratio={d[2]:.2f} "
         f"digits_fastgrad={d[3]:.1f} digits_fastgrad_ratio={d[4]:.2f} "
         f"svgg9_stock={s[0]:.2f} svgg9_fast={s[1]:.2f} svgg9_ratio={s[2]:.2f} "
         f"svgg9_fastgrad={s[3]:.2f} svgg9_fastgrad_ratio={s[4]:.2f} "
         f"svgg9live_ratio={v[2]:.2f} svgg9live_fastgrad_ratio={v[4]:.2f} "
         + "".join(f"digits_ratio_{n}threads={r['digits'][2]:.2f} digits_fastgrad_ratio_{n}threads={r['digits'][4]:.2f} "
                   f"svgg9_fastgrad_ratio_{n}threads={r['svgg9'][4]:.2f} "
                   for n, r in by_threads.items() if r is not first)
         + f"ratio={d[2]:.2f}")
    if args.save:
        report.save("train_throughput")


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))