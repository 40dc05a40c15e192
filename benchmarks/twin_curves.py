"""A paper network trained centrally beside its ANN twin: the learning curves, epoch by epoch.

Both are the preset's network trained as one client holding every training image (IID, one
local epoch a round, so round = epoch), with the preset's optimizer, batch and T; the twin is
``model.kind=ann`` (the same layers with ReLU units, analog input, normed alike when the
preset norms). Each ``--arm NAME=SET[,SET...]`` adds a pair under further settings (e.g. the
preset without its batch norm). A run folder that holds the epochs asked for is read, not run
again (fewer: resumed). Writes ``benchmarks/results/twin_curves/`` (``results.jsonl``,
``table.md``, ``curves.png``) with ``--save``.

    python benchmarks/twin_curves.py --root ../shared/data/mnist --epochs 3 --out /tmp/twins --save
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, machine_header, run_rounds, run_to  # noqa: E402

RESULTS = Path(ROOT) / "benchmarks" / "results" / "twin_curves"
CENTRAL = ["partition.scheme=iid", "partition.num_clients=1", "federation.clients_per_round=1",
           "federation.local_epochs=1", "algorithm.name=fedavg", "export=false", "energy.enabled=false",
           "federation.target_accuracy=null"]
KINDS = {"snn": [], "ann": ["model.kind=ann"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="sfedca_mnist_dir03")
    p.add_argument("--root", default=None, help="the data set's files (the preset's data.root)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", required=True, help="folder for the runs (reused and resumed)")
    p.add_argument("--train", type=int, default=None, help="training images (default: all)")
    p.add_argument("--test", type=int, default=None, help="test images (default: all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--arm", action="append", default=[], help="NAME=KEY=VALUE[,KEY=VALUE...]: a further pair")
    p.add_argument("--save", action="store_true")
    args = p.parse_args(argv)
    arms = {"preset": []}
    for arm in args.arm:
        name, _, sets = arm.partition("=")
        if not name or not sets:
            p.error(f"--arm: got {arm!r}; expected NAME=KEY=VALUE[,KEY=VALUE...]")
        arms[name] = sets.split(",")
    base = [*CENTRAL, f"federation.threads={args.threads}",
            *([f"data.root={args.root}"] if args.root else []),
            *([f"data.train_subset={args.train}"] if args.train else []),
            *([f"data.test_subset={args.test}"] if args.test else [])]
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for arm, sets in arms.items():
        for kind, kind_sets in KINDS.items():
            run_dir = Path(args.out) / f"{args.preset}-{arm}-{kind}"
            started = time.time()
            status = run_to(args.preset, run_dir, args.epochs, [*base, *sets, *kind_sets], f"{run_dir}.log")
            if status != 0:
                print(f"{run_dir.name}: exited {status}, see {run_dir}.log", flush=True)
            rounds = run_rounds(run_dir)[: args.epochs]
            rows.append({"preset": args.preset, "arm": arm, "kind": kind, "sets": sets,
                         "accuracy": [r["accuracy"] for r in rounds], "train_loss": [r.get("train_loss") for r in rounds],
                         "epoch_s": [r.get("time_train_s") for r in rounds], "run_dir": str(run_dir),
                         "wall_s": round(time.time() - started, 1)})
    lines = [machine_header("twin_curves", f"({args.threads} thread(s) a run)"), "",
             "| arm | net | " + " | ".join(f"epoch {e + 1} %" for e in range(args.epochs)) + " | s / epoch |",
             "|---|---|" + "---|" * (args.epochs + 1)]
    for r in rows:
        acc = [f"{100 * a:.2f}" for a in r["accuracy"]] + ["—"] * (args.epochs - len(r["accuracy"]))
        sec = [s for s in r["epoch_s"] if s]
        lines.append(f"| {r['arm']} | {r['kind'].upper()} | " + " | ".join(acc)
                     + f" | {sum(sec) / len(sec) if sec else 0:.0f} |")
    print("\n".join(lines))
    if args.save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        with open(RESULTS / "results.jsonl", "a", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps({**r, "recorded": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        (RESULTS / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        plot(rows, RESULTS / "curves.png")
        print(f"saved {RESULTS}")
    return 0


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.plot(range(1, len(r["accuracy"]) + 1), [100 * a for a in r["accuracy"]], marker="o",
                ls="-" if r["kind"] == "snn" else "--", label=f"{r['arm']} {r['kind'].upper()}")
    ax.set(xlabel="epoch", ylabel="test accuracy %", title=f"{rows[0]['preset']}: central training, SNN and ANN twin")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
