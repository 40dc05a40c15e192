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

import json
import logging
from pathlib import Path

import numpy as np

from neurofed.data import register_dataset
from neurofed.data.base import DataFileError, Dataset
from neurofed.data.identify import warn_unverified
from neurofed.data.image_formats import IMAGE_SETS, first_labels
from neurofed.data.image_sets import NEVER_DOWNLOADS, ImageSet
from neurofed.data.cache import build_cached, cache_dir, cache_ready, cache_root, file_stamps, load_cached

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # bump when the arrays decoded from the same files change (2: files identified)


# --------------------------------------------------------------------------- IDX (MNIST, Fashion-MNIST)


# --------------------------------------------------------------------------- CIFAR-10 / CIFAR-100


# --------------------------------------------------------------------------- SVHN


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

    labels = first_labels(files) if spec.name in ("mnist", "fashion_mnist") else None
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
