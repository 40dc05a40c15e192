"""On-disk caches of decoded data sets: uint8 ``.npy`` arrays that later runs memory-map.

A cache folder is ``<cache root>/<name>-<digest>/`` where the digest covers everything
that changes the arrays (for local files: their relative paths, sizes and modification
times, so replacing or editing a file in place rebuilds the cache). The cache root is ``data.cache`` when set, else
``<data folder>/.neurofed_cache``, else (embedded sets, read-only data folders)
``$XDG_CACHE_HOME/neurofed`` (default ``~/.cache/neurofed``). Folders are built under a
temporary name and renamed into place, so a killed build never leaves a half cache;
the temporary folder a killed build leaves (``.<name>-<digest>.tmp-<pid>``) is removed by
the next build once its process is gone.
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


def file_stamps(base: Path, paths: Iterable[Path]) -> list[list]:
    """``[[relative path, size, mtime in ns], ...]`` of the data files: what keys a cache to
    the data on disk. The modification time catches a file edited in place (same size,
    other labels) without hashing gigabytes on every load."""
    out = []
    for p in sorted(map(str, paths)):
        st = os.stat(p)
        out.append([os.path.relpath(p, base), st.st_size, st.st_mtime_ns])
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def remove_stale_builds(root: Path) -> None:
    """Remove the temporary folders of builds whose process is gone (killed mid-build)."""
    for tmp in Path(root).glob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if tmp.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def build_cached(folder: Path, key: dict, build: Callable[[Path], dict]) -> None:
    """Run ``build(tmp)`` (writes the .npy files, returns extra meta) and publish atomically."""
    remove_stale_builds(folder.parent)
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
