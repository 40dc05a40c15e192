"""A paper network trained centrally beside its ANN twin: the learning curves, epoch by epoch.

Both are the preset's network trained as one client holding every training image (IID, one
local epoch a round, so round = epoch), with the preset's optimizer, batch and T; the twin is
``model.kind=ann`` (the same layers with ReLU units, analog input, normed alike when the
preset norms). Each ``--arm NAME=SET[,SET...]`` adds a pair under further settings (e.g. the
preset without its batch norm); ``--set`` applies to every run. A run folder that holds the
epochs asked for is read, not run again (fewer: resumed).

With ``--root`` the preset's own data files are read and ``--save`` writes
``benchmarks/results/twin_curves/``; without it the preset's STAND-IN
(``neurofed.data.standins``) is used and ``--save`` writes ``benchmarks/results/twin_curves/standins/``.
Each folder keeps ``results.jsonl`` (appended; a run read again is not added twice), ``table.md`` (the latest pair of every preset and
arm in it, with the ANN − SNN gap at the last epoch) and ``curves_PRESET.png``.

    python benchmarks/twin_curves.py --root ../shared/data/mnist --epochs 3 --out /tmp/twins --save
    python benchmarks/twin_curves.py --preset sfedca_fashion_mnist_dir03 --epochs 3 --out /tmp/twins --save
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ROOT, at_least, machine_header, run_rounds, run_to, stop_runs_with_the_benchmark,  # noqa: E402
                    with_one_line_errors)

RESULTS = Path(ROOT) / "benchmarks" / "results" / "twin_curves"
CENTRAL = ["partition.scheme=iid", "partition.num_clients=1", "federation.clients_per_round=1",
           "federation.local_epochs=1", "algorithm.name=fedavg", "export=false", "energy.enabled=false",
           "federation.target_accuracy=null"]
KINDS = {"snn": [], "ann": ["model.kind=ann"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="sfedca_mnist_dir03")
    p.add_argument("--root", default=None, help="the data set's files (the preset's data.root)")
    p.add_argument("--epochs", type=at_least(1), default=3)
    p.add_argument("--out", required=True, help="folder for the runs (reused and resumed)")
    p.add_argument("--train", type=at_least(1), default=None, help="training images (default: all)")
    p.add_argument("--test", type=at_least(1), default=None, help="test images (default: all)")
    p.add_argument("--threads", type=at_least(1), default=1)
    p.add_argument("--arm", action="append", default=[], help="NAME=KEY=VALUE[,KEY=VALUE...]: a further pair")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run (e.g. model.width=0.25)")
    p.add_argument("--arms-only", action="store_true",
                   help="run the --arm pairs alone, not the preset's own pair (table.md keeps its last one)")
    p.add_argument("--kinds", default="snn,ann",
                   help="which nets of each pair to run: snn,ann (default), snn or ann "
                        "(e.g. a setting only the twin reads)")
    p.add_argument("--save", action="store_true")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        p.error(f"--kinds: got {args.kinds!r}; allowed: a comma-separated subset of {', '.join(KINDS)}")
    if args.arms_only and not args.arm:
        p.error("--arms-only needs at least one --arm NAME=KEY=VALUE")
    arms = {} if args.arms_only else {"preset": []}
    for arm in args.arm:
        name, _, sets = arm.partition("=")
        if not name or not sets:
            p.error(f"--arm: got {arm!r}; expected NAME=KEY=VALUE[,KEY=VALUE...]")
        arms[name] = sets.split(",")
    base = [*CENTRAL, f"federation.threads={args.threads}", data_override(args.preset, args.root),
            *([f"data.train_subset={args.train}"] if args.train else []),
            *([f"data.test_subset={args.test}"] if args.test else []), *args.set]
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for arm, sets in arms.items():
        for kind in kinds:
            kind_sets = KINDS[kind]
            run_dir = Path(args.out) / f"{args.preset}-{arm}-{kind}"
            started = time.time()
            status = run_to(args.preset, run_dir, args.epochs, [*base, *sets, *kind_sets], f"{run_dir}.log")
            if status != 0:
                print(f"{run_dir.name}: exited {status}, see {run_dir}.log", flush=True)
            rounds = run_rounds(run_dir)[: args.epochs]
            rows.append({"preset": args.preset, "data": "files" if args.root else "stand-in", "arm": arm,
                         "kind": kind, "sets": [*args.set, *sets],
                         "accuracy": [r["accuracy"] for r in rounds], "train_loss": [r.get("train_loss") for r in rounds],
                         "epoch_s": [r.get("time_train_s") for r in rounds], "run_dir": str(run_dir),
                         "cpu": run_cpu(run_dir), "wall_s": round(time.time() - started, 1)})
    print("\n".join(table(rows, args.threads)))
    if args.save:
        results = RESULTS if args.root else RESULTS / "standins"
        results.mkdir(parents=True, exist_ok=True)
        latest = record(results, rows)  # every preset's latest pair, this run's included
        (results / "table.md").write_text("\n".join(table(latest, args.threads)) + "\n", encoding="utf-8")
        plot([r for r in latest if r["preset"] == args.preset],
             results / ("curves.png" if args.root else f"curves_{args.preset}.png"))
        print(f"saved {results}")
    return 0


def data_override(preset: str, root: str | None) -> str:
    """``data.root=ROOT``, or the preset's stand-in data set when no files are given (an
    embedded data set, which needs none, as it is)."""
    if root:
        return f"data.root={root}"
    import yaml

    from neurofed.data.catalog import EMBEDDED
    from neurofed.data.standins import standin_name
    from neurofed.presets import resolve

    name = yaml.safe_load(Path(resolve(preset)).read_text(encoding="utf-8"))["data"]["name"]
    standin = name if name in EMBEDDED else standin_name(name)
    if standin is None:
        sys.exit(f"{Path(sys.argv[0]).name}: preset {preset!r} reads {name!r}, which has no stand-in; "
                 "give its files with --root")
    return f"data.name={standin}"


def run_cpu(run_dir: Path) -> str:
    """The CPU a run trained on, from its summary (a folder read, not run, keeps its own)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "?"
    return summary.get("environment", {}).get("cpu", "?")


def record(results: Path, rows: list[dict]) -> list[dict]:
    """Append ``rows`` to ``results/results.jsonl``, each stamped with when it was recorded, and
    return every (preset, arm)'s latest pair. A row that is its key's latest record read again
    (a save that re-reads runs to replot them, or beside new arms) is not written twice."""
    latest = {run_key(r): r for r in recorded(results)}
    with open(results / "results.jsonl", "a", encoding="utf-8") as fh:
        for r in rows:
            if not same_run(r, latest.get(run_key(r))):
                r = {**r, "recorded": time.strftime("%Y-%m-%d %H:%M:%S")}
                fh.write(json.dumps(r) + "\n")
                latest.pop(run_key(r), None)  # ordered as recorded() orders: the latest row last
                latest[run_key(r)] = r
    return list(latest.values())


def same_run(row: dict, earlier: dict | None) -> bool:
    """Whether ``row`` is ``earlier``'s run read again: the same record but for when it was
    recorded and how long the reading took."""
    volatile = ("recorded", "wall_s")
    return earlier is not None and ({k: v for k, v in row.items() if k not in volatile}
                                    == {k: v for k, v in earlier.items() if k not in volatile})


def run_key(row: dict) -> tuple:
    return row["preset"], row["arm"], row["kind"]


def recorded(results: Path) -> list[dict]:
    """The latest recorded pair of every (preset, arm), in the order of those latest rows."""
    latest: dict[tuple, dict] = {}
    path = results / "results.jsonl"
    for line in (path.read_text(encoding="utf-8") if path.exists() else "").splitlines():
        r = json.loads(line)
        latest.pop(run_key(r), None)
        latest[run_key(r)] = r
    return list(latest.values())


def table(rows: list[dict], threads: int) -> list[str]:
    """One line per run: accuracy after each epoch, and for each SNN the ANN twin's lead at the
    last epoch both ran (a twin run alone, ``--kinds ann``, is set against the preset arm's
    SNN). Rows keep the date and CPU of their own run: the header names only the machine that
    wrote the table."""
    epochs = max(len(r["accuracy"]) for r in rows)
    lines = [machine_header("twin_curves", f"({threads} thread(s) a run)"), "",
             "| preset | arm | net | " + " | ".join(f"epoch {e + 1} %" for e in range(epochs))
             + " | ANN − SNN (points) | s / epoch | recorded | CPU |",
             "|---|---|---|" + "---|" * (epochs + 4)]
    by_key = {(r["preset"], r["arm"], r["kind"]): r for r in rows}
    for r in rows:
        acc = [f"{100 * a:.2f}" for a in r["accuracy"]] + ["—"] * (epochs - len(r["accuracy"]))
        gap = ""
        if r["kind"] == "snn":
            snn, twin, against = r, by_key.get((r["preset"], r["arm"], "ann")), ""
        elif (r["preset"], r["arm"], "snn") not in by_key:  # a twin-only arm: against the preset's SNN
            snn, twin, against = by_key.get((r["preset"], "preset", "snn")), r, ", vs the preset's SNN"
        else:
            snn = twin = None
        if snn and twin and snn["accuracy"] and twin["accuracy"]:
            last = min(len(snn["accuracy"]), len(twin["accuracy"]))
            gap = f"{100 * (twin['accuracy'][last - 1] - snn['accuracy'][last - 1]):+.2f} (epoch {last}{against})"
        sec = [s for s in r["epoch_s"] if s]
        lines.append(f"| {r['preset']} | {r['arm']} | {r['kind'].upper()} | " + " | ".join(acc)
                     + f" | {gap} | {sum(sec) / len(sec) if sec else 0:.0f} | {r.get('recorded', '')[:10]}"
                     + f" | {r.get('cpu', '?')} |")
    return lines


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(dict.fromkeys(r["arm"] for r in rows))  # one colour an arm: the SNN solid, its twin dashed
    # past ten arms the default cycle repeats its colours, so two arms would read as one
    colours = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20").colors
    fig, ax = plt.subplots(figsize=(6 if len(rows) <= 8 else 8.5, 4))
    for r in rows:
        ax.plot(range(1, len(r["accuracy"]) + 1), [100 * a for a in r["accuracy"]], marker="o", markersize=3,
                color=colours[arms.index(r["arm"]) % len(colours)], ls="-" if r["kind"] == "snn" else "--",
                label=f"{r['arm']} {r['kind'].upper()}")
    standin = " on its STAND-IN data" if rows[0].get("data") == "stand-in" else ""
    ax.set(xlabel="epoch", ylabel="test accuracy %",
           title=f"{rows[0]['preset']}{standin}:\ncentral training, SNN and ANN twin")
    if len(rows) <= 8:
        ax.legend(fontsize=8)
    else:  # beside the axes: inside, a long legend hides the curves' ends
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    stop_runs_with_the_benchmark()
    sys.exit(with_one_line_errors(main))