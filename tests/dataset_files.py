"""Tiny data set files written in their publishers' formats, for tests only.

Each ``write_*`` function writes ``n`` training and ``n_test`` test samples of random
pixels under ``root`` in the published layout and returns what a correct reader must
load, in neurofed's layout: ``{"x_train": (n, C, H, W) uint8, "y_train": (n,) int64,
"x_test", "y_test"}`` (+ ``"y_train_coarse"``/``"y_test_coarse"`` for CIFAR-100,
``"x_extra"``/``"y_extra"`` for SVHN) and ``"dir"``, the folder the files are in.
Labels cycle through every class, so stratified subsets and partitions have all of
them. Keep this API stable: the paper presets' test uses it too.

Formats, as published:

- IDX (MNIST, Fashion-MNIST): big-endian magic ``0x0000080N`` (unsigned bytes, N
  dimensions), N 32-bit sizes, then the bytes; optionally gzip-compressed (``.gz``).
- CIFAR python release: Python 2 pickles (protocol 2, byte strings written as
  ``str``) of dicts with ``data`` (n x 3072 uint8, channel-major rows), ``labels``
  (CIFAR-10) or ``fine_labels`` + ``coarse_labels`` (CIFAR-100), ``batch_label``,
  ``filenames``.
- CIFAR binary release: records of 1 label byte (CIFAR-100: coarse byte, fine byte)
  and 3,072 pixel bytes.
- SVHN cropped digits: MATLAB v5 .mat with ``X`` (32, 32, 3, n) uint8 and ``y``
  (n, 1) uint8 labels 1-10, 10 meaning digit 0.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
from pathlib import Path

import numpy as np


def dated_later(path) -> None:
    """Date ``path`` a second after it was written, as an edit made later is, so that a test
    of an in-place edit does not depend on the file system's timestamp granularity."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _images(rng, n: int, shape) -> np.ndarray:
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def _labels(rng, n: int, k: int) -> np.ndarray:
    return rng.permutation(np.arange(n) % k).astype(np.int64)


# --------------------------------------------------------------------------- IDX


def idx_bytes(array: np.ndarray) -> bytes:
    """An array of unsigned bytes in the IDX format."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def _write_idx_set(root, folder: str, n: int, n_test: int, gz: bool, layout: str, seed: int) -> dict:
    if layout not in ("flat", "torchvision"):
        raise ValueError(f"layout: got {layout!r}; allowed: flat, torchvision")
    rng = np.random.default_rng(seed)
    out = Path(root) / folder / "raw" if layout == "torchvision" else Path(root)
    out.mkdir(parents=True, exist_ok=True)
    data = {"x_train": _images(rng, n, (28, 28)), "y_train": _labels(rng, n, 10),
            "x_test": _images(rng, n_test, (28, 28)), "y_test": _labels(rng, n_test, 10)}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        for what, name, array in (("x", f"{prefix}-images-idx3-ubyte", data[f"x_{split}"]),
                                  ("y", f"{prefix}-labels-idx1-ubyte", data[f"y_{split}"])):
            raw = idx_bytes(array)
            if gz:
                (out / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (out / name).write_bytes(raw)
    data["x_train"], data["x_test"] = data["x_train"][:, None], data["x_test"][:, None]
    data["dir"] = out
    return data


def write_mnist(root, n: int = 40, n_test: int = 20, *, gz: bool = False, layout: str = "flat",
                seed: int = 0) -> dict:
    """MNIST's four IDX files in ``root`` (``layout="flat"``) or ``root/MNIST/raw``."""
    return _write_idx_set(root, "MNIST", n, n_test, gz, layout, seed)


def write_fashion_mnist(root, n: int = 40, n_test: int = 20, *, gz: bool = False, layout: str = "flat",
                        seed: int = 1) -> dict:
    """Fashion-MNIST's four IDX files in ``root`` or ``root/FashionMNIST/raw``."""
    return _write_idx_set(root, "FashionMNIST", n, n_test, gz, layout, seed)


# --------------------------------------------------------------------------- CIFAR


class _Py2Pickler(pickle._Pickler):
    """Pickles ``bytes`` as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING), as the
    published CIFAR files were written; read back with ``encoding="bytes"``."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _batch_dict(x: np.ndarray, labels: dict, name: str) -> dict:
    d = {b"batch_label": name.encode(), b"data": x.reshape(len(x), -1)}
    d.update({k.encode(): [int(v) for v in y] for k, y in labels.items()})
    d[b"filenames"] = [f"img_{i:05d}.png".encode() for i in range(len(x))]
    return d


def write_cifar10(root, n: int = 50, n_test: int = 20, *, release: str = "python", seed: int = 2) -> dict:
    """CIFAR-10 in ``root/cifar-10-batches-py`` or ``root/cifar-10-batches-bin``:
    the training samples spread over ``data_batch_1..5`` in order, then ``test_batch``."""
    if release not in ("python", "binary"):
        raise ValueError(f"release: got {release!r}; allowed: python, binary")
    rng = np.random.default_rng(seed)
    data = {"x_train": _images(rng, n, (3, 32, 32)), "y_train": _labels(rng, n, 10),
            "x_test": _images(rng, n_test, (3, 32, 32)), "y_test": _labels(rng, n_test, 10)}
    out = Path(root) / ("cifar-10-batches-py" if release == "python" else "cifar-10-batches-bin")
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, n, 6).astype(int)
    files = [(f"data_batch_{i + 1}", slice(bounds[i], bounds[i + 1]), "train") for i in range(5)]
    files.append(("test_batch", slice(0, n_test), "test"))
    for name, sl, split in files:
        x, y = data[f"x_{split}"][sl], data[f"y_{split}"][sl]
        if release == "python":
            (out / name).write_bytes(py2_pickle(_batch_dict(x, {"labels": y}, name)))
        else:
            rec = np.concatenate([y.astype(np.uint8)[:, None], x.reshape(len(x), -1)], axis=1)
            (out / f"{name}.bin").write_bytes(rec.tobytes())
    if release == "python":
        meta = {b"label_names": [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog",
                                 b"horse", b"ship", b"truck"], b"num_cases_per_batch": 10000, b"num_vis": 3072}
        (out / "batches.meta").write_bytes(py2_pickle(meta))
    else:
        (out / "batches.meta.txt").write_text("airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n")
    data["dir"] = out
    return data


def write_cifar100(root, n: int = 200, n_test: int = 100, *, release: str = "python", seed: int = 3) -> dict:
    """CIFAR-100 in ``root/cifar-100-python/{train,test}`` or ``root/cifar-100-binary/{train,test}.bin``.
    A fine label f has the coarse label f // 5 here (the real mapping differs; only its
    pairing per sample matters to a reader)."""
    if release not in ("python", "binary"):
        raise ValueError(f"release: got {release!r}; allowed: python, binary")
    rng = np.random.default_rng(seed)
    data = {"x_train": _images(rng, n, (3, 32, 32)), "y_train": _labels(rng, n, 100),
            "x_test": _images(rng, n_test, (3, 32, 32)), "y_test": _labels(rng, n_test, 100)}
    data["y_train_coarse"], data["y_test_coarse"] = data["y_train"] // 5, data["y_test"] // 5
    out = Path(root) / ("cifar-100-python" if release == "python" else "cifar-100-binary")
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        x, fine, coarse = data[f"x_{split}"], data[f"y_{split}"], data[f"y_{split}_coarse"]
        if release == "python":
            d = _batch_dict(x, {"fine_labels": fine, "coarse_labels": coarse}, split)
            (out / split).write_bytes(py2_pickle(d))
        else:
            rec = np.concatenate([coarse.astype(np.uint8)[:, None], fine.astype(np.uint8)[:, None],
                                  x.reshape(len(x), -1)], axis=1)
            (out / f"{split}.bin").write_bytes(rec.tobytes())
    data["dir"] = out
    return data


# --------------------------------------------------------------------------- SVHN


def write_svhn(root, n: int = 40, n_test: int = 20, *, extra: int = 0, seed: int = 4) -> dict:
    """SVHN's ``train_32x32.mat``, ``test_32x32.mat`` (and ``extra_32x32.mat`` when
    ``extra`` > 0) in ``root``, MATLAB v5, digit 0 labelled 10."""
    import scipy.io

    rng = np.random.default_rng(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    data = {"dir": root}
    for split, m in (("train", n), ("test", n_test), ("extra", extra)):
        if split == "extra" and not extra:
            continue
        x, y = _images(rng, m, (3, 32, 32)), _labels(rng, m, 10)
        mat_y = np.where(y == 0, 10, y).astype(np.uint8)[:, None]
        scipy.io.savemat(root / f"{split}_32x32.mat", {"X": np.ascontiguousarray(x.transpose(2, 3, 1, 0)), "y": mat_y},
                         format="5")
        data[f"x_{split}"], data[f"y_{split}"] = x, y
    return data
