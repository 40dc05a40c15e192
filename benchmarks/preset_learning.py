"""Does each paper preset's network learn? A reduced-scale run of every preset on its
learnable STAND-IN (``neurofed.data.standins``), or on the real files with ``--root``.

Same model, T, encoding, neuron, optimizer, algorithm, readout, pools and initialization
as the preset; reduced: clients (at most ``--clients``), rounds (``--rounds``), local
epochs (at most ``--epochs``), training and test samples (``--train`` / ``--test``),
and, for the wide nets only, the width (``--width``, said in the table). Per preset it
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
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "examples" / "papers"
OUT = ROOT / "benchmarks" / "results" / "preset_learning"
WIDE = {"svgg9", "sfedca_alexnet", "hifi_resnet18", "resnet18"}  # reduced in width on 2 cores


def overrides(cfg: dict, args) -> tuple[list[str], dict]:
    """The reduced-scale ``--set`` list for a preset's config, and what was reduced."""
    from neurofed.data.standins import standin_name

    data, part, fed, algo, model = cfg["data"], cfg["partition"], cfg["federation"], cfg["algorithm"], cfg["model"]
    clients = min(part["num_clients"], args.clients)
    reduced = {"clients": f"{part['num_clients']} -> {clients}", "rounds": f"{fed['rounds']} -> {args.rounds}",
               "local_epochs": f"{fed['local_epochs']} -> {min(fed['local_epochs'], args.epochs)}"}
    over = [f"partition.num_clients={clients}", f"federation.rounds={args.rounds}",
            f"federation.local_epochs={min(fed['local_epochs'], args.epochs)}",
            f"federation.clients_per_round={min(fed['clients_per_round'], clients)}",
            "export=false", "energy.enabled=false", "federation.target_accuracy=null"]
    if args.root:
        over.append(f"data.root={args.root}")
    else:
        over.append(f"data.name={standin_name(data['name'])}")
    over += args.set or []
    if args.train:
        over.append(f"data.train_subset={args.train}")
        reduced["train"] = f"{args.train} samples"
    if args.test:
        over.append(f"data.test_subset={args.test}")
        reduced["test"] = f"{args.test} samples"
    if "candidates" in algo:  # SFedCA trains every candidate each round
        candidates = min(algo["candidates"] or clients, clients, args.candidates)
        over.append(f"algorithm.candidates={candidates}")
        reduced["candidates"] = f"{algo['candidates']} -> {candidates}"
    if model["name"] in WIDE and model.get("width", 1.0) > args.width:
        over.append(f"model.width={args.width}")
        reduced["width"] = f"{model.get('width', 1.0)} -> {args.width}"
    return over, reduced


def run_one(preset: Path, args, tmp: Path) -> dict:
    from neurofed.config import load_config

    cfg = load_config(preset, overrides=["data.root=/nonexistent"])
    over, reduced = overrides(cfg, args)
    out = tmp / preset.stem
    cmd = [sys.executable, "-m", "neurofed.cli", "run", str(preset), "--out", str(out), "--quiet"]
    for o in over:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    row = {"preset": preset.stem, "dataset": cfg["data"]["name"], "model": cfg["model"]["name"],
           "algorithm": cfg["algorithm"]["name"], "optimizer": f"{cfg['federation']['optimizer']} "
           f"lr {cfg['federation']['lr']}", "T": cfg["data"]["timesteps"], "reduced": reduced, "wall_s": round(wall, 1),
           "exit": res.returncode}
    try:
        summary = json.loads((out / "summary.json").read_text())
        history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        classes = len(json.loads((out / "partition.json").read_text())["label_counts"][0])  # clients x classes
    except (OSError, ValueError):
        return {**row, "error": (res.stderr.strip().splitlines() or ["no output"])[-1]}
    accs = [h["accuracy"] for h in history]
    return {**row, "data": summary["dataset"], "chance": 1 / classes, "accuracy": [round(a, 4) for a in accs],
            "final": accs[-1], "best": max(accs), "rates": history[-1].get("layer_firing_rates"),
            "health": summary.get("health", {}).get("ok"), "problems": summary.get("health", {}).get("problems", []),
            "learns": max(accs) >= 2.5 / classes and accs[-1] > accs[0]}


def table(rows: list[dict], args) -> str:
    cpu = platform.processor() or platform.machine()
    lines = [
        "# Do the paper presets learn? (reduced scale, stand-in data)",
        "",
        f"`python benchmarks/preset_learning.py` on {cpu}, {os.cpu_count()} cores, table written "
        f"{time.strftime('%Y-%m-%d')} (each row's own command is in `results.jsonl`). Each preset's own model, T, "
        "encoding, neuron, optimizer, algorithm, readout, pools, surrogate and init; reduced as its row says "
        "(clients, rounds, local epochs, samples, the width of the wide nets, SFedCA's candidates). Data: the "
        "STAND-INS made of the digits (`neurofed.data.standins`), not the papers' data: no figure here is a "
        "paper's number. 'learns': best accuracy at least 2.5x chance and the last round above the first.",
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
    lines += ["", f"{learned} of {len(rows)} presets learn at this scale."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the presets whose file name contains this (comma-separated: any of these)")
    ap.add_argument("--root", help="the real data files (data.root) instead of the stand-ins")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train", type=int, default=None, help="data.train_subset")
    ap.add_argument("--test", type=int, default=None, help="data.test_subset")
    ap.add_argument("--candidates", type=int, default=4, help="SFedCA's candidates S, at most")
    ap.add_argument("--width", type=float, default=0.25, help="width of the wide nets")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per preset")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="a further override for every preset")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--report", action="store_true", help="only rewrite README.md from results.jsonl")
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    if args.report:  # the table of every preset's latest recorded row, with the command of each
        rows = {}
        for line in (out / "results.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows[row["preset"]] = row
        (out / "README.md").write_text(table(sorted(rows.values(), key=lambda r: r["preset"]), args))
        print(f"{len(rows)} presets -> {out / 'README.md'}")
        return 0
    only = args.only.split(",") if args.only else None
    presets = sorted(p for p in PRESETS.glob("*.yaml") if not only or any(o in p.stem for o in only))
    if not presets:
        print(f"preset_learning: --only {args.only!r} matches no preset in {PRESETS}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="neurofed-presets-") as tmp:
        for i, preset in enumerate(presets, 1):
            row = {**run_one(preset, args, Path(tmp)), "command": "python benchmarks/preset_learning.py "
                   + " ".join(args.argv)}
            rows.append(row)
            acc = " ".join(f"{a:.2f}" for a in row.get("accuracy", [])) or row.get("error")
            print(f"[{i}/{len(presets)}] {preset.stem}: {acc} (chance {row.get('chance', 0):.2f}) "
                  f"{'learns' if row.get('learns') else 'DOES NOT LEARN'} in {row['wall_s']} s", flush=True)
            with (out / "results.jsonl").open("a") as fh:
                fh.write(json.dumps(row) + "\n")
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
