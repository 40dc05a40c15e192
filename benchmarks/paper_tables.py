"""SFedCA's Tables 2-3, MNIST columns, at the paper's scale on the publisher's MNIST files.

Each (split, method) is one ``neurofed run`` of the split's preset (``examples/papers/
sfedca_mnist_<split>.yaml``: N = 100, S = 10, P = 2, 5 local epochs, batch 128, SGD 0.1,
T = 12) with the method's ``--set``: FedSNN is FedAvg's random selection of SNN clients,
DivFL and FedMoS select among them as their papers do, the ANN FedAvg row is the same
network as an ANN. Only the number of rounds and the test subset may be reduced (say so).
A run folder already holding the rounds asked for is read, not run again; one holding fewer
is resumed to them (``neurofed run --resume``), so a table grows across sessions towards the
paper's 300 rounds.

It writes, per run, rounds to the column's Table 3 target and the final and best accuracy
beside the paper's figures (``benchmarks/data/sfedca_tables_mnist.yaml``), and what a round
cost, into ``benchmarks/results/paper_tables/`` (``results.jsonl``, ``README.md``,
``curves.png``). Figures from fewer rounds than the paper's are not its Table 2: the table
says how many rounds ran.

    python benchmarks/paper_tables.py --root ../shared/data/mnist --rounds 40 \\
        --splits dir03 --methods fedsnn,sfedca --out /tmp/paper_tables --save
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (at_least, machine_header, run_rounds, run_to, stop_runs_with_the_benchmark,  # noqa: E402
                    with_one_line_errors)

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "benchmarks" / "data" / "sfedca_tables_mnist.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "paper_tables"

# The rows in the paper's order (Table 2 lists the ANN first; the issue asks FedSNN and SFedCA
# first, then DivFL, FedMoS and the ANN), each the ``--set`` that turns the SFedCA preset into it.
METHODS = {
    "fedsnn": ("FedSNN (random selection)", ["algorithm.name=fedavg"]),
    "sfedca": ("SFedCA", ["algorithm.name=sfedca"]),
    "divfl": ("FedSNN+DivFL", ["algorithm.name=divfl"]),
    "fedmos": ("FedSNN+FedMoS", ["algorithm.name=fedmos"]),
    "fedavg_ann": ("FedAvg (ANN)", ["algorithm.name=fedavg", "model.kind=ann"]),
}
PAPER_ROWS = list(METHODS)  # the default --methods
# Variants beside the rows, each read against the paper row it stands in for: FedSNN with the
# plain mean of FedLab's SyncServerHandler, the server the authors' code extends (FedSNN's
# random-selection baseline likely ran on it; neurofed's FedAvg weights by n_k).
VARIANTS = {"fedsnn_uniform": ("FedSNN, uniform average", ["algorithm.name=fedavg", "algorithm.weighting=uniform"],
                               "fedsnn")}
METHODS.update({name: (label, sets) for name, (label, sets, _) in VARIANTS.items()})


def paper_row(method: str) -> str:
    """The paper's row a method's figures are set beside (a variant: the row it stands in for)."""
    return VARIANTS[method][2] if method in VARIANTS else method


def load_paper() -> dict:
    with open(PAPER, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def run_one(split: str, method: str, args, paper: dict) -> dict:
    """Run (or resume, or read) one cell and return its row."""
    run_dir = Path(args.out) / f"{split}-{method}"
    if args.read:
        return summarize(split, method, run_dir, paper)
    sets = [f"data.root={args.root}", f"federation.threads={args.threads}", "export=false", "energy.enabled=false",
            f"seed={args.seed}", *METHODS[method][1], *([f"data.test_subset={args.test}"] if args.test else []),
            *(args.set or [])]
    status = run_to(paper["splits"][split]["preset"], run_dir, args.rounds, sets, Path(args.out) / f"{split}-{method}.log")
    if status != 0:
        print(f"[{split}/{method}] exited {status}: see {args.out}/{split}-{method}.log", flush=True)
    return summarize(split, method, run_dir, paper)


def rounds_to(accuracies: list[float], target: float) -> int | None:
    # runs recorded before evaluate() returned the exact fraction hold float32 means (0.95 as
    # 0.94999999); a test set's accuracies are k / n, so 1e-6 below the target is the target
    return next((i + 1 for i, a in enumerate(accuracies) if a >= target - 1e-6), None)


def summarize(split: str, method: str, run_dir: Path, paper: dict) -> dict:
    rounds = run_rounds(run_dir)
    acc = [r["accuracy"] for r in rounds]
    target = paper["splits"][split]["target"]
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
    test = (json.loads((run_dir / "summary.json").read_text()).get("accuracy_measured_on", {})
            if (run_dir / "summary.json").exists() else {})
    return {
        "split": split, "method": method, "rounds_run": len(rounds),
        "rounds_to_target": rounds_to(acc, target), "target": target,
        "final_accuracy": acc[-1] if acc else None, "best_accuracy": max(acc) if acc else None,
        "mean_last_10": sum(acc[-10:]) / len(acc[-10:]) if acc else None,
        # rows stopped at different rounds still compare over the rounds they all ran
        "mean_first_10": sum(acc[:10]) / 10 if len(acc) >= 10 else None,
        "rounds_to": {f"{t:.2f}": rounds_to(acc, t) for t in (0.8, 0.85, 0.9, 0.95)},
        "accuracies": acc,
        "round_s": [r.get("wall_time_s") for r in rounds],
        "train_s": [r.get("time_train_s") for r in rounds],
        "trained_per_round": [len(r.get("trained", [])) for r in rounds],
        "paper_final": paper["final_accuracy"][paper_row(method)][split],
        "paper_rounds_to_target": paper["rounds_to_target"][paper_row(method)][split],
        "test_samples": test.get("samples"), "model": config.get("model", {}),
        "run_dir": str(run_dir),
    }


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def table(rows: list[dict], paper: dict) -> list[str]:
    lines = ["| split | method | rounds run | rounds to target (paper) | rounds to 80 / 85 / 90 / 95 % "
             "| final % (paper, 300 rounds) | best % | mean of rounds 1-10 % | mean of last 10 % "
             "| s / round (train) | clients trained / round |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        label = paper["splits"][r["split"]]["label"]
        reached = r["rounds_to_target"] if r["rounds_to_target"] else f"not in {r['rounds_run']}"
        paper_rounds = r["paper_rounds_to_target"] if r["paper_rounds_to_target"] else "not in 300"
        pct = (lambda x: f"{100 * x:.2f}" if x is not None else "—")
        lines.append(
            f"| {label} (target {100 * r['target']:.0f} %) | {METHODS[r['method']][0]} | {r['rounds_run']} "
            f"| {reached} ({paper_rounds}) | {' / '.join(str(v or '—') for v in r['rounds_to'].values())} "
            f"| {pct(r['final_accuracy'])} ({r['paper_final']:.2f}) "
            f"| {pct(r['best_accuracy'])} | {pct(r['mean_first_10'])} | {pct(r['mean_last_10'])} "
            f"| {_median(r['round_s']) or 0:.1f} ({_median(r['train_s']) or 0:.1f}) "
            f"| {_median(r['trained_per_round']) or 0} |")
    return lines


def plot(rows: list[dict], paper: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(dict.fromkeys(r["split"] for r in rows))
    fig, axes = plt.subplots(1, len(splits), figsize=(5.5 * len(splits), 4), squeeze=False)
    for ax, split in zip(axes[0], splits):
        for r in (r for r in rows if r["split"] == split):
            ax.plot(range(1, len(r["accuracies"]) + 1), [100 * a for a in r["accuracies"]],
                    label=METHODS[r["method"]][0])
        ax.axhline(100 * paper["splits"][split]["target"], color="grey", lw=0.8, ls="--")
        ax.set(title=f"MNIST {paper['splits'][split]['label']}", xlabel="round", ylabel="test accuracy %")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    paper = load_paper()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="folder with the publisher's MNIST files")
    p.add_argument("--out", required=True, help="folder for the runs (reused and resumed)")
    p.add_argument("--rounds", type=at_least(1), default=paper["rounds"], help="rounds per run (the paper: 300)")
    p.add_argument("--splits", default=",".join(paper["splits"]), help=f"of {','.join(paper['splits'])}")
    p.add_argument("--methods", default=",".join(PAPER_ROWS),
                   help=f"of {','.join(METHODS)} (default: the paper's rows, {','.join(PAPER_ROWS)})")
    p.add_argument("--test", type=at_least(1), default=None, help="test images (default: all 10,000)")
    p.add_argument("--workers", type=at_least(1), default=1, help="runs at a time")
    p.add_argument("--threads", type=at_least(1), default=1, help="torch threads per run")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--set", action="append", help="a further --set for every run (say it in the record)")
    p.add_argument("--read", action="store_true", help="read the runs in --out as they stand (stopped early: "
                                                        "the table says how many rounds each ran); run nothing")
    p.add_argument("--save", action="store_true", help=f"write the record to {RESULTS.relative_to(ROOT)}")
    p.add_argument("--record", default="", help="with --save: a subfolder of it for this record (runs made with "
                                                "other settings keep their own table and plot)")
    args = p.parse_args(argv)
    if args.record and (os.sep in args.record or args.record.startswith(".")):
        p.error(f"--record: {args.record!r} is not a plain folder name")
    splits, methods = args.splits.split(","), args.methods.split(",")
    for name, known in (("split", paper["splits"]), ("method", METHODS)):
        bad = [x for x in (splits if name == "split" else methods) if x not in known]
        if bad:
            p.error(f"--{name}s: unknown {', '.join(bad)}; allowed: {', '.join(known)}")
    if not Path(args.root).is_dir():
        p.error(f"--root: {args.root} is not a folder (the publisher's MNIST files: *-idx?-ubyte.gz)")
    os.makedirs(args.out, exist_ok=True)

    start = time.time()
    cells = [(s, m) for s in splits for m in methods]
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = {pool.submit(run_one, s, m, args, paper): (s, m) for s, m in cells}
        done = {futures[f]: f.result() for f in as_completed(futures)}
    rows = [done[c] for c in cells]

    header = machine_header("paper_tables", f"(runs {args.workers} at a time, {args.threads} thread(s) each)")
    footer = (f"wall time {time.time() - start:.0f} s; figures from fewer than {paper['rounds']} rounds are not "
              f"Table 2's (which is after {paper['rounds']})")
    print("\n".join([header, "", *table(rows, paper), "", footer]))
    if args.save:
        results = RESULTS / args.record
        results.mkdir(parents=True, exist_ok=True)
        with open(results / "results.jsonl", "a", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps({**r, "seed": args.seed, "recorded": time.strftime("%Y-%m-%d %H:%M:%S"),
                                     "sets": args.set or []}) + "\n")
        kept = recorded_rows(results / "results.jsonl", rows, args.seed)
        merged = sorted(rows + kept, key=lambda r: (list(paper["splits"]).index(r["split"]),
                                                    list(METHODS).index(r["method"]))) if kept else rows
        lines = [header, "", *table(merged, paper), "", footer]
        if kept:
            lines.append("carried from the record (their run folders not re-read): " + "; ".join(
                f"{r['split']}/{r['method']} as recorded {r.get('recorded', '?')}" for r in kept))
        plot(merged, paper, results / "curves.png")
        (results / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"saved {results}/results.jsonl, table.md, curves.png")
    return 0


def recorded_rows(path: Path, rows: list[dict], seed: int) -> list[dict]:
    """The record's latest row of each (split, method) of ``seed`` that this call did not
    produce: a record grown one method at a time (a long run resumed after its partner's run
    folder is gone) keeps every method in its table and plot."""
    fresh = {(r["split"], r["method"]) for r in rows}
    latest: dict[tuple, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r.get("seed") == seed and (r["split"], r["method"]) not in fresh:
            latest[(r["split"], r["method"])] = r
    return list(latest.values())


if __name__ == "__main__":
    stop_runs_with_the_benchmark()
    sys.exit(with_one_line_errors(main))