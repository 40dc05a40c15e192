"""The papers' networks on the chip: each preset trained at reduced scale with ``neurofed run``,
whose pipeline ends with the netx export and the Lava check (the presets' ``export: true``,
``lava: {samples: 100}``), one table row per preset.

Per row: the run's final test accuracy (summary.json); on the Lava check's 100 test samples
the trained (float) model's accuracy, the exported 8-bit network's in torch and in Lava,
the prediction agreement Lava vs torch and which layers' spikes are identical (lava.json);
Lava's samples/s and workers; the Loihi 2 cores at the trained width (hardware.json) and at
full width (shapes only: ``neurofed.deploy.constraints.hardware_use``, as
benchmarks/preset_cores.py). A row whose model ``neurofed run`` refuses to export says
"refused: <reason>" (checked before training with the pipeline's own structure check, so
no one trains for a refusal; ``--no-precheck`` runs it anyway). Stand-in rows
(``neurofed.data.standins``) say that a network deploys, never what a paper's table shows.

    python benchmarks/deploy_presets.py                        # every row, one run at a time
    python benchmarks/deploy_presets.py --only fedsnn_cifar10_iid --save
    python benchmarks/deploy_presets.py --report               # README.md from results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "benchmarks")) if p not in sys.path]
from common import Report, machine_header, with_one_line_errors  # noqa: E402
from neurofed.models.quantize import qat_round  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "deploy_presets"
MNIST = "/work/shared/data/mnist"  # the publisher's idx.gz files (see its README)
COMMON = ["energy.enabled=false", "federation.target_accuracy=null"]  # energy: not this table's question
# the float twin of a row that trains with QAT (model.quantize: R or 'last ...'): float weights
# throughout, as the papers and the presets train; no export
FLOAT_TWIN = ["model.quantize=false", "export=false"]

# preset -> (data note, overrides, what was reduced). Settings from tests/test_presets.py's LEARNS
# and benchmarks/preset_learning.py's SCALE, each a few minutes on 2 shared cores.
ROWS = {
    "sfedca_mnist_dir03": ("MNIST (real files)", [
        f"data.root={MNIST}", "data.train_subset=6000", "data.test_subset=1000", "partition.num_clients=10",
        "federation.clients_per_round=2", "algorithm.candidates=4", "federation.local_epochs=1",
        "federation.rounds=8"], "clients 100 -> 10, candidates 10 -> 4, rounds 300 -> 8, local epochs 5 -> 1, "
        "6,000 train / 1,000 test samples; full width"),
    "fedlec_cifar10_iid": ("stand-in CIFAR-10", [
        "data.name=standin_cifar10", "data.test_subset=200", "model.width=0.125", "partition.num_clients=2",
        "federation.clients_per_round=2", "federation.local_epochs=3", "federation.rounds=5"],
        "width 1.0 -> 0.125, rounds 50 -> 5, local epochs 10 -> 3, 2 clients, all 1,347 train / 200 test"),
    "fedsnn_cifar10_iid": ("stand-in CIFAR-10", [
        "data.name=standin_cifar10", "data.train_subset=400", "data.test_subset=200", "model.width=0.125",
        "partition.num_clients=2", "federation.clients_per_round=2", "federation.local_epochs=2",
        "federation.rounds=5", "federation.lr=0.001"], "width 1.0 -> 0.125, clients 100 -> 2, rounds 100 -> 5, "
        "local epochs 5 -> 2, 400 train / 200 test, Adam lr 3e-4 -> 1e-3 (the presets' is for width 1); float weights, as the preset trains (its own run is its float "
        "twin)"),
    "sfedhifi_fashion_mnist_iid": ("stand-in Fashion-MNIST", [
        "data.name=standin_fashion_mnist", "data.train_subset=600", "data.test_subset=200",
        "partition.num_clients=4", "federation.clients_per_round=4", "algorithm.widths=[0.5, 1.0]",
        "algorithm.fusion_until=null", "federation.local_epochs=2", "federation.rounds=4"],
        "widths [0.25 .. 1.0] -> [0.5, 1.0] (exported: 1.0), clients 10 -> 4, rounds 500 -> 4, 600 train / 200 test"),
    "sfedhifi_cifar10_iid": ("stand-in CIFAR-10", [
        "data.name=standin_cifar10", "data.test_subset=200",
        "model.width=0.125", "algorithm.widths=[0.0312, 0.0625, 0.0938, 0.125]", "partition.num_clients=4",
        "federation.clients_per_round=4", "federation.local_epochs=2", "federation.rounds=12"],
        "widths x0.125 (exported: 0.125), clients 10 -> 4, rounds 500 -> 12, all 1,347 train / 200 test; "
        "float weights, as the preset trains (its own run is its float twin)"),
    "sfedca_cifar10_dir03": ("stand-in CIFAR-10", [
        "data.name=standin_cifar10", "data.test_subset=200", "model.width=0.25", "partition.num_clients=3",
        "federation.clients_per_round=2", "algorithm.candidates=3", "federation.local_epochs=2",
        "federation.rounds=5"], "width 1.0 -> 0.25, clients 100 -> 3, candidates 10 -> 3, rounds 300 -> 5, "
        "local epochs 10 -> 2, all 1,347 train / 200 test; float weights, as the preset trains"),
    "sfedca_fashion_mnist_dir03": ("stand-in Fashion-MNIST", [
        "data.name=standin_fashion_mnist", "data.train_subset=600", "data.test_subset=200",
        "partition.num_clients=3", "federation.clients_per_round=2", "algorithm.candidates=3",
        "federation.local_epochs=2", "federation.rounds=5"], "clients 100 -> 3, candidates 10 -> 3, "
        "rounds 300 -> 5, local epochs 5 -> 2, 600 train / 200 test; full width; float weights, as the preset trains"),
}
# a net the pipeline refuses to export is sized as it would be mapped: spiking pool and readout, no norm
MAPPED = {"global_pool": "spikes", "readout": "spikes", "norm": "none"}


def config(preset: str, overrides: list[str]) -> dict:
    from neurofed.config import load_config
    from neurofed.presets import presets

    return load_config(presets()[preset], overrides=overrides)


def refusal(cfg: dict) -> str | None:
    """What ``neurofed run``'s plan (neurofed.pipeline) says about exporting this config's model."""
    from neurofed.models import build_model
    from neurofed.pipeline import export_refusal

    shape, classes = input_of(cfg)
    return export_refusal(build_model(cfg["model"], shape, classes, cfg["federation"]["logit_scale"]))


def input_of(cfg: dict) -> tuple[tuple, int]:
    """The paper data set's (C, H, W) and classes, for a row on it or on its stand-in."""
    from neurofed.data.image_formats import IMAGE_SETS
    from neurofed.data.standins import STANDINS

    name = cfg["data"]["name"]
    paper = IMAGE_SETS[STANDINS[name][0] if name in STANDINS else name]
    return paper.shape, paper.num_classes


def full_width_cores(cfg: dict) -> dict:
    """Loihi 2 cores of the preset's net at width 1.0 (shapes only; no training)."""
    from neurofed.deploy.constraints import hardware_use
    from neurofed.models import build_model

    shape, classes = input_of(cfg)
    model_cfg = {**cfg["model"], "width": 1.0}
    mapped = refusal(cfg) is not None  # a net netx refuses today: sized as it would be mapped
    if mapped:
        model_cfg.update(MAPPED)
    from neurofed.deploy.deployable import deployable_copy

    model = build_model(model_cfg, shape, classes)
    use = hardware_use(model if mapped else deployable_copy(model), timesteps=cfg["data"]["timesteps"])
    return {"cores": use["cores"], "chips": use["chips"], "neurons": use["neurons"], "as_mapped": mapped}


def neurofed(args: list[str], env: dict | None = None, timeout: float = 3600) -> tuple[int, str, float]:
    cmd = [sys.executable, "-m", "neurofed.cli", *args]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return res.returncode, (res.stdout + res.stderr).strip(), time.perf_counter() - t0


def one_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1].strip() if lines else "no output"


def run_row(preset: str, out: Path, args, rep: Report) -> dict:
    data, over, reduced = ROWS[preset]
    over = [*over, *COMMON]
    cfg = config(preset, over)
    command = f"neurofed run {preset} " + " ".join(f"--set '{o}'" for o in over)
    row = {"preset": preset, "data": data, "model": cfg["model"]["name"], "width": cfg["model"]["width"],
           "T": cfg["data"]["timesteps"], "encoding": cfg["data"]["encoding"], "reduced": reduced,
           "overrides": over, "command": command, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load": [round(x, 2) for x in os.getloadavg()]}
    try:
        row["full_width"] = full_width_cores(cfg)
    except Exception as exc:  # a sizing that fails must not lose the row
        row["full_width"] = {"error": f"{type(exc).__name__}: {exc}"}
    if args.precheck and (why := refusal(cfg)):
        rep.emit(f"{preset}: refused before training: {why}")
        return {**row, "status": f"refused: {why}"}
    run_dir = out / preset
    reused = args.reuse and (run_dir / "summary.json").is_file()
    if reused:  # trained before: its export and Lava check again, with this neurofed
        rep.emit(f"{preset}: reusing the trained run {run_dir}: neurofed export, neurofed lava")
        lava = ["lava", str(run_dir), "--samples", str(cfg["lava"]["samples"]), "--quiet"]
        for sub in (["export", str(run_dir)], lava):
            rc, text, _ = neurofed(sub, timeout=args.timeout)
            if rc != 0:
                return {**row, "status": f"failed: neurofed {sub[0]}: {one_line(text)}"}
        text, wall = "", json.loads((run_dir / "summary.json").read_text()).get("wall_time_s", 0.0)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        rep.emit(f"{preset}: {command} --out {run_dir}")
        rc, text, wall = neurofed(["run", preset, "--out", str(run_dir), "--quiet",
                                   *[a for o in over for a in ("--set", o)]], timeout=args.timeout)
    row["run_wall_s"] = round(wall, 1)
    row["reused"] = reused
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {**row, "status": f"failed: exit {rc}: {one_line(text)}"}
    history = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    row.update(accuracy_per_round=[round(h["accuracy"], 4) for h in history],
               final_accuracy=summary["final_accuracy"], dataset=summary["dataset"])
    after = summary.get("after_training", {})
    bad = None if reused else next(((k, r) for k, r in after.items()
                                    if k in ("export", "lava") and r.get("status") != "ok"), None)
    if bad:
        status = bad[1].get("status")
        why = bad[1].get("reason") or str(bad[1].get("error", "")).splitlines()[0]
        return {**row, "status": f"{status}: {why}"}
    hw = json.loads((run_dir / "hardware.json").read_text())
    lava = json.loads((run_dir / "lava.json").read_text())
    row.update(status="ok", cores=hw["cores"], chips=hw["chips"], hw_profile=hw["profile"],
               **{k: lava[k] for k in ("samples", "trained_accuracy", "torch_accuracy", "accuracy", "agreement",
                                       "trained_agreement", "spike_for_spike", "layer_kinds",
                                       "layer_raster_agreement", "layer_count_agreement", "samples_per_s",
                                       "compile_s", "run_s", "conv_model", "lava_window", "readout")},
               lava_workers=lava.get("workers"), lava_machine=lava.get("machine"))
    if "workers" not in lava:  # lava.json of this version does not record it: the pipeline's default
        from neurofed.deploy.lava_shards import usable_cores

        row["lava_workers"] = min(usable_cores(), lava["samples"])
    row["qat"] = {"from_round": qat_round(cfg["model"]["quantize"], cfg["federation"]["rounds"]),
                  **exported_accuracies(run_dir)}
    row["float_twin"] = (float_twin(preset, over, out, args, rep) if row["qat"]["from_round"] is not None else
                         {"status": "ok", "same_run": True, "final_accuracy": summary["final_accuracy"],
                          "run_wall_s": row["run_wall_s"], **{k: v for k, v in row["qat"].items() if k != "from_round"},
                          "note": "The preset trains float weights: its own run is its float twin."})
    if preset == args.stock_compare:
        row["conv_speed"] = conv_speed(run_dir, rep)
    rep.emit(line(row))
    return row


NOISE = 1e-4  # relative weight noise of the noise floor: far below any 8-bit grid's step
NOISE_DRAWS = 2


def exported_accuracies(run_dir: Path) -> dict:
    """The exported model's (the run's last global model; SFedHIFI's largest width) test
    accuracy on the run's test samples: with its float weights, as export writes it (each layer
    on its exponent's grid), on SLAYER's one grid (export before per-layer exponents), and the
    float model's with every parameter times (1 + 1e-4 N(0, 1)), NOISE_DRAWS draws: how far a
    perturbation far below any grid's step moves this network's accuracy (its noise floor)."""
    import copy

    import torch

    from neurofed.deploy.export import load_global_model
    from neurofed.models.quantize import set_export_grid
    from neurofed.seeds import seed_for
    from neurofed.training.local import evaluate
    from qat_accuracy import accuracies

    run = load_global_model(run_dir)
    float_weights, grid, one_grid = accuracies(run)
    model, cfg, ds, _ = run
    set_export_grid(model, on=False)  # accuracies leaves it on the one grid
    x, y, seed = torch.as_tensor(ds.x_test), torch.as_tensor(ds.y_test), seed_for(cfg["seed"], "eval")
    noisy = []
    for draw in range(NOISE_DRAWS):
        m, gen = copy.deepcopy(model), torch.Generator().manual_seed(draw)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 + NOISE * torch.randn(p.shape, generator=gen))
        noisy.append(round(evaluate(m, x, y, cfg, seed)["accuracy"], 4))
    return {"float": round(float_weights, 4), "export8": round(grid, 4), "one_grid8": round(one_grid, 4),
            "noisy_float": noisy}


def trained(preset: str, run_dir: Path, sets: list[str], args, rep: Report, what: str) -> str | None:
    """``neurofed run preset`` with ``sets`` into ``run_dir`` (kept with ``--reuse`` when it
    finished before); the failure in one line, or None."""
    if args.reuse and (run_dir / "summary.json").is_file():
        return None
    shutil.rmtree(run_dir, ignore_errors=True)
    rep.emit(f"{preset} ({what}): --out {run_dir}")
    rc, text, _ = neurofed(["run", preset, "--out", str(run_dir), "--quiet", *[a for o in sets for a in ("--set", o)]],
                           timeout=args.timeout)
    return None if rc == 0 else f"failed: {what}: exit {rc}: {one_line(text)}"


def float_twin(preset: str, over: list[str], out: Path, args, rep: Report) -> dict:
    """The row's run with float weights throughout (FLOAT_TWIN), same seed and data: what
    export costs without quantization-aware training, and what QAT costs the float accuracy."""
    run_dir = out / f"{preset}-float"
    failed = trained(preset, run_dir, [*over, *FLOAT_TWIN], args, rep, "float twin")
    if failed:
        return {"status": failed}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"status": "ok", "final_accuracy": summary["final_accuracy"],
            "run_wall_s": round(summary.get("wall_time_s", 0.0), 1), **exported_accuracies(run_dir)}


def seed_runs(preset: str, seed: int, out: Path, args, rep: Report) -> dict:
    """The row's QAT run and its float twin again with another ``seed`` (the partition, the
    initialization, the batches), both without export: what QAT costs, once more."""
    _, over, _ = ROWS[preset]
    res = {}
    floats = qat_round(config(preset, [*over, *COMMON])["model"]["quantize"], 1) is None
    for label, extra in (("qat", ["export=false"]), ("twin", FLOAT_TWIN))[floats:]:
        run_dir = out / f"{preset}-seed{seed}-{label}"
        failed = trained(preset, run_dir, [*over, *COMMON, *extra, f"seed={seed}"], args, rep, f"seed {seed}, {label}")
        if failed:
            return {"status": failed}
        res[label] = exported_accuracies(run_dir)
    res.setdefault("qat", res["twin"])  # a float preset: its run is its twin
    row = {"status": "ok", "float_preset": floats, "qat8": res["qat"]["export8"], "twin_float": res["twin"]["float"],
           "twin8": res["twin"]["export8"]}
    rep.emit(f"{preset} seed {seed}: {seed_text(row)}")
    return row


def seed_text(sr: dict) -> str:
    twin = f"{pct(sr['twin_float'])} float / {pct(sr['twin8'])} 8-bit"
    return f"float weights {twin}" if sr.get("float_preset") else f"QAT {pct(sr['qat8'])} (8-bit), float twin {twin}"


def losses(row: dict) -> list[float]:
    """twin float - QAT 8-bit, in points, for the row's own seed and every extra one."""
    q, f = row.get("qat", {}), row.get("float_twin", {})
    out = [100 * (f["float"] - q["export8"])] if f.get("status") == "ok" and "export8" in q else []
    return out + [100 * (r["twin_float"] - r["qat8"]) for r in row.get("seeds", {}).values() if r.get("status") == "ok"]


def conv_speed(run_dir: Path, rep: Report) -> dict:
    """``neurofed lava RUN --samples 10 --workers 1`` with Lava's stock Conv model and with
    neurofed's im2col one (the default), on the same run dir; the 100-sample lava.json is kept."""
    keep = run_dir / "lava.json"
    saved = keep.read_bytes()
    res = {}
    try:
        for name, extra in (("stock", ["--stock-conv"]), ("im2col", [])):
            rc, text, wall = neurofed(["lava", str(run_dir), "--samples", "10", "--workers", "1", "--quiet", *extra])
            if rc != 0:
                res[name] = {"error": one_line(text)}
                continue
            r = json.loads(keep.read_text())
            shutil.copy(keep, run_dir / f"lava_10_{name}.json")
            res[name] = {"samples_per_s": r["samples_per_s"], "run_s": r["run_s"], "compile_s": r["compile_s"],
                         "agreement": r["agreement"], "spike_for_spike": r["spike_for_spike"], "wall_s": round(wall, 1),
                         "conv_model": r.get("conv_model")}
            rep.emit(f"  lava --samples 10 --workers 1{' --stock-conv' if extra else ''}: "
                     f"{r['samples_per_s']:.3g} samples/s (run {r['run_s']:.1f} s, compile {r['compile_s']:.1f} s, "
                     f"spike-for-spike {r['spike_for_spike']})")
    finally:
        keep.write_bytes(saved)
    if all("samples_per_s" in v for v in res.values()):
        res["ratio"] = round(res["im2col"]["samples_per_s"] / res["stock"]["samples_per_s"], 2)
        rep.emit(f"  im2col / stock: {res['ratio']}x")
    return res


def pct(x) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def identical_layers(row: dict) -> str:
    """Layers whose raster equals torch's in every sample (lava.json's layer_raster_agreement)."""
    flags = row["layer_raster_agreement"]
    same = [j for j, a in enumerate(flags) if a == 1.0]
    if len(same) == len(flags):
        return f"all {len(flags)}"
    return f"{len(same)} of {len(flags)}; differ: " + ", ".join(
        f"{j}:{row['layer_kinds'][j]} ({pct(a)} of samples)" for j, a in enumerate(flags) if a != 1.0)


def line(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['preset']}: {row['status']}"
    q, f = row.get("qat", {}), row.get("float_twin", {})
    trains = f"QAT from round {q['from_round']}" if q.get("from_round") else "float weights"
    twin = (f"; exported model on the run's test samples: {trains} {pct(q['export8'])} "
            f"(8-bit), float twin {pct(f.get('float'))} float / {pct(f.get('export8'))} 8-bit" if q else "")
    return (f"{row['preset']}: final test {pct(row['final_accuracy'])}{twin}; on {row['samples']} samples float "
            f"{pct(row['trained_accuracy'])}, 8-bit {pct(row['torch_accuracy'])}, Lava {pct(row['accuracy'])}, "
            f"agreement {pct(row['agreement'])}, identical layers {identical_layers(row)}; "
            f"{row['samples_per_s']:.3g} samples/s on {row['lava_workers']} worker(s); "
            f"{row['cores']} cores ({row['chips']} chip(s))")


def table(rows: list[dict], header: str) -> str:
    out = ["# The papers' networks on the chip (reduced scale; Lava's CPU simulator)", "",
           "`python benchmarks/deploy_presets.py --save` (one row: `--only NAME --save`). Each row is one "
           "`neurofed run` of the preset with the overrides below; its pipeline ends with the netx export and "
           "the Lava check on 100 test samples (`lava.json`, `hardware.json`). Rows on **stand-in** data "
           "(`neurofed.data.standins`, made of the 8x8 digits) show that the network trains, exports and runs "
           "on Lava; their accuracies are **not** the papers' numbers. Only sfedca_mnist_dir03 uses real "
           "data (MNIST, the publisher's files), and at a fraction of the paper's scale.", "",
           "```", header, "```", "",
           "Columns: *QAT from*: `float` where the row trains float weights, as the presets do (its run is "
           "its own float twin); a round R where it trains with `model.quantize: R` or `'last ...'` (float "
           "weights until round R, then every forward pass on the 8-bit grids export writes), and is also "
           "run as its **float twin**: the same command with `model.quantize=false` and no export. "
           "On the run's test samples "
           "(its `data.test_subset`), the exported model (SFedHIFI: the largest width) of: the twin with its "
           "float weights (*twin float*), as export writes it (*twin 8-bit*: each layer on its own exponent's "
           "grid, neurofed.models.quantize; what exporting it costs) and on SLAYER's one grid for every layer "
           "(*one grid*: export before per-layer exponents), and of the preset as it trains now (*QAT 8-bit*: "
           "what Lava runs; a float preset's own run is its twin); *loss* = twin float - QAT 8-bit, in points "
           "(negative: QAT scored higher); *noise floor*: the twin's float accuracy with every parameter times "
           "(1 + 1e-4 N(0, 1)), two draws: a perturbation far below any grid step, which moves a network on "
           "the edge of its decisions as far as 8 bits do. On the Lava check's 100 test samples and input spikes: "
           "*8-bit / Lava*: the exported network in torch and on Lava fixed_pt, *agree* Lava vs torch "
           "predictions; *identical layers*: layers whose spike raster equals torch's in every sample; "
           "*samples/s*: Lava run time only (compile excluded), Lava's Conv on neurofed's im2col model; "
           "*cores*: Loihi 2 (hw_profiles/loihi2.yaml) at the trained width / at full width (shapes only). "
           "At this scale a run's accuracy still swings by a few points from round to round, and 100 to "
           "1,000 test samples hold a point to within about 1.5 to 5 points: the loss column is within that "
           "noise. The 2 cores may be shared with other jobs: each row gives its load average; its times "
           "and samples/s move with it.", "",
           "| preset | data | model (width) | T | QAT from (of) | twin float | twin 8-bit | one grid | QAT 8-bit | "
           "loss | "
           "noise floor | 8-bit / Lava (100) | agree | identical layers | samples/s (workers) | "
           "cores trained / full width | run s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fw = r.get("full_width", {})
        full = (f"{fw['cores']} ({fw['chips']} chip{'s' * (fw['chips'] != 1)}){' as mapped' if fw.get('as_mapped') else ''}"
                if "cores" in fw else "?")
        model = f"{r['model']} ({r['width']})"
        q, f = r.get("qat", {}), r.get("float_twin", {})
        rounds = len(r.get("accuracy_per_round", [])) or "?"
        twin = (f"{pct(f.get('float'))} | {pct(f.get('export8'))} | {pct(f.get('one_grid8'))} | "
                if f.get("status") == "ok" else f"{f.get('status', '')} | | | ")
        noise = " / ".join(f"{100 * a:.1f}%" for a in f.get("noisy_float", []))
        each = losses(r)
        loss = (f"{each[0]:+.1f}" if len(each) == 1 else
                f"{sum(each) / len(each):+.1f} (mean of {len(each)} seeds: {', '.join(f'{x:+.1f}' for x in each)})"
                if each else "")
        head = (f"| {r['preset']} | {r['data']} | {model} | {r['T']} | {q.get('from_round') or 'float'} ({rounds}) | "
                f"{twin}{pct(q.get('export8'))} | {loss} | {noise} | ")
        if r["status"] != "ok":
            out.append(f"{head}| | **{r['status']}** | | – / {full} | {r.get('run_wall_s', '')} |")  # noqa: E501
            continue
        out.append(f"{head}{pct(r['torch_accuracy'])} / {pct(r['accuracy'])} | "
                   f"{pct(r['agreement'])} | {identical_layers(r)} | {r['samples_per_s']:.3g} ({r['lava_workers']}) | "
                   f"{r['cores']} ({r['chips']} chip{'s' * (r['chips'] != 1)}) / {full} | {r['run_wall_s']} |")
    out += ["", "## Per row: what was reduced, the command, when", ""]
    for r in rows:
        out += [f"- **{r['preset']}** ({r['date']}, load {' '.join(map(str, r['load']))}): {r['reduced']}.",
                f"  `{r['command']}`"]
        if r["status"].startswith("refused") and "run_wall_s" not in r:
            out.append("  Not trained: `neurofed run`'s plan (neurofed.pipeline, the same structure check) refuses "
                       "the export before training; the row is re-run once the model exports. Full-width cores "
                       "sized as it would be mapped (benchmarks/preset_cores.py: the folded network, batch "
                       "norm folded).")
        if r.get("accuracy_per_round"):
            out.append(f"  Test accuracy per round: {' '.join(f'{a:.2f}' for a in r['accuracy_per_round'])}.")
        if r.get("reused"):
            out.append("  Reused (`--reuse`): trained by an earlier run of this command (its config.yaml differs "
                       "at most in `export`); its export, Lava check and accuracies are this version's.")
        if r.get("extra"):
            out.append(f"  {r['extra']}")
        for seed, sr in r.get("seeds", {}).items():
            out.append(f"  Seed {seed} (`--set seed={seed}`, no export): "
                       + (seed_text(sr) if sr.get("status") == "ok" else sr.get("status", "")) + ".")
        if r.get("float_twin", {}).get("status") == "ok":
            out.append(f"  Float twin: final {pct(r['float_twin']['final_accuracy'])}, run "
                       f"{r['float_twin']['run_wall_s']} s.{' ' + r['float_twin']['note'] if 'note' in r['float_twin'] else ''}")
        cs = r.get("conv_speed")
        if cs and "ratio" in cs:
            out.append(f"  Lava's Conv model, `neurofed lava RUN --samples 10 --workers 1` on the same run dir: "
                       f"stock (scipy, `--stock-conv`) {cs['stock']['samples_per_s']:.3g} samples/s, im2col "
                       f"(default) {cs['im2col']['samples_per_s']:.3g} samples/s: **{cs['ratio']}x**; "
                       f"spike-for-spike with torch: stock {cs['stock']['spike_for_spike']}, im2col "
                       f"{cs['im2col']['spike_for_spike']}. The pipeline's 100 samples with the default on "
                       f"{r['lava_workers']} workers: run {r['run_s']:.0f} s + compile {r['compile_s']:.0f} s.")
    return "\n".join(out) + "\n"


def save(rows_new: list[dict], header: str, out: Path = RESULTS) -> None:
    """Replace (or add) the rows of these presets in results.jsonl; rewrite README.md."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    rows = {}
    if path.is_file():
        for l in path.read_text().splitlines():
            if l.strip():
                r = json.loads(l)
                rows[r["preset"]] = r
    for r in rows_new:
        # a row trained afresh drops the earlier row's extra seeds: they trained another config or neurofed
        kept = rows.get(r["preset"], {}).get("seeds", {}) if r.get("reused", True) else {}
        seeds = {**kept, **r.get("seeds", {})}
        rows[r["preset"]] = {**r, "machine": header or rows.get(r["preset"], {}).get("machine", ""),
                             **({"seeds": seeds} if seeds else {})}
    ordered = [rows[p] for p in ROWS if p in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    headers = list(dict.fromkeys(r["machine"] for r in ordered))
    (out / "README.md").write_text(table(ordered, "\n\n".join(headers)))
    print(f"saved {path} and {out / 'README.md'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help=f"one preset (comma-separated: several); allowed: {', '.join(ROWS)}")
    ap.add_argument("--out", default=None, help="run dirs (default: a temporary folder, deleted at the end)")
    ap.add_argument("--save", action="store_true", help="write the rows to benchmarks/results/deploy_presets/")
    ap.add_argument("--report", action="store_true", help="only rewrite README.md from results.jsonl")
    ap.add_argument("--reuse", action="store_true",
                    help="a row whose run dir under --out holds a finished run: export and Lava again, no training")
    ap.add_argument("--no-precheck", dest="precheck", action="store_false",
                    help="train a preset whose export neurofed run refuses anyway")
    ap.add_argument("--stock-compare", default="fedsnn_cifar10_iid", metavar="PRESET",
                    help="the row that also times Lava's stock Conv model against im2col (default fedsnn_cifar10_iid)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per neurofed run")
    ap.add_argument("--seeds", default=None, metavar="S1,S2",
                    help="instead of the rows: each row's QAT run and float twin again with these seeds (no export, "
                         "no Lava), added to the saved row")
    args = ap.parse_args(argv)
    if args.report:
        save([], "")
        return 0
    only = args.only.split(",") if args.only else list(ROWS)
    unknown = [p for p in only if p not in ROWS]
    if unknown:
        print(f"deploy_presets: --only {','.join(unknown)}: no such row; allowed: {', '.join(ROWS)}", file=sys.stderr)
        return 2
    rep = Report()
    header = machine_header("deploy_presets") + "\n# command: python benchmarks/deploy_presets.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    rep.emit(header)
    tmp = None if args.out else tempfile.mkdtemp(prefix="neurofed-deploy-")
    out = Path(args.out or tmp)
    rows = []
    try:
        if args.seeds:  # extra seeds join the saved rows
            saved = {} if not (RESULTS / "results.jsonl").is_file() else {
                json.loads(l)["preset"]: json.loads(l) for l in (RESULTS / "results.jsonl").read_text().splitlines()
                if l.strip()}
            for preset in only:
                row = {**saved.get(preset, {"preset": preset})}
                row["seeds"] = {**row.get("seeds", {}), **{str(sd): seed_runs(preset, int(sd), out, args, rep)
                                                            for sd in args.seeds.split(",")}}
                if args.save and "status" in row:  # only a row that has been run
                    save([row], "")
            return 0
        for preset in only:
            rows.append(run_row(preset, out, args, rep))
            if args.save:  # each row as it ends: a stopped table keeps its rows
                save([rows[-1]], header)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(r["status"] == "ok" or r["status"].startswith("refused") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))