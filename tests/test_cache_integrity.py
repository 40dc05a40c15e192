"""The data cache checks itself: meta.json records a SHA-256 of what the cache was built
from and of each of its arrays; a cache changed since (a label written into the MNIST
cache's labels, an array removed) is rebuilt, with one warning line naming the file."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from dataset_files import write_mnist
from neurofed.data import load_dataset
from neurofed.data.cache import cache_problem


@pytest.fixture
def mnist(tmp_path):
    ref = write_mnist(tmp_path / "data", 30, 12)
    conf = {"name": "mnist", "root": str(tmp_path / "data"), "cache": str(tmp_path / "cache")}
    load_dataset(conf)
    (folder,) = (tmp_path / "cache").iterdir()
    return ref, conf, folder


def _warnings(caplog) -> list[str]:
    """The cache's warnings (the unverified tiny files get their own, from neurofed.data.identify)."""
    records = {id(r): r for r in caplog.records}.values()  # once, whether or not the logger propagates too
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING and r.name == "neurofed.data.cache"]


@pytest.fixture
def caplog(caplog):
    logger = logging.getLogger("neurofed")  # it does not propagate to the root logger caplog reads
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


def test_the_cache_records_hashes_of_its_source_and_its_arrays(mnist, caplog):
    _, conf, folder = mnist
    meta = json.loads((folder / "meta.json").read_text())
    assert len(meta["source_sha256"]) == 64
    assert sorted(meta["arrays"]) == sorted(p.name for p in folder.glob("*.npy"))
    stamp = (folder / "meta.json").stat().st_mtime_ns
    load_dataset(conf)  # unchanged: used as it is, nothing said
    assert (folder / "meta.json").stat().st_mtime_ns == stamp and not _warnings(caplog)


def test_a_label_written_into_the_cache_is_caught_and_the_cache_rebuilt(mnist, caplog):
    ref, conf, folder = mnist
    labels = np.load(folder / "y_train.npy")
    labels[0] = 200
    np.save(folder / "y_train.npy", labels)
    caplog.clear()
    assert "y_train.npy: changed since the cache was built" in cache_problem(folder, json.loads(
        (folder / "meta.json").read_text())["key"])

    ds = load_dataset(conf)
    assert np.array_equal(ds.y_train, ref["y_train"]) and int(ds.y_train.max()) < 10
    (line,) = _warnings(caplog)
    assert str(folder / "y_train.npy") in line and "rebuilding" in line and "\n" not in line


@pytest.mark.parametrize("damage", ["remove an array", "add an array", "drop the hashes"])
def test_a_cache_missing_an_array_or_its_hashes_is_rebuilt(mnist, caplog, damage):
    ref, conf, folder = mnist
    if damage == "remove an array":
        (folder / "x_test.npy").unlink()
    elif damage == "add an array":
        np.save(folder / "y_extra.npy", np.zeros(3, np.int64))
    else:  # a cache an older neurofed built
        meta = json.loads((folder / "meta.json").read_text())
        del meta["arrays"]
        (folder / "meta.json").write_text(json.dumps(meta))
    caplog.clear()
    ds = load_dataset(conf)
    assert np.array_equal(ds.x_test, ref["x_test"])
    (line,) = _warnings(caplog)
    assert str(folder) in line and "rebuilding" in line
    assert cache_problem(folder, json.loads((folder / "meta.json").read_text())["key"]) is None
