"""The sweep runner: grids of real runs, results tables that agree with the runs,
failures recorded without stopping the grid, resume, and sweep-file validation."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from neurofed.config import ConfigError
from neurofed.sweep import load_sweep, point_configs, report, run_sweep

# A run of a few seconds on embedded digits (as tests/conftest.py's tiny_overrides).
TINY_BASE = {
    "data": {"name": "digits", "timesteps": 4},
    "partition": {"scheme": "iid", "num_clients": 4},
    "model": {"name": "mlp", "width": 0.25},
    "federation": {"rounds": 1, "clients_per_round": 2, "local_epochs": 1, "batch_size": 64, "lr": 0.003,
                   "fast_kernels": False},  # no dependence on the kernel build cache
    "export": False,
    "energy": {"enabled": False},  # on only where a test reads energy.json
}


def write_sweep(folder: Path, **sweep) -> Path:
    """A base config ``base.yaml`` and a sweep file ``sweep.yaml`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(TINY_BASE))
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", **sweep}, sort_keys=False))
    return path


def read_csv(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """Two points (learning rates) x two seeds, run in-process."""
    folder = tmp_path_factory.mktemp("grid")
    path = write_sweep(folder, set={"energy.enabled": True}, grid={"federation.lr": [0.003, 0.01]}, seeds=[0, 1],
                       target_accuracy=0.2,
                       plots=[{"kind": "bars", "x": "federation.lr"}, {"kind": "curves", "x": "federation.lr"},
                              {"kind": "rounds", "hue": "federation.lr", "name": "curves_by_round"}])
    rows = run_sweep(path, out=folder / "out", workers=1, progress=False)
    return path, folder / "out", rows


def test_grid_runs_every_point_and_seed_and_the_table_matches_the_runs(finished_sweep):
    _, out, rows = finished_sweep
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["lr=0.003-seed0", "lr=0.003-seed1", "lr=0.01-seed0", "lr=0.01-seed1"]
    table = read_csv(out / "results.csv")
    assert [r["point"] for r in table] == ["lr=0.003", "lr=0.01"] == [r["point"] for r in rows]
    for row in table:
        summaries = [json.loads((out / "runs" / f"{row['point']}-seed{s}" / "summary.json").read_text())
                     for s in (0, 1)]
        cfgs = [yaml.safe_load((out / "runs" / f"{row['point']}-seed{s}" / "config.yaml").read_text())
                for s in (0, 1)]
        assert [c["seed"] for c in cfgs] == [0, 1]
        assert {c["federation"]["lr"] for c in cfgs} == {float(row["federation.lr"])}
        assert row["seeds"] == "2" and row["failed"] == "0"
        for key in ("final_accuracy", "best_accuracy", "wall_time_s"):
            vals = [s[key] for s in summaries]
            assert float(row[key + "_mean"]) == pytest.approx(np.mean(vals), abs=1e-6)
            assert float(row[key + "_std"]) == pytest.approx(np.std(vals, ddof=1), rel=1e-5, abs=1e-9)
        energies = [json.loads((out / "runs" / f"{row['point']}-seed{s}" / "energy.json").read_text())
                    for s in (0, 1)]  # the energy columns come from the runs' energy.json
        for key in ("snn_energy_j", "ann_energy_j"):
            assert float(row[key + "_mean"]) == pytest.approx(np.mean([e[key] for e in energies]), rel=1e-5)
    md = (out / "results.md").read_text()
    assert "| 0.003 | 2 |" in md and "rounds to 20%" in md
    assert len(read_csv(out / "runs.csv")) == 4
    for name in ("01_bars_final_accuracy_by_lr", "02_curves_final_accuracy_by_lr", "curves_by_round"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_report_rebuilds_tables_and_plots_from_the_runs(finished_sweep):
    from neurofed.cli import main

    _, out, rows = finished_sweep
    before = (out / "results.csv").read_text()
    for f in ("results.csv", "results.md"):
        (out / f).unlink()
    for png in (out / "plots").glob("*.png"):
        png.unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "results.csv").read_text() == before
    assert len(list((out / "plots").glob("*.png"))) == 3


def test_report_without_runs_refuses_and_keeps_the_committed_tables(tmp_path, capsys):
    """A copy of a committed results folder (no runs/ inside): 919f94d rewrote every row as
    "—" and exited 0; now nothing is touched and the exit code says so."""
    from neurofed.cli import main

    src = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "selection"
    shutil.copytree(src, tmp_path / "sel")
    before = {p.name: p.read_bytes() for p in (tmp_path / "sel").iterdir() if p.is_file()}
    assert main(["report", str(tmp_path / "sel")]) == 2
    assert "no runs to read" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (tmp_path / "sel").iterdir() if p.is_file()} == before


def test_report_never_replaces_a_table_with_fewer_seeds(finished_sweep, tmp_path, capsys):
    from neurofed.cli import main

    _, out, _ = finished_sweep
    shutil.copytree(out, tmp_path / "out")
    shutil.rmtree(tmp_path / "out" / "runs" / "lr=0.01-seed1")  # one run's directory lost
    before = (tmp_path / "out" / "results.csv").read_text()
    assert main(["report", str(tmp_path / "out")]) == 2
    assert "lr=0.01 (1 < 2)" in capsys.readouterr().err
    assert (tmp_path / "out" / "results.csv").read_text() == before
    (tmp_path / "out" / "results.csv").unlink()  # the way to rebuild from what is left
    assert main(["report", str(tmp_path / "out")]) == 0
    assert [r["seeds"] for r in read_csv(tmp_path / "out" / "results.csv")] == ["2", "1"]


def test_resume_skips_finished_runs_and_continues_interrupted_ones(finished_sweep, tmp_path):
    import shutil

    path, out0, _ = finished_sweep
    out = tmp_path / "out"
    shutil.copytree(out0, out)
    runs = sorted((out / "runs").iterdir())
    stamps = {r.name: (r / "summary.json").stat().st_mtime_ns for r in runs}
    metrics = {r.name: (r / "metrics.jsonl").read_text() for r in runs}

    # without --resume an existing sweep directory is refused before anything runs
    with pytest.raises(ConfigError, match="already holds runs.*--resume"):
        run_sweep(path, out=out, workers=1, progress=False)

    rows = run_sweep(path, out=out, workers=1, progress=False, resume=True)
    assert {r.name: (r / "summary.json").stat().st_mtime_ns for r in runs} == stamps
    assert all(r["seeds"] == 2 for r in rows)

    # more rounds: every run continues from its checkpoint; round 1 is kept, not redone
    # (energy is not part of the config a resume must match)
    sweep = yaml.safe_load(path.read_text())
    sweep["set"] = {"federation.rounds": 2, "energy.enabled": False}
    path2 = path.with_name("sweep_more.yaml")
    path2.write_text(yaml.safe_dump(sweep))
    run_sweep(path2, out=out, workers=1, progress=False, resume=True)
    for r in runs:
        lines = (r / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2 and lines[0] == metrics[r.name].splitlines()[0]

    # a changed config (other than rounds) cannot be resumed into the same directory
    sweep["set"] = {"federation.rounds": 2, "energy.enabled": False, "federation.batch_size": 32}
    path2.write_text(yaml.safe_dump(sweep))
    with pytest.raises(ConfigError, match="different config"):
        run_sweep(path2, out=out, workers=1, progress=False, resume=True)


def test_a_failing_point_is_recorded_and_the_others_finish(tmp_path):
    # 5000 clients > 1347 training samples passes config validation but fails when the
    # run partitions the data; worker processes (spawn) run the two points.
    path = write_sweep(tmp_path, zip={"partition.num_clients": [5000, 4], "federation.clients_per_round": [1, 2]},
                       seeds=[0])
    rows = run_sweep(path, out=tmp_path / "out", workers=2, progress=False)
    bad, good = (tmp_path / "out" / "runs" / f"{p}-seed0" for p in
                 ("num_clients=5000,clients_per_round=1", "num_clients=4,clients_per_round=2"))
    assert (good / "summary.json").exists()
    assert not (bad / "summary.json").exists()
    assert "partition.num_clients" in (bad / "error.txt").read_text().splitlines()[0]
    assert [(r["seeds"], r["failed"]) for r in rows] == [(0, 1), (1, 0)]
    table = read_csv(tmp_path / "out" / "results.csv")
    assert "partition.num_clients" in table[0]["errors"] and table[1]["errors"] == ""
    assert "Failed runs" in (tmp_path / "out" / "results.md").read_text()

    # --resume retries the failed run (and only it)
    stamp = (good / "summary.json").stat().st_mtime_ns
    rows = run_sweep(path, out=tmp_path / "out", workers=1, progress=False, resume=True)
    assert (good / "summary.json").stat().st_mtime_ns == stamp
    assert rows[0]["failed"] == 1 and (bad / "error.txt").exists()


def test_a_point_whose_step_failed_is_shown_and_resume_runs_it_again(tmp_path, monkeypatch):
    """Training finished but a step after it failed (here the energy report, as on a full
    disk): the point is failed in results.md, not done, and --resume runs the step again."""
    from neurofed import pipeline

    def full_disk(out, cfg, exp):
        raise OSError("[Errno 28] No space left on device: 'energy.json'")

    path = write_sweep(tmp_path, set={"energy.enabled": True}, grid={"federation.lr": [0.003, 0.01]}, seeds=[0])
    energy = pipeline._energy
    monkeypatch.setattr(pipeline, "_energy", lambda out, cfg, exp: (full_disk if cfg["federation"]["lr"] == 0.01
                                                                    else energy)(out, cfg, exp))
    rows = run_sweep(path, out=tmp_path / "out", workers=1, progress=False)
    assert [(r["seeds"], r["failed"]) for r in rows] == [(1, 0), (0, 1)]
    assert "energy step failed: OSError" in rows[1]["errors"][0]
    md = (tmp_path / "out" / "results.md").read_text()
    assert "Failed runs" in md and "lr=0.01-seed0" in md and "No space left" in md
    assert "energy step failed" in read_csv(tmp_path / "out" / "runs.csv")[1]["error"]

    monkeypatch.setattr(pipeline, "_energy", energy)  # the disk has room again
    bad = tmp_path / "out" / "runs" / "lr=0.01-seed0"
    metrics = (bad / "metrics.jsonl").read_text()
    rows = run_sweep(path, out=tmp_path / "out", workers=1, progress=False, resume=True)
    assert [(r["seeds"], r["failed"]) for r in rows] == [(1, 0), (1, 0)]
    assert (bad / "energy.json").is_file() and (bad / "metrics.jsonl").read_text() == metrics  # rounds kept
    assert "Failed runs" not in (tmp_path / "out" / "results.md").read_text()


def test_zip_keys_vary_together_and_each_point_config_is_the_base_plus_overrides(tmp_path):
    path = write_sweep(tmp_path, set={"federation.local_epochs": 2},
                       grid={"model.kind": ["snn", "ann"]},
                       zip={"partition.num_clients": [1, 20], "federation.clients_per_round": [1, 5]},
                       seeds=[3, 4])
    sweep = load_sweep(path)
    assert [p.id for p in sweep.points] == [
        "kind=snn,num_clients=1,clients_per_round=1", "kind=snn,num_clients=20,clients_per_round=5",
        "kind=ann,num_clients=1,clients_per_round=1", "kind=ann,num_clients=20,clients_per_round=5"]
    configs = point_configs(sweep)
    assert len(configs) == 8
    cfg = configs["kind=ann,num_clients=20,clients_per_round=5-seed4"]
    assert (cfg["model"]["kind"], cfg["partition"]["num_clients"], cfg["federation"]["clients_per_round"],
            cfg["seed"]) == ("ann", 20, 5, 4)
    assert cfg["federation"]["local_epochs"] == 2 and cfg["model"]["name"] == "mlp"  # set + base


@pytest.mark.parametrize("sweep, message", [
    ({"gird": {"federation.lr": [0.1]}}, r"gird: unknown sweep key; allowed: name, description, base"),
    ({"base": "missing.yaml"}, r"base: config file .*missing.yaml' not found"),
    ({"grid": {"federation.lr": 0.1}}, r"grid.federation.lr: expected a non-empty list"),
    ({"zip": {"partition.num_clients": [1, 2], "federation.clients_per_round": [1]}}, r"zip: .*equal lengths"),
    ({"set": {"federation.lr": 0.1}, "grid": {"federation.lr": [0.1, 0.2]}},
     r"grid.federation.lr: also given in set"),
    ({"grid": {"seed": [0, 1]}}, r"grid.seed: the seed is set per run by seeds"),
    ({"seeds": [0, -1]}, r"seeds: expected a non-empty list of integers >= 0"),
    ({"grid": {"federation.lr": [0.1, 0.1]}}, r"grid federation.lr: value 0.1 is listed twice"),
    ({"grid": {"federation.lr": [0.1, -1.0]}}, r"point lr=-1: federation.lr: got -1.0; expected > 0"),
    ({"grid": {"federation.lrr": [0.1, 0.2]}}, r"point lrr=0.1 \(and 1 more\): federation.lrr: unknown key"),
    ({"grid": {"federation.lr": [0.1]}, "plots": [{"kind": "bars", "x": "model.kind"}]},
     r"plots\[0\].x: got 'model.kind'; expected a key the grid varies \(federation.lr\)"),
    ({"grid": {"federation.lr": [0.1], "model.kind": ["snn", "ann"]}, "plots": [{"kind": "bars", "x": "federation.lr"}]},
     r"plots\[0\]: model.kind varies but is not x, hue or panels"),
    ({"grid": {"federation.lr": [0.1]}, "plots": [{"kind": "pie", "x": "federation.lr"}]},
     r"plots\[0\].kind: got 'pie'; allowed: bars, curves, rounds"),
])
def test_sweep_file_errors_name_the_key_before_anything_runs(tmp_path, sweep, message):
    path = write_sweep(tmp_path, **sweep)
    with pytest.raises(ConfigError, match=message) as info:
        run_sweep(path, out=tmp_path / "out", workers=1, progress=False)
    assert all(line.startswith("sweep.yaml: ") for line in str(info.value).splitlines())
    assert not (tmp_path / "out").exists()


def test_cli_reports_sweep_file_errors_as_one_line(tmp_path, capsys):
    from neurofed.cli import main

    path = write_sweep(tmp_path, grid={"federation.optimizer": ["adam", "lion"]})
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["neurofed: error: sweep.yaml: point optimizer=lion: federation.optimizer: got 'lion'; "
                   "allowed: adam, sgd"]
    assert main(["report", str(tmp_path)]) == 2  # not a sweep directory


def test_sweep_set_overrides_every_run_and_refuses_a_varied_key(tmp_path):
    from neurofed.sweep.grid import with_overrides

    path = write_sweep(tmp_path, set={"federation.local_epochs": 2}, grid={"federation.lr": [0.003, 0.01]})
    sweep = with_overrides(load_sweep(path), ["federation.local_epochs=3", "federation.batch_size=16"])
    configs = point_configs(sweep)
    assert {(c["federation"]["local_epochs"], c["federation"]["batch_size"]) for c in configs.values()} == {(3, 16)}
    assert sorted(c["federation"]["lr"] for c in configs.values()) == [0.003, 0.01]  # the grid still varies
    for item, message in [("federation.lr=0.1", r"federation.lr is varied by the sweep's grid"),
                          ("federation=x", r"federation is varied by the sweep's grid"),
                          ("seed=3", r"the seeds of a sweep are its seeds"), ("federation.lr", r"expected KEY=VALUE")]:
        with pytest.raises(ConfigError, match=message):
            with_overrides(load_sweep(path), [item])


def test_cli_sweep_set_reaches_the_runs_and_sweep_json(tmp_path):
    from neurofed.cli import main

    path = write_sweep(tmp_path, grid={"federation.lr": [0.003]})
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--quiet", "--set", "federation.rounds=2"]) == 0
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["set"] == {"federation.rounds": 2}
    rounds = (tmp_path / "out" / "runs" / "lr=0.003-seed0" / "metrics.jsonl").read_text().splitlines()
    assert len(rounds) == 2


def test_a_grid_of_algorithms_drops_the_base_algorithm_keys_the_others_do_not_read(tmp_path, caplog):
    # the base is SFedHIFI with one of its own keys; the grid's other rows are its baselines
    path = write_sweep(tmp_path, grid={"algorithm.name": ["sfedhifi", "hetero_fedavg", "hetero_fednova"]})
    base = yaml.safe_load((tmp_path / "base.yaml").read_text())
    base["model"] = {"name": "hifi_cnn_digits", "width": 1.0}
    base["algorithm"] = {"name": "sfedhifi", "fusion_until": 3, "orth_lambda": 0.5}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    configs = point_configs(load_sweep(path))
    by_name = {c["algorithm"]["name"]: c["algorithm"] for c in configs.values()}
    assert by_name["sfedhifi"]["fusion_until"] == 3
    for name in ("hetero_fedavg", "hetero_fednova"):
        assert "fusion_until" not in by_name[name] and by_name[name]["orth_lambda"] == 0.5  # shared keys kept
    assert "does not read the file's algorithm.fusion_until; ignored" in caplog.text


def test_default_workers_never_oversubscribe_the_cores():
    from neurofed.sweep import default_workers

    cores = len(os.sched_getaffinity(0))
    workers, threads = default_workers()
    assert workers >= 1 and threads >= 1 and workers * threads <= max(cores, 1)
