"""What an image data set is on disk: its published releases (folders, file names, reader)
and how the first complete one under ``data.root`` is found."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from neurofed.data.base import DataFileError


NEVER_DOWNLOADS = "neurofed never downloads data sets: copy the published files there"


# A reader maps the found files (role -> path) and the options to, per split, a list
# of chunks (images (n, C, H, W) uint8, {label array name: (n,) labels}).
Chunks = dict[str, list[tuple[np.ndarray, dict[str, np.ndarray]]]]


@dataclass(frozen=True)
class Release:
    """One published layout of a data set: its folder(s), file names and reader."""

    name: str  # e.g. "IDX", "python release"
    folders: tuple[str, ...]  # candidate folders relative to data.root ("" = data.root itself)
    files: dict  # role -> accepted file names, first found wins (e.g. raw, then .gz)
    read: Callable[[dict, dict], Chunks]
    count: Callable[[dict], dict]  # found files -> {"train": n, "test": n} (cheap)
    optional: tuple[str, ...] = ()  # roles that may be absent (SVHN's extra)

    def lookup(self, folder: Path) -> dict[str, Path]:
        found = {}
        for role, names in self.files.items():
            path = next((folder / n for n in names if (folder / n).is_file()), None)
            if path is not None:
                found[role] = path
        return found

    def required(self) -> list[str]:
        return [r for r in self.files if r not in self.optional]


@dataclass(frozen=True)
class ImageSet:
    name: str
    title: str
    shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int
    sizes: tuple[int, int]  # published train / test sizes
    releases: tuple[Release, ...]
    layout: str  # what to put where, for messages and `neurofed datasets`
    class_names: tuple[str, ...] = ()

    def candidates(self, root: Path):
        """(release, folder) pairs to look in, in order."""
        for rel in self.releases:
            for sub in rel.folders:
                folder = root / sub if sub else root
                if sub and not folder.is_dir() and root.name == Path(sub).name:
                    folder = root  # data.root is the release folder itself
                yield rel, folder

    def find(self, root) -> tuple[Release, Path, dict[str, Path]]:
        """The first complete release under ``root``; one-line DataFileError otherwise."""
        if root is None:
            raise DataFileError(
                f"data.root: {self.name} ({self.title}) is read from local files and never downloaded; "
                f"set data.root to the folder holding {self.layout}"
            )
        root = Path(root).expanduser()
        if root.exists() and not root.is_dir():
            raise DataFileError(f"{self.name}: data.root={str(root)!r} is a file; expected the folder holding "
                                f"{self.layout}")
        partial = None
        for rel, folder in self.candidates(root):
            found = rel.lookup(folder)
            missing = [r for r in rel.required() if r not in found]
            if not missing:
                return rel, folder, found
            if found and (partial is None or len(found) > len(partial[2])):
                partial = (rel, folder, found, missing)
        if partial is not None:
            rel, folder, found, missing = partial
            names = ", ".join("|".join(rel.files[r]) for r in missing)
            raise DataFileError(
                f"{self.name}: incomplete {self.title} {rel.name} in {str(folder)!r}: missing {names}; "
                f"expected {self.layout} ({NEVER_DOWNLOADS})"
            )
        raise DataFileError(
            f"{self.name}: no {self.title} files found under data.root={str(root)!r}; "
            f"expected {self.layout} ({NEVER_DOWNLOADS})"
        )


def malformed(path: Path, problem: str, expected: str) -> DataFileError:
    return DataFileError(f"{path}: {problem}; expected {expected}")
