"""Static image data sets read from their published files: MNIST, Fashion-MNIST,
CIFAR-10, CIFAR-100, SVHN. Nothing is ever downloaded.

Registered data sets (``data.name``) and the layouts looked for under ``data.root``:

- ``mnist``, ``fashion_mnist``: the four IDX files ``train-images-idx3-ubyte``,
  ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``
  (each raw or ``.gz``; also dotted, ``train-images.idx3-ubyte``, as many copies name
  them; also Kaggle's unzipped ``train-images-idx3-ubyte/train-images-idx3-ubyte``),
  directly in ``data.root``, in torchvision's ``<root>/MNIST/raw/``
  (``<root>/FashionMNIST/raw/``) or in ``<root>/mnist/`` (``<root>/fashion-mnist/``,
  ``fashion_mnist/``, ``fashion/``). 1x28x28, 60,000 / 10,000.
- ``cifar10``: the python release ``<root>/cifar-10-batches-py/{data_batch_1..5,
  test_batch}`` (pickles, read by :mod:`neurofed.data.safe_pickle`, which runs nothing)
  or the binary release ``<root>/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin``
  (records of 1 label byte + 3,072 pixel bytes). 3x32x32, 50,000 / 10,000.
- ``cifar100``: ``<root>/cifar-100-python/{train,test}`` or
  ``<root>/cifar-100-binary/{train,test}.bin`` (records of coarse byte, fine byte,
  3,072 pixels). 100 fine classes; ``data.cifar100_labels: coarse`` trains on the 20
  superclasses. 50,000 / 10,000.
- ``svhn``: the cropped digits ``<root>/{train,test}_32x32.mat`` (MATLAB v5: ``X``
  32x32x3xN uint8, ``y`` Nx1 with 10 meaning digit 0, stored here as 0);
  ``data.svhn_extra: true`` appends ``extra_32x32.mat`` to the training split.
  3x32x32, 73,257 / 26,032 (+ 531,131 extra).

``data.root`` may also be the release folder itself (e.g. ``.../cifar-10-batches-py``).

Before the first decode the files are identified (:mod:`neurofed.data.identify`: the
published MD5s, and for MNIST / Fashion-MNIST the first labels): another data set's
files are refused, files that cannot be verified load with a warning and are recorded
(``info["files_identified"]``, the run's ``summary.json``).

The files are decoded once into uint8 ``.npy`` arrays (N, C, H, W) in a cache folder
(:mod:`neurofed.data.cache`: ``data.cache``, default ``<files' folder>/.neurofed_cache``)
keyed by the files' names, sizes and modification times; every later load memory-maps them, so a run
starts in seconds and all clients share one uint8 copy of the images. Pixels become
floats only per batch, in the encoder (:mod:`neurofed.data.encoding`).
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from neurofed.data import register_dataset
from neurofed.data.base import Dataset
from neurofed.data.identify import warn_unverified
from neurofed.data.cache import build_cached, cache_dir, cache_ready, cache_root, file_stamps, load_cached

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # bump when the arrays decoded from the same files change (2: files identified)
NEVER_DOWNLOADS = "neurofed never downloads data sets: copy the published files there"

# A reader maps the found files (role -> path) and the options to, per split, a list
# of chunks (images (n, C, H, W) uint8, {label array name: (n,) labels}).
Chunks = dict[str, list[tuple[np.ndarray, dict[str, np.ndarray]]]]


class DataFileError(ValueError):
    """A data set file is missing, malformed or not what its layout promises (one line)."""


@dataclass(frozen=True)
class Release:
    """One published layout of a data set: its folder(s), file names and reader."""

    name: str  # e.g. "IDX", "python release"
    folders: tuple[str, ...]  # candidate folders relative to data.root ("" = data.root itself)
    files: dict  # role -> accepted file names, first found wins (e.g. raw, then .gz)
    read: Callable[[dict, dict], Chunks]
    count: Callable[[dict], dict]  # found files -> {"train": n, "test": n} (cheap)
    optional: tuple[str, ...] = ()  # roles that may be absent (SVHN's extra)

    def lookup(self, folder: Path) -> dict[str, Path]:
        found = {}
        for role, names in self.files.items():
            path = next((folder / n for n in names if (folder / n).is_file()), None)
            if path is not None:
                found[role] = path
        return found

    def required(self) -> list[str]:
        return [r for r in self.files if r not in self.optional]


@dataclass(frozen=True)
class ImageSet:
    name: str
    title: str
    shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int
    sizes: tuple[int, int]  # published train / test sizes
    releases: tuple[Release, ...]
    layout: str  # what to put where, for messages and `neurofed datasets`
    class_names: tuple[str, ...] = ()

    def candidates(self, root: Path):
        """(release, folder) pairs to look in, in order."""
        for rel in self.releases:
            for sub in rel.folders:
                folder = root / sub if sub else root
                if sub and not folder.is_dir() and root.name == Path(sub).name:
                    folder = root  # data.root is the release folder itself
                yield rel, folder

    def find(self, root) -> tuple[Release, Path, dict[str, Path]]:
        """The first complete release under ``root``; one-line DataFileError otherwise."""
        if root is None:
            raise DataFileError(
                f"data.root: {self.name} ({self.title}) is read from local files and never downloaded; "
                f"set data.root to the folder holding {self.layout}"
            )
        root = Path(root).expanduser()
        partial = None
        for rel, folder in self.candidates(root):
            found = rel.lookup(folder)
            missing = [r for r in rel.required() if r not in found]
            if not missing:
                return rel, folder, found
            if found and (partial is None or len(found) > len(partial[2])):
                partial = (rel, folder, found, missing)
        if partial is not None:
            rel, folder, found, missing = partial
            names = ", ".join("|".join(rel.files[r]) for r in missing)
            raise DataFileError(
                f"{self.name}: incomplete {self.title} {rel.name} in {str(folder)!r}: missing {names}; "
                f"expected {self.layout} ({NEVER_DOWNLOADS})"
            )
        raise DataFileError(
            f"{self.name}: no {self.title} files found under data.root={str(root)!r}; "
            f"expected {self.layout} ({NEVER_DOWNLOADS})"
        )


def _malformed(path: Path, problem: str, expected: str) -> DataFileError:
    return DataFileError(f"{path}: {problem}; expected {expected}")


# --------------------------------------------------------------------------- IDX (MNIST, Fashion-MNIST)

IDX_UBYTE = 0x08


def _idx_bytes(path: Path, limit: int | None = None) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read(-1 if limit is None else limit)
        with open(path, "rb") as fh:
            return fh.read(-1 if limit is None else limit)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise _malformed(path, f"cannot be read ({exc})", "an IDX file, raw or gzip-compressed") from None


def _idx_header(raw: bytes, path: Path, ndim: int) -> tuple[int, ...]:
    what = f"an IDX file of unsigned bytes with {ndim} dimension(s) (magic 0x000008{ndim:02x})"
    if len(raw) < 4 + 4 * ndim or raw[0] != 0 or raw[1] != 0 or raw[2] != IDX_UBYTE or raw[3] != ndim:
        magic = raw[:4].hex() if len(raw) >= 4 else "truncated"
        raise _malformed(path, f"bad IDX header (magic {magic})", what)
    return tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes (raw or .gz) as a uint8 array of its dimensions."""
    raw = _idx_bytes(path)
    dims = _idx_header(raw, path, ndim)
    n = int(np.prod(dims))
    if len(raw) != 4 + 4 * ndim + n:
        raise _malformed(path, f"holds {len(raw) - 4 - 4 * ndim} data bytes, its header {dims} says {n}",
                         "a complete IDX file")
    return np.frombuffer(raw, np.uint8, n, 4 + 4 * ndim).reshape(dims)


def _idx_pair(files: dict, split: str, prefix: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    x = read_idx(files[f"{split}_images"], 3)
    y = read_idx(files[f"{split}_labels"], 1)
    if x.shape[1:] != (28, 28):
        raise _malformed(files[f"{split}_images"], f"images of {x.shape[1]}x{x.shape[2]}", "28x28 images")
    if len(x) == 0:
        raise _malformed(files[f"{split}_images"], "0 images", f"the {split} split's images (at least one)")
    if len(x) != len(y):
        raise _malformed(files[f"{split}_labels"], f"{len(y)} labels for {len(x)} images in "
                         f"{files[f'{split}_images'].name}", f"one label per image of {prefix}")
    if len(y) and y.max() >= num_classes:
        raise _malformed(files[f"{split}_labels"], f"label {int(y.max())}", f"labels 0-{num_classes - 1}")
    return x[:, None], y


def _read_mnist_like(files: dict, opts: dict) -> Chunks:
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x, y = _idx_pair(files, split, prefix, 10)
        out[split] = [(x, {"y": y})]
    return out


def _count_idx(files: dict) -> dict:
    return {split: _idx_header(_idx_bytes(files[f"{split}_labels"], 8), files[f"{split}_labels"], 1)[0]
            for split in ("train", "test")}


FINGERPRINT_LABELS = 10


def _first_labels(files: dict) -> dict:
    """The first labels of the train and test label files (the content fingerprint of
    :mod:`neurofed.data.identify`)."""
    out = {}
    for role in ("train_labels", "test_labels"):
        raw = _idx_bytes(files[role], 8 + FINGERPRINT_LABELS)
        _idx_header(raw, files[role], 1)
        out[role] = list(raw[8:])
    return out


def _idx_files() -> dict:
    """Each IDX file under the names it is distributed with: the publisher's, raw or .gz;
    the dotted ``train-images.idx3-ubyte`` of many copies (Kaggle's MNIST); and Kaggle's
    unzipped layout, a folder of the file's name holding the file."""
    names = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
             "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
    out = {}
    for role, n in names.items():
        dotted = n.replace("-idx", ".idx")
        out[role] = tuple(v for m in (n, dotted) for v in (m, m + ".gz", f"{m}/{m}"))
    return out


def _idx_layout(torchvision: str) -> str:
    return ("the four IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
            "t10k-labels-idx1-ubyte (each raw or .gz, or dotted as train-images.idx3-ubyte) directly in data.root, "
            f"in <root>/{torchvision}/raw/ (torchvision's layout) or in <root>/{torchvision.lower()}/")


MNIST = ImageSet(
    "mnist", "MNIST", (1, 28, 28), 10, (60_000, 10_000),
    (Release("IDX files", ("", "MNIST/raw", "MNIST", "mnist"), _idx_files(), _read_mnist_like, _count_idx),),
    _idx_layout("MNIST"),
)
FASHION_MNIST = ImageSet(
    "fashion_mnist", "Fashion-MNIST", (1, 28, 28), 10, (60_000, 10_000),
    (Release("IDX files", ("", "FashionMNIST/raw", "FashionMNIST", "fashionmnist", "fashion-mnist", "fashion_mnist",
                           "fashion"), _idx_files(), _read_mnist_like, _count_idx),),
    _idx_layout("FashionMNIST"),
    ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
)


# --------------------------------------------------------------------------- CIFAR-10 / CIFAR-100

CIFAR_PIXELS = 3 * 32 * 32
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _cifar_pickle(path: Path, label_keys: tuple[str, ...]) -> tuple[np.ndarray, dict]:
    """One python-release batch: images (n, 3, 32, 32) and its label lists."""
    from neurofed.data.safe_pickle import load

    expected = f"a CIFAR python-release batch: a pickled dict with 'data' (n x 3072 uint8) and {label_keys}"
    d = load(path)
    if not isinstance(d, dict):
        raise _malformed(path, f"holds a {type(d).__name__}", expected)
    d = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in d.items()}
    x = d.get("data")
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != CIFAR_PIXELS:
        got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise _malformed(path, f"'data' is {got}", expected)
    labels = {}
    for k in label_keys:
        if k not in d:
            raise _malformed(path, f"no {k!r} entry", expected)
        y = np.asarray(d[k])
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
            raise _malformed(path, f"{k!r} holds {y.shape} {y.dtype} for {len(x)} images", expected)
        labels[k] = y.astype(np.int64)
    return x.reshape(-1, 3, 32, 32), labels


def _cifar_binary(path: Path, label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A binary-release file as a (n, label_bytes + 3072) uint8 memory map."""
    rec = label_bytes + CIFAR_PIXELS
    size = path.stat().st_size
    if size == 0 or size % rec:
        raise _malformed(path, f"{size} bytes, not a whole number of {rec}-byte records",
                         f"CIFAR binary records of {label_bytes} label byte(s) + 3072 pixel bytes")
    return np.memmap(path, np.uint8, "r", shape=(size // rec, rec))


def _check_labels(path: Path, y: np.ndarray, k: int, what: str) -> None:
    bad = y[(y < 0) | (y >= k)] if len(y) else y
    if len(bad):
        raise _malformed(path, f"{what} label {int(bad[0])}", f"{what} labels 0-{k - 1}")


CIFAR10_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))


def _read_cifar10_py(files: dict, opts: dict) -> Chunks:
    out = {"train": [], "test": []}
    for role, path in sorted(files.items()):
        x, labels = _cifar_pickle(path, ("labels",))
        _check_labels(path, labels["labels"], 10, "class")
        out["test" if role == "test_batch" else "train"].append((x, {"y": labels["labels"]}))
    return out


def _read_cifar10_bin(files: dict, opts: dict) -> Chunks:
    out = {"train": [], "test": []}
    for role, path in sorted(files.items()):
        rec = _cifar_binary(path, 1)
        y = np.asarray(rec[:, 0], dtype=np.int64)
        _check_labels(path, y, 10, "class")
        out["test" if role == "test_batch" else "train"].append((rec[:, 1:].reshape(-1, 3, 32, 32), {"y": y}))
    return out


def _read_cifar100_py(files: dict, opts: dict) -> Chunks:
    out = {}
    for split in ("train", "test"):
        path = files[split]
        x, labels = _cifar_pickle(path, ("fine_labels", "coarse_labels"))
        _check_labels(path, labels["fine_labels"], 100, "fine")
        _check_labels(path, labels["coarse_labels"], 20, "coarse")
        out[split] = [(x, {"y": labels["fine_labels"], "y_coarse": labels["coarse_labels"]})]
    return out


def _read_cifar100_bin(files: dict, opts: dict) -> Chunks:
    out = {}
    for split in ("train", "test"):
        path = files[split]
        rec = _cifar_binary(path, 2)
        coarse, fine = (np.asarray(rec[:, i], dtype=np.int64) for i in (0, 1))
        _check_labels(path, fine, 100, "fine")
        _check_labels(path, coarse, 20, "coarse")
        out[split] = [(rec[:, 2:].reshape(-1, 3, 32, 32), {"y": fine, "y_coarse": coarse})]
    return out


def _count_pickles(files: dict) -> dict:
    counts = {"train": 0, "test": 0}
    for role, path in files.items():
        x, _ = _cifar_pickle(path, ())
        counts["test" if role in ("test_batch", "test") else "train"] += len(x)
    return counts


def _count_binary(label_bytes: int):
    def count(files: dict) -> dict:
        counts = {"train": 0, "test": 0}
        for role, path in files.items():
            counts["test" if role in ("test_batch", "test") else "train"] += len(_cifar_binary(path, label_bytes))
        return counts

    return count


CIFAR10 = ImageSet(
    "cifar10", "CIFAR-10", (3, 32, 32), 10, (50_000, 10_000),
    (Release("python release", ("cifar-10-batches-py",),
             {n: (n,) for n in (*CIFAR10_BATCHES, "test_batch")}, _read_cifar10_py, _count_pickles),
     Release("binary release", ("cifar-10-batches-bin",),
             {n: (n + ".bin",) for n in (*CIFAR10_BATCHES, "test_batch")}, _read_cifar10_bin, _count_binary(1))),
    "the python release <root>/cifar-10-batches-py/{data_batch_1..5,test_batch} or the binary release "
    "<root>/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin",
    CIFAR10_CLASSES,
)
CIFAR100 = ImageSet(
    "cifar100", "CIFAR-100", (3, 32, 32), 100, (50_000, 10_000),
    (Release("python release", ("cifar-100-python",), {"train": ("train",), "test": ("test",)},
             _read_cifar100_py, _count_pickles),
     Release("binary release", ("cifar-100-binary",), {"train": ("train.bin",), "test": ("test.bin",)},
             _read_cifar100_bin, _count_binary(2))),
    "the python release <root>/cifar-100-python/{train,test} or the binary release "
    "<root>/cifar-100-binary/{train,test}.bin",
)


# --------------------------------------------------------------------------- SVHN

SVHN_CHUNK = 8192  # images transposed per step while caching (extra holds 531,131)


def _svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``X`` (32, 32, 3, N) uint8 and ``y`` (N,) of one .mat file, y == 10 turned into 0."""
    import scipy.io

    expected = "SVHN's cropped-digit .mat (MATLAB v5) with X 32x32x3xN uint8 and y Nx1 labels 1-10"
    try:
        m = scipy.io.loadmat(path, variable_names=("X", "y"))
    except (ValueError, TypeError, OSError, NotImplementedError, scipy.io.matlab.MatReadError) as exc:
        problem = f"not a readable MATLAB v5 file ({exc})".splitlines()[0]
        raise _malformed(path, problem, expected) from None
    x, y = m.get("X"), m.get("y")
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else "no X"
        raise _malformed(path, f"X is {got}", expected)
    y = np.asarray(y).reshape(-1) if y is not None else None
    if y is None or len(y) != x.shape[3] or not np.all((y >= 1) & (y <= 10) & (y == np.round(y))):
        raise _malformed(path, "y is missing, of another length than X, or outside 1-10", expected)
    y = y.astype(np.int64)
    y[y == 10] = 0  # SVHN marks the digit 0 with label 10
    return x, y


def _svhn_chunks(path: Path) -> list:
    x, y = _svhn_mat(path)
    # (H, W, C, N) -> (N, C, H, W) views, copied chunk by chunk when written to the cache
    return [(x[..., i:i + SVHN_CHUNK].transpose(3, 2, 0, 1), {"y": y[i:i + SVHN_CHUNK]})
            for i in range(0, len(y), SVHN_CHUNK)]


def _read_svhn(files: dict, opts: dict) -> Chunks:
    out = {"train": _svhn_chunks(files["train"]), "test": _svhn_chunks(files["test"])}
    if opts.get("svhn_extra"):
        out["train"] += _svhn_chunks(files["extra"])
    return out


def _count_svhn(files: dict) -> dict:
    import scipy.io

    counts = {}
    for role, path in files.items():
        try:
            shapes = {name: shape for name, shape, _ in scipy.io.whosmat(path)}
        except (ValueError, TypeError, OSError, NotImplementedError, scipy.io.matlab.MatReadError):
            shapes = {}
        if len(shapes.get("X", ())) != 4:
            raise _malformed(path, "no 32x32x3xN X", "SVHN's cropped-digit .mat (MATLAB v5)")
        counts[role] = int(shapes["X"][3])
    return counts


SVHN = ImageSet(
    "svhn", "SVHN", (3, 32, 32), 10, (73_257, 26_032),
    (Release("cropped digits (.mat)", ("", "svhn", "SVHN"),
             {"train": ("train_32x32.mat",), "test": ("test_32x32.mat",), "extra": ("extra_32x32.mat",)},
             _read_svhn, _count_svhn, optional=("extra",)),),
    "train_32x32.mat and test_32x32.mat (optional extra_32x32.mat; SVHN's cropped digits, MATLAB v5) "
    "directly in data.root or in <root>/svhn/",
    tuple(str(d) for d in range(10)),
)

IMAGE_SETS = {s.name: s for s in (MNIST, FASHION_MNIST, CIFAR10, CIFAR100, SVHN)}


# --------------------------------------------------------------------------- options, cache, load


def image_options(name: str, data_cfg: dict) -> dict:
    """The keys that change what ``name`` loads; one-line errors for keys of other sets."""
    from neurofed.data import DATA_DEFAULTS, image_option_problems

    d = {**DATA_DEFAULTS, **data_cfg, "name": name}
    problems = image_option_problems(d)
    if problems:
        raise DataFileError("\n".join(problems))
    return {"root": d.get("root"), "cache": d.get("cache"), "cifar100_labels": d["cifar100_labels"],
            "svhn_extra": d["svhn_extra"]}


def _write_split(tmp: Path, split: str, chunks: list, shape: tuple) -> dict:
    n = sum(len(x) for x, _ in chunks)
    x_out = np.lib.format.open_memmap(tmp / f"x_{split}.npy", mode="w+", dtype=np.uint8, shape=(n, *shape))
    labels: dict[str, list] = {}
    i = 0
    for x, ys in chunks:
        if tuple(x.shape[1:]) != tuple(shape):
            raise DataFileError(f"images of shape {tuple(x.shape[1:])}; expected {shape}")
        x_out[i:i + len(x)] = x
        i += len(x)
        for k, y in ys.items():
            labels.setdefault(k, []).append(np.asarray(y, dtype=np.int64))
    x_out.flush()
    del x_out
    for k, parts in labels.items():
        suffix = k[1:]  # "y" -> "", "y_coarse" -> "_coarse"
        np.save(tmp / f"y_{split}{suffix}.npy", np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return {"n": n}


def load_image_set(spec: ImageSet, data_cfg: dict) -> Dataset:
    """``spec``'s data set from ``data.root``, through the uint8 cache."""
    opts = image_options(spec.name, data_cfg)
    release, folder, files = spec.find(opts["root"])
    used = {r: p for r, p in files.items() if r != "extra" or opts["svhn_extra"]}
    if spec.name == "svhn" and opts["svhn_extra"] and "extra" not in used:
        raise DataFileError(f"data.svhn_extra: true but no extra_32x32.mat in {str(folder)!r}; "
                            f"expected {spec.layout} ({NEVER_DOWNLOADS})")
    key = {"dataset": spec.name, "format": FORMAT_VERSION, "release": release.name,
           "files": file_stamps(folder, used.values()), "svhn_extra": opts["svhn_extra"]}
    target = cache_dir(cache_root(opts["cache"], folder), spec.name, key)
    if not cache_ready(target, key):  # absent, or changed since it was built (then rebuilt)
        log.info("%s: decoding the %s in %s into %s (once)", spec.name, release.name, folder, target)

        def build(tmp: Path) -> dict:
            identity = identify_files(spec, used)  # before decoding: another set's files are refused
            chunks = release.read(used, opts)
            splits = {s: _write_split(tmp, s, c, spec.shape) for s, c in chunks.items()}
            empty = [s for s, meta in splits.items() if meta["n"] == 0]
            if empty:
                raise DataFileError(f"{folder}: the {empty[0]} split of its {spec.title} {release.name} holds 0 "
                                    f"images; expected {spec.layout}")
            return {"splits": splits, "identity": identity}

        build_cached(target, key, build)
    identity = json.loads((target / "meta.json").read_text()).get("identity", {})
    warn_unverified(spec.name, spec.title, folder, identity)
    # copy-on-write maps: writable for torch.from_numpy, yet nothing is ever written back
    arrays = load_cached(target, mmap_mode="c")
    num_classes, label_set = spec.num_classes, ""
    if spec.name == "cifar100" and opts["cifar100_labels"] == "coarse":
        num_classes, label_set = 20, "_coarse"
    info = {"synthetic": False, "source": spec.title, "release": release.name, "data_dir": str(folder),
            "cache": str(target), "files_identified": identity,
            "labels": opts["cifar100_labels"] if spec.name == "cifar100" else "class",
            "class_names": list(spec.class_names) if spec.class_names and not label_set else None}
    if spec.name == "svhn":
        info["svhn_extra"] = opts["svhn_extra"]
    return Dataset(spec.name, arrays["x_train"], arrays[f"y_train{label_set}"], arrays["x_test"],
                   arrays[f"y_test{label_set}"], num_classes=num_classes, kind="image", info=info)


def describe(spec: ImageSet, root) -> dict:
    """What ``neurofed datasets`` shows: found or not, shape, classes, split sizes."""
    row = {"name": spec.name, "shape": spec.shape, "classes": spec.num_classes, "layout": spec.layout}
    missing = {**row, "found": False, "where": None, "train": spec.sizes[0], "test": spec.sizes[1],
               "sizes_from": "published"}
    try:
        release, folder, files = spec.find(root)
    except DataFileError as exc:  # a partial set is worth its message; an absent one only the layout
        return {**missing, "problem": str(exc) if "incomplete" in str(exc) else None}
    try:
        counts = release.count(files)
        identity = identify_files(spec, files)
    except DataFileError as exc:
        return {**missing, "problem": str(exc)}
    unverified = f"; not verified as {spec.title}'s: {', '.join(identity['unverified'])}" \
        if identity["unverified"] else ""
    where = f"{folder} ({release.name}{', with extra' if 'extra' in files else ''}{unverified})"
    row.update(found=True, where=where, train=counts["train"], test=counts["test"], sizes_from="files")
    if "extra" in counts:
        row["extra"] = counts["extra"]
    return row


def identify_files(spec: ImageSet, files: dict) -> dict:
    """:func:`neurofed.data.identify.identify` for ``spec``'s found files (role -> path)."""
    from neurofed.data.identify import identify

    labels = _first_labels(files) if spec.name in ("mnist", "fashion_mnist") else None
    return identify(spec.name, {s.name: s.title for s in IMAGE_SETS.values()}, files, labels)


def _register(spec: ImageSet):
    @register_dataset(spec.name)
    def load(data_cfg: dict, seed: int = 0) -> Dataset:
        return load_image_set(spec, data_cfg)

    load.__name__ = f"load_{spec.name}"
    load.__doc__ = f"{spec.title} from {spec.layout}."
    return load


for _spec in IMAGE_SETS.values():
    _register(_spec)
