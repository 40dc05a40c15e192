"""benchmarks/paper_tables.py: every cell is a valid config of its split's preset, the paper's
figures cover every cell, and a run folder is read into rounds to target and accuracies."""

import json

import pytest

from neurofed.config import load_config
from neurofed.presets import presets


@pytest.fixture
def bench(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import paper_tables

    return paper_tables


def test_every_cell_is_its_splits_preset_at_the_papers_scale_with_the_methods_settings(bench):
    paper, known = bench.load_paper(), presets()
    for split, column in paper["splits"].items():
        for method, (_, sets) in bench.METHODS.items():
            cfg = load_config(known[column["preset"]], overrides=["data.root=/nonexistent", *sets])
            fed, part = cfg["federation"], cfg["partition"]
            assert (part["num_clients"], fed["clients_per_round"], fed["local_epochs"], fed["batch_size"]) == (100, 2, 5, 128)
            assert (fed["optimizer"], fed["lr"], cfg["data"]["timesteps"]) == ("sgd", 0.1, 12)
            assert cfg["model"]["kind"] == ("ann" if method == "fedavg_ann" else "snn")
            assert fed["target_accuracy"] == column["target"], split  # Table 3's column target
            row = bench.paper_row(method)  # a variant is read against the row it stands in for
            assert row in paper["final_accuracy"] and split in paper["final_accuracy"][row]
            assert split in paper["rounds_to_target"][row]
            assert cfg["algorithm"]["name"] == ("sfedca" if method == "sfedca" else row if row in ("divfl", "fedmos")
                                                else "fedavg")
    assert bench.PAPER_ROWS == ["fedsnn", "sfedca", "divfl", "fedmos", "fedavg_ann"]  # the order
    uniform = load_config(known["sfedca_mnist_dir03"], overrides=["data.root=/nonexistent", *bench.METHODS["fedsnn_uniform"][1]])
    assert uniform["algorithm"]["weighting"] == "uniform" and bench.paper_row("fedsnn_uniform") == "fedsnn"


def test_a_run_folder_is_read_into_rounds_to_target_and_accuracies(bench, tmp_path):
    run = tmp_path / "dir03-sfedca"
    run.mkdir()
    accuracies = [0.5, 0.85, 0.91, 0.88, 0.93]
    lines = [json.dumps({"round": i + 1, "accuracy": a, "wall_time_s": 2.0, "time_train_s": 1.5,
                         "trained": list(range(10))}) for i, a in enumerate(accuracies)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n{\"round\": 6, \"accur")  # a cut last line
    row = bench.summarize("dir03", "sfedca", run, bench.load_paper())
    assert row["rounds_run"] == 5 and row["rounds_to_target"] == 3 and row["final_accuracy"] == 0.93
    assert row["best_accuracy"] == 0.93 and row["rounds_to"]["0.95"] is None and row["rounds_to"]["0.85"] == 2
    assert row["paper_rounds_to_target"] == 55 and row["paper_final"] == 96.37  # SFedCA, MNIST Dir(0.3)
    assert "| 5 | 3 (55) |" in bench.table([row], bench.load_paper())[2]


def test_an_unknown_method_is_refused_naming_the_allowed_ones(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--root", str(tmp_path), "--out", str(tmp_path), "--methods", "fedsnn,fedcat"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "fedcat" in err and "sfedca" in err and "fedavg_ann" in err


def test_a_sigterm_to_the_benchmark_stops_its_run_which_then_resumes(tmp_path):
    # pkill -f on paper_tables.py once left its `neurofed run` child training; a resume then
    # ran a second one on the same folder. The run-folder lock tells whether the child is gone.
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from conftest import tiny_overrides

    root = Path(__file__).resolve().parents[1]
    out, log = tmp_path / "run", tmp_path / "run.log"
    sets = tiny_overrides(**{"energy.enabled": False})
    driver = ("import sys; sys.path.insert(0, sys.argv[1]); import common; common.stop_runs_with_the_benchmark(); "
              "sys.exit(common.run_to('digits_fedavg', sys.argv[2], 10_000, sys.argv[4:], sys.argv[3]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    bench = subprocess.Popen([sys.executable, "-c", driver, str(root / "benchmarks"), str(out), str(log), *sets],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()):
        assert bench.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:] if log.exists() else "no log"
        time.sleep(0.2)
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=120) == 128 + signal.SIGTERM
    text = metrics.read_text()
    done = len(text.splitlines()[: None if text.endswith("\n") else -1])
    more = [a for kv in sets for a in ("--set", kv)] + ["--set", f"federation.rounds={done + 1}"]
    resumed = subprocess.run([sys.executable, "-m", "neurofed.cli", "run", "digits_fedavg", *more, "--out", str(out),
                              "--resume", "--quiet"], capture_output=True, text=True, timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]  # 2 with "another neurofed run" while the child lives


def test_a_record_grown_one_method_at_a_time_keeps_every_method_in_its_table(bench, tmp_path, monkeypatch):
    """Saving SFedCA alone into a record that holds FedSNN's row (its run folder gone) keeps
    FedSNN's latest row of that seed in table.md beside SFedCA's fresh one."""
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "records")
    paper = bench.load_paper()

    def folder(out, method, accuracies):
        run = out / f"dir03-{method}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"round": i + 1, "accuracy": a, "trained": [0, 1]}) + "\n"
                                                   for i, a in enumerate(accuracies)))

    first, later = tmp_path / "first", tmp_path / "later"
    folder(first, "fedsnn", [0.5, 0.92, 0.95])
    folder(first, "sfedca", [0.6, 0.8])
    folder(later, "sfedca", [0.6, 0.8, 0.91, 0.93])
    args = ["--root", str(tmp_path), "--splits", "dir03", "--read", "--save", "--record", "r", "--seed", "4"]
    assert bench.main([*args, "--out", str(first), "--methods", "fedsnn,sfedca"]) == 0
    assert bench.main([*args, "--out", str(later), "--methods", "sfedca"]) == 0
    rows = [l for l in (tmp_path / "records" / "r" / "table.md").read_text().splitlines() if l.startswith("| Dir(0.3)")]
    assert len(rows) == 2 and "FedSNN" in rows[0] and "| 3 | 2 (99) |" in rows[0]  # carried, as recorded
    assert "SFedCA" in rows[1] and "| 4 | 3 (55) |" in rows[1]  # the fresh read of the resumed run
    assert "carried from the record" in (tmp_path / "records" / "r" / "table.md").read_text()
    assert (tmp_path / "records" / "r" / "curves.png").stat().st_size > 0
    assert paper["rounds_to_target"]["fedsnn"]["dir03"] == 99
