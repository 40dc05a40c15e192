"""Events -> binary frames (tonic transforms) and their cache: each data set's frames are
computed once, stored as uint8 ``.npy`` and memory-mapped by every later load."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from neurofed.data.base import Dataset
from neurofed.data.cache import build_cached, cache_dir, cache_ready, cache_root, load_cached

log = logging.getLogger(__name__)

PIPELINE_VERSION = 1  # bump when the frames computed from the same events change
POLARITY_CHANNELS = ("OFF", "ON")


class Subset:
    """Some samples of a tonic data set, by index."""

    def __init__(self, ds, indices):
        self.ds, self.indices = ds, np.asarray(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        return self.ds[int(self.indices[i])]


class EventFrames:
    """Tonic transforms turning one recording into a binary (2, H, W, T) uint8 spike tensor."""

    def __init__(self, sensor_size: Sequence[int], timesteps: int, bin_by: str = "time",
                 downsample: int = 1, denoise_us: float | None = None):
        from tonic import transforms as tt

        w, h, p = (int(s) for s in sensor_size)
        if p != 2:
            raise ValueError(f"sensor_size: expected 2 polarities, got {p}")
        self.sensor_size = (w, h, p)
        # Downsample multiplies x and y by 1/k and truncates: pixel x -> x // k.
        self.frame_size = ((w - 1) // downsample + 1, (h - 1) // downsample + 1, p)
        self.timesteps = timesteps
        pre = []
        if denoise_us is not None:
            pre.append(tt.Denoise(filter_time=denoise_us))
        if downsample > 1:
            pre.append(tt.Downsample(spatial_factor=1.0 / downsample))
        self._pre = tt.Compose(pre) if pre else None
        bins = {"n_time_bins": timesteps} if bin_by == "time" else {"n_event_bins": timesteps}
        self._to_frame = tt.ToFrame(sensor_size=self.frame_size, **bins)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        w, h, p = self.frame_size
        return (p, h, w, self.timesteps)

    def __call__(self, events: np.ndarray) -> np.ndarray:
        if self._pre is not None and len(events):
            events = self._pre(events)
        out = np.zeros(self.shape, dtype=np.uint8)
        if len(events):
            frames = self._to_frame(events)  # (T, P, H, W) event counts
            out[...] = np.moveaxis(np.minimum(frames, 1), 0, -1)
        return out


def frames_cache_root(opts: dict, data_dir: Path | None) -> Path:
    return cache_root(opts["cache"], data_dir)


# What one sample file of each set must hold, for the message naming a file that does not.
SAMPLE_FORMAT = {
    "nmnist": "N-MNIST's 40-bit-per-event .bin recording",
    "dvsgesture": "an (N, 4) integer array of x < 128, y < 128, p in {0, 1}, t in ms (tonic's preprocessed "
                  "DVS128 Gesture), saved by numpy",
    "cifar10dvs": "a CIFAR10-DVS AEDAT 4 recording of a 128x128 sensor",
}


def _sample_file(samples, i: int) -> str:
    """The file sample ``i`` of ``samples`` is read from (tonic keeps the paths in ``data``)."""
    if isinstance(samples, Subset):
        return _sample_file(samples.ds, int(samples.indices[i]))
    paths = getattr(samples, "data", None)
    return str(paths[i]) if isinstance(paths, list) and i < len(paths) else f"sample {i}"


def _bin_split(path: Path, samples, pipeline: EventFrames, what: str) -> np.ndarray:
    """Bin every sample of ``samples`` into a uint8 .npy at ``path``; return the labels.
    A sample that cannot be read or binned is one line naming its file."""
    n = len(samples)
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(n, *pipeline.shape))
    y = np.empty(n, dtype=np.int64)
    step = max(n // 10, 1)
    expected = SAMPLE_FORMAT.get(what.split()[0], "an event recording")
    for i in range(n):
        try:
            events, label = samples[i]
            x[i] = pipeline(events)
            y[i] = label
        except Exception as exc:  # truncated, object-array or wrongly shaped file: name it, not the symptom
            raise ValueError(f"{_sample_file(samples, i)}: cannot be read ({type(exc).__name__}: {exc}); "
                             f"expected {expected}".replace("\n", " ")) from None
        if (i + 1) % step == 0 and n >= 1000:
            log.info("%s: binned %d/%d samples", what, i + 1, n)
    x.flush()
    del x
    return y


def frames_dataset(name: str, opts: dict, sensor_size, cache_root: Path, key: dict,
                    splits: Callable[[], tuple], num_classes: int, info: dict) -> Dataset:
    """Cached (or newly binned) frames of a data set as a :class:`Dataset`.

    ``splits()`` returns ``(train_samples, test_samples, extra)``: sequences of
    ``(events, label)`` and a dict of further things to cache and put in ``info``
    (numpy arrays are saved as .npy, anything else in meta.json). It is only called
    when the frames are not cached yet.
    """
    pipeline = EventFrames(sensor_size, opts["timesteps"], opts["bin_by"], opts["downsample"], opts["denoise_us"])
    key = {"dataset": name, "pipeline": PIPELINE_VERSION, "sensor_size": list(pipeline.sensor_size),
           "timesteps": opts["timesteps"], "bin_by": opts["bin_by"], "downsample": opts["downsample"],
           "denoise_us": opts["denoise_us"], **key}
    folder = cache_dir(cache_root, name, key)
    if not cache_ready(folder, key):  # absent, or changed since it was built (then rebuilt)
        log.info("%s: binning events into %s frames (cached in %s)", name, pipeline.shape, folder)

        def build(tmp: Path) -> dict:
            train, test, extra = splits()
            np.save(tmp / "y_train.npy", _bin_split(tmp / "x_train.npy", train, pipeline, f"{name} train"))
            np.save(tmp / "y_test.npy", _bin_split(tmp / "x_test.npy", test, pipeline, f"{name} test"))
            for k, v in extra.items():
                if isinstance(v, np.ndarray):
                    np.save(tmp / f"{k}.npy", v)
            return {"frame_shape": list(pipeline.shape),
                    "info": {k: v for k, v in extra.items() if not isinstance(v, np.ndarray)}}

        build_cached(folder, key, build)
    arrays = load_cached(folder)
    meta = json.loads((folder / "meta.json").read_text())
    info = {
        **info,
        **meta.get("info", {}),
        "sensor_size": pipeline.sensor_size,
        "frame_size": pipeline.frame_size,
        "polarity_channels": POLARITY_CHANNELS,
        "binary": True,
        "timesteps": opts["timesteps"],
        "bin_by": opts["bin_by"],
        "downsample": opts["downsample"],
        "denoise_us": opts["denoise_us"],
        "cache": str(folder),
        **{k: v for k, v in arrays.items() if k not in ("x_train", "x_test", "y_train", "y_test")},
    }
    return Dataset(name, arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"],
                   num_classes=num_classes, kind="events", info=info)
