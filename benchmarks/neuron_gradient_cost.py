"""What SpikingJelly's neuron gradient costs a training step, torch form against the fused kernel.

``model.neuron_gradient: spikingjelly`` (the four SFedCA MNIST presets) keeps SLAYER's forward
and differentiates the reset (:mod:`neurofed.models.reset_gradient`). Its torch form runs the
neuron's two leaky integrators as separate autograd nodes and its backward as a Python loop
over time; with the fast kernels on, the patch point ``reset_gradient``
(:data:`neurofed.kernels.PATCHES`) runs it as SLAYER's neuron runs: one fused kernel each way.

Trains the SFedCA MNIST network as its preset builds it (``examples/papers/
sfedca_mnist_dir03.yaml``: 28x28 direct input, T = 12, batch norm, SGD 0.1, batch 128;
cross-entropy on the spike count, scaled as the runner scales it) on random images, four
ways, taking turns step by step so that all see the same machine load:

* ``torch form`` (the baseline: the cost before the fused kernel): the fast kernels on for
  every other layer, the neuron's forward the stock ``ResetGradientNeuron.forward``;
* ``fused``: the fast kernels on, the neuron's forward patched;
* ``slayer``: the preset with ``model.neuron_gradient: slayer`` (SLAYER's gradient, fused):
  the step the gradient replaced;
* ``fused, fast gradients``: ``fused`` with ``federation.fast_gradients: true`` (spike-driven
  weight gradients and the rest of the fast gradient mode, within float32 rounding of the
  exact ones): what a step costs at the least the kernels offer.

Before timing, the torch form and the fused kernel train one step from the same parameters
on the same batch: their spikes, loss and every parameter's gradient must be equal bit for
bit (the script stops otherwise). Prints ms a step (best and median of the timed steps) and
the ratio torch form / fused.

    python benchmarks/neuron_gradient_cost.py                       # RESULT line last
    python benchmarks/neuron_gradient_cost.py --save                # benchmarks/results/neuron_gradient_cost.txt
    NEUROFED_KERNELS=x86-64-v3 python benchmarks/neuron_gradient_cost.py --save --suffix _avx2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

from common import Report, machine_header, with_one_line_errors  # noqa: E402

PRESET = os.path.join(ROOT, "examples", "papers", "sfedca_mnist_dir03.yaml")


def build(gradient: str, seed: int):
    from neurofed.config import load_config
    from neurofed.models import build_model

    cfg = load_config(PRESET, [f"model.neuron_gradient={gradient}"])
    torch.manual_seed(seed)
    net = build_model(cfg["model"], (1, 28, 28), 10, logit_scale=cfg["federation"]["logit_scale"])
    net.train()
    return net, torch.optim.SGD(net.parameters(), lr=cfg["federation"]["lr"])


def backward(net, x, y):
    """Forward, cross-entropy on the readout, backward (gradients cleared first); returns the
    output spikes and the loss."""
    out = net(x)
    loss = torch.nn.functional.cross_entropy(net.readout(out).flatten(1), y)
    net.zero_grad(set_to_none=True)
    loss.backward()
    return out.detach(), loss.detach()


def step(net, opt, x, y) -> None:
    """One training step."""
    backward(net, x, y)
    opt.step()


def grads_of(net, x, y):
    out, loss = backward(net, x, y)
    return out, loss, {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per way (default 8)")
    ap.add_argument("--batch", type=int, default=128, help="batch size (the paper's: 128)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the runs use)")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/neuron_gradient_cost<suffix>.txt")
    ap.add_argument("--suffix", default="", help="suffix of the saved file's name (e.g. _avx2)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.threads < 1:
        ap.error("--steps, --batch and --threads must be >= 1")
    torch.set_num_threads(args.threads)

    from neurofed import kernels
    from neurofed.kernels import ops, patches, variants
    from neurofed.models.reset_gradient import ResetGradientNeuron

    if not kernels.enable():
        print(f"neuron_gradient_cost: the fast kernels cannot be loaded ({variants.error()})", file=sys.stderr)
        return 1
    fused_forward = ResetGradientNeuron.forward
    torch_form = patches.stock.functions["reset_gradient"]

    report = Report()
    emit = report.emit
    emit(machine_header("neuron_gradient_cost", "(shared machine: the four ways take turns step by step)"))
    emit(f"# kernels: variant {kernels.variant()} (this CPU runs: {', '.join(variants.runnable_variants())}); "
         f"torch's own kernels (convolutions, batch norm) use the CPU's best: {torch.backends.cpu.get_cpu_capability()}")
    emit(f"# network: the SFedCA MNIST net of {os.path.relpath(PRESET, ROOT)}, batch {args.batch}, T = 12, "
         f"SGD, random 28x28 images")
    emit("# baseline: torch form = ResetGradientNeuron's stock forward (two autograd leaky integrators, "
         "a Python loop over time backwards), every other layer on the fast kernels")
    emit("")

    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(args.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
               for _ in range(4)]

    def encode(images):  # direct encoding: the image as a current at every step
        return images.unsqueeze(-1).expand(*images.shape, 12).contiguous()

    # the same parameters, the same batch: the two forms must agree bit for bit
    x0, y0 = encode(batches[0][0]), batches[0][1]
    net_a, _ = build("spikingjelly", seed=0)
    net_b, _ = build("spikingjelly", seed=0)
    ResetGradientNeuron.forward = torch_form
    out_a, loss_a, grads_a = grads_of(net_a, x0, y0)
    ResetGradientNeuron.forward = fused_forward
    out_b, loss_b, grads_b = grads_of(net_b, x0, y0)
    differing = [n for n in grads_a if not same_bits(grads_a[n], grads_b[n])]
    if not (same_bits(out_a, out_b) and same_bits(loss_a, loss_b)) or differing or grads_a.keys() != grads_b.keys():
        emit(f"MISMATCH: torch form and fused kernel differ (output/loss equal: "
             f"{same_bits(out_a, out_b)}/{same_bits(loss_a, loss_b)}; gradients differing: {differing})")
        return 1
    emit(f"check: one step from the same parameters: output spikes, loss and all {len(grads_a)} parameter "
         f"gradients equal bit for bit (torch form vs fused)")

    ways = {"torch form": ("spikingjelly", torch_form, "exact"), "fused": ("spikingjelly", fused_forward, "exact"),
            "slayer": ("slayer", fused_forward, "exact"), "fused, fast gradients": ("spikingjelly", fused_forward, "fast")}
    models = {name: build(gradient, seed=0) for name, (gradient, _, _) in ways.items()}
    times = {name: [] for name in ways}
    for i in range(2 + args.steps):  # two warm-up steps each (first-call allocations, oneDNN primitives)
        images, labels = batches[i % len(batches)]
        x = encode(images)
        for name, (_, forward, mode) in ways.items():
            ResetGradientNeuron.forward = forward
            ops.mode = mode  # read by the kernels at each call
            net, opt = models[name]
            t0 = time.perf_counter()
            step(net, opt, x, labels)
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
    ResetGradientNeuron.forward = fused_forward
    ops.mode = "exact"

    emit(f"{'way':<22} {'best ms/step':>13} {'median ms/step':>15}   ({args.steps} steps of {args.batch}, "
         f"{args.threads} thread{'s' if args.threads > 1 else ''})")
    best = {n: 1000 * min(t) for n, t in times.items()}
    med = {n: 1000 * statistics.median(t) for n, t in times.items()}
    for name in ways:
        emit(f"{name:<22} {best[name]:>13.1f} {med[name]:>15.1f}")
    ratio = best["torch form"] / best["fused"]
    emit(f"torch form / fused: {ratio:.2f}x (best), {med['torch form'] / med['fused']:.2f}x (median); "
         f"fused / slayer: {best['fused'] / best['slayer']:.2f}x; fused / fused with fast gradients: "
         f"{best['fused'] / best['fused, fast gradients']:.2f}x")
    emit(f"RESULT name=neuron_gradient_cost variant={kernels.variant()} batch={args.batch} threads={args.threads} "
         f"torch_form_ms={best['torch form']:.1f} fused_ms={best['fused']:.1f} slayer_ms={best['slayer']:.1f} "
         f"fused_fast_gradients_ms={best['fused, fast gradients']:.1f} "
         f"ratio={ratio:.2f}")
    if args.save:
        report.save(f"neuron_gradient_cost{args.suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))