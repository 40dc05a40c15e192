"""Static image data sets from their published files (tiny files written by
``tests/dataset_files.py``), the restricted unpickler, the uint8 cache, subsets,
``neurofed datasets`` and a federated run on them."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from dataset_files import (dated_later, idx_bytes, py2_pickle, write_cifar10, write_cifar100, write_fashion_mnist,
                           write_mnist, write_svhn)
from neurofed.data import load_dataset
from neurofed.data.base import DataFileError
from neurofed.data.safe_pickle import UnsafePickleError, loads


def cfg(name, root, **extra):
    return {"name": name, "root": str(root), **extra}


def same(ds, ref, label_suffix=""):
    for split in ("train", "test"):
        x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
        assert x.dtype == np.uint8 and x.shape == ref[f"x_{split}"].shape, split
        assert np.array_equal(x, ref[f"x_{split}"]), split
        assert y.dtype == np.int64 and np.array_equal(y, ref[f"y_{split}{label_suffix}"]), split


# --------------------------------------------------------------------------- every published format


@pytest.mark.parametrize("name,writer,kw", [
    ("mnist", write_mnist, {"layout": "flat", "gz": False}),
    ("mnist", write_mnist, {"layout": "flat", "gz": True}),
    ("mnist", write_mnist, {"layout": "torchvision", "gz": False}),
    ("mnist", write_mnist, {"layout": "torchvision", "gz": True}),
    ("fashion_mnist", write_fashion_mnist, {"layout": "flat", "gz": True}),
    ("fashion_mnist", write_fashion_mnist, {"layout": "torchvision", "gz": False}),
])
def test_idx_sets_load_in_both_layouts_raw_and_gz(tmp_path, name, writer, kw):
    ref = writer(tmp_path, 30, 12, **kw)
    ds = load_dataset(cfg(name, tmp_path))
    same(ds, ref)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10 and ds.kind == "image"
    assert isinstance(ds.x_train, np.memmap)  # served from the uint8 cache


@pytest.mark.parametrize("release", ["python", "binary"])
def test_cifar10_both_releases(tmp_path, release):
    ref = write_cifar10(tmp_path, 47, 13, release=release)  # 47: uneven batches
    ds = load_dataset(cfg("cifar10", tmp_path))
    same(ds, ref)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    assert ds.info["release"] == f"{release} release"
    # data.root may be the release folder itself
    same(load_dataset(cfg("cifar10", ref["dir"])), ref)


@pytest.mark.parametrize("release", ["python", "binary"])
def test_cifar100_fine_and_coarse_labels(tmp_path, release):
    ref = write_cifar100(tmp_path, 200, 100, release=release)
    fine = load_dataset(cfg("cifar100", tmp_path))
    same(fine, ref)
    assert fine.num_classes == 100 and set(fine.y_train) == set(range(100))
    coarse = load_dataset(cfg("cifar100", tmp_path, cifar100_labels="coarse"))
    same(coarse, ref, "_coarse")
    assert coarse.num_classes == 20 and set(coarse.y_train) == set(range(20))


def test_svhn_label_10_is_digit_0_and_extra_is_optional(tmp_path):
    ref = write_svhn(tmp_path, 30, 20, extra=10)
    import scipy.io

    assert 10 in scipy.io.loadmat(tmp_path / "train_32x32.mat")["y"]  # digit 0 as published
    ds = load_dataset(cfg("svhn", tmp_path))
    same(ds, ref)
    assert 0 in ds.y_train and ds.y_train.max() == 9 and len(ds.y_train) == 30
    with_extra = load_dataset(cfg("svhn", tmp_path, svhn_extra=True))
    assert np.array_equal(with_extra.x_train, np.concatenate([ref["x_train"], ref["x_extra"]]))
    assert np.array_equal(with_extra.y_train, np.concatenate([ref["y_train"], ref["y_extra"]]))
    assert np.array_equal(with_extra.x_test, ref["x_test"])


def test_svhn_extra_requested_but_absent(tmp_path):
    write_svhn(tmp_path, 10, 10)
    with pytest.raises(DataFileError, match=r"data.svhn_extra: true but no extra_32x32.mat"):
        load_dataset(cfg("svhn", tmp_path, svhn_extra=True))


# --------------------------------------------------------------------------- the cache



def test_cache_is_memory_mapped_and_keyed_by_the_files_as_they_are(tmp_path):
    ref = write_cifar10(tmp_path / "data", 20, 10, release="binary")
    first = load_dataset(cfg("cifar10", tmp_path / "data", cache=str(tmp_path / "cache")))
    folders = list((tmp_path / "cache").iterdir())
    assert len(folders) == 1 and (folders[0] / "x_train.npy").is_file()
    assert isinstance(first.x_train, np.memmap) and Path(first.x_train.filename) == folders[0] / "x_train.npy"
    again = load_dataset(cfg("cifar10", tmp_path / "data", cache=str(tmp_path / "cache")))
    assert len(list((tmp_path / "cache").iterdir())) == 1 and np.array_equal(again.x_train, ref["x_train"])
    # Same size, other bytes (a file edited in place, issue 35.6): a new cache of the files as they are now.
    batch = ref["dir"] / "data_batch_1.bin"
    batch.write_bytes(bytes(len(batch.read_bytes())))
    dated_later(batch)
    edited = load_dataset(cfg("cifar10", tmp_path / "data", cache=str(tmp_path / "cache")))
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert not edited.x_train[:4].any() and np.array_equal(edited.x_train[4:], ref["x_train"][4:])
    assert not edited.y_train[:4].any()  # data_batch_1's 4 records, zeroed
    # Another size: a new cache is built from the files as they are now.
    batch.write_bytes(batch.read_bytes()[:3073])
    rebuilt = load_dataset(cfg("cifar10", tmp_path / "data", cache=str(tmp_path / "cache")))
    assert len(list((tmp_path / "cache").iterdir())) == 3
    assert len(rebuilt.y_train) == 20 - 4 + 1  # data_batch_1 held 4 of the 20, now 1
    assert not rebuilt.x_train[0].any()  # the zeroed record


def test_default_cache_is_next_to_the_files(tmp_path):
    write_mnist(tmp_path, 10, 10, gz=True)
    ds = load_dataset(cfg("mnist", tmp_path))
    assert Path(ds.info["cache"]).parent == tmp_path / ".neurofed_cache"


# --------------------------------------------------------------------------- pickles never run code


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_crafted_pickle_is_refused_and_its_payload_never_runs(tmp_path):
    marker = tmp_path / "payload-ran"
    # a CIFAR batch as published (Python 2 pickle) whose label list holds the payload
    evil = py2_pickle({b"data": np.zeros((1, 3072), np.uint8), b"labels": [Payload(marker)]})
    pickle.loads(pickle.dumps(Payload(tmp_path / "control")))  # the payload does run under plain pickle
    assert (tmp_path / "control").exists()
    with pytest.raises(UnsafePickleError, match=r"refused to unpickle (__builtin__|builtins)\.exec"):
        loads(evil, "data_batch_1")
    assert not marker.exists()
    # ... and through the registry: one error naming the file, nothing run
    write_cifar10(tmp_path, 10, 5)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(evil)
    with pytest.raises(UnsafePickleError, match=r"data_batch_3: refused to unpickle (__builtin__|builtins)\.exec"):
        load_dataset(cfg("cifar10", tmp_path, cache=str(tmp_path / "cache")))
    assert not marker.exists()


def test_object_arrays_and_other_classes_are_refused():
    with pytest.raises(UnsafePickleError, match="object arrays"):
        loads(py2_pickle(np.array([1, "a"], dtype=object)))
    with pytest.raises(UnsafePickleError, match=r"collections\.OrderedDict"):
        from collections import OrderedDict

        loads(py2_pickle(OrderedDict(a=1)))


def test_plain_data_round_trips_as_plain_pickle_reads_it():
    d = {b"data": np.arange(12, dtype=np.uint8).reshape(2, 6), b"labels": [3, 4], b"name": b"x", "f": 1.5,
         "n": None, "t": (1, 2)}
    raw = py2_pickle(d)
    got = loads(raw)
    want = pickle.loads(raw, encoding="bytes")
    assert got.keys() == want.keys() and np.array_equal(got[b"data"], want[b"data"])
    assert got[b"labels"] == [3, 4] and got[b"name"] == b"x" and got["t"] == (1, 2)


# --------------------------------------------------------------------------- missing and malformed files


def _cli_error(capsys, *argv):
    from neurofed.cli import main

    rc = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


def test_missing_files_one_line_naming_files_where_and_layout(tmp_path, capsys):
    with pytest.raises(DataFileError) as exc:
        load_dataset(cfg("mnist", tmp_path))
    msg = str(exc.value)
    assert "\n" not in msg and str(tmp_path) in msg
    for name in ("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte", ".gz", "MNIST/raw", "never downloads"):
        assert name in msg
    with pytest.raises(DataFileError, match=r"cifar-10-batches-py.*cifar-10-batches-bin"):
        load_dataset(cfg("cifar10", tmp_path))
    with pytest.raises(DataFileError, match=r"data.root: svhn .*train_32x32.mat"):
        load_dataset({"name": "svhn", "root": None})
    # an incomplete release names what is missing and where
    write_cifar10(tmp_path, 10, 5, release="binary")
    (tmp_path / "cifar-10-batches-bin" / "data_batch_4.bin").unlink()
    with pytest.raises(DataFileError, match=r"incomplete CIFAR-10 binary release in .*cifar-10-batches-bin.*"
                                            r"missing data_batch_4\.bin"):
        load_dataset(cfg("cifar10", tmp_path))
    # through the CLI: exit 2 and one line
    rc, err = _cli_error(capsys, "partition", "examples/digits_fedavg.yaml", "--set", "data.name=fashion_mnist",
                         "--set", f"data.root={tmp_path}", "--png", str(tmp_path / "p.png"))
    assert rc == 2 and len(err) == 1 and "train-images-idx3-ubyte" in err[0] and "FashionMNIST/raw" in err[0]


def test_malformed_files_one_line(tmp_path):
    write_mnist(tmp_path, 10, 5)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x0d\x03" + bytes(20))  # float IDX
    with pytest.raises(DataFileError, match=r"train-images-idx3-ubyte: bad IDX header \(magic 00000d03\)"):
        load_dataset(cfg("mnist", tmp_path))
    raw = idx_bytes(np.zeros((10, 28, 28), np.uint8))
    (tmp_path / "train-images-idx3-ubyte").write_bytes(raw[:-5])
    with pytest.raises(DataFileError, match="a complete IDX file"):
        load_dataset(cfg("mnist", tmp_path))
    (tmp_path / "train-images-idx3-ubyte").unlink()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(DataFileError, match=r"train-images-idx3-ubyte.gz: cannot be read"):
        load_dataset(cfg("mnist", tmp_path))
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((9, 28, 28), np.uint8))))
    with pytest.raises(DataFileError, match="9 labels|10 labels for 9 images"):
        load_dataset(cfg("mnist", tmp_path))
    write_cifar10(tmp_path, 10, 5, release="binary")
    (tmp_path / "cifar-10-batches-bin" / "test_batch.bin").write_bytes(bytes(3000))
    with pytest.raises(DataFileError, match=r"test_batch.bin: 3000 bytes, not a whole number of 3073-byte records"):
        load_dataset(cfg("cifar10", tmp_path))
    (tmp_path / "svhn").mkdir()
    (tmp_path / "svhn" / "train_32x32.mat").write_bytes(b"junk")
    (tmp_path / "svhn" / "test_32x32.mat").write_bytes(b"junk")
    with pytest.raises(DataFileError, match=r"train_32x32.mat: .*expected SVHN's cropped-digit .mat"):
        load_dataset(cfg("svhn", tmp_path))


# --------------------------------------------------------------------------- subsets


def test_subsets_are_stratified_seeded_and_exact(tmp_path):
    from neurofed.data.subset import stratified_indices

    write_cifar10(tmp_path, 200, 100, release="binary")
    full = load_dataset(cfg("cifar10", tmp_path))
    a = load_dataset(cfg("cifar10", tmp_path, train_subset=0.25, test_subset=30), seed=1)
    b = load_dataset(cfg("cifar10", tmp_path, train_subset=0.25, test_subset=30), seed=1)
    c = load_dataset(cfg("cifar10", tmp_path, train_subset=0.25, test_subset=30), seed=2)
    assert len(a.y_train) == 50 and len(a.y_test) == 30
    assert np.bincount(a.y_train, minlength=10).tolist() == [5] * 10  # 20 per class -> 5 each
    assert np.bincount(a.y_test, minlength=10).tolist() == [3] * 10
    assert np.array_equal(a.x_train, b.x_train) and not np.array_equal(a.x_train, c.x_train)
    assert a.x_train.dtype == np.uint8
    # every chosen sample is the full set's sample with its own label
    rows = {full.x_train[i].tobytes(): full.y_train[i] for i in range(len(full.y_train))}
    assert all(rows[x.tobytes()] == y for x, y in zip(a.x_train, a.y_train))
    assert a.info["subset"] == {"train": {"requested": 0.25, "samples": 50, "of": 200},
                                "test": {"requested": 30, "samples": 30, "of": 100}}
    # uneven classes: each keeps its share within one, the total is exact
    y = np.repeat(np.arange(4), [50, 30, 15, 5])
    idx = stratified_indices(y, 33, np.random.default_rng(0))
    assert len(idx) == 33 and len(np.unique(idx)) == 33
    counts = np.bincount(y[idx], minlength=4)
    assert np.all(np.abs(counts - np.array([50, 30, 15, 5]) * 33 / 100) < 1)
    with pytest.raises(ValueError, match=r"data.train_subset: got 500; expected a count between 1 and the split's 200"):
        load_dataset(cfg("cifar10", tmp_path, train_subset=500))


def test_subset_and_data_keys_validated_at_the_boundary():
    from neurofed.config import ConfigError, load_config

    for item, want in [("data.train_subset=0", "data.train_subset: got 0; expected a count >= 1"),
                       ("data.test_subset=1.5", "data.test_subset: got 1.5; expected a fraction in (0, 1]"),
                       ("data.cifar100_labels=medium", "data.cifar100_labels: got 'medium'; allowed: fine, coarse"),
                       ("data.cifar100_labels=coarse", "only cifar100 has coarse labels"),
                       ("data.svhn_extra=true", "only svhn has an extra split"),
                       ("data.mean=[0.5]", "normalisation applies to direct (analog) input only"),
                       ("data.std=[0]", "data.std: got [0]; expected values > 0")]:
        with pytest.raises(ConfigError) as exc:
            load_config(None, [item])
        assert want in str(exc.value), (item, str(exc.value))


# --------------------------------------------------------------------------- encoding per batch


def test_uint8_pixels_encode_as_their_float_values():
    from neurofed.data.encoding import encode

    x8 = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    xf = x8.float() / 255
    for enc in ("rate", "direct"):
        a = encode(x8, enc, 6, torch.Generator().manual_seed(3))
        b = encode(xf, enc, 6, torch.Generator().manual_seed(3))
        assert torch.equal(a, b), enc
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    d = encode(x8, "direct", 2, mean=mean, std=std)
    assert torch.allclose(d[:, 1, ..., 0], (xf[:, 1] - 0.4) / 0.25)


# --------------------------------------------------------------------------- `neurofed datasets` and a run


def test_datasets_command_lists_every_dataset(tmp_path, capsys):
    from neurofed.cli import main
    from neurofed.data import dataset_names

    write_mnist(tmp_path, 30, 12, layout="torchvision", gz=True)
    write_cifar10(tmp_path, 25, 10, release="python")
    write_svhn(tmp_path / "svhn", 14, 6, extra=4)
    assert main(["datasets", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[3:3 + len(dataset_names())]}
    assert set(rows) == set(dataset_names())
    assert rows["mnist"][1:6] == ["found", "1x28x28", "10", "30", "12"]
    assert rows["cifar10"][1:6] == ["found", "3x32x32", "10", "25", "10"]
    assert rows["svhn"][1:5] == ["found", "3x32x32", "10", "14"] and "(+4 extra)" in " ".join(rows["svhn"])
    assert rows["cifar100"][1:6] == ["missing", "3x32x32", "100", "50,000*", "10,000*"]
    assert rows["digits"][1:6] == ["embedded", "1x8x8", "10", "1,347", "450"]
    assert rows["nmnist"][1] == "missing" and rows["dvsgesture"][2] == "2x128x128xT"
    assert "fashion_mnist: not found; expects the four IDX files" in out


def test_two_client_round_on_tiny_mnist_files(tiny_cfg, tmp_path):
    from neurofed.fl.experiment import Experiment
    from neurofed.pipeline import run

    write_mnist(tmp_path / "data", 60, 30, gz=True, layout="torchvision")
    cfg = tiny_cfg(**{"data.name": "mnist", "data.root": str(tmp_path / "data"), "partition.num_clients": 2,
                      "federation.rounds": 1, "federation.batch_size": 16, "data.test_subset": 20,
                      "federation.threads": 1})
    summary = run(cfg, tmp_path / "run", progress=False, after=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and sorted(records[0]["trained"]) == [0, 1]
    assert 0.0 <= summary["final_accuracy"] <= 1.0 and np.isfinite(records[0]["train_loss"])
    assert summary["data_subset"] == {"test": {"requested": 20, "samples": 20, "of": 30}}
    # the run holds the training images once, as the cache's uint8 memory map
    exp = Experiment(cfg)
    assert exp.x_train.dtype == torch.uint8
    assert exp.x_train.data_ptr() == exp.dataset.x_train.ctypes.data
    assert exp.client_data(0).x.dtype == torch.uint8
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["data_subset"] == summary["data_subset"]
