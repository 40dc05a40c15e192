"""On-disk caches of decoded data sets: uint8 ``.npy`` arrays that later runs memory-map.

A cache folder is ``<cache root>/<name>-<digest>/`` where the digest covers everything
that changes the arrays (for local files: their relative paths, sizes and modification
times, so replacing or editing a file in place rebuilds the cache). The cache root is ``data.cache`` when set, else
``<data folder>/.neurofed_cache``, else (embedded sets, read-only data folders)
``$XDG_CACHE_HOME/neurofed`` (default ``~/.cache/neurofed``). Folders are built under a
temporary name and renamed into place, so a killed build never leaves a half cache;
the temporary folder a killed build leaves (``.<name>-<digest>.tmp-<pid>``) is removed by
the next build once its process is gone.

``meta.json`` records a SHA-256 of what the cache was built from (its key: data set, format,
the source files' stamps) and of each of its own ``.npy`` files. :func:`cache_ready` checks
both before a load; a cache that differs (an array edited, a label written into it, a file
missing or added) is removed with one warning line naming the file, and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

log = logging.getLogger(__name__)
META = "meta.json"


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


def key_sha256(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def digest(key: dict) -> str:
    return key_sha256(key)[:16]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def array_hashes(folder: Path) -> dict[str, str]:
    return {f.name: file_sha256(f) for f in sorted(Path(folder).glob("*.npy"))}


def cache_problem(folder: Path, key: dict) -> str | None:
    """None when ``folder`` holds the cache of ``key`` as it was built; else one line naming
    the file that differs."""
    meta_path = Path(folder) / META
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        return f"{meta_path}: unreadable ({type(exc).__name__})"
    if meta.get("source_sha256") != key_sha256(key):
        return f"{meta_path}: does not record the hash of the files this cache is for"
    recorded = meta.get("arrays")
    if not isinstance(recorded, dict):
        return f"{meta_path}: records no hashes of its arrays (built by an older neurofed)"
    found = {f.name for f in Path(folder).glob("*.npy")}
    for name in sorted(found | set(recorded)):
        path = Path(folder) / name
        if name not in recorded:
            return f"{path}: not part of the cache as it was built"
        if name not in found:
            return f"{path}: missing"
        if file_sha256(path) != recorded[name]:
            return f"{path}: changed since the cache was built (its SHA-256 differs from meta.json's)"
    return None


def cache_ready(folder: Path, key: dict) -> bool:
    """True when ``folder`` holds the cache of ``key``, unchanged since it was built. A
    changed cache is removed (so the caller rebuilds it) with one warning naming the file."""
    if not (Path(folder) / META).is_file():
        return False
    problem = cache_problem(folder, key)
    if problem is None:
        return True
    log.warning("data cache %s; rebuilding it", problem)
    shutil.rmtree(folder, ignore_errors=True)
    return False


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
        record = {"key": key, "source_sha256": key_sha256(key), "arrays": array_hashes(tmp)}
        (tmp / META).write_text(json.dumps({**record, **meta}, indent=1, default=str))
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
