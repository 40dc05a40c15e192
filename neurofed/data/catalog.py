"""``neurofed datasets [--root DIR]``: every registered data set, whether its files
are under the root, its sample shape, classes and train/test sizes.

Sizes come from the files when they are found (IDX headers, record counts, .mat
headers, event files per split; nothing is decoded into the cache) and are the
published ones otherwise.
"""

from __future__ import annotations

import math
from pathlib import Path

# Event sets: (sensor C, H, W), classes, published train / test sizes, per-split globs
# under the tonic folder (None: no published split, data.test_fraction cuts it).
_EVENT_SETS = {
    "nmnist": ((2, 34, 34), 10, (60_000, 10_000), ("Train/[0-9]/*.bin", "Test/[0-9]/*.bin")),
    "dvsgesture": ((2, 128, 128), 11, (1_077, 264),
                   ("ibmGestureTrain/user*_*/*.npy", "ibmGestureTest/user*_*/*.npy")),
    "cifar10dvs": ((2, 128, 128), 10, (7_500, 2_500), None),
}


EMBEDDED = ("digits", "digits_events")  # need no files: made from scikit-learn's digits


def _digit_sizes(test_fraction: float) -> tuple[int, int]:
    """(train, test) sizes of scikit-learn's 1,797 digits split at ``test_fraction``."""
    n = 1797
    n_test = math.ceil(n * test_fraction)  # as train_test_split rounds the test size
    return n - n_test, n_test


def _embedded(name: str, test_fraction: float) -> dict:
    from neurofed.data.synthetic_events import SENSOR_SIZE

    train, n_test = _digit_sizes(test_fraction)
    if name == "digits":
        return {"name": name, "found": True, "where": "embedded (scikit-learn's 8x8 digits)", "shape": "1x8x8",
                "classes": 10, "train": train, "test": n_test, "sizes_from": "embedded"}
    w, h, p = SENSOR_SIZE
    return {"name": name, "found": True, "where": "embedded (SYNTHETIC events of the digits)",
            "shape": f"{p}x{h}x{w}xT", "classes": 10, "train": train, "test": n_test, "sizes_from": "embedded"}


def _event_row(name: str, root, test_fraction: float) -> dict:
    from neurofed.data import events

    spec = {"nmnist": events.NMNIST, "dvsgesture": events.DVSGESTURE, "cifar10dvs": events.CIFAR10DVS}[name]
    (c, h, w), classes, sizes, globs = _EVENT_SETS[name]
    row = {"name": name, "shape": f"{c}x{h}x{w}xT", "classes": classes, "train": sizes[0], "test": sizes[1],
           "sizes_from": "published"}
    try:
        save_to, data_dir = spec.folder(root)
        spec.check_files(root, save_to)
    except FileNotFoundError:
        return {**row, "found": False, "where": None, "layout": f"<root>/{spec.layout}"}
    base = save_to / spec.tonic_class
    if globs is not None:
        row.update(train=sum(1 for _ in base.glob(globs[0])), test=sum(1 for _ in base.glob(globs[1])))
    else:
        total = sum(1 for _ in base.glob("*/*.aedat4"))
        test = math.ceil(total * test_fraction)
        row.update(train=total - test, test=test)
    return {**row, "found": True, "where": str(data_dir), "sizes_from": "files"}


def catalog(root=None, test_fraction: float = 0.25) -> list[dict]:
    """One row per registered data set (see the module docstring)."""
    from neurofed.data import dataset_names
    from neurofed.data.images import IMAGE_SETS, describe
    from neurofed.data.standins import STANDINS, describe as describe_standin

    rows = []
    for name in dataset_names():
        if name in IMAGE_SETS:
            row = describe(IMAGE_SETS[name], root)
            row["shape"] = "x".join(map(str, row["shape"]))
        elif name in EMBEDDED:
            row = _embedded(name, test_fraction)
        elif name in STANDINS:
            row = describe_standin(name, *_digit_sizes(test_fraction))
        elif name in _EVENT_SETS:
            row = _event_row(name, root, test_fraction)
        else:  # registered elsewhere, without a description
            row = {"name": name, "found": None, "where": "(no description)", "shape": "?", "classes": "?",
                   "train": "?", "test": "?", "sizes_from": "?"}
        rows.append(row)
    return rows


def format_table(rows: list[dict], root) -> str:
    head = ("dataset", "files", "shape", "classes", "train", "test")
    lines = []
    for r in rows:
        files = "embedded" if r["sizes_from"] == "embedded" else ("found" if r["found"] else "missing")
        sizes = [f"{r['train']:,}" if isinstance(r["train"], int) else str(r["train"]),
                 f"{r['test']:,}" if isinstance(r["test"], int) else str(r["test"])]
        if r.get("extra"):
            sizes[0] += f" (+{r['extra']:,} extra)"
        if r["sizes_from"] == "published":
            sizes = [s + "*" for s in sizes]
        lines.append((r["name"], files, r["shape"], str(r["classes"]), *sizes))
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [f"data sets under --root {root}" if root else "data sets (no --root: only embedded ones can be found)",
           fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*x).rstrip() for x in lines]
    out.append("* published size (files not found). T = data.timesteps for event sets.")
    for r in rows:
        if r["sizes_from"] == "embedded":
            continue
        if r["found"]:
            out.append(f"{r['name']}: {r['where']}")
        elif r.get("problem"):
            out.append(f"{r['name']}: {r['problem']}")
        else:
            out.append(f"{r['name']}: not found; expects {r['layout']}")
    return "\n".join(out)


def cmd_datasets(args) -> int:
    root = args.root
    if root is not None and not Path(root).expanduser().is_dir():
        raise FileNotFoundError(f"--root: {root!r} is not a folder")
    print(format_table(catalog(root), root))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("datasets", help="list the registered data sets and whether their files are under --root")
    p.add_argument("--root", help="folder holding the data sets' files (what data.root would be)")
    p.set_defaults(func=cmd_datasets)
