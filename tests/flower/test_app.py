"""neurofed.flower.app: the Flower app end to end — in Flower's simulation engine (Ray), through
``flwr run``, and as the app bundle (FAB) — equals the in-process runner."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

# flower_helpers first: it turns Flower's telemetry off before flwr is imported
from flower_helpers import (BIN, REPO, assert_server_ran_fast_kernels, env_for, flwr_run, loopback, processes,
                            read_run, reference, same_records, simulate, start_superlink, tiny_set)
from neurofed.flower.loopback import free_ports
from neurofed.config import load_config
from neurofed import rundir


def test_fedavg_in_flower_simulation_equals_the_in_process_runner(tmp_path, processes):
    """FedAvg, 2 rounds, 4 clients, 2 per round: the same global parameters (bit for
    bit) and the same metrics lines, in process and in Flower's simulation engine."""
    neurofed_set = tiny_set()
    out = simulate(tmp_path, processes, "flower", neurofed_set)
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    assert [l["round"] for l in lines] == [1, 2] and all(len(l["trained"]) == 2 for l in lines)
    assert (out / "summary.json").exists() and (out / "plots" / "accuracy.png").exists()



@pytest.mark.slow
@pytest.mark.parametrize("algo", [{"algorithm.name": "scaffold"},
                                  {"algorithm.name": "sfedca", "algorithm.candidates": 3}])
def test_stateful_and_candidate_algorithms_in_flower_simulation_equal_the_runner(tmp_path, processes, algo):
    """SCAFFOLD (c_i in each node's Context.state across rounds) and SFedCA (S
    candidates train, the top P by ΔR are aggregated) give the runner's result."""
    neurofed_set = tiny_set(**algo, **{"federation.rounds": 3})
    params, lines = read_run(simulate(tmp_path, processes, "flower", neurofed_set))
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    if algo["algorithm.name"] == "sfedca":
        assert all(len(l["trained"]) == 3 and len(l["aggregated"]) == 2 for l in lines)



def test_sfedhifi_in_flower_simulation_equals_the_in_process_runner(tmp_path, processes):
    """SFedHIFI (one global model per width; each client downloads its width's model and
    uploads in that width's layout; banks averaged over all, mixes within width, HIFI
    fusion on the server) for 2 rounds: every width's global parameters and every
    metrics line equal the in-process runner's."""
    neurofed_set = tiny_set(**{"algorithm.name": "sfedhifi", "model.name": "hifi_cnn_digits", "model.width": 1.0,
                               "algorithm.widths": "[0.5,1.0]", "algorithm.rate_samples": 16,
                               "algorithm.selection": "cover_widths"})  # both widths every round
    params, lines = read_run(simulate(tmp_path, processes, "flower", neurofed_set))
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    same_records(lines, ref_lines)
    widths = [rundir.load_state(tmp_path / d / "checkpoint.npz", "checkpoint")["server"]["widths"]
              for d in ("flower", "inprocess")]
    assert set(widths[0]) == {"0.5", "1"}
    for p in widths[0]:
        assert np.array_equal(widths[0][p]["params"], widths[1][p]["params"])
    assert np.array_equal(params, ref_params)
    assert all(l["clients_per_width"] == {"0.5": 1, "1": 1} and l["hifi_layer"] is not None for l in lines)
    assert set(lines[-1]["accuracy_per_width"]) == {"0.5", "1"}



@pytest.mark.slow
def test_flwr_run_simulation_matches_the_runner_and_reports_failures_in_flwr_ls(tmp_path, processes):
    neurofed_set = tiny_set()
    (port,) = free_ports(1)
    home = start_superlink(tmp_path, processes, port, simulation=True)
    sim = "num-supernodes=4 client-resources-num-cpus=1"
    out = tmp_path / "flower"
    status = flwr_run(home, f"neurofed-set='{neurofed_set}' out='{out}'", "--federation-config", sim)
    assert status == "finished:completed"
    params, lines = read_run(out)
    ref_params, ref_lines = reference(tmp_path, "inprocess", neurofed_set)
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
    # A broken config fails the run; `flwr run` still exits 0, `flwr ls` says so.
    bad = flwr_run(home, f"neurofed-set='{neurofed_set} federation.lr=-1' out='{tmp_path / 'bad'}'",
                   "--federation-config", sim)
    assert bad.startswith("finished:failed")



def test_the_app_bundle_holds_every_preset_and_its_neurofed_loads_the_installed_kernels(tmp_path):
    """``flwr build`` ships every example config (the paper presets and sweeps too) and
    hardware profile. Installed as Flower installs it (unpacked, first on sys.path), its
    neurofed compiles no kernels of its own: the FAB holds no C++ (flwr refuses it), so it
    loads the build of the installed neurofed's sources, the variant the run would use."""
    import zipfile

    from neurofed.kernels import variants

    # flwr takes the app's name from its folder's (letters, digits, hyphens): the checkout's
    # folder may be named otherwise (a CI clone), so the app's files are copied under a valid name
    app = tmp_path / "neurofed-app"
    app.mkdir()
    for item in ("pyproject.toml", "README.md", "neurofed", "examples", "hw_profiles"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, app / item)
    res = subprocess.run([str(BIN / "flwr"), "build", "--app", str(app)], cwd=tmp_path, env=env_for(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (fab,) = tmp_path.glob("*.fab")
    with zipfile.ZipFile(fab) as z:
        shipped = set(z.namelist())
        z.extractall(tmp_path / "app")
    wanted = {p.relative_to(REPO).as_posix() for folder in ("examples", "hw_profiles")
              for p in (REPO / folder).rglob("*.yaml")}
    assert {"examples/papers/sfedca_mnist_dir03.yaml", "examples/papers/sweeps/sfedca_table2.yaml"} <= wanted
    assert wanted - shipped == set()
    name = variants.default_variant()
    variants.build_variant(name)  # built once for the suite: the app below must load it, not compile
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import neurofed; from neurofed.kernels import variants; "
             "assert neurofed.__file__.startswith(sys.argv[1]), neurofed.__file__; "
             "print(variants.csrc()); print(variants.build() and variants.variant, variants.error())")
    res = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "app")], cwd=tmp_path / "app",
                         env={**env_for(), "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [str(REPO / "neurofed" / "kernels" / "csrc"), name, "None"]
    assert "compiling" not in res.stderr



@pytest.mark.slow
def test_a_paper_preset_runs_through_flwr_run_and_its_serverapp_runs_the_fast_kernels(tmp_path):
    """``flwr run .`` on a loopback deployment (3 SuperNodes, long-lived ClientApps) with a
    paper preset named in ``neurofed-config`` (SFedCA, MNIST Dir(0.3); tiny MNIST files in
    the published format, a small width and window): the run completes, the ServerApp
    evaluated with the fast kernels, and the result equals the in-process run's."""
    from dataset_files import write_mnist

    from neurofed.pipeline import run

    write_mnist(tmp_path / "data", n=60, n_test=30)
    preset = "examples/papers/sfedca_mnist_dir03.yaml"
    sets = [f"data.root={tmp_path / 'data'}", "data.timesteps=4", "model.width=0.25", "partition.num_clients=3",
            "algorithm.candidates=3", "federation.rounds=2", "federation.local_epochs=1", "federation.batch_size=16",
            "energy.enabled=false", "federation.threads=1", "federation.device=cpu"]
    out = tmp_path / "flower"
    lb = loopback(tmp_path, 3, tls=False, isolation="process")
    try:
        lb.start()
        res = lb.run(f"neurofed-config='{preset}' neurofed-set='{' '.join(sets)}' out='{out}' round-timeout=300.0 "
                     f"node-timeout=300.0")
    finally:
        left = lb.stop()
    assert left == [], "processes survived SIGKILL"
    assert res["status"] == "finished:completed", res["output"][-3000:]
    assert_server_ran_fast_kernels(out)
    import torch

    threads = torch.get_num_threads()
    try:
        run(load_config(REPO / preset, sets), tmp_path / "inprocess", progress=False)
    finally:
        torch.set_num_threads(threads)
    params, lines = read_run(out)
    ref_params, ref_lines = read_run(tmp_path / "inprocess")
    assert np.array_equal(params, ref_params)
    same_records(lines, ref_lines)
