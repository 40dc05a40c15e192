"""federation.device: validated, reported, CPU results unchanged, a missing GPU is a
one-line error. Tests marked ``gpu`` run only where torch sees a CUDA GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from neurofed.config import ConfigError, load_config
from neurofed.device import describe_device, resolve_device

HAS_GPU = torch.cuda.is_available()


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_values_accepted(value):
    assert load_config(None, [f"federation.device={value}"])["federation"]["device"] == value


@pytest.mark.parametrize("value", ["gpu", "CUDA", "cuda:", "cuda:-1", "cuda0", " cpu", 0, None, "mps"])
def test_bad_device_is_one_line_naming_key_value_and_allowed(value):
    with pytest.raises(ConfigError) as err:
        load_config(None, data={"federation": {"device": value}})
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("federation.device: got ")
    assert lines[0].endswith("allowed: auto, cpu, cuda, cuda:N")


def test_default_is_auto_and_auto_means_the_gpu_if_any():
    assert load_config(None, [])["federation"]["device"] == "auto"
    assert resolve_device("auto").type == ("cuda" if HAS_GPU else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("value", ["cuda", "cuda:1"])
def test_cuda_without_gpu_is_a_config_error(value):
    with pytest.raises(ConfigError) as err:
        resolve_device(value)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"federation.device: got {value!r}") and "use cpu or auto" in msg


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_cli_cuda_without_gpu_exit_2_one_line_no_run_dir(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "neurofed.cli", "run", "examples/digits_fedavg.yaml", "--out", str(out),
         "--set", "federation.device=cuda"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 2
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("neurofed: error: federation.device: got 'cuda'; ")
    assert not out.exists()  # stopped before any work


@pytest.mark.gpu
def test_cuda_index_out_of_range_is_a_config_error():
    n = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=rf"has {n} CUDA device"):
        resolve_device(f"cuda:{n}")
    assert resolve_device(f"cuda:{n - 1}") == torch.device("cuda", n - 1)


def _checkpoint(run_dir) -> dict:
    from neurofed.rundir import CHECKPOINT, load_state

    return load_state(run_dir / CHECKPOINT, "checkpoint")


def _params(run_dir) -> np.ndarray:
    return _checkpoint(run_dir)["server"]["params"]


def _metrics(run_dir) -> list[dict]:
    timing = ("wall_time_s", "time_train_s", "time_aggregate_s", "time_eval_s")
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in timing} for r in rows]


@pytest.mark.skipif(HAS_GPU, reason="without the key a GPU machine trains on the GPU")
@pytest.mark.parametrize("algorithm", ["fedavg", "fedmos"])
def test_device_cpu_is_bit_identical_to_a_run_without_the_key(tiny_cfg, tmp_path, algorithm):
    from neurofed.pipeline import run

    rounds = 2 if algorithm == "fedavg" else 1
    plain = tiny_cfg(**{"algorithm.name": algorithm, "federation.rounds": rounds})
    del plain["federation"]["device"]
    run(plain, tmp_path / "plain", progress=False, after=False)
    summary = run(tiny_cfg(**{"algorithm.name": algorithm, "federation.rounds": rounds, "federation.device": "cpu"}),
                  tmp_path / "cpu", progress=False, after=False)
    assert np.array_equal(_params(tmp_path / "plain"), _params(tmp_path / "cpu"))
    assert _metrics(tmp_path / "plain") == _metrics(tmp_path / "cpu")
    assert summary["device"]["device"] == "cpu"


def test_device_is_in_the_log_and_summary(tiny_cfg, tmp_path, capsys):
    from neurofed.pipeline import run

    run(tiny_cfg(**{"federation.device": "cpu", "federation.rounds": 1}), tmp_path, after=False)
    saved = json.loads((tmp_path / "summary.json").read_text())["device"]
    assert saved["device"] == "cpu" and saved["torch"] == torch.__version__ and saved["name"]
    assert f"neurofed: training on cpu ({saved['name']}" in capsys.readouterr().err


def test_resume_may_change_the_device(tiny_cfg, tmp_path):
    from neurofed.fl.resume import config_differences

    assert config_differences(tiny_cfg(**{"federation.device": "cuda"}), tiny_cfg(**{"federation.device": "cpu"})) == []


def test_resume_may_change_the_threads_and_says_so(tiny_cfg, tmp_path, capsys):
    from neurofed.pipeline import run

    threads = torch.get_num_threads()  # a run sets this process's threads; later tests keep theirs
    try:
        run(tiny_cfg(**{"federation.rounds": 1, "federation.threads": 1}), tmp_path, after=False)
        capsys.readouterr()
        run(tiny_cfg(**{"federation.rounds": 2, "federation.threads": 2}), tmp_path, after=False, resume=True)
    finally:
        torch.set_num_threads(threads)
    assert "--resume: federation.threads 1 -> 2; from round 2" in capsys.readouterr().err
    rounds = [json.loads(line)["round"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2]


# ---------------------------------------------------------------- on a CUDA GPU
RANDOM_DIGITS = "random_digits_8x8"


@pytest.fixture
def gpu_cfg(tiny_cfg):
    """tiny_cfg on random 8x8 images registered as a data set (the GPU machine need not
    have scikit-learn for the embedded digits)."""
    from neurofed.data import register_dataset
    from neurofed.data.base import Dataset

    @register_dataset(RANDOM_DIGITS)
    def load(data_cfg: dict, seed: int = 0) -> Dataset:
        rng = np.random.default_rng(7)
        x = rng.random((300, 1, 8, 8), dtype=np.float32)
        y = np.arange(300) % 10
        return Dataset(RANDOM_DIGITS, x[:200], y[:200], x[200:], y[200:], num_classes=10)

    return lambda **extra: tiny_cfg(**{"data.name": RANDOM_DIGITS, **extra})


@pytest.mark.gpu
def test_cuda_run_trains_on_the_gpu_and_keeps_files_on_the_cpu(gpu_cfg, tmp_path):
    from neurofed.fl.experiment import Experiment
    from neurofed.pipeline import run

    cfg = gpu_cfg(**{"federation.device": "cuda", "model.name": "cnn", "algorithm.name": "scaffold"})
    summary = run(cfg, tmp_path / "run", progress=False, after=False)
    assert summary["failed_clients"] == 0  # the runner drops a client that raises: none may
    assert summary["device"]["device"].startswith("cuda") and summary["device"]["name"]
    state = _checkpoint(tmp_path / "run")
    assert isinstance(state["server"]["params"], np.ndarray) and np.all(np.isfinite(state["server"]["params"]))
    assert state["clients"] and all(isinstance(s["c_i"], np.ndarray) for s in state["clients"].values())
    exp = Experiment(cfg)
    assert all(p.is_cuda for p in exp.new_train_model().parameters())
    assert all(not p.is_cuda for p in exp.eval_model.parameters())
    assert 0.0 <= summary["final_accuracy"] <= 1.0


@pytest.mark.gpu
def test_cuda_and_cpu_forward_give_the_same_spikes(gpu_cfg):
    """Same weights, same input spikes: SLAYER's fixed-point neurons on both devices.
    8-bit weights and binary inputs make the synaptic sums exact in float32."""
    from neurofed.data import load_dataset
    from neurofed.training.local import forward_dataset
    from neurofed.models import build_run_model

    cfg = gpu_cfg(**{"model.name": "cnn", "data.timesteps": 8})
    ds = load_dataset(cfg["data"], cfg["seed"])
    torch.manual_seed(0)
    cpu = build_run_model(cfg, ds)
    gpu = build_run_model(cfg, ds)
    gpu.load_state_dict(cpu.state_dict())
    gpu.to("cuda")
    x = torch.as_tensor(np.asarray(ds.x_test[:64], dtype=np.float32))
    logits_c, spikes_c = forward_dataset(cpu, x, cfg["data"], seed=3)
    logits_g, spikes_g = forward_dataset(gpu, x, cfg["data"], seed=3)
    assert spikes_g.device.type == "cpu"
    assert torch.equal(spikes_c, spikes_g) and torch.equal(logits_c, logits_g)


def test_describe_cpu():
    info = describe_device(torch.device("cpu"))
    assert info["device"] == "cpu" and info["threads"] == torch.get_num_threads()


def test_batches_ahead_are_the_same_batches_in_the_same_order(tiny_cfg):
    """On a GPU the batches are encoded by a helper thread, ahead of training: the same
    permutations and spikes as the CPU path draws inline."""
    from neurofed.training.local import ahead, encoded_batches
    from neurofed.models import build_model

    cfg = tiny_cfg()
    model = build_model(cfg["model"], (1, 8, 8), 10)
    x, y = torch.rand(50, 1, 8, 8), torch.arange(50) % 10

    def draw():
        return encoded_batches(model, x, y, cfg["data"], 16, torch.Generator().manual_seed(5), epochs=2)

    inline, threaded = list(draw()), list(ahead(draw()))
    assert len(inline) == len(threaded) == 8
    for (i0, x0, y0), (i1, x1, y1) in zip(inline, threaded):
        assert torch.equal(i0, i1) and torch.equal(x0, x1) and torch.equal(y0, y1)


def test_ahead_raises_the_producers_error_and_stops_when_left():
    from neurofed.training.local import ahead

    def failing():
        yield 1
        raise RuntimeError("bad batch")

    with pytest.raises(RuntimeError, match="bad batch"):
        list(ahead(failing()))
    it = ahead(iter(range(10**9)))
    assert next(it) == 0
    it.close()  # the helper thread is stopped and joined, not left filling a queue


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_gpu_benchmark_refuses_a_missing_gpu_in_one_line():
    res = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--device", "cuda:0"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu_throughput: error: federation.device: got 'cuda:0'")


@pytest.mark.slow
def test_gpu_benchmark_smoke_on_the_cpu():
    res = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--device", "cpu", "--small"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "digits cnn (default): IDENTICAL" in res.stdout and "round 2:" in res.stdout
    assert "RESULT spikes digits cnn [default]: 0 spike values differ" in res.stdout
    assert "RESULT throughput svgg9 batch 2 T=4: stock SLAYER " in res.stdout


@pytest.mark.gpu
def test_gpu_benchmark_small_on_the_gpu(tmp_path):
    res = subprocess.run([sys.executable, "benchmarks/gpu_throughput.py", "--device", "cuda", "--small", "--save",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    saved = json.loads((tmp_path / "gpu_throughput_cuda.json").read_text())
    assert saved["device"]["device"].startswith("cuda") and len(saved["round"]["rounds"]) == 2


@pytest.mark.parametrize("value", ["auto", True, False])
def test_tf32_values_accepted(value):
    assert load_config(None, [f"federation.tf32={str(value).lower()}"])["federation"]["tf32"] == value


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "off"])
def test_bad_tf32_is_one_line_naming_key_value_and_allowed(value):
    with pytest.raises(ConfigError) as err:
        load_config(None, data={"federation": {"tf32": value}})
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("federation.tf32: got ") and lines[0].endswith("allowed: auto, true, false")


def test_tf32_false_and_true_set_both_flags_auto_leaves_them():
    from neurofed.device import configure_cuda

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False  # torch's defaults
        configure_cuda("auto")
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, False)
        configure_cuda(False)
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
        configure_cuda(True)
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_run_applies_federation_tf32(tiny_cfg):
    """The runner and every Flower ClientApp configure compute through configure_compute."""
    from neurofed.fl.experiment import configure_compute

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        configure_compute(tiny_cfg(**{"federation.tf32": False}))
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
