"""``data.train_subset`` / ``data.test_subset``: a stratified, seeded slice of a split.

A subset is a count (integer >= 1) or a fraction (0 < f < 1, or 1.0 for all) of the
split. Every class keeps its share of the split (largest-remainder rounding, so the
total is exact) and the samples within a class are drawn from the run's seed (stream
``"train_subset"`` / ``"test_subset"``), so a resumed run or a Flower node sees the
same slice. The chosen indices are kept in file order.
"""

from __future__ import annotations

import numbers

import numpy as np


def subset_size(value, n: int, key: str) -> int:
    """The number of samples ``value`` (count or fraction) asks of a split of ``n``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{key}: got {value!r}; expected a count >= 1, a fraction in (0, 1], or null")
    if isinstance(value, numbers.Integral):
        if not 1 <= value <= n:
            raise ValueError(f"{key}: got {value}; expected a count between 1 and the split's {n} samples, "
                             "or a fraction in (0, 1]")
        return int(value)
    if not 0 < value <= 1:
        raise ValueError(f"{key}: got {value!r}; expected a fraction in (0, 1] or a count >= 1")
    return max(1, int(round(value * n)))


def stratified_indices(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` sorted indices of ``labels``, every class in proportion to its count."""
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * size / len(labels)
    quota = np.floor(exact).astype(np.int64)
    short = size - int(quota.sum())
    if short:
        # the classes with the largest remainders get one more (ties broken by the seed)
        order = np.lexsort((rng.random(len(classes)), -(exact - quota)))
        quota[order[:short]] += 1
    chosen = [rng.choice(np.flatnonzero(labels == c), q, replace=False) for c, q in zip(classes, quota) if q]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def apply_subsets(ds, data_cfg: dict, seed: int):
    """``ds`` cut to ``data.train_subset`` / ``data.test_subset`` (unchanged when both are null).

    The cut arrays are in-memory copies of the chosen samples (still uint8 for file
    data sets); ``ds.info["subset"]`` records what was used, for the run's summary.
    """
    from neurofed.seeds import rng_for

    used = {}
    for split in ("train", "test"):
        value = data_cfg.get(f"{split}_subset")
        if value is None:
            continue
        y = getattr(ds, f"y_{split}")
        size = subset_size(value, len(y), f"data.{split}_subset")
        if size == len(y):
            continue
        idx = stratified_indices(y, size, rng_for(seed, f"{split}_subset"))
        setattr(ds, f"x_{split}", np.ascontiguousarray(getattr(ds, f"x_{split}")[idx]))
        setattr(ds, f"y_{split}", np.asarray(y)[idx])
        for k, v in list(ds.info.items()):  # per-sample side arrays, e.g. users_train of dvsgesture
            if k.endswith(f"_{split}") and isinstance(v, np.ndarray) and len(v) == len(y):
                ds.info[k] = v[idx]
        used[split] = {"requested": value, "samples": int(size), "of": int(len(y))}
    if used:
        ds.info["subset"] = used
    return ds
