"""On-disk caches of decoded data sets: uint8 ``.npy`` arrays that later runs memory-map.

A cache folder is ``<cache root>/<name>-<digest>/`` where the digest covers everything
that changes the arrays (for local files: their relative paths and sizes, so replacing
a file rebuilds the cache). The cache root is ``data.cache`` when set, else
``<data folder>/.neurofed_cache``, else (embedded sets, read-only data folders)
``$XDG_CACHE_HOME/neurofed`` (default ``~/.cache/neurofed``). Folders are built under a
temporary name and renamed into place, so a killed build never leaves a half cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable

import numpy as np


def user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neurofed"


def cache_root(cache: str | None, data_dir: Path | None) -> Path:
    """The folder holding cache folders (see the module docstring for the order)."""
    if cache:
        root = Path(cache).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        return root
    if data_dir is not None:
        root = Path(data_dir) / ".neurofed_cache"
        try:
            root.mkdir(exist_ok=True)
            if os.access(root, os.W_OK):
                return root
        except OSError:
            pass
    root = user_cache()
    root.mkdir(parents=True, exist_ok=True)
    return root


def digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_dir(root: Path, name: str, key: dict) -> Path:
    """Folder of the cached arrays of ``name`` for the parameters ``key``."""
    return Path(root) / f"{name}-{digest(key)}"


def file_sizes(base: Path, paths: Iterable[Path]) -> list[list]:
    """``[[relative path, size], ...]`` of the data files: what keys a cache to the data on disk."""
    return [[os.path.relpath(p, base), os.path.getsize(p)] for p in sorted(map(str, paths))]


def build_cached(folder: Path, key: dict, build: Callable[[Path], dict]) -> None:
    """Run ``build(tmp)`` (writes the .npy files, returns extra meta) and publish atomically."""
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = build(tmp)
        (tmp / "meta.json").write_text(json.dumps({"key": key, **meta}, indent=1, default=str))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process published the same arrays first
            if not (folder / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_cached(folder: Path, mmap_mode: str = "r") -> dict[str, np.ndarray]:
    """The arrays of a cache folder: ``x_*`` memory-mapped, the (small) rest in memory."""
    return {f.stem: np.load(f, mmap_mode=mmap_mode if f.stem.startswith("x_") else None)
            for f in sorted(Path(folder).glob("*.npy"))}
