"""Presets by name: the example jobs (``examples/*.yaml``) and the paper presets
(``examples/papers/*.yaml``) that ship with neurofed (:mod:`neurofed.resources`).

- ``neurofed presets``: one line each, with its paper, table, data set and split;
- ``neurofed presets copy NAME DIR``: writes ``DIR/NAME.yaml`` to edit;
- ``neurofed run NAME`` (and ``partition NAME``): a preset by name, as well as a path.

A preset's paper and table are read from its first comment line (``# FedLEC (Yu et al.
2025), Table 1: ...``); its data set and split from its ``data`` and ``partition`` sections.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import yaml

from neurofed.config import ConfigError
from neurofed.resources import examples_dir

PRESET_FOLDERS = (".", "papers")  # under examples/; sweeps/ and papers/printed/ are not run configs
_NAME = re.compile(r"\b([A-Z][a-z]*[A-Z][A-Za-z]*)\b")  # FedLEC, SFedCA
_AUTHORS = re.compile(r"\b([A-Z][\w-]+ et al\.[^,()]*?\d{4})")  # Yu et al. 2025
_TABLE = re.compile(r"Tables? [\w-]+(?: and Table \w+)?")
LIST_HINT = "`neurofed presets` lists them"


def presets() -> dict[str, Path]:
    """Every preset name (its file's stem) and its shipped file."""
    root = examples_dir()
    return {p.stem: p for folder in PRESET_FOLDERS for p in sorted((root / folder).glob("*.yaml"))}


def resolve(ref: str) -> str:
    """``ref`` as given when it is a file or reads as a path; else the preset of that name.
    A name that is no preset is refused in one line that says how to see the names."""
    if Path(ref).is_file() or Path(ref).suffix in (".yaml", ".yml") or "/" in ref or "\\" in ref:
        return ref
    found = presets().get(ref)
    if found is None:
        raise ConfigError(f"{ref!r}: no such config file and no preset of that name ({len(presets())} presets; "
                          f"{LIST_HINT})")
    return str(found)


def describe(path: Path) -> dict:
    """Name, paper, table, data set and split of one preset file."""
    text = path.read_text()
    first = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), "")
    cfg = yaml.safe_load(text) or {}
    name, authors, table = _NAME.search(first), _AUTHORS.search(first), _TABLE.search(first)
    part = cfg.get("partition") or {}
    details = ", ".join(f"{k} {v}" for k, v in part.items() if k not in ("scheme", "num_clients"))
    split = f"{part.get('scheme', 'iid')}{f' ({details})' if details else ''}, {part.get('num_clients', '?')} clients"
    return {"name": path.stem, "paper": f"{name.group(1)} ({authors.group(1)})" if name and authors else "-",
            "table": table.group(0) if table else "-", "dataset": (cfg.get("data") or {}).get("name", "digits"),
            "split": split}


def table_lines(rows: list[dict]) -> list[str]:
    """A header and one aligned line per preset (the split last, unpadded)."""
    header = {"name": "name", "paper": "paper", "table": "table", "dataset": "data set", "split": "split"}
    padded = ("name", "paper", "table", "dataset")
    width = {c: max(len(str(r[c])) for r in [header, *rows]) for c in padded}
    return ["  ".join(str(r[c]).ljust(width[c]) for c in padded) + "  " + str(r["split"]) for r in [header, *rows]]


def cmd_presets(args) -> int:
    if args.action == "copy":
        src = presets().get(args.name)
        if src is None:
            raise ConfigError(f"presets copy: {args.name!r} is no preset name; {LIST_HINT}")
        dest = Path(args.dir) / src.name
        if dest.exists():
            raise ConfigError(f"presets copy: {dest} exists; remove it or choose another folder")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        print(f"{src.stem} -> {dest} (run it: neurofed run {dest})")
        return 0
    for line in table_lines([describe(p) for p in presets().values()]):
        print(line)
    print(f"{len(presets())} presets; run one: neurofed run NAME; edit one: neurofed presets copy NAME DIR",
          file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("presets", help="list the shipped presets (paper, table, data set, split), or copy one out")
    actions = p.add_subparsers(dest="action")
    c = actions.add_parser("copy", help="write the preset NAME to DIR/NAME.yaml to edit")
    c.add_argument("name", help="preset name (see `neurofed presets`)")
    c.add_argument("dir", help="folder to write it to (created if missing)")
    p.set_defaults(func=cmd_presets, action=None)
