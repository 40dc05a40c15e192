"""A run's own record, trusted as it stands: post-training steps that cannot work are
refused up front and failed ones change the exit code (issue 34)."""

from __future__ import annotations

import csv
import json
import platform
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

import neurofed

from conftest import tiny_overrides
from neurofed.cli import main


def _run(tmp_path, *flags, name="run", **extra) -> tuple[int, dict]:
    out = tmp_path / name
    args = ["run", "examples/digits_fedavg.yaml", "--out", str(out), *flags]
    # stock SLAYER unless a test asks: no wait on the kernel build cache
    for item in tiny_overrides(**{"federation.rounds": 1, "energy.enabled": False, "federation.fast_kernels": False,
                                  **extra}):
        args += ["--set", item]
    rc = main(args)
    return rc, json.loads((out / "summary.json").read_text())


def test_export_of_an_unmappable_net_is_refused_once_before_training(tmp_path, capfd):
    """919f94d trained, then printed the refusal 16 times under an empty 'needs 0 cores'
    table, and recorded nothing. (A residual net exports now; a batch norm on a current with
    memory still cannot be mapped.)"""
    rc, summary = _run(tmp_path, "--verbose", **{"model.name": "resnet18", "model.width": 0.125, "export": True,
                                    "model.norm": "batch", "model.current_decay": 0.25, "lava.samples": 2})
    err = capfd.readouterr().err
    assert rc == 0  # the run did what it could; nothing failed
    assert err.count("batch norm's shift is a constant current") == 1 and "needs 0 cores" not in err
    assert err.index("cannot be exported") < err.index("training on")  # said at the start
    assert summary["after_training"]["export"]["status"] == "refused"
    assert summary["after_training"]["lava"] == {"status": "refused", "reason": "needs the netx export"}
    assert not (tmp_path / "run" / "model.net").exists()


@pytest.mark.slow
def test_a_failed_lava_step_is_recorded_and_makes_the_exit_code_non_zero(tmp_path, capfd):
    """A 5-layer cnn at T=4 exports, but Lava cannot run it: 919f94d exited 0."""
    rc, summary = _run(tmp_path, "--quiet", **{"model.name": "cnn", "model.width": 0.125, "export": True, "lava.samples": 2})
    assert rc == 1
    steps = summary["after_training"]
    assert steps["export"] == {"status": "ok"} and (tmp_path / "run" / "model.net").exists()
    assert steps["lava"]["status"] == "failed" and "timesteps is 4" in steps["lava"]["error"]
    assert "lava step(s) failed" in capfd.readouterr().err


# ----------------------------------------------------------------------------- logging (item 4)

def test_run_log_holds_the_info_messages_with_timestamps_and_the_console_only_warnings(tmp_path, capfd):
    """919f94d configured no logging: every INFO message was lost and no run.log existed."""
    rc, _ = _run(tmp_path, "--quiet", name="quiet", **{"federation.ldp_laplace": 0.01})
    err = capfd.readouterr().err
    log = (tmp_path / "quiet" / "run.log").read_text().splitlines()
    assert rc == 0
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO neurofed\.fl\.runner: round 1: accuracy", log[-2])
    assert any(" WARNING " in line and "no epsilon holds" in line for line in log)  # a note: both places
    assert "no epsilon holds" in err and "round 1: accuracy" not in err and "training on" not in err
    rc, _ = _run(tmp_path, "--verbose", name="verbose")
    assert "neurofed: round 1: accuracy" in capfd.readouterr().err


# ----------------------------------------------------------------------------- stamps (item 5)

def test_summary_is_stamped_with_versions_commit_kernels_and_cpu_class(tmp_path, capsys):
    rc, summary = _run(tmp_path, "--quiet")
    env = summary["environment"]
    assert env["neurofed"] == neurofed.__version__ and env["torch"] == torch.__version__
    assert env["python"] == platform.python_version() and env["cpu"] and env["lava_dl"] and env["lava_nc"]
    assert env["isa"] in ("avx512_vnni", "avx512", "avx2", "sse4.2", "baseline", platform.machine())
    root = Path(neurofed.__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # run from a checkout
        assert env["git_commit"].split("+")[0] == head.stdout.strip()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])  # 919f94d: "the following arguments are required: command", exit 2
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"neurofed {neurofed.__version__}")


def test_the_kernel_variant_is_the_one_loaded(tmp_path):
    from neurofed import kernels

    rc, summary = _run(tmp_path, "--quiet", **{"federation.fast_kernels": True})
    assert kernels.is_enabled()  # (if the build failed, the stamp must say None: stock SLAYER)
    assert summary["environment"]["kernel_variant"] == kernels.variant() in kernels.VARIANTS


# ----------------------------------------------------------------------------- progress (item 6)

def test_progress_inside_a_round_shows_clients_and_batches_and_quiet_shows_none(tmp_path, capfd, monkeypatch):
    """919f94d drew one bar of rounds: nothing moved within a round. Bars are drawn on a
    terminal only (tests/test_console.py); here stderr counts as one."""
    from neurofed import progress

    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    rc, _ = _run(tmp_path, name="shown", **{"partition.num_clients": 2, "federation.clients_per_round": 2})
    err = capfd.readouterr().err
    assert re.search(r"round 1 clients: .*\| 2/2 \[", err)  # both clients' training counted
    assert re.search(r"batches: .*\| \d+/\d+ \[", err)
    rc, _ = _run(tmp_path, "--quiet", name="quiet")
    err = capfd.readouterr().err  # warnings (the run's health) may remain; no bar does
    assert "rounds:" not in err and "clients:" not in err and "batches:" not in err


# ----------------------------------------------------------------------------- TensorBoard (item 7)

def test_tensorboard_event_files_hold_each_rounds_metrics_and_the_energy(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rc, _ = _run(tmp_path, **{"federation.rounds": 2, "energy.enabled": True, "log.tensorboard": True})
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    energy = json.loads((tmp_path / "run" / "energy.json").read_text())
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    for tag, key in (("test/accuracy", "accuracy"), ("test/loss", "loss"), ("test/firing_rate", "firing_rate")):
        assert scalars[tag] == [(m["round"], pytest.approx(m[key])) for m in metrics]
    assert scalars["test/firing_rate_layer/0"][-1][1] == pytest.approx(metrics[-1]["layer_firing_rates"][0])
    cumulative = energy["training"]["snn_cumulative_j"]
    assert [v for _, v in scalars["energy/train_snn_j"]] == pytest.approx(
        [cumulative[0], cumulative[1] - cumulative[0]], rel=1e-6)
    for name, p in energy["profiles"].items():
        if p.get("snn_energy_j") is not None:
            assert scalars[f"energy/inference_snn_j/{name}"] == [(2, pytest.approx(p["snn_energy_j"], rel=1e-6))]
    # off by default: no event files
    _run(tmp_path, name="plain")
    assert not (tmp_path / "plain" / "tensorboard").exists()


# ----------------------------------------------------------------------------- one model, one number (8, 9)

@pytest.fixture(scope="module")
def energy_run(tmp_path_factory):
    """Two rounds with export, a 6-sample Lava run and the energy step (default profiles)."""
    tmp = tmp_path_factory.mktemp("energy")
    rc, summary = _run(tmp, "--quiet", **{"federation.rounds": 2, "energy.enabled": True, "export": True,
                                          "lava.samples": 6})
    assert rc == 0
    return tmp / "run", summary


def test_every_accuracy_names_its_samples_and_input_draw(energy_run, capsys):
    from neurofed.data import load_dataset

    out, summary = energy_run
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    n = len(load_dataset(cfg["data"], cfg["seed"]).y_test)
    assert summary["accuracy_measured_on"] == {"split": "test", "samples": n, "of": n, "first": False,
                                               "input_draw": "eval"}
    lava = json.loads((out / "lava.json").read_text())
    assert lava["accuracy_measured_on"] == {"split": "test", "samples": 6, "of": n, "first": True,
                                            "input_draw": "lava"}
    # `neurofed energy --samples 10`: its accuracy is on 10 samples and says so, beside the run's
    assert main(["energy", str(out), "--samples", "10"]) == 0
    printed = capsys.readouterr().out
    energy = json.loads((out / "energy.json").read_text())
    assert energy["accuracy_measured_on"]["samples"] == 10
    assert f"on the same samples (first 10 of {n} test samples, rate spikes of draw 'eval')" in printed
    assert (f"the run's final accuracy {100 * summary['final_accuracy']:.1f}% (summary.json) is on all {n} "
            "test samples") in printed
    # energy-report: the accuracy beside the energies is the one measured on their samples
    assert main(["energy-report", str(out), "--out", str(out.parent / "report")]) == 0
    with (out.parent / "report" / "energy_report.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["accuracy"] for r in rows} == {str(energy["accuracy"])}  # 919f94d: summary's final_accuracy
    assert {r["accuracy_on"] for r in rows} == {f"10/{n} test, draw eval"}


def test_energy_lines_say_what_each_figure_is(energy_run):
    from neurofed.energy.report import energy_for_run
    from neurofed.energy.text import format_summary

    out, _ = energy_run
    exact = energy_for_run(out, samples=20, write=False, plots=False)
    text = format_summary(exact)
    assert "(approx" not in text and "with the papers' MACs x rate x T for synaptic ops" in text
    assert "energies: convention exact" in text
    loihi2 = next(line for line in text.splitlines() if line.startswith("loihi2"))
    assert "SNN not priced: loihi2 publishes no per-operation energies" in loihi2
    for name, p in exact["profiles"].items():  # every ANN/SNN below 1 is explained
        if p.get("ann_over_snn") is not None and p["ann_over_snn"] < 1:
            line = next(l for l in text.splitlines() if l.startswith(name))
            assert f"the SNN costs {1 / p['ann_over_snn']:.1f}x the ANN" in line and "cmos45_int's MAC" in line
    paper = format_summary(energy_for_run(out, samples=20, convention="paper", write=False, plots=False))
    assert "energies: convention paper (fedsnn's formula" in paper
