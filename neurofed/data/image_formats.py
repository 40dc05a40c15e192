"""The readers of the published image files (IDX, CIFAR's python and binary releases,
SVHN's MATLAB files) and the data sets built on them (layouts: :mod:`neurofed.data.images`)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from neurofed.data.image_sets import Chunks, ImageSet, Release, malformed


IDX_UBYTE = 0x08


def _idx_bytes(path: Path, limit: int | None = None) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read(-1 if limit is None else limit)
        with open(path, "rb") as fh:
            return fh.read(-1 if limit is None else limit)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise malformed(path, f"cannot be read ({exc})", "an IDX file, raw or gzip-compressed") from None


def _idx_header(raw: bytes, path: Path, ndim: int) -> tuple[int, ...]:
    what = f"an IDX file of unsigned bytes with {ndim} dimension(s) (magic 0x000008{ndim:02x})"
    if len(raw) < 4 + 4 * ndim or raw[0] != 0 or raw[1] != 0 or raw[2] != IDX_UBYTE or raw[3] != ndim:
        magic = raw[:4].hex() if len(raw) >= 4 else "truncated"
        raise malformed(path, f"bad IDX header (magic {magic})", what)
    return tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes (raw or .gz) as a uint8 array of its dimensions."""
    raw = _idx_bytes(path)
    dims = _idx_header(raw, path, ndim)
    n = int(np.prod(dims))
    if len(raw) != 4 + 4 * ndim + n:
        raise malformed(path, f"holds {len(raw) - 4 - 4 * ndim} data bytes, its header {dims} says {n}",
                         "a complete IDX file")
    return np.frombuffer(raw, np.uint8, n, 4 + 4 * ndim).reshape(dims)


def _idx_pair(files: dict, split: str, prefix: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    x = read_idx(files[f"{split}_images"], 3)
    y = read_idx(files[f"{split}_labels"], 1)
    if x.shape[1:] != (28, 28):
        raise malformed(files[f"{split}_images"], f"images of {x.shape[1]}x{x.shape[2]}", "28x28 images")
    if len(x) == 0:
        raise malformed(files[f"{split}_images"], "0 images", f"the {split} split's images (at least one)")
    if len(x) != len(y):
        raise malformed(files[f"{split}_labels"], f"{len(y)} labels for {len(x)} images in "
                         f"{files[f'{split}_images'].name}", f"one label per image of {prefix}")
    if len(y) and y.max() >= num_classes:
        raise malformed(files[f"{split}_labels"], f"label {int(y.max())}", f"labels 0-{num_classes - 1}")
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


def first_labels(files: dict) -> dict:
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


CIFAR_PIXELS = 3 * 32 * 32


CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _cifar_pickle(path: Path, label_keys: tuple[str, ...]) -> tuple[np.ndarray, dict]:
    """One python-release batch: images (n, 3, 32, 32) and its label lists."""
    from neurofed.data.safe_pickle import load

    expected = f"a CIFAR python-release batch: a pickled dict with 'data' (n x 3072 uint8) and {label_keys}"
    d = load(path)
    if not isinstance(d, dict):
        raise malformed(path, f"holds a {type(d).__name__}", expected)
    d = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in d.items()}
    x = d.get("data")
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != CIFAR_PIXELS:
        got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise malformed(path, f"'data' is {got}", expected)
    labels = {}
    for k in label_keys:
        if k not in d:
            raise malformed(path, f"no {k!r} entry", expected)
        y = np.asarray(d[k])
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
            raise malformed(path, f"{k!r} holds {y.shape} {y.dtype} for {len(x)} images", expected)
        labels[k] = y.astype(np.int64)
    return x.reshape(-1, 3, 32, 32), labels


def _cifar_binary(path: Path, label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A binary-release file as a (n, label_bytes + 3072) uint8 memory map."""
    rec = label_bytes + CIFAR_PIXELS
    size = path.stat().st_size
    if size == 0 or size % rec:
        raise malformed(path, f"{size} bytes, not a whole number of {rec}-byte records",
                         f"CIFAR binary records of {label_bytes} label byte(s) + 3072 pixel bytes")
    return np.memmap(path, np.uint8, "r", shape=(size // rec, rec))


def _check_labels(path: Path, y: np.ndarray, k: int, what: str) -> None:
    bad = y[(y < 0) | (y >= k)] if len(y) else y
    if len(bad):
        raise malformed(path, f"{what} label {int(bad[0])}", f"{what} labels 0-{k - 1}")


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


SVHN_CHUNK = 8192  # images transposed per step while caching (extra holds 531,131)


def _svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``X`` (32, 32, 3, N) uint8 and ``y`` (N,) of one .mat file, y == 10 turned into 0."""
    import scipy.io

    expected = "SVHN's cropped-digit .mat (MATLAB v5) with X 32x32x3xN uint8 and y Nx1 labels 1-10"
    try:
        m = scipy.io.loadmat(path, variable_names=("X", "y"))
    except (ValueError, TypeError, OSError, NotImplementedError, scipy.io.matlab.MatReadError) as exc:
        problem = f"not a readable MATLAB v5 file ({exc})".splitlines()[0]
        raise malformed(path, problem, expected) from None
    x, y = m.get("X"), m.get("y")
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else "no X"
        raise malformed(path, f"X is {got}", expected)
    y = np.asarray(y).reshape(-1) if y is not None else None
    if y is None or len(y) != x.shape[3] or not np.all((y >= 1) & (y <= 10) & (y == np.round(y))):
        raise malformed(path, "y is missing, of another length than X, or outside 1-10", expected)
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
            raise malformed(path, "no 32x32x3xN X", "SVHN's cropped-digit .mat (MATLAB v5)")
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
