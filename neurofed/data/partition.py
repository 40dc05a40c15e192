"""Split a labelled training set among federated clients (``partition`` config section).

Every scheme returns one sorted ``int64`` index array per client; no sample is given
to two clients, and the result depends only on the labels, the config and the
``numpy.random.Generator`` passed in (derive it from the run's seed).

The schemes and the papers they follow: :mod:`neurofed.data.schemes`.
"""

from __future__ import annotations

import numbers
from pathlib import Path

import numpy as np

from neurofed.config import Section, choice, number, register_section
from neurofed.data.schemes import (MAX_DRAWS, MIN_SIZE_RULES, SCHEMES, SCHEME_FUNCS, PartitionError, check_labels,
                                   get_int, parts_from_owner)

PARTITION_DEFAULTS: dict = {
    "scheme": "iid",
    "num_clients": 10,
    "alpha": 0.5,
    "classes_per_client": 2,
    "shards_per_client": 2,
    "ratio": [3, 1],
    "min_size": 10,
    "min_size_rule": "redraw",
}


def _ratio(v):
    if (
        isinstance(v, (list, tuple))
        and len(v) == 2
        and all(isinstance(x, numbers.Real) and not isinstance(x, bool) and x > 0 for x in v)
    ):
        return None
    return "expected two positive numbers [n1, n2]"


register_section(Section("partition", PARTITION_DEFAULTS, lambda: {
    "partition.scheme": choice(SCHEMES),
    "partition.num_clients": number(1, integer=True),
    "partition.alpha": number(0, lo_open=True),
    "partition.classes_per_client": number(1, integer=True),
    "partition.shards_per_client": number(1, integer=True),
    "partition.ratio": _ratio,
    "partition.min_size": number(0, integer=True),
    "partition.min_size_rule": choice(MIN_SIZE_RULES),
}))

# describe() prints one column per class up to this many classes, a compact list beyond.
_WIDE_CLASSES = 20
# plot_heatmap() writes the count into each cell up to this many cells.
_ANNOTATE_CELLS = 400


# --------------------------------------------------------------------------- public API


def partition(labels: np.ndarray, num_classes: int, cfg: dict, rng: np.random.Generator) -> list[np.ndarray]:
    """Split sample indices ``0..len(labels)-1`` among ``cfg["num_clients"]`` clients.

    ``cfg`` is the config's ``partition`` section (missing keys take the project
    defaults from :data:`PARTITION_DEFAULTS`). Returns one sorted ``int64`` array
    of sample indices per client; the arrays are disjoint. Raises
    :class:`PartitionError` for a setting that cannot be met.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    labels = check_labels(labels, num_classes)
    cfg = {**PARTITION_DEFAULTS, **cfg}
    scheme = cfg["scheme"]
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise PartitionError(f"partition.scheme: got {scheme!r}; allowed: {', '.join(SCHEMES)}")
    n = get_int(cfg, "num_clients", 1)
    if n > len(labels):
        raise PartitionError(
            f"partition.num_clients: got {n}; expected <= the number of samples ({len(labels)})"
        )
    owner = SCHEME_FUNCS[scheme](labels, num_classes, n, cfg, rng)
    return parts_from_owner(owner, n)


def scheme_label(cfg: dict) -> str:
    """The papers' short name of a partition setting: IID, Dir(0.1), #cnum=2, ..."""
    scheme = cfg.get("scheme")
    names = {
        "iid": lambda: "IID",
        "dirichlet": lambda: f"Dir({cfg['alpha']:g})",
        "cnum": lambda: f"#cnum={cfg['classes_per_client']}",
        "dir_n": lambda: f"Dir_n({cfg['alpha']:g})",
        "shards": lambda: f"{cfg['shards_per_client']}Shards",
        "ci": lambda: f"CI({':'.join(str(r) for r in cfg['ratio'])}; {cfg['alpha']:g})",
    }
    try:
        return names[scheme]()
    except KeyError:  # unknown scheme or a key left to its default: the raw setting
        return "+".join(f"{k}-{v}" for k, v in cfg.items())


def label_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """(clients, classes) array: how many samples of each class each client holds."""
    labels = check_labels(labels, num_classes)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    if len(parts) == 0:
        return np.zeros((0, num_classes), dtype=np.int64)
    idx = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    client = np.repeat(np.arange(len(parts), dtype=np.int64), sizes)
    flat = client * num_classes + labels[idx]
    return np.bincount(flat, minlength=len(parts) * num_classes).reshape(len(parts), num_classes)


def describe(counts: np.ndarray) -> str:
    """Printable table of a (clients, classes) count matrix, with totals and a summary.

    One row per client (size, number of labels held, count per label), a ``total``
    row, and a summary line: client sizes (min / max / mean / std) and the mean number
    of labels per client. With more than 20 classes each row lists only the labels the
    client holds, largest first, as ``label:count``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 2:
        raise ValueError(f"counts: expected a (clients, classes) array, got shape {counts.shape}")
    n, k = counts.shape
    sizes = counts.sum(axis=1)
    held = (counts > 0).sum(axis=1)
    totals = counts.sum(axis=0)
    w = max(5, len(str(int(sizes.sum()))) + 1)
    head = f"{'client':>6} {'size':>{w}} {'labels':>6}"
    lines = []
    if k <= _WIDE_CLASSES:
        cw = max(4, max((len(str(int(v))) for v in totals), default=1) + 1, len(str(k - 1)) + 1)
        lines.append(head + " | " + " ".join(f"{j:>{cw}}" for j in range(k)))
        lines.append("-" * len(lines[0]))
        for i in range(n):
            cells = " ".join(f"{int(v):>{cw}}" for v in counts[i])
            lines.append(f"{i:>6} {int(sizes[i]):>{w}} {int(held[i]):>6} | {cells}")
        lines.append("-" * len(lines[0]))
        cells = " ".join(f"{int(v):>{cw}}" for v in totals)
        lines.append(f"{'total':>6} {int(sizes.sum()):>{w}} {int((totals > 0).sum()):>6} | {cells}")
    else:
        lines.append(head + " | label:count (largest first)")
        lines.append("-" * len(lines[0]))
        for i in range(n):
            nz = np.flatnonzero(counts[i])
            nz = nz[np.argsort(-counts[i, nz], kind="stable")]
            shown = " ".join(f"{j}:{int(counts[i, j])}" for j in nz[:8])
            more = f" +{len(nz) - 8} more" if len(nz) > 8 else ""
            lines.append(f"{i:>6} {int(sizes[i]):>{w}} {int(held[i]):>6} | {shown}{more}")
        lines.append("-" * len(lines[0]))
        lines.append(
            f"{'total':>6} {int(sizes.sum()):>{w}} {int((totals > 0).sum()):>6} | "
            f"per class min {int(totals.min())}, max {int(totals.max())}"
        )
    if n:
        lines.append(
            f"clients: {n}  samples: {int(sizes.sum())}  size min/max/mean/std: "
            f"{int(sizes.min())}/{int(sizes.max())}/{sizes.mean():.1f}/{sizes.std():.1f}  "
            f"labels per client: mean {held.mean():.2f} (min {int(held.min())}, max {int(held.max())})"
        )
    else:
        lines.append("clients: 0  samples: 0")
    return "\n".join(lines)


def plot_heatmap(counts: np.ndarray, path, title: str = "") -> None:
    """Write a client x class heatmap of ``counts`` as a PNG (Agg canvas; no pyplot state).

    Cells carry their count when the matrix has at most 400 cells.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts: expected a (clients, classes) array, got shape {counts.shape}")
    if counts.size == 0:
        raise ValueError("counts: nothing to plot (no clients or no classes)")
    n, k = counts.shape
    fig = Figure(figsize=(min(2.5 + 0.45 * k, 16), min(1.5 + 0.3 * n, 16)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="samples")
    if k <= 30:
        ax.set_xticks(range(k))
    if n <= 30:
        ax.set_yticks(range(n))
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if title:
        ax.set_title(title)
    if 0 < counts.size <= _ANNOTATE_CELLS:
        mid = (counts.max() + counts.min()) / 2
        for (i, j), v in np.ndenumerate(counts):
            ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=7,
                    color="black" if v > mid else "white")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)


__all__ = ["SCHEMES", "MAX_DRAWS", "PartitionError", "partition", "label_counts", "describe", "plot_heatmap"]
