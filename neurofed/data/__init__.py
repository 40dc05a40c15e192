"""Dataset registry: ``load_dataset(cfg["data"], seed)`` by name.

A dataset loader is a function ``(data_cfg: dict, seed: int) -> Dataset`` registered
with :func:`register_dataset`. Datasets that are not embedded read from
``data.root`` and never download. ``data.train_subset`` / ``data.test_subset`` cut
any of them to a stratified, seeded slice (:mod:`neurofed.data.subset`).
"""

from __future__ import annotations

import numbers

from neurofed.config import Section, register_section
from neurofed.config.checks import Check, boolean, choice, number, optional_str
from neurofed.data.base import Dataset
from neurofed.registry import Registry

DATASETS = Registry("data.name", "dataset")  # name -> loader (data config, seed) -> Dataset


def register_dataset(name: str):
    """``@register_dataset(name)``: a loader ``(data_cfg, seed) -> Dataset``."""
    return DATASETS.decorator(name)


def _ensure_builtin():
    # Importing the modules registers their datasets.
    from neurofed.data import digits, images, standins  # noqa: F401

    try:
        from neurofed.data import events  # noqa: F401
    except ImportError:  # event support is optional until tonic is present
        pass


def dataset_names() -> list[str]:
    _ensure_builtin()
    return DATASETS.names()


def load_dataset(data_cfg: dict, seed: int = 0) -> Dataset:
    _ensure_builtin()
    load = DATASETS.lookup(data_cfg.get("name"))
    from neurofed.data.subset import apply_subsets

    return apply_subsets(load(data_cfg, seed), data_cfg, seed)


# --------------------------------------------------------------------------- the data section

ENCODINGS = ("rate", "direct", "events")
DATA_DEFAULTS: dict = {
    "name": "digits",
    "root": None,  # local folder for datasets that are not embedded
    "encoding": "rate",  # rate (Poisson) | direct (analog current) | events
    "timesteps": 16,
    "max_rate": 1.0,  # spike probability per step of a pixel at full intensity
    "test_fraction": 0.25,
    # event data sets (neurofed.data.events); data.encoding must be "events" for them
    "bin_by": "time",  # T frames of equal duration (time) or equal event count (count)
    "downsample": 1,  # integer spatial downsampling factor of event data (1 = full size)
    "denoise_us": None,  # tonic Denoise filter_time in µs; null = off
    "contrast_threshold": 0.15,  # log-intensity threshold of the synthetic event camera
    "cache": None,  # folder for decoded images / binned event frames; null = <root>/.neurofed_cache
    # a stratified, seeded slice of a split: a count (>= 1) or a fraction in (0, 1]; null = all
    "train_subset": None,
    "test_subset": None,
    "cifar100_labels": "fine",  # cifar100: fine (100 classes) | coarse (20 superclasses)
    "svhn_extra": False,  # svhn: append extra_32x32.mat to the training split
    # direct encoding / ANN twin: per-channel (pixel in [0, 1] - mean) / std; null = none
    "mean": None,
    "std": None,
}


def _subset(v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return "expected a count >= 1, a fraction in (0, 1], or null (all)"
    if isinstance(v, numbers.Integral):
        return None if v >= 1 else "expected a count >= 1, a fraction in (0, 1], or null (all)"
    return None if 0 < v <= 1 else "expected a fraction in (0, 1], a count >= 1, or null (all)"


def _channel_values(positive: bool) -> Check:
    def check(v):
        if v is None:
            return None
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            v = [v]
        if (not isinstance(v, (list, tuple)) or not v
                or not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in v)):
            return "expected a number or a list of one number per input channel, or null"
        if positive and any(x <= 0 for x in v):
            return "expected values > 0"
        return None

    return check


def _checks() -> dict[str, Check]:
    return {
        "data.name": choice(dataset_names()),
        "data.root": optional_str,
        "data.encoding": choice(ENCODINGS),
        "data.timesteps": number(1, 10_000, integer=True),
        "data.max_rate": number(0, 1, lo_open=True),
        "data.test_fraction": number(0, 1, lo_open=True),
        "data.bin_by": choice(("time", "count")),
        "data.downsample": number(1, integer=True),
        "data.denoise_us": number(0, lo_open=True, nullable=True),
        "data.contrast_threshold": number(0, lo_open=True),
        "data.cache": optional_str,
        "data.train_subset": _subset,
        "data.test_subset": _subset,
        "data.cifar100_labels": choice(("fine", "coarse")),
        "data.svhn_extra": boolean,
        "data.mean": _channel_values(False),
        "data.std": _channel_values(True),
    }


def image_option_problems(d: dict) -> list[str]:
    """The image sets' own keys (``d``: the data section, defaults filled in): valid, and
    set only for the data set that has them. Checked by the config and again by the
    loader, which may be called without a validated config."""
    problems = []
    if d.get("cifar100_labels") not in ("fine", "coarse"):
        problems.append(f"data.cifar100_labels: got {d.get('cifar100_labels')!r}; allowed: fine, coarse")
    elif d["cifar100_labels"] == "coarse" and d.get("name") != "cifar100":
        problems.append(f"data.cifar100_labels: got 'coarse'; only cifar100 has coarse labels "
                        f"(data.name is {d.get('name')!r})")
    if not isinstance(d.get("svhn_extra"), bool):
        problems.append(f"data.svhn_extra: got {d.get('svhn_extra')!r}; expected true or false")
    elif d["svhn_extra"] and d.get("name") != "svhn":
        problems.append(f"data.svhn_extra: got true; only svhn has an extra split (data.name is {d.get('name')!r})")
    return problems


def _cross_checks(cfg: dict) -> list[str]:
    """Keys that only make sense together with others (the load checks the rest)."""
    d = cfg.get("data", {})
    problems = []
    if (d.get("mean") is not None or d.get("std") is not None) and d.get("encoding") not in ("direct",):
        problems.append(f"data.mean / data.std: set with data.encoding {d.get('encoding')!r}; normalisation "
                        "applies to direct (analog) input only: rate coding needs pixels in [0, 1] as spike "
                        "probabilities")
    return problems + image_option_problems({**DATA_DEFAULTS, **d})


register_section(Section("data", DATA_DEFAULTS, _checks, _cross_checks))

__all__ = ["DATA_DEFAULTS", "Dataset", "register_dataset", "dataset_names", "load_dataset"]
