"""The run directory: its file names, the :class:`RunDir` that training writes and
export, Lava, NIR and energy read, and its state files (data only, ``.npz`` + JSON).

A run directory may come from someone else, so nothing read from it may execute
code. A state (nested dicts, lists, tuples, numbers, strings and numpy arrays) is
written as one uncompressed ``.npz`` archive: every array is a member of its own,
and the structure is a JSON document (a ``uint8`` member) in which arrays appear as
``{"$array": "a3"}``. Loading uses ``np.load(allow_pickle=False)`` and ``json``:
neither can run code, and an object array (the only way a pickle can hide in
``.npz``) is refused.

Every file carries a format tag, its kind (``checkpoint`` or ``model``) and a
SHA-256 over the structure and the arrays' dtypes, shapes and bytes. The digest
catches truncation, corruption and edits made without recomputing it; it is not a
signature (anyone who can write the file can also rewrite the digest), so it does
not authenticate who wrote a run. Any problem raises :class:`RunFileError`: one
line naming the file and what is wrong (the command line exits with 2).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from neurofed.config import ConfigError

FORMAT = "neurofed-run-file"
VERSION = 1
META = "__neurofed__"  # the JSON member
DIGEST = "__sha256__"
CHECKPOINT = "checkpoint.npz"
LEGACY_CHECKPOINT = "checkpoint.pkl"
MODEL_LAST = "model_last.npz"
MODEL_BEST = "model_best.npz"


# Every file a run and its after-training steps write into the run directory (the names
# hold a "*" where a step writes one per option). A run started without --resume refuses
# a directory holding any of them: the rule "an existing run is never overwritten" must
# hold for each file, not only for the checkpoint.
RUN_OUTPUTS = ("config.yaml", "partition.json", "metrics.jsonl", "summary.json", CHECKPOINT, LEGACY_CHECKPOINT,
               MODEL_BEST, MODEL_LAST, "class_coverage.json", "plots", "model.net", "model.net.sha256",
               "hardware.json", "lava.json", "lava_checks.jsonl", "lava_layer_spikes.npy", "lava_neuron_spikes.npz",
               "model.nir", "nir.json", "nir_checks.jsonl", "nir_*", "energy*")
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
RUN_FILES = (METRICS, SUMMARY, CHECKPOINT, LEGACY_CHECKPOINT)  # any of them: a run was started here


class RunFileError(ConfigError):
    """A run file cannot be read: one line naming the file and the problem."""


def append_check(history: Path, result: dict, per_sample_keys: tuple[str, ...]) -> None:
    """Append one check's figures (``result`` without its per-sample lists) to ``history``, a
    JSON-lines file, with the time it ran: the result file a check writes holds only the
    latest check, and a later one must not lose the figures of those before it."""
    line = {"checked": time.strftime("%Y-%m-%d %H:%M:%S"),
            **{k: v for k, v in result.items() if k not in per_sample_keys}}
    with open(history, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def run_outputs_in(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` that a run would write (:data:`RUN_OUTPUTS`), sorted."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted({p.name for pattern in RUN_OUTPUTS for p in run_dir.glob(pattern)})


def check_out_dir(out: Path, flag: str = "--out") -> None:
    """``out`` is a folder or can become one: one line (not a FileExistsError) otherwise."""
    out = Path(out)
    for p in (out, *out.parents):
        if p.exists() and not p.is_dir():
            where = "is a file" if p == out else f"lies below {p}, which is a file"
            raise RunFileError(f"{flag} {out}: {where}; expected a folder (new, or one neurofed wrote)")
        if p.is_dir():
            break


def require_run_folder(run_dir: str | Path) -> Path:
    """``run_dir`` as a Path, or a RunFileError when no such folder exists: said before any
    file it should hold is asked for, so the user hears what is actually missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFileError(f"{run_dir}: no such folder; expected the directory of a finished `neurofed run`")
    return run_dir


def read_run_config(run_dir: Path) -> dict:
    """``RUN_DIR/config.yaml`` as the run wrote it, defaults filled and validated like any
    config (a run directory may come from someone else); RunFileError naming the file."""
    from neurofed.config import resolve, validate, yaml_load

    run_dir = require_run_folder(run_dir)
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise RunFileError(f"{run_dir}: no config.yaml; expected the directory of a finished `neurofed run`")
    try:
        cfg = yaml_load(path.read_text(errors="replace"), str(path))
    except ConfigError as exc:
        raise RunFileError(str(exc)) from None
    except Exception as exc:  # yaml.YAMLError
        raise RunFileError(f"{path}: not valid YAML ({exc})".splitlines()[0]) from None
    if not isinstance(cfg, dict):
        raise RunFileError(f"{path}: holds a {type(cfg).__name__}; expected the mapping of sections a run writes")
    try:
        return validate(resolve(cfg))
    except ConfigError as exc:
        raise RunFileError(f"{path}: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # a section that is not a mapping, read by a component's resolve
        raise RunFileError(f"{path}: not a run's config ({type(exc).__name__}: {exc})".splitlines()[0]) from None


class RunDir:
    """One run's folder: what training writes there and how the later steps read it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def config(self) -> dict:
        """``config.yaml``, validated (:func:`read_run_config`)."""
        return read_run_config(self.path)

    def read_metrics(self, upto: int) -> tuple[list[dict], list[str]]:
        """Rounds 1..``upto`` of ``metrics.jsonl`` and notes (:func:`read_metrics`)."""
        return read_metrics(self.path, upto)

    def append_metrics(self, record: dict) -> None:
        append_metrics(self.path, record)

    def rewrite_metrics(self, history: list[dict]) -> None:
        """``metrics.jsonl`` replaced, at once, by ``history``'s lines."""
        write_atomic(self.path / METRICS, "".join(json.dumps(h) + "\n" for h in history).encode())

    def write_summary(self, summary: dict) -> None:
        write_atomic(self.path / SUMMARY, json.dumps(summary, indent=2).encode())

    def summary(self) -> dict:
        return json.loads((self.path / SUMMARY).read_text())

    def save(self, name: str, state: dict, kind: str) -> None:
        """A state file (``checkpoint`` or ``model``) in this folder (:func:`save_state`)."""
        save_state(self.path / name, state, kind)

    def load(self, name: str, kind: str) -> dict:
        return load_state(self.path / name, kind)


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole or keeps what it held: a kill never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- metrics.jsonl


def append_metrics(run_dir: Path, record: dict) -> None:
    """Append one round's line to ``metrics.jsonl`` in one write, flushed to disk before the
    checkpoint of that round is written: a kill leaves at most a half line *after* the
    checkpoint's round, which :func:`read_metrics` drops."""
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(Path(run_dir) / METRICS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_metrics(run_dir: Path, upto: int | None) -> tuple[list[dict], list[str]]:
    """The lines of ``metrics.jsonl`` of rounds 1..``upto`` (the checkpoint's round; None: every
    line, for readers of a finished or running run), and notes on what was dropped: a
    half-written last line (a kill mid-write) and lines of rounds past the checkpoint are
    recomputed by the resumed run. A damaged line inside the file is a RunFileError naming it."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return [], []
    lines = path.read_bytes().split(b"\n")
    history, notes = [], []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict) or not isinstance(record.get("round"), int):
                raise ValueError("no round number")
        except ValueError:
            if any(l.strip() for l in lines[i + 1:]):
                raise RunFileError(f"{path}: line {i + 1} is not a round's JSON record (damaged file); "
                                   f"expected one JSON object per round") from None
            notes.append(f"{path}: dropped a half-written last line (a kill mid-write); the run recomputes "
                         f"the rounds after {upto} from the checkpoint")
            break
        history.append(record)
    if upto is None:
        return history, notes
    past = [h["round"] for h in history if h["round"] > upto]
    history = [h for h in history if h["round"] <= upto]
    if past:
        notes.append(f"{path}: dropped the lines of rounds {', '.join(map(str, past))}, past the checkpoint's "
                     f"round {upto}; they are recomputed")
    missing = sorted(set(range(1, upto + 1)) - {h["round"] for h in history})
    if missing:
        notes.append(f"{path}: holds no line for rounds {', '.join(map(str, missing))} (of the {upto} the "
                     f"checkpoint completed); the summary counts the rounds it holds")
    return history, notes


# --------------------------------------------------------------------------- encoding


def _encode(obj: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)) and not isinstance(obj, np.generic):
        return obj
    if isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise TypeError(f"{where}: object arrays cannot be stored as data")
        name = f"a{len(arrays)}"
        arrays[name] = arr.copy(order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        return {"$array": name, "scalar": True} if isinstance(obj, np.generic) else {"$array": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _encode(v, arrays, f"{where}.{k}") for k, v in obj.items()}
        return {"$map": [[_encode(k, arrays, where), _encode(v, arrays, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if isinstance(obj, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    raise TypeError(f"{where}: {type(obj).__name__} is not data a run file can hold")


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(node, list):
        return [_decode(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    if "$array" in node:
        arr = arrays[node["$array"]]  # KeyError: a member the structure names is missing
        return arr[()] if node.get("scalar") else arr
    if "$map" in node:
        return {_hashable(_decode(k, arrays)): _decode(v, arrays) for k, v in node["$map"]}
    if "$tuple" in node:
        return tuple(_decode(v, arrays) for v in node["$tuple"])
    return {k: _decode(v, arrays) for k, v in node.items()}


def _hashable(key):
    return key.item() if isinstance(key, np.generic) else key


def _digest(meta: bytes, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(meta)
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes(order="C"))
    return h.hexdigest()


# --------------------------------------------------------------------------- files


def save_state(path: str | Path, state: dict, kind: str) -> None:
    """Write ``state`` to ``path`` (atomically: a kill leaves the old file or the new)."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(state, arrays, kind)
    meta = json.dumps({"format": FORMAT, "version": VERSION, "kind": kind, "state": tree}).encode()
    members = {META: np.frombuffer(meta, dtype=np.uint8), **arrays}
    members[DIGEST] = np.frombuffer(_digest(meta, arrays).encode(), dtype=np.uint8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **members)
    os.replace(tmp, path)


def load_state(path: str | Path, kind: str) -> dict:
    """The state saved by :func:`save_state` as ``kind``; :class:`RunFileError` on any problem."""
    path = Path(path)
    if not path.is_file():
        raise RunFileError(f"{path}: not found")
    try:
        raw = path.read_bytes()
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            bad = zf.testzip()  # CRC of every member: catches bytes changed in place
            if bad is not None:
                raise RunFileError(f"{path}: member {bad} is corrupted (CRC mismatch)")
        npz = np.load(io.BytesIO(raw), allow_pickle=False)
    except RunFileError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise RunFileError(f"{path}: not a readable neurofed {kind} file (truncated or not an .npz archive: "
                           f"{type(exc).__name__})") from None
    with npz:
        names = set(npz.files)
        if META not in names or DIGEST not in names:
            raise RunFileError(f"{path}: foreign .npz file (no neurofed header); expected a {kind} written by neurofed")
        try:
            arrays = {n: npz[n] for n in names}
        except ValueError as exc:  # object arrays: pickled data, refused by allow_pickle=False
            raise RunFileError(f"{path}: holds pickled (object) data, refused: {exc}".splitlines()[0]) from None
        except Exception as exc:  # truncated member, bad header
            raise RunFileError(f"{path}: damaged member ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    meta_bytes = arrays.pop(META).tobytes()
    digest = arrays.pop(DIGEST).tobytes().decode("ascii", "replace")
    try:
        meta = json.loads(meta_bytes)
    except ValueError:
        raise RunFileError(f"{path}: header is not valid JSON (damaged file)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RunFileError(f"{path}: foreign file (format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                           f"expected {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise RunFileError(f"{path}: {FORMAT} version {meta.get('version')!r}; this neurofed reads version {VERSION}")
    if meta.get("kind") != kind:
        raise RunFileError(f"{path}: holds a {meta.get('kind')!r}, expected a {kind!r}")
    if _digest(meta_bytes, arrays) != digest:
        raise RunFileError(f"{path}: checksum mismatch (the file was modified or damaged after neurofed wrote it)")
    try:
        return _decode(meta["state"], arrays)
    except (KeyError, TypeError, AttributeError) as exc:
        raise RunFileError(f"{path}: structure names a missing or malformed entry ({exc})") from None


def legacy_checkpoint_error(run_dir: Path) -> RunFileError:
    """The message for a run directory written before run files held data only."""
    return RunFileError(
        f"{run_dir / LEGACY_CHECKPOINT}: pickle checkpoint from an older neurofed, not loaded (a pickle can run code); "
        f"re-run the experiment, or if you wrote it yourself convert it with "
        f"`python -m neurofed.rundir convert-legacy {run_dir} --trusted`")


def convert_legacy(run_dir: str | Path) -> Path:
    """Unpickle ``RUN_DIR/checkpoint.pkl`` (this executes whatever the pickle holds:
    only for files you made yourself) and write ``checkpoint.npz`` and ``model_last.npz``."""
    import pickle

    run_dir = Path(run_dir)
    old = run_dir / LEGACY_CHECKPOINT
    if not old.is_file():
        raise RunFileError(f"{old}: not found")
    state = pickle.loads(old.read_bytes())  # the one deliberate unpickling, on explicit request
    state.setdefault("best", None)
    save_state(run_dir / CHECKPOINT, state, "checkpoint")
    rnd = int(state["round"])
    save_state(run_dir / MODEL_LAST, {"round": rnd, "accuracy": None, "params": state["server"]["params"]}, "model")
    return run_dir / CHECKPOINT


def main(argv: list[str] | None = None) -> int:
    """``python -m neurofed.rundir convert-legacy RUN_DIR --trusted``."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[0] != "convert-legacy" or args[2:] not in ([], ["--trusted"]):
        print("usage: python -m neurofed.rundir convert-legacy RUN_DIR --trusted", file=sys.stderr)
        return 2
    old = Path(args[1]) / LEGACY_CHECKPOINT
    if args[2:] != ["--trusted"]:
        print(f"neurofed: error: {old}: converting unpickles the file, which runs any code it holds; "
              f"add --trusted only for a checkpoint you wrote yourself (else re-run the experiment)", file=sys.stderr)
        return 2
    print(f"warning: unpickling {old}: this runs any code the file holds", file=sys.stderr)
    try:
        path = convert_legacy(args[1])
    except RunFileError as exc:
        print(f"neurofed: error: {exc}", file=sys.stderr)
        return 2
    print(f"-> {path}, {path.with_name(MODEL_LAST)} (the old format kept no best-round model)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
