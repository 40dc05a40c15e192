"""Event-camera (DVS) data sets as binary spike tensors (N, 2, H, W, T), read with tonic.

Registered data sets (``data.name``):

- ``nmnist``: N-MNIST (Orchard et al., 2015), 34x34, 10 classes, from
  ``<data.root>/NMNIST/{Train,Test}/<digit>/<id>.bin`` (the published 40-bit event
  files, read by ``tonic.datasets.NMNIST``).
- ``dvsgesture``: DVS128 Gesture (Amir et al., 2017), 128x128, 11 classes, from
  ``<data.root>/DVSGesture/{ibmGestureTrain,ibmGestureTest}/user<NN>_<lighting>/<label>.npy``
  (tonic's preprocessed release, read by ``tonic.datasets.DVSGesture``).
- ``cifar10dvs``: CIFAR10-DVS (Li et al., 2017), 128x128, 10 classes, from
  ``<data.root>/CIFAR10DVS/<class>/<id>.aedat4`` (tonic's release, read by
  ``tonic.datasets.CIFAR10DVS``, which needs the ``aedat`` package). It has no
  published split: the split is stratified with ``data.test_fraction`` and a fixed
  seed, as for ``digits``.
- ``digits_events``: **synthetic** events of scikit-learn's 8x8 digits moved in
  three N-MNIST-like saccades in front of a simulated event camera (24x24, see
  :mod:`neurofed.data.synthetic_events`); embedded, nothing to put on disk. Same
  train/test split as ``digits``.

``data.root`` may be the folder tonic would download into (holding ``NMNIST/``
etc.) or the data set's own folder. Nothing is ever downloaded: tonic's dataset
classes are used through subclasses whose ``download`` cannot run, and missing
files raise one line naming the files expected and where.

Event -> tensor pipeline (tonic transforms, applied per sample, in this order):
``Denoise(filter_time=data.denoise_us)`` (when not null), ``Downsample(spatial_factor=
1/data.downsample)`` (when > 1), ``ToFrame`` into ``data.timesteps`` frames of equal
duration (``data.bin_by: time``, tonic's ``n_time_bins``) or of equal event count
(``count``, ``n_event_bins``), then counts clipped to 1: the tensors are binary input
spikes for SLAYER and Lava. Channel 0 holds OFF events (p = 0), channel 1 ON (p = 1).

The frames are computed once and cached as ``.npy`` files (uint8) in
``<data.cache>/<name>-<hash>/``, ``data.cache`` defaulting to
``<data.root>/.neurofed_cache`` (``~/.cache/neurofed`` for the embedded set, or when
the data folder is read-only). The hash covers every parameter that changes the
frames and, for local files, the list of files and their sizes. Later loads
memory-map the cached arrays (``np.load(mmap_mode="r")``) and bin nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Sequence

import numpy as np
import numpy.lib.recfunctions  # noqa: F401  (tonic's DVSGesture uses np.lib.recfunctions)

from neurofed.data import register_dataset
from neurofed.data.base import Dataset
from neurofed.data.event_frames import Subset, frames_cache_root, frames_dataset

log = logging.getLogger(__name__)

SPLIT_SEED = 0  # the fixed split seed of neurofed.data.digits
EVENT_DATASETS = ("nmnist", "dvsgesture", "cifar10dvs", "digits_events")


# --------------------------------------------------------------------------- options


def event_options(data_cfg: dict) -> dict:
    """The pipeline parameters of ``data_cfg`` (defaults filled in), checked.

    Raises ``ValueError`` with one line per problem, naming the key.
    """
    from neurofed.data import DATA_DEFAULTS

    d = {**DATA_DEFAULTS, **data_cfg}
    name = d.get("name")
    problems = []
    if d.get("encoding") != "events":
        problems.append(
            f"data.encoding: got {d.get('encoding')!r}; {name} is an event data set whose samples "
            "already are spike tensors: set data.encoding: events"
        )
    t = d.get("timesteps")
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        problems.append(f"data.timesteps: got {t!r}; expected an integer >= 1")
    if d.get("bin_by") not in ("time", "count"):
        problems.append(f"data.bin_by: got {d.get('bin_by')!r}; allowed: time, count")
    k = d.get("downsample")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        problems.append(f"data.downsample: got {k!r}; expected an integer >= 1 (1 = full resolution)")
    dn = d.get("denoise_us")
    if dn is not None and (isinstance(dn, bool) or not isinstance(dn, (int, float)) or dn <= 0):
        problems.append(f"data.denoise_us: got {dn!r}; expected a time in microseconds > 0, or null (off)")
    c = d.get("contrast_threshold")
    if isinstance(c, bool) or not isinstance(c, (int, float)) or c <= 0:
        problems.append(f"data.contrast_threshold: got {c!r}; expected a number > 0")
    if problems:
        raise ValueError("\n".join(problems))
    return {
        "timesteps": int(t),
        "bin_by": d["bin_by"],
        "downsample": int(k),
        "denoise_us": None if dn is None else float(dn),
        "contrast_threshold": float(c),
        "test_fraction": float(d["test_fraction"]),
        "root": d.get("root"),
        "cache": d.get("cache"),
    }


# --------------------------------------------------------------------------- events -> frames


# --------------------------------------------------------------------------- cache


# --------------------------------------------------------------------------- local files via tonic


@dataclass(frozen=True)
class _LocalSet:
    name: str  # registry name
    title: str
    tonic_class: str  # class in tonic.datasets; tonic keeps its files in <save_to>/<tonic_class>
    num_classes: int
    layout: str  # the expected files, relative to data.root, for error messages
    required: tuple[tuple[str, str], ...]  # (glob under <tonic_class>/, what it is) that must match
    # (folder, sample file) patterns under a split folder that tonic parses the names of
    names: tuple[str, str] | None = None

    def folder(self, root) -> tuple[Path, Path]:
        """(save_to for tonic, the data set folder) for ``data.root``."""
        if root is None:
            raise FileNotFoundError(
                f"data.root: {self.name} ({self.title}) is read from local files and never downloaded; "
                f"set data.root to the folder holding {self.layout}"
            )
        root = Path(root).expanduser()
        if root.exists() and not root.is_dir():
            raise FileNotFoundError(f"{self.name}: data.root={str(root)!r} is a file; expected the folder holding "
                                    f"{self.layout}")
        if not (root / self.tonic_class).is_dir() and root.name == self.tonic_class:
            root = root.parent  # data.root is the data set folder itself
        return root, root / self.tonic_class

    def check_files(self, root, save_to: Path) -> None:
        base = save_to / self.tonic_class
        missing = [what for pattern, what in self.required if next(base.glob(pattern), None) is None]
        if missing:
            raise FileNotFoundError(
                f"{self.name}: no {' and no '.join(missing)} found under data.root={str(root)!r}; "
                f"expected {self.layout} (the layout tonic.datasets.{self.tonic_class} reads; "
                "neurofed never downloads data sets: copy the published files there)"
            )

    def check_names(self, save_to: Path) -> None:
        """Every folder and sample file under the split folders is named as tonic parses
        it (``user<NN>_<lighting>/<label>.npy`` for DVS128 Gesture): one line naming the
        first that is not, before tonic reads the names."""
        if self.names is None:
            return
        folder_rule, file_rule = (re.compile(r) for r in self.names)
        base = save_to / self.tonic_class
        for split in sorted({pattern.split("/")[0] for pattern, _ in self.required}):
            for path in sorted((base / split).rglob("*")):
                rel = path.relative_to(base / split).as_posix()
                bad_folder = path.is_dir() and not folder_rule.fullmatch(rel.split("/")[0])
                bad_file = path.is_file() and path.name.endswith("npy") and not (
                    file_rule.fullmatch(rel) and int(file_rule.fullmatch(rel).group(1)) < self.num_classes)
                if bad_folder or bad_file:
                    raise ValueError(f"{path}: not a {self.title} {'folder' if bad_folder else 'sample'} name; "
                                     f"expected {self.layout}")

    def dataset(self, save_to: Path, **kwargs):
        """tonic's dataset class for this set, with downloading disabled, samples sorted by path."""
        self.check_names(save_to)
        ds = _offline(self.tonic_class)(str(save_to), **kwargs)
        order = sorted(range(len(ds.data)), key=lambda i: ds.data[i])
        for attr in ("data", "targets", "users", "lighting"):
            values = getattr(ds, attr, None)
            if isinstance(values, list) and len(values) == len(order):
                setattr(ds, attr, [values[i] for i in order])
        return ds


@cache
def _offline(class_name: str):
    """A subclass of ``tonic.datasets.<class_name>`` that never downloads.

    It keeps the class name because tonic derives the data folder from it
    (``<save_to>/<class name>``); neurofed checks the files before constructing it.
    """
    import tonic.datasets

    base = getattr(tonic.datasets, class_name)

    def download(self):
        raise RuntimeError(f"neurofed never downloads data sets ({class_name})")

    return type(class_name, (base,), {
        "__module__": __name__,
        "__doc__": f"tonic.datasets.{class_name} reading local files only.",
        "_check_exists": lambda self: True,
        "download": download,
    })


def _fingerprint(save_to: Path, paths: Sequence[str]) -> str:
    """Hash of the data files' relative paths, sizes and modification times (keys the
    cache to the data on disk: a file replaced or edited in place rebuilds it)."""
    h = hashlib.sha256()
    for p in sorted(paths):
        st = os.stat(p)
        h.update(f"{os.path.relpath(p, save_to)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


NMNIST = _LocalSet(
    "nmnist", "N-MNIST", "NMNIST", 10,
    "NMNIST/Train/<digit 0-9>/<id>.bin and NMNIST/Test/<digit 0-9>/<id>.bin "
    "(N-MNIST's 40-bit-per-event .bin files)",
    (("Train/[0-9]/*.bin", "NMNIST/Train/<digit>/*.bin"), ("Test/[0-9]/*.bin", "NMNIST/Test/<digit>/*.bin")),
)
DVSGESTURE = _LocalSet(
    "dvsgesture", "DVS128 Gesture", "DVSGesture", 11,
    "DVSGesture/ibmGestureTrain/user<NN>_<lighting>/<label 0-10>.npy and "
    "DVSGesture/ibmGestureTest/user<NN>_<lighting>/<label 0-10>.npy "
    "(tonic's preprocessed DVS128 Gesture: per gesture an (N, 4) array of x, y, p, t in ms)",
    (("ibmGestureTrain/user*_*/*.npy", "DVSGesture/ibmGestureTrain/user<NN>_<lighting>/*.npy"),
     ("ibmGestureTest/user*_*/*.npy", "DVSGesture/ibmGestureTest/user<NN>_<lighting>/*.npy")),
    (r"user\d+_.+", r"user\d+_[^/]+/(\d+)\.npy"),
)
CIFAR10DVS = _LocalSet(
    "cifar10dvs", "CIFAR10-DVS", "CIFAR10DVS", 10,
    "CIFAR10DVS/<class>/<id>.aedat4 with <class> one of airplane, automobile, bird, cat, deer, dog, "
    "frog, horse, ship, truck (tonic's CIFAR10-DVS release in AEDAT 4)",
    (("*/*.aedat4", "CIFAR10DVS/<class>/*.aedat4"),),
)


def _sensor_size(class_name: str) -> tuple[int, int, int]:
    import tonic.datasets

    return tuple(getattr(tonic.datasets, class_name).sensor_size)


def _load_local(spec: _LocalSet, data_cfg: dict, make_splits) -> Dataset:
    """``make_splits(save_to, opts)`` -> ``(train, test, cache key, extra)`` (see frames_dataset)."""
    opts = event_options(data_cfg)
    save_to, data_dir = spec.folder(opts["root"])
    spec.check_files(opts["root"], save_to)
    train, test, key, extra = make_splits(save_to, opts)
    return frames_dataset(
        spec.name, opts, _sensor_size(spec.tonic_class), frames_cache_root(opts, save_to), key,
        lambda: (train, test, extra), spec.num_classes,
        {"synthetic": False, "source": spec.title, "data_dir": str(data_dir)},
    )


def _train_test_sets(spec: _LocalSet):
    def make(save_to: Path, opts: dict):
        train = spec.dataset(save_to, train=True)
        test = spec.dataset(save_to, train=False)
        key = {"files": _fingerprint(save_to, train.data + test.data)}
        extra = {}
        if hasattr(train, "users"):
            extra = {"users_train": np.asarray(train.users), "users_test": np.asarray(test.users)}
        return train, test, key, extra

    return make


@register_dataset("nmnist")
def load_nmnist(data_cfg: dict, seed: int = 0) -> Dataset:
    """N-MNIST from ``<data.root>/NMNIST/{Train,Test}/<digit>/*.bin`` (published split)."""
    return _load_local(NMNIST, data_cfg, _train_test_sets(NMNIST))


@register_dataset("dvsgesture")
def load_dvsgesture(data_cfg: dict, seed: int = 0) -> Dataset:
    """DVS128 Gesture (tonic's preprocessed release; published user split).

    ``info["users_train"]`` / ``info["users_test"]`` give each sample's subject, a
    natural client identity for federated partitions.
    """
    return _load_local(DVSGESTURE, data_cfg, _train_test_sets(DVSGESTURE))


@register_dataset("cifar10dvs")
def load_cifar10dvs(data_cfg: dict, seed: int = 0) -> Dataset:
    """CIFAR10-DVS from ``<data.root>/CIFAR10DVS/<class>/*.aedat4``.

    The set has no published split: a stratified split with ``data.test_fraction``
    and the fixed seed of ``digits`` (0.1 gives the usual 9,000 / 1,000).
    """
    try:
        import aedat  # noqa: F401
    except ImportError:
        raise ImportError(
            "cifar10dvs: reading .aedat4 files needs the 'aedat' package (used by tonic.io.read_aedat4): "
            "pip install aedat"
        ) from None

    def make(save_to: Path, opts: dict):
        from sklearn.model_selection import train_test_split

        full = CIFAR10DVS.dataset(save_to)
        idx = np.arange(len(full.targets))
        tr, te = train_test_split(idx, test_size=opts["test_fraction"], stratify=full.targets,
                                  random_state=SPLIT_SEED)
        key = {"files": _fingerprint(save_to, full.data), "test_fraction": opts["test_fraction"],
               "split_seed": SPLIT_SEED}
        return Subset(full, tr), Subset(full, te), key, {}

    return _load_local(CIFAR10DVS, data_cfg, make)


# --------------------------------------------------------------------------- embedded synthetic set


@register_dataset("digits_events")
def load_digits_events(data_cfg: dict, seed: int = 0) -> Dataset:
    """SYNTHETIC event recordings of scikit-learn's digits (see :mod:`neurofed.data.synthetic_events`).

    Same stratified train/test split as ``digits``; frames cached like the other sets.
    """
    from neurofed.data import synthetic_events as se

    opts = event_options(data_cfg)
    c = opts["contrast_threshold"]
    key = {
        "generator": se.GENERATOR_VERSION, "contrast_threshold": c, "test_fraction": opts["test_fraction"],
        "split_seed": SPLIT_SEED,
        "geometry": [se.SCALE, list(se.SENSOR_SIZE), list(se.REST_XY), [list(w) for w in se.SACCADE_WAYPOINTS],
                     se.SACCADE_US, se.STEPS_PER_SACCADE, se.DARK],
    }
    def splits():
        from sklearn.model_selection import train_test_split

        events, offsets, labels = se.digits_events(c)
        per_sample = list(zip(se.split_events(events, offsets), labels))
        idx = np.arange(len(labels))
        tr, te = train_test_split(idx, test_size=opts["test_fraction"], stratify=labels, random_state=SPLIT_SEED)
        return [per_sample[i] for i in tr], [per_sample[i] for i in te], se.event_stats(offsets)

    return frames_dataset(
        "digits_events", opts, se.SENSOR_SIZE, frames_cache_root(opts, None), key, splits, 10,
        {"synthetic": True, "source": "scikit-learn digits moved in 3 saccades before a simulated event camera",
         "contrast_threshold": c},
    )
