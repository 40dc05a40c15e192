"""Does each paper preset's network learn? A reduced-scale run of every preset on its
learnable STAND-IN (``neurofed.data.standins``), or on the real files with ``--root``.

Same model, T, encoding, neuron, optimizer, algorithm, readout, pools and initialization
as the preset; reduced: clients (at most ``--clients``), clients per round (``--per-round``),
rounds (``--rounds``), local epochs (at most ``--epochs``), training and test samples
(``--train`` / ``--test``),
and, for the wide nets only, the width (``--width``, said in the table) with, where a preset's
Adam lr is set for its own width, the lr its net learns with at the narrower one (SCALE's
``width_lr``, said in the table too). Per preset it
records the test accuracy of every round against chance (1 / classes), the last
round's firing rate per layer, the run's health record and its time, in
``benchmarks/results/preset_learning/results.jsonl``, and writes the table
``README.md`` beside it. A stand-in's accuracy says whether the preset learns, never
what the paper's table would show.

    python benchmarks/preset_learning.py                      # every preset, stand-ins
    python benchmarks/preset_learning.py --only sfedca_mnist  # presets whose name has this
    python benchmarks/preset_learning.py --root DIR           # the real files under DIR
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "examples" / "papers"
OUT = ROOT / "benchmarks" / "results" / "preset_learning"
WIDE = {"svgg9", "sfedca_alexnet", "hifi_resnet18", "resnet18"}  # reduced in width on 2 cores


# The reduced scale (aimed at a whole table of about an hour on 2 cores; the 40 rows of 2026-11-26
# took 345 min, the six ResNet-18 rows 147 of them, many beside a second run), per paper and then per
# data set or split, each later match updating the earlier: few clients, so that each trains enough
# local steps on the few samples a stand-in gives; more clients per round and more rounds where a
# label skew leaves each client two classes, so that a round sees most classes. A flag overrides it.
SCALE = [
    ("fedsnn_*", {"clients": 4, "rounds": 5, "epochs": 2, "train": 600, "test": 300,  # T = 20: the costliest step
                 # the presets' 3e-4 is for width 1 (1e-3's first steps stalled two of three seeds
                 # there); the rows at width 0.25 were measured with 1e-3 (twin_curves/standins)
                 "width_lr": 0.001}),
    # 10 rounds: at 5, Dir(0.5) ended at 15-26 % on two seeds with and without batch norm (2026-11-29)
    ("fedsnn_cifar10_*", {"rounds": 10}),
    ("fedsnn_cifar100_*", {"clients": 10, "per_round": 2, "epochs": 5, "train": 0, "rounds": 6}),  # as FedLEC's
    ("fedlec_*", {"clients": 10, "per_round": 5, "rounds": 12, "epochs": 5, "train": 0, "test": 300}),
    ("fedlec_*_cnum*", {"rounds": 20}),  # label skew: (#cnum, Dir) rises about 1.5 points a round
    ("fedlec_*_dir*", {"rounds": 20}),
    # Dir(0.05) over 10 clients leaves a 10-class stand-in about one class a client (135 samples, 15
    # Adam steps a round): FedLEC stayed at 10-18 % in 20 rounds, FedAvg at 10-23 % in 30 (H100); over 5
    # clients (all in each round) each holds 3 to 6 labels, 2 to 4 of them 5 % or more of its samples
    ("fedlec_*_dir005", {"clients": 5}),
    # 100 classes: 5,000 samples, long local training; under Dir(0.05) each of 10 clients holds 20-64 labels
    ("fedlec_cifar100_*", {"clients": 10, "per_round": 2, "rounds": 10}),
    ("sfedca_*", {"clients": 5, "rounds": 10, "epochs": 5, "train": 600, "test": 300, "candidates": 3}),
    ("sfedca_cifar10_*", {"train": 0, "epochs": 2, "rounds": 20,  # AlexNet, Adam: every sample, short rounds
                          # an Adam step moves every weight by about lr, so a unit's input by about
                          # lr x its fan-in: the presets' 3e-4 is for width 1 (1e-3 collapsed there),
                          # at a quarter of it the net learns with 1e-3 (3e-4: 69.8 % against 85.3
                          # centrally; benchmarks/results/twin_curves/standins/, "At full width")
                          "width_lr": 0.001}),
    ("sfedca_*_2shards", {"candidates": 5, "per_round": 4, "epochs": 2, "train": 0}),  # a client: 2 classes
    ("sfedca_cifar10_2shards", {"rounds": 40, "width_lr": None}),  # SGD (the paper's): 20 rounds: 8 -> 21 %, rising
    ("sfedhifi_*", {"clients": 4, "rounds": 6, "epochs": 2, "train": 600, "test": 300}),
    # ResNet-18 on every sample, about 50 s a round (CIFAR-100's 5,000: 170 s): one client a width
    # trains 21 steps a round (CIFAR-100: 78), and the authors' SGD (lr 0.1, momentum 0.9) leaves
    # chance only after about 200 of them; the row's accuracy is the mean over the four widths
    ("sfedhifi_cifar*", {"width": 0.125, "rounds": 12, "train": 0}),
    ("sfedhifi_cifar10_dir05", {"rounds": 20}),  # 12 rounds: 10 -> 19 %, rising about a point a round
]
SCALE_KEYS = ("clients", "per_round", "rounds", "epochs", "train", "test", "candidates", "width")


def scale_for(preset: str, args) -> argparse.Namespace:
    """``args`` with the preset's reduced scale (every SCALE pattern it matches, in order)
    wherever no flag set it."""
    default = {"candidates": 4, "width": 0.25}
    for pattern, scale in SCALE:
        if fnmatch.fnmatchcase(preset, pattern):
            default.update(scale)
    scaled = argparse.Namespace(**{**vars(args), **{k: default.get(k) for k in SCALE_KEYS if getattr(args, k) is None}})
    scaled.width_lr = default.get("width_lr")  # the lr for the reduced width, where the preset's is for its own
    return scaled


def available(cfg: dict, args) -> int:
    """Training samples of the preset's data (its stand-in unless ``--root``): a subset is
    taken only where it is smaller."""
    from neurofed.data.standins import standin_name

    data = {**cfg["data"], "root": args.root} if args.root else {**cfg["data"], "name": standin_name(cfg["data"]["name"])}
    return _train_size(json.dumps({**data, "train_subset": None, "test_subset": None}, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _train_size(data_json: str) -> int:
    """Training samples of one data config: loaded once per distinct config, not once per
    preset (many presets share a data set and its stand-in)."""
    from neurofed.data import load_dataset

    return len(load_dataset(json.loads(data_json)).y_train)


def overrides(cfg: dict, args) -> tuple[list[str], dict]:
    """The reduced-scale ``--set`` list for a preset's config, and what was reduced."""
    from neurofed.data.standins import standin_name

    data, part, fed, algo, model = cfg["data"], cfg["partition"], cfg["federation"], cfg["algorithm"], cfg["model"]
    clients = min(part["num_clients"], args.clients)
    per_round = min(args.per_round or fed["clients_per_round"], clients)
    epochs = min(fed["local_epochs"], args.epochs)
    reduced = {"clients": f"{part['num_clients']} -> {clients}", "rounds": f"{fed['rounds']} -> {args.rounds}",
               "local_epochs": f"{fed['local_epochs']} -> {epochs}"}
    if per_round != fed["clients_per_round"]:
        reduced["per_round"] = f"{fed['clients_per_round']} -> {per_round}"
    over = [f"partition.num_clients={clients}", f"federation.rounds={args.rounds}",
            f"federation.local_epochs={epochs}",
            f"federation.clients_per_round={per_round}", f"federation.threads={args.threads}",
            "export=false", "energy.enabled=false", "federation.target_accuracy=null"]
    if args.root:
        over.append(f"data.root={args.root}")
    else:
        over.append(f"data.name={standin_name(data['name'])}")
    over += args.set or []
    if args.train and args.train < available(cfg, args):
        over.append(f"data.train_subset={args.train}")
        reduced["train"] = f"{args.train} samples"
    if args.test:
        over.append(f"data.test_subset={args.test}")
        reduced["test"] = f"{args.test} samples"
    if "candidates" in algo:  # SFedCA trains every candidate each round
        candidates = min(algo["candidates"] or clients, clients, args.candidates)
        over.append(f"algorithm.candidates={candidates}")
        reduced["candidates"] = f"{algo['candidates']} -> {candidates}"
    if model["name"] in WIDE and "widths" in algo:  # SFedHIFI's widths are absolute: each scaled
        widths = [round(w * args.width, 4) for w in algo["widths"]]
        over += [f"model.width={max(widths)}", f"algorithm.widths=[{', '.join(map(str, widths))}]"]
        reduced["width"] = f"{algo['widths']} -> {widths}"
    elif model["name"] in WIDE and model.get("width", 1.0) > args.width:
        over.append(f"model.width={args.width}")
        reduced["width"] = f"{model.get('width', 1.0)} -> {args.width}"
        width_lr = getattr(args, "width_lr", None)
        lr_set = any(o.startswith("federation.lr=") for o in args.set or [])
        if width_lr is not None and width_lr != fed["lr"] and not lr_set:
            over.append(f"federation.lr={width_lr}")
            reduced["lr"] = f"{fed['lr']} -> {width_lr}"
    return over, reduced


def optimizer_label(preset: Path, over: list[str]) -> str:
    """The optimizer and lr a row ran with: the preset's under the row's overrides (a --set
    federation.lr, the narrowed width's lr)."""
    from neurofed.config import load_config

    fed = load_config(preset, overrides=["data.root=/nonexistent", *over])["federation"]
    return f"{fed['optimizer']} lr {fed['lr']}"


def run_one(preset: Path, args, tmp: Path) -> dict:
    from neurofed.config import load_config

    cfg = load_config(preset, overrides=["data.root=/nonexistent"])
    over, reduced = overrides(cfg, scale_for(preset.stem, args))
    out = tmp / preset.stem
    cmd = [sys.executable, "-m", "neurofed.cli", "run", str(preset), "--out", str(out), "--quiet"]
    for o in over:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        res = subprocess.CompletedProcess(cmd, 124, "", f"timed out after {args.timeout:.0f} s (--timeout)")
    wall = time.perf_counter() - t0
    row = {"preset": preset.stem, "dataset": cfg["data"]["name"], "model": cfg["model"]["name"],
           "algorithm": cfg["algorithm"]["name"], "optimizer": optimizer_label(preset, over),
           "T": cfg["data"]["timesteps"], "reduced": reduced, "wall_s": round(wall, 1),
           "exit": res.returncode}
    try:
        summary = json.loads((out / "summary.json").read_text())
        history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        classes = len(json.loads((out / "partition.json").read_text())["label_counts"][0])  # clients x classes
    except (OSError, ValueError):
        return {**row, "error": (res.stderr.strip().splitlines() or ["no output"])[-1]}
    accs = [h["accuracy"] for h in history]
    return {**row, "data": summary["dataset"], "chance": 1 / classes, "accuracy": [round(a, 4) for a in accs],
            "train_loss": [round(h["train_loss"], 4) if h.get("train_loss") is not None else None for h in history],
            "final": accs[-1], "best": max(accs), "rates": history[-1].get("layer_firing_rates"),
            "health": summary.get("health", {}).get("ok"), "problems": summary.get("health", {}).get("problems", []),
            "learns": learns(accs, 1 / classes)}


def learns(accs: list[float], chance: float) -> bool:
    """Far above chance and rising: the best round at least 2.5x chance and 10 points above
    it (with 100 classes 2.5x chance is 1.5 points), the last round above the first."""
    return max(accs) >= max(2.5 * chance, chance + 0.10) and accs[-1] > accs[0]


def table(rows: list[dict], args, missing: list[str] = ()) -> str:
    cpu = platform.processor() or platform.machine()
    lines = [
        "# Do the paper presets learn? (reduced scale, stand-in data)",
        "",
        f"`python benchmarks/preset_learning.py` on {cpu}, {os.cpu_count()} cores, table written "
        f"{time.strftime('%Y-%m-%d')} (each row's own command is in `results.jsonl`). Each preset's own model, T, "
        "encoding, neuron, optimizer, algorithm, readout, pools, surrogate and init; reduced as its row says "
        "(clients, clients per round, rounds, local epochs, samples, the width of the wide nets and, for the "
        "AlexNet's Adam, the lr at that width, SFedCA's candidates). Data: the "
        "STAND-INS made of the digits (`neurofed.data.standins`), not the papers' data: no figure here is a "
        "paper's number. 'learns': the best round at least 2.5x chance and 10 points above it, the last "
        "round above the first.",
        "",
        "| preset | data | model | optimizer | T | reduced | accuracy per round | chance | learns "
        "| last-round firing rates | health | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reduced = ", ".join(f"{k} {v}" for k, v in r["reduced"].items())
        if "error" in r:
            lines.append(f"| {r['preset']} | | {r['model']} | {r['optimizer']} | {r['T']} | {reduced} | "
                         f"error: {r['error'][:90]} | | no | | | {r['wall_s']} |")
            continue
        rates = " ".join(f"{x:.3f}" for x in (r["rates"] or []))
        lines.append(f"| {r['preset']} | {r['data']} | {r['model']} | {r['optimizer']} | {r['T']} | {reduced} | "
                     f"{' '.join(f'{a:.2f}' for a in r['accuracy'])} | {r['chance']:.2f} | "
                     f"{'yes' if r['learns'] else '**no**'} | {rates} | {'ok' if r['health'] else 'problems'} | "
                     f"{r['wall_s']} |")
    learned = sum(1 for r in rows if r.get("learns"))
    lines += [f"| {stem} | | | | | | not run | | not run | | | |" for stem in missing]
    lines += ["", f"{learned} of {len(rows)} presets run learn at this scale"
              + (f"; {len(missing)} not run." if missing else ".")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the presets whose file name contains this (comma-separated: any of these)")
    ap.add_argument("--root", help="the real data files (data.root) instead of the stand-ins")
    ap.add_argument("--clients", type=int, help="clients at most (default: the paper's SCALE)")
    ap.add_argument("--per-round", type=int, help="clients per round, at most (default: SCALE, else the preset's)")
    ap.add_argument("--rounds", type=int, help="rounds (default: the paper's SCALE)")
    ap.add_argument("--epochs", type=int, help="local epochs at most (default: the paper's SCALE)")
    ap.add_argument("--train", type=int, help="data.train_subset (default: the paper's SCALE; 0 = all)")
    ap.add_argument("--test", type=int, help="data.test_subset (default: the paper's SCALE; 0 = all)")
    ap.add_argument("--candidates", type=int, help="SFedCA's candidates S, at most (default: SCALE, else 4)")
    ap.add_argument("--width", type=float, help="width of the wide nets (default: SCALE, else 0.25)")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds per preset (a ResNet-18 row takes 12-17 min alone on 2 cores, "
                         "a CIFAR-100 one about 35)")
    ap.add_argument("--jobs", type=int, default=1, help="presets run at once, each on cores/jobs torch threads "
                    "(on 2 cores, two 1-thread runs gave no more throughput than one 2-thread run)")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="a further override for every preset")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--report", action="store_true", help="only rewrite README.md from results.jsonl")
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    if args.report:  # the table of every preset's latest recorded row, with the command of each
        if not (out / "results.jsonl").is_file():
            print(f"preset_learning: --report: no {out / 'results.jsonl'}; run the benchmark first "
                  "(or give --out the folder that holds it)", file=sys.stderr)
            return 2
        rows = {}
        for line in (out / "results.jsonl").read_text().splitlines():
            row = json.loads(line)
            if "accuracy" in row:  # judged by today's rule
                row["learns"] = learns(row["accuracy"], row["chance"])
            rows[row["preset"]] = row
        missing = sorted(p.stem for p in PRESETS.glob("*.yaml") if p.stem not in rows)
        (out / "README.md").write_text(table(sorted(rows.values(), key=lambda r: r["preset"]), args, missing))
        print(f"{len(rows)} presets -> {out / 'README.md'}")
        return 0
    only = args.only.split(",") if args.only else None
    presets = sorted(p for p in PRESETS.glob("*.yaml") if not only or any(o in p.stem for o in only))
    if not presets:
        print(f"preset_learning: --only {args.only!r} matches no preset in {PRESETS}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    args.threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    command = "python benchmarks/preset_learning.py " + " ".join(args.argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="neurofed-presets-") as tmp, \
            ThreadPoolExecutor(max(1, args.jobs)) as pool:
        running = {pool.submit(run_one, preset, args, Path(tmp)): preset for preset in presets}
        for i, done in enumerate(as_completed(running), 1):
            row = {**done.result(), "command": command, "jobs": args.jobs, "threads": args.threads}
            rows.append(row)
            acc = " ".join(f"{a:.2f}" for a in row.get("accuracy", [])) or row.get("error")
            print(f"[{i}/{len(presets)}] {row['preset']}: {acc} (chance {row.get('chance', 0):.2f}) "
                  f"{'learns' if row.get('learns') else 'DOES NOT LEARN'} in {row['wall_s']} s", flush=True)
            with (out / "results.jsonl").open("a") as fh:  # each row as it ends: a stopped table keeps its rows
                fh.write(json.dumps(row) + "\n")
    rows.sort(key=lambda r: r["preset"])
    text = table(rows, args)
    if args.only or args.set:  # a part of the table, or another setting, never replaces the whole one
        print(text)
    else:
        (out / "README.md").write_text(text)
    print(f"{sum(1 for r in rows if r.get('learns'))} of {len(rows)} presets learn"
          + ("" if args.only else f" -> {out / 'README.md'}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
