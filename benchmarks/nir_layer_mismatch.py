"""Where NIR simulators and SLAYER part: each neuron layer on its own.

``neurofed nir`` compares whole networks, where a spike that moves in one layer
moves others downstream. Here every CubaLIF layer of a run's ``model.nir`` runs
alone in the simulator (its own NIR importer, a graph Input -> CubaLIF -> Output),
fed the exact weighted input SLAYER's neuron receives (the synapse applied to the
layer's torch input, over the run's test-set input spikes), and its spikes are
compared with SLAYER's neuron output. What differs is the arithmetic only: float32
Euler steps against SLAYER's 64-bit fixed point (decays applied with truncation
toward zero at 1/4096).

With ``--threshold-offsets`` the layers also run with v_threshold raised by k/4096
(k = 1, 2, 4, 8): the mean truncation loss SLAYER's voltage accumulates between
spikes is of that order, so this shows how much of the mismatch a shifted
threshold would absorb (neurofed exports the exact threshold).

    python benchmarks/nir_layer_mismatch.py RUN_DIR [--sim snntorch] [--samples 450] [--save]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from common import Report, machine_header, with_one_line_errors  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a finished run directory (model.nir is written when missing)")
    ap.add_argument("--sim", default="snntorch")
    ap.add_argument("--samples", type=int, default=450)
    ap.add_argument("--threshold-offsets", action="store_true")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/nir/layer_mismatch_<sim>.txt")
    args = ap.parse_args(argv)

    import nir
    import numpy as np
    import torch

    from neurofed.deploy.export import load_global_model
    from neurofed.deploy.lava_run import input_spikes
    from neurofed.deploy.nir_export import NIR_FILE, export_nir_run, graph_meta, node_names, read_nir
    from neurofed.deploy.nir_simulators import get_simulator
    from neurofed.seeds import seed_for

    torch.set_num_threads(1)
    report = Report()
    say = report.emit
    say(machine_header(f"nir_layer_mismatch ({args.sim})"))
    run_dir = Path(args.run_dir)
    model, cfg, ds, rnd = load_global_model(run_dir)
    if not (run_dir / NIR_FILE).exists():
        export_nir_run(run_dir, quiet=True)
    graph = read_nir(run_dir / NIR_FILE, model)
    dt = float(graph_meta(graph)["dt"])
    sim = get_simulator(args.sim)
    n = min(args.samples, len(ds.y_test))
    spikes, _ = input_spikes(ds.x_test[:n], cfg["data"], seed_for(cfg["seed"], "lava"))
    say(f"# run {run_dir} (round {rnd}), {n} test samples, T={spikes.shape[-1]}, sim {args.sim}")
    offsets = (0, 1, 2, 4, 8) if args.threshold_offsets else (0,)
    say("layer      neurons  SLAYER spikes/sample  " + "  ".join(f"mismatch θ+{k}/4096" for k in offsets))

    x = torch.from_numpy(spikes).float()
    names = node_names(model)
    with torch.no_grad():
        for (syn, lif), layer, block in zip(names, model.layers, model.blocks):
            if lif is None:
                x = block(x)
                continue
            current = block.synapse(x)  # the weighted input SLAYER's neuron integrates
            reference = block.neuron(current)  # its spikes, before the block's one-step shift
            x = block(x)
            node = graph.nodes[lif]
            row = []
            for k in offsets:
                params = {key: np.asarray(getattr(node, key)) for key in
                          ("tau_syn", "tau_mem", "r", "v_leak", "v_threshold", "v_reset", "w_in")}
                params["v_threshold"] = params["v_threshold"] + k / 4096
                shape = tuple(int(s) for s in node.output_type["output"])
                alone = nir.NIRGraph(nodes={"input": nir.Input(input_type={"input": np.array(shape)}),
                                            "lif": nir.CubaLIF(**params),
                                            "output": nir.Output(output_type={"output": np.array(shape)})},
                                     edges=[("input", "lif"), ("lif", "output")])
                net = sim.load(alone, dt)
                seen = []
                dict(net.named_modules())["lif"].register_forward_hook(
                    lambda m, i, o: seen.append((o[0] if isinstance(o, tuple) else o) != 0))
                state = sim.reset(net)
                for t in range(current.shape[-1]):  # batched: no Flatten in this graph
                    state = sim.step(net, current[..., t], state)
                out = torch.stack(seen, -1)
                row.append(float((out != (reference != 0)).sum()) / max(float((reference != 0).sum()), 1.0))
            say(f"{lif.removesuffix('_lif'):<10} {layer.num_neurons:>7}  {float((reference != 0).sum()) / n:>20.1f}  "
                + "  ".join(f"{100 * m:>17.3f}%" for m in row))
    say("# mismatch: (neuron, step) entries where the simulator's spike differs from SLAYER's, "
        "per SLAYER spike, each layer fed SLAYER's own input")
    if args.save:
        report.save(f"nir/layer_mismatch_{args.sim}")
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))