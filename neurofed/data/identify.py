"""Which data set a folder of image files is: published checksums and label fingerprints.

MNIST and Fashion-MNIST have the same file names, format and sizes, so a folder of one
loads as the other without an error. Before a set is decoded into its cache, each file
is identified with ``published_files.yaml`` (sources there):

1. its MD5 against every set's published MD5s: the published file of *this* set is
   verified; that of *another* set is refused, naming the set the file belongs to;
2. for IDX sets, the first ten labels of the train and test label files against each
   set's (a fingerprint that survives decompression, e.g. Kaggle's raw copies): another
   set's are refused; this set's verify the folder as this set's files (their other
   bytes are not compared: nobody publishes MD5s of the decompressed files);
3. anything else (a subset, a re-encoded or hand-made copy, the tests' tiny files) loads
   with a warning naming the files that could not be verified, and the run records it
   (``summary.json``: ``data_files``).
"""

from __future__ import annotations

import hashlib
import logging
from functools import cache
from pathlib import Path

import yaml

log = logging.getLogger(__name__)

PUBLISHED = Path(__file__).with_name("published_files.yaml")
BY_MD5 = "published MD5"
BY_LABELS = "first labels of the train and test label files"


@cache
def published() -> dict:
    return yaml.safe_load(PUBLISHED.read_text())


def md5(path: Path) -> str:
    with open(path, "rb") as fh:  # the publishers' checksums are MD5: integrity, not security
        return hashlib.file_digest(fh, "md5").hexdigest()


def identify(name: str, titles: dict[str, str], files: dict[str, Path], first_labels: dict[str, list] | None = None,
             table: dict | None = None) -> dict:
    """How the ``files`` (role -> path) of data set ``name`` were identified:
    ``{"verified": {file: how}, "unverified": [file, ...]}``. Raises a one-line
    DataFileError when they are another set's. ``first_labels``: role -> the first labels
    of an IDX label file; ``table``: the published entries (default: the data file)."""
    from neurofed.data.base import DataFileError

    table = published() if table is None else table
    owner = {digest: (set_name, fname) for set_name, entry in table.items()
             for fname, digest in (entry.get("md5") or {}).items()}
    verified, unverified = {}, []
    for role, path in sorted(files.items()):
        hit = owner.get(md5(path))
        if hit is not None and hit[0] != name:
            raise DataFileError(f"{path}: this is {titles.get(hit[0], hit[0])}'s {hit[1]} (its published MD5), not "
                                f"{titles[name]}'s; set data.name: {hit[0]} to train on it, or point data.root at "
                                f"{titles[name]}'s files")
        if hit is not None:
            verified[path.name] = BY_MD5
        else:
            unverified.append(role)
    if first_labels:
        for set_name, entry in table.items():
            fingerprint = entry.get("first_labels") or {}
            if not fingerprint or any(list(first_labels.get(r, []))[:len(v)] != list(v) for r, v in fingerprint.items()):
                continue
            if set_name != name:
                role = next(iter(fingerprint))
                raise DataFileError(f"{files[role]}: its first labels {list(fingerprint[role])} are "
                                    f"{titles.get(set_name, set_name)}'s, not {titles[name]}'s: these are "
                                    f"{titles.get(set_name, set_name)}'s files; set data.name: {set_name} to train "
                                    f"on them, or point data.root at {titles[name]}'s files")
            verified.update({files[r].name: BY_LABELS for r in unverified})
            unverified = []
    return {"verified": verified, "unverified": sorted(files[r].name for r in unverified),
            "published": PUBLISHED.name}


def warn_unverified(name: str, title: str, folder: Path, identity: dict) -> None:
    if identity.get("unverified"):
        log.warning("%s: could not verify %s in %s as %s's files (no published checksum or fingerprint matches); "
                    "training on them as %s (recorded in summary.json: data_files)", name,
                    ", ".join(identity["unverified"]), folder, title, title)
