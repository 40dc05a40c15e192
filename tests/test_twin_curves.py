"""benchmarks/twin_curves.py: a preset without files trains on its stand-in, and the table
gives each SNN its ANN twin's lead at the last epoch both ran, from the latest record;
benchmarks/fit_check.py counts ties."""

import json

import pytest


@pytest.fixture
def bench(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import twin_curves

    return twin_curves


def test_without_files_a_preset_trains_on_its_stand_in(bench):
    assert bench.data_override("sfedca_fashion_mnist_dir03", None) == "data.name=standin_fashion_mnist"
    assert bench.data_override("sfedca_mnist_dir03", "/data/mnist") == "data.root=/data/mnist"
    assert bench.data_override("digits_fedavg", None) == "data.name=digits"  # embedded: needs no stand-in


def test_the_table_reads_the_latest_pair_and_the_twins_lead(bench, tmp_path):
    def row(kind, accuracy):
        return {"preset": "p", "arm": "preset", "kind": kind, "accuracy": accuracy, "epoch_s": [1.0]}

    records = [row("snn", [0.1]), row("snn", [0.5, 0.7]), row("ann", [0.6, 0.75, 0.8])]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    latest = bench.recorded(tmp_path)
    assert [(r["kind"], r["accuracy"]) for r in latest] == [("snn", [0.5, 0.7]), ("ann", [0.6, 0.75, 0.8])]
    snn_line = next(line for line in bench.table(latest, 1) if "| SNN |" in line)
    assert "+5.00 (epoch 2)" in snn_line and "| 50.00 | 70.00 | — |" in snn_line
    assert snn_line.endswith("| ? |")  # a record without its CPU does not take the writer's


def test_a_row_names_the_cpu_its_run_trained_on(bench, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"environment": {"cpu": "Some ARM board"}}))
    assert bench.run_cpu(tmp_path) == "Some ARM board"
    assert bench.run_cpu(tmp_path / "absent") == "?"
    row = {"preset": "p", "arm": "preset", "kind": "snn", "accuracy": [0.5], "epoch_s": [1.0],
           "recorded": "2026-11-29 13:55:04", "cpu": "Some ARM board"}
    assert bench.table([row], 1)[-1].endswith("| 2026-11-29 | Some ARM board |")


def test_fit_check_counts_ties_and_the_wrong_answers_among_them(monkeypatch):
    from pathlib import Path

    import torch

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fit_check

    logits = torch.tensor([[3.0, 3.0, 1.0],   # tied, label 1 among the tied, argmax takes 0: wrong
                           [0.0, 2.0, 2.0],   # tied, label 1 among the tied, argmax takes 1: right
                           [5.0, 1.0, 0.0],   # clear, right
                           [1.0, 4.0, 0.0]])  # clear, wrong
    s = fit_check.scores(logits, torch.tensor([1, 1, 0, 2]))
    assert (s["accuracy"], s["tied"], s["wrong_in_tie"]) == (50.0, 50.0, 25.0)
    assert s["ties_split"] == 100 * (0.5 + 0.5 + 1 + 0) / 4  # a coin is right half the time on each tie


def test_arms_only_needs_an_arm(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--preset", "sfedca_fashion_mnist_dir03", "--out", str(tmp_path), "--arms-only"])
    assert "--arms-only needs at least one --arm" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any run started


def test_a_twin_run_alone_is_set_against_the_presets_snn(bench):
    def row(arm, kind, accuracy):
        return {"preset": "p", "arm": arm, "kind": kind, "accuracy": accuracy, "epoch_s": [1.0]}

    rows = [row("preset", "snn", [0.5, 0.7]), row("preset", "ann", [0.2, 0.3]), row("lsuv", "ann", [0.6, 0.9])]
    lines = bench.table(rows, 1)
    lsuv = next(line for line in lines if "| lsuv | ANN |" in line)
    assert "+20.00 (epoch 2, vs the preset's SNN)" in lsuv
    assert "-40.00 (epoch 2)" in next(line for line in lines if "| preset | SNN |" in line)


def test_kinds_are_checked_before_any_run(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--preset", "sfedca_fashion_mnist_dir03", "--out", str(tmp_path / "o"), "--kinds", "cnn"])
    assert "--kinds: got 'cnn'; allowed: a comma-separated subset of snn, ann" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_save_that_reads_a_recorded_run_again_adds_no_copy_of_it(bench, tmp_path):
    run = {"preset": "p", "arm": "a", "kind": "snn", "accuracy": [0.5, 0.7], "run_dir": "/runs/p-a-snn", "wall_s": 300.0}
    bench.record(tmp_path, [run])
    latest = bench.record(tmp_path, [{**run, "wall_s": 0.2}])  # the same folder, read, not run
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["wall_s"] == 300.0 and "recorded" in json.loads(lines[0])
    assert [r["accuracy"] for r in latest] == [[0.5, 0.7]]
    resumed = {**run, "accuracy": [0.5, 0.7, 0.8]}  # the same arm run on: a new record, and the latest
    assert [r["accuracy"] for r in bench.record(tmp_path, [resumed])] == [[0.5, 0.7, 0.8]]
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
