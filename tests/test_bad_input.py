"""Bad input, hardened (issue 35; issue 34 items 3, 9, 10, 11): no run or file a user
already has is overwritten, no value or file makes a run silently wrong, nothing hangs,
and every refusal is one line naming the problem, with exit code 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_overrides
from neurofed.cli import main
from neurofed.config import ConfigError, load_config
from neurofed.config.checks import MAX_PROBLEMS

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_fedavg.yaml"


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def refused(capsys, *argv) -> str:
    """Run the CLI; assert it answered with exit 2 and one line; return that line."""
    code, err = cli(capsys, *argv)
    errors = [l for l in err if l.startswith("neurofed: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in "\n".join(err), (code, err)
    return errors[0]


# --------------------------------------------------------------------------- configs (35.4, 35.10, 35.11, 34.9)


@pytest.mark.parametrize("key", ["federation.lr", "federation.lr_decay", "federation.momentum",
                                 "federation.weight_decay", "federation.logit_scale", "federation.straggler_prob",
                                 "federation.ldp_laplace", "federation.update_noise", "federation.target_accuracy",
                                 "data.max_rate", "partition.alpha"])
@pytest.mark.parametrize("value", [".nan", ".inf"])
def test_every_float_option_is_finite(key, value):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [f"{key}={value}"])
    assert str(exc.value) == f"{key}: got {float(value[1:])}; expected a finite number"


def test_non_finite_values_inside_lists_and_algorithm_keys_are_refused():
    with pytest.raises(ConfigError, match=r"^partition\.ratio: got \[inf, 1\]; expected a finite number$"):
        load_config(None, ["partition.ratio=[.inf, 1]"])
    with pytest.raises(ConfigError, match=r"^algorithm\.mu: got nan; expected a finite number$"):
        load_config(None, ["algorithm.name=fedprox", "algorithm.mu=.nan"])


def test_a_typo_in_a_key_suggests_the_nearest():
    with pytest.raises(ConfigError, match=r"^federation\.rouds: unknown key; did you mean federation\.rounds\?$"):
        load_config(None, ["federation.rouds=3"])
    with pytest.raises(ConfigError, match=r"^federaton\.lr: unknown key; did you mean federation\.lr\?$"):
        load_config(None, ["federaton.lr=0.1"])
    with pytest.raises(ConfigError, match=r"algorithm\.muu: unknown key for fedprox; did you mean algorithm\.mu\?"):
        load_config(None, ["algorithm.name=fedprox", "algorithm.muu=0.1"])


def test_a_section_set_to_a_scalar_is_one_line(capsys):
    line = refused(capsys, "run", EXAMPLE, "--set", "algorithm=3", "--out", "unused")
    assert line == ("neurofed: error: algorithm: got 3; expected a mapping of keys (an empty section runs its "
                    "defaults: remove it instead)")


# billion laughs: 9 aliases of 9 aliases ... 9 levels deep, used as a value (9^9 strings when expanded)
BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
               for p, a in zip(["", *"abcdefgh"], "abcdefghi")) + "federation:\n  lr: *i\n"


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB)
    t0 = time.perf_counter()
    line = refused(capsys, "run", cfg, "--out", tmp_path / "o")
    assert time.perf_counter() - t0 < 5
    assert "holds more than 100,000 values once its YAML aliases are expanded" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["file", "set value", "set key"])
def test_nesting_thousands_deep_is_one_line(tmp_path, capsys, where):
    deep = "[" * 5000 + "]" * 5000
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"seed: 0\nfederation:\n  lr: {deep}\n" if where == "file" else "seed: 0\n")
    extra = {"file": [], "set value": ["--set", f"federation.lr={deep}"],
             "set key": ["--set", "a" + ".a" * 5000 + "=1"]}[where]
    line = refused(capsys, "run", cfg, *extra, "--out", tmp_path / "o")
    assert "levels deep" in line and len(line) < 300


def test_big_configs_are_refused_and_errors_are_capped(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    big.write_text("federation:\n" + "  pad: " + "x" * (2 << 20) + "\n")
    line = refused(capsys, "run", big, "--out", tmp_path / "o")
    assert "bytes; a config holds at most 1,048,576" in line
    many = tmp_path / "many.yaml"
    many.write_text("federation:\n" + "".join(f"  unknown_{i}: 1\n" for i in range(500)))
    code, err = cli(capsys, "run", many, "--out", tmp_path / "o")
    assert code == 2 and len(err) == MAX_PROBLEMS + 1
    assert err[-1] == f"neurofed: error: ... and {500 - MAX_PROBLEMS} more problems (fix these first)"
    long_value = tmp_path / "long.yaml"
    long_value.write_text("federation:\n  optimizer: " + "x" * 500_000 + "\n")
    line = refused(capsys, "run", long_value, "--out", tmp_path / "o")
    assert line.startswith("neurofed: error: federation.optimizer: got 'xxx") and len(line) < 300


# --------------------------------------------------------------------------- run directories (35.1-35.5, 35.11, 34.3)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-round run, written by the command line."""
    from neurofed.pipeline import run

    out = tmp_path_factory.mktemp("run") / "r"
    run(load_config(None, tiny_overrides(**{"federation.privacy_noise": "seeded_not_private"})), out,
        progress=False, after=False)
    return out


def run_argv(run_dir, *extra):
    return ["run", run_dir / "config.yaml", "--out", run_dir, "--quiet", *extra]


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_without_a_checkpoint_keeps_the_results(run_dir, capsys):
    (run_dir / "checkpoint.npz").unlink()
    before = snapshot(run_dir)
    line = refused(capsys, *run_argv(run_dir, "--resume"))
    assert "but no checkpoint.npz to continue from; starting again would overwrite them" in line
    assert "metrics.jsonl" in line and "model_best.npz" in line
    assert snapshot(run_dir) == before


def test_no_file_of_an_existing_run_is_overwritten(run_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("model_best.npz", "model_last.npz"):
        shutil.copy(run_dir / name, out / name)
    (out / "config.yaml").write_text("# my own notes on this experiment\n" + (run_dir / "config.yaml").read_text())
    before = snapshot(out)
    line = refused(capsys, *run_argv(run_dir)[:2], "--out", out, "--quiet")
    assert "already holds config.yaml, model_best.npz, model_last.npz, which this run would overwrite" in line
    assert snapshot(out) == before


def test_a_half_written_metrics_line_is_recovered(run_dir, tmp_path, capsys):
    """A kill mid-write of round 3's line: --resume drops the half line (the checkpoint is
    at round 2) and ends exactly where the uninterrupted run does."""
    from neurofed.pipeline import run

    cfg = load_config(run_dir / "config.yaml", ["federation.rounds=3"])
    whole = run(cfg, tmp_path / "whole", progress=False, after=False)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 3, "accuracy": 0.1')
    code, err = cli(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=3"))
    assert code == 0, err
    assert any("dropped a half-written last line" in l for l in err)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["round"] for l in lines] == [1, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] == whole["final_accuracy"] and summary["rounds"] == 3


def test_a_damaged_line_inside_metrics_is_named(run_dir, capsys):
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("{garbage\n" + "\n".join(lines[1:]) + "\n")
    line = refused(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=3"))
    assert line.endswith("metrics.jsonl: line 1 is not a round's JSON record (damaged file); "
                         "expected one JSON object per round")


def test_resume_with_fewer_rounds_than_done_is_refused(run_dir, capsys):
    line = refused(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=1"))
    assert line.endswith("federation.rounds: got 1; " + f"{run_dir} has already completed 2 rounds "
                         "(resume with federation.rounds >= 2, or read its results as they are)")


@pytest.mark.parametrize("where", ["file", "below a file"])
def test_out_that_is_a_file_is_one_line(tmp_path, capsys, where):
    (tmp_path / "f").write_text("mine")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "run"
    line = refused(capsys, "run", EXAMPLE, "--out", out, "--quiet")
    assert ("is a file; expected a folder" if where == "file" else f"lies below {tmp_path / 'f'}, which is a file") \
        in line
    assert (tmp_path / "f").read_text() == "mine"


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line(run_dir, capsys):
    from neurofed.rundir import load_state, save_state

    state = load_state(run_dir / "checkpoint.npz", "checkpoint")
    state["server"]["params"] = state["server"]["params"][:-7]  # save_state recomputes the digest
    save_state(run_dir / "checkpoint.npz", state, "checkpoint")
    line = refused(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=3"))
    assert "checkpoint.npz: does not fit this run's model and algorithm" in line


def test_a_failed_start_leaves_no_run_directory(tmp_path, capsys):
    """A data set whose files are missing: the start fails after the run directory was
    made; it is removed, so a second try is not refused as existing."""
    out = tmp_path / "runs" / "mnist-seed0"
    argv = ["run", EXAMPLE, "--set", "data.name=mnist", "--set", f"data.root={tmp_path / 'nothing'}",
            "--out", out, "--quiet"]
    first = refused(capsys, *argv)
    assert "no MNIST files found" in first and not out.exists()
    assert refused(capsys, *argv) == first
    out.mkdir(parents=True)  # a folder the user made: kept, and left as it was
    refused(capsys, *argv)
    assert out.is_dir() and not any(out.iterdir())


def test_a_run_in_which_no_update_was_aggregated_fails(tmp_path, capsys):
    """Noise of 1e39 overflows every float32 update: each client's reply is dropped as
    non-finite, so the global model never changes. That is not a success."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 0\n")
    argv = ["run", cfg, *sum((["--set", o] for o in tiny_overrides(**{
        "federation.rounds": 1, "federation.update_noise": 1e39, "federation.update_noise_mode": "absolute"})), []),
        "--out", tmp_path / "o", "--quiet"]
    line = refused(capsys, *argv)
    assert "no client's update was aggregated in any of the 1 rounds (2 client replies failed, first: client" in line
    assert "update has non-finite values" in line
    assert (tmp_path / "o" / "summary.json").exists()  # the results are kept


# --------------------------------------------------------------------------- exported networks (35.9, 35.11)


def test_an_altered_network_is_refused_before_lava_runs_it(run_dir, capsys):
    import hashlib

    import h5py

    from neurofed.deploy.export import export_run

    net = export_run(run_dir, quiet=True)
    assert (run_dir / "model.net.sha256").read_text() == f"{hashlib.sha256(net.read_bytes()).hexdigest()}  model.net\n"
    with h5py.File(net, "r+") as h:  # still valid HDF5, same shapes: only the digest tells
        w = h["layer/2/weight"]
        w[...] = -w[()]
    line = refused(capsys, "lava", run_dir, "--samples", 2, "--quiet")
    assert line.endswith("model.net: SHA-256 differs from the one recorded at export (model.net.sha256): the "
                         f"network was changed after `neurofed export`; re-create it with `neurofed export {run_dir}`")
    assert not (run_dir / "lava.json").exists()


def test_a_tie_break_the_run_cannot_take_is_refused_before_lava_runs(run_dir, capsys):
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["model"]["readout"] = "voltage"  # no spike counts to tie
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    line = refused(capsys, "lava", run_dir, "--tie-break", "voltage", "--samples", 2, "--quiet")
    assert line.startswith("neurofed: error: --tie-break voltage: model.tie_break: voltage with model.readout "
                           "'voltage'")
    assert "lowest_label" in line and not (run_dir / "lava.json").exists()
    with pytest.raises(SystemExit) as exit_:  # argparse's own answer, before anything is read
        main(["lava", str(run_dir), "--tie-break", "coin"])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1] == (
        "neurofed lava: error: argument --tie-break: invalid choice: 'coin' (choose from 'lowest_label', 'voltage')")


@pytest.mark.parametrize("content", ["- 1\n- 2\n", "federation: [1]\n", "federation:\n  lr: .nan\n"])
def test_export_reads_the_run_config_validated(run_dir, capsys, content):
    (run_dir / "config.yaml").write_text(content)
    line = refused(capsys, "export", run_dir)
    assert f"{run_dir / 'config.yaml'}: " in line


# --------------------------------------------------------------------------- data set files (35.6-35.8, 35.11-35.13, 34.10, 34.11)


def data_cfg(name, root, **extra):
    return {"name": name, "root": str(root), "encoding": "events" if name == "dvsgesture" else "rate",
            "timesteps": 4, **extra}


def load(name, root, **extra):
    from neurofed.data import load_dataset

    return load_dataset(data_cfg(name, root, **extra))


def refused_load(capsys, name, root, **extra) -> str:
    """The data set loaded through `neurofed partition` (the CLI's error path): one line, exit 2."""
    cfg = root / "partition.yaml"
    cfg.write_text(json.dumps({"data": data_cfg(name, root, **extra), "partition": {"num_clients": 2},
                               "federation": {"clients_per_round": 1}}))
    return refused(capsys, "partition", cfg, "--png", root / "p.png")



def test_a_data_file_edited_in_place_is_decoded_again(tmp_path):
    from dataset_files import dated_later, idx_bytes, write_mnist

    ref = write_mnist(tmp_path, 20, 10)
    assert np.array_equal(load("mnist", tmp_path).y_train, ref["y_train"])
    labels = tmp_path / "train-labels-idx1-ubyte"
    labels.write_bytes(idx_bytes((ref["y_train"] + 1) % 10))  # same size, other labels
    dated_later(labels)
    assert np.array_equal(load("mnist", tmp_path).y_train, (ref["y_train"] + 1) % 10)


def test_an_array_declared_without_its_bytes_is_refused(tmp_path, capsys):
    """A 150-byte CIFAR batch declaring a (100000, 3072) array: refused, nothing cached."""
    import pickle

    from dataset_files import write_cifar10

    ref = write_cifar10(tmp_path, 10, 5)

    class Declared:
        def __reduce__(self):  # numpy's array reconstructor asked for a big shape, no data follows
            return np.core.multiarray._reconstruct, (np.ndarray, (100000, 3072), b"B")

    batch = ref["dir"] / "data_batch_1"
    batch.write_bytes(pickle.dumps({b"data": Declared(), b"labels": [0]}, protocol=2))
    assert batch.stat().st_size < 1000
    line = refused_load(capsys, "cifar10", tmp_path)
    assert f"{batch}: refused numpy _reconstruct of shape (100000, 3072)" in line
    assert not list((tmp_path / "cifar-10-batches-py" / ".neurofed_cache").glob("cifar10-*"))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_plain_cifar_batches_repickled_by_python3_load(tmp_path, protocol):
    import pickle

    from dataset_files import write_cifar10
    from neurofed.data.safe_pickle import load as safe_load

    ref = write_cifar10(tmp_path, 10, 5)
    for path in ref["dir"].glob("*_batch*"):
        path.write_bytes(pickle.dumps(safe_load(path), protocol=protocol))
    ds = load("cifar10", tmp_path)
    assert np.array_equal(ds.x_train, ref["x_train"]) and np.array_equal(ds.y_test, ref["y_test"])


def write_labelled_like(writer, root, set_name: str, **kw) -> dict:
    """Tiny IDX files whose label files begin with ``set_name``'s published first labels."""
    from dataset_files import idx_bytes
    from neurofed.data.identify import published

    ref = writer(root, 20, 10, **kw)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        y = ref[f"y_{split}"].copy()
        first = published()[set_name]["first_labels"][f"{split}_labels"]
        y[:len(first)] = first
        (ref["dir"] / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(y))
        ref[f"y_{split}"] = y
    return ref


def test_mnist_files_are_not_taken_for_fashion_mnist(tmp_path, capsys):
    from dataset_files import write_mnist

    ref = write_labelled_like(write_mnist, tmp_path, "mnist")
    line = refused_load(capsys, "fashion_mnist", tmp_path)
    assert line == (f"neurofed: error: {tmp_path / 'train-labels-idx1-ubyte'}: its first labels "
                    "[5, 0, 4, 1, 9, 2, 1, 3, 1, 4] are MNIST's, not Fashion-MNIST's: these are MNIST's files; "
                    "set data.name: mnist to train on them, or point data.root at Fashion-MNIST's files")
    ds = load("mnist", tmp_path)  # as MNIST they load, verified by that fingerprint
    assert np.array_equal(ds.y_train, ref["y_train"])
    assert set(ds.info["files_identified"]["verified"].values()) == {"first labels of the train and test label files"}
    assert ds.info["files_identified"]["unverified"] == []


def test_the_datasets_command_says_whose_files_they_are(tmp_path, capsys):
    from dataset_files import write_mnist

    write_labelled_like(write_mnist, tmp_path, "mnist")
    assert main(["datasets", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fashion_mnist: " + str(tmp_path / "train-labels-idx1-ubyte") + ": its first labels" in out
    status = {l.split()[0]: l.split()[1] for l in out.splitlines() if l.split()[:1] in (["mnist"], ["fashion_mnist"])}
    assert status == {"mnist": "found", "fashion_mnist": "missing"}


def test_a_published_checksum_of_another_set_is_refused(tmp_path):
    """The MD5 table (here one built from these files, as published_files.yaml holds the
    publishers') identifies a file as another set's whatever its name."""
    from dataset_files import write_mnist
    from neurofed.data.identify import identify, md5
    from neurofed.data.base import DataFileError
    from neurofed.data.image_formats import IMAGE_SETS, MNIST

    write_mnist(tmp_path, 20, 10, gz=True)
    files = MNIST.find(tmp_path)[2]
    table = {"mnist": {"md5": {p.name: md5(p) for p in files.values()}}, "fashion_mnist": {"md5": {}}}
    titles = {s.name: s.title for s in IMAGE_SETS.values()}
    with pytest.raises(DataFileError, match=r"t10k-images-idx3-ubyte\.gz: this is MNIST's t10k-images-idx3-ubyte"
                                            r"\.gz \(its published MD5\), not Fashion-MNIST's"):
        identify("fashion_mnist", titles, files, table=table)
    assert set(identify("mnist", titles, files, table=table)["verified"].values()) == {"published MD5"}


def test_unverified_files_load_with_a_warning_and_are_recorded(tmp_path, caplog):
    from dataset_files import write_fashion_mnist

    write_fashion_mnist(tmp_path, 20, 10)
    ds = load("fashion_mnist", tmp_path)
    assert ds.info["files_identified"]["unverified"] == sorted(
        ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"])
    assert any("could not verify" in r.message and "as Fashion-MNIST's files" in r.message for r in caplog.records)


@pytest.mark.parametrize("variant", ["dotted", "dotted.gz", "kaggle folders"])
def test_common_variants_of_mnist_file_names_load(tmp_path, variant):
    from dataset_files import write_mnist

    ref = write_mnist(tmp_path / "w", 20, 10, gz=variant.endswith(".gz"))
    root = tmp_path / "mnist"
    root.mkdir()
    for path in (tmp_path / "w").iterdir():
        if not path.is_file():
            continue
        name = path.name.replace("-idx", ".idx")
        if variant == "kaggle folders":
            name = f"{path.name}/{path.name}"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / name)
    ds = load("mnist", tmp_path)  # data.root holding a mnist/ folder
    assert np.array_equal(ds.x_train, ref["x_train"]) and np.array_equal(ds.y_test, ref["y_test"])


def test_a_set_with_zero_images_names_the_file(tmp_path, capsys):
    from dataset_files import idx_bytes, write_mnist

    write_mnist(tmp_path, 20, 10)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((0, 28, 28), np.uint8)))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(0, np.uint8)))
    line = refused_load(capsys, "mnist", tmp_path)
    assert line.endswith(f"{tmp_path / 't10k-images-idx3-ubyte'}: 0 images; expected the test split's images "
                         f"(at least one)")


def test_a_negative_cifar_label_names_the_file(tmp_path, capsys):
    from dataset_files import py2_pickle, write_cifar10
    from neurofed.data.safe_pickle import load as safe_load

    ref = write_cifar10(tmp_path, 10, 5)
    batch = ref["dir"] / "test_batch"
    d = safe_load(batch)
    d[b"labels"][0] = -1
    batch.write_bytes(py2_pickle(d))
    assert refused_load(capsys, "cifar10", tmp_path).endswith(f"{batch}: class label -1; expected class labels 0-9")


def test_a_killed_decode_leaves_no_temporary_folder(tmp_path):
    """A build killed mid-way leaves ``.<name>-<digest>.tmp-<pid>``; the next build removes
    it once its process is gone."""
    from dataset_files import write_mnist

    write_mnist(tmp_path, 20, 10)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    cache = tmp_path / ".neurofed_cache"
    stale = cache / f".mnist-0123456789abcdef.tmp-{int(dead.stdout)}"
    stale.mkdir(parents=True)
    (stale / "x_train.npy").write_bytes(b"half")
    load("mnist", tmp_path)
    assert not stale.exists() and [p.name.startswith("mnist-") for p in cache.iterdir()] == [True]


def write_gestures(root: Path) -> Path:
    from test_events import random_events, write_dvsgesture_npy

    rng = np.random.default_rng(1)
    for split, user, labels in (("ibmGestureTrain", "user01_led", [0, 1]), ("ibmGestureTest", "user24_led", [2])):
        for label in labels:
            x, y, t_us, p = random_events(rng, 50, 128, duration_us=1_000_000)
            write_dvsgesture_npy(root / "DVSGesture" / split / user / f"{label}.npy", x, y, p, t_us // 1000)
    return root / "DVSGesture" / "ibmGestureTrain" / "user01_led"


@pytest.mark.parametrize("damage", ["wrong shape", "truncated", "object array"])
def test_a_bad_dvsgesture_sample_names_its_file(tmp_path, capsys, damage):
    folder = write_gestures(tmp_path)
    sample = folder / "1.npy"
    if damage == "wrong shape":
        np.save(sample, np.zeros(7))
    elif damage == "truncated":
        sample.write_bytes(sample.read_bytes()[:-100])
    else:
        np.save(sample, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    line = refused_load(capsys, "dvsgesture", tmp_path, downsample=4)
    assert line.startswith(f"neurofed: error: {sample}: cannot be read (")
    assert line.endswith("expected an (N, 4) integer array of x < 128, y < 128, p in {0, 1}, t in ms (tonic's "
                         "preprocessed DVS128 Gesture), saved by numpy")


@pytest.mark.parametrize("bad", ["folder", "file", "label"])
def test_a_bad_name_in_the_dvsgesture_layout_is_named(tmp_path, capsys, bad):
    folder = write_gestures(tmp_path)
    wrong = {"folder": folder.parent / "subject1", "file": folder / "wave.npy", "label": folder / "11.npy"}[bad]
    if bad == "folder":
        shutil.copytree(folder, wrong)
    else:
        shutil.copy(folder / "0.npy", wrong)
    line = refused_load(capsys, "dvsgesture", tmp_path, downsample=4)
    assert line.startswith(f"neurofed: error: {wrong}: not a DVS128 Gesture {'folder' if bad == 'folder' else 'sample'}"
                           f" name; expected DVSGesture/ibmGestureTrain/user<NN>_<lighting>/<label 0-10>.npy")


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_folder_or_device_given_as_a_yaml_file_is_named_for_what_it_is(capsys, tmp_path, command):
    assert "is a folder; expected a YAML file" in refused(capsys, command, tmp_path)
    if Path("/dev/null").exists():
        assert "is not a regular file; expected a YAML file" in refused(capsys, command, "/dev/null")
    assert "not found" in refused(capsys, command, tmp_path / "missing.yaml")


def test_a_run_folder_that_does_not_exist_is_named_so(capsys, tmp_path):
    for command in ("lava", "export", "energy"):
        assert "no such folder" in refused(capsys, command, tmp_path / "missing")


@pytest.mark.parametrize("name", ["mnist", "cifar10", "nmnist"])
def test_a_data_root_that_is_a_file_is_named_a_file(capsys, tmp_path, name):
    root = tmp_path / "train-images-idx3-ubyte"
    root.write_bytes(b"\0\0\x08\x03")
    extra = ["--set", "data.encoding=events"] if name == "nmnist" else []
    line = refused(capsys, "run", EXAMPLE, "--out", tmp_path / "run", "--quiet", "--set", f"data.name={name}",
                   "--set", f"data.root={root}", *extra)
    assert f"{name}: data.root='{root}' is a file; expected the folder holding" in line
