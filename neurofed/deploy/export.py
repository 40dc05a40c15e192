"""The global model of a run, and its netx HDF5 export (``RUN_DIR/model.net``).

The file is written by the SLAYER blocks' own ``export_hdf5``, with two additions
netx needs: an ``input`` entry carrying the input shape (netx cannot infer it for a
first conv layer), and pool blocks written as grouped convolutions (netx has no
pool; a conv in which each output channel sees only its own input channel through
the pool weight is exact).
``export_hdf5`` disables weight norm on the block it writes, so the export works on
a fresh copy of the model (built anew and loaded with ``load_state_dict``: SLAYER
blocks cannot be deep-copied after a forward pass). Root attributes record what
neurofed needs to recognise and check the file later (netx ignores them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np
import torch

from neurofed.deploy import DeployError
from neurofed.deploy.constraints import DEFAULT_PROFILE, ConstraintReport, check_model
from neurofed.deploy.lava_plan import first_neuron_layer, fitting_input_bits, graded_state_warning, plan_for
from neurofed.deploy.deployable import fresh_copy  # noqa: F401  (imported from here by callers)
from neurofed.deploy.netx_entries import write_layer

NET_FILE = "model.net"
FORMAT = "neurofed-netx-1"
# The SHA-256 of model.net recorded at export, beside it (``sha256sum -c`` reads it):
# a network altered afterwards (weights changed, a layer cut) is refused before Lava runs it.
DIGEST_SUFFIX = ".sha256"


def digest_file(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + DIGEST_SUFFIX)


def file_sha256(path: Path) -> str:
    import hashlib

    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def check_net_digest(path: Path) -> None:
    """``path`` is the network ``neurofed export`` wrote: its SHA-256 is the one recorded then."""
    path = Path(path)
    recorded = digest_file(path).read_text().split()[:1] if digest_file(path).is_file() else []
    if not recorded:
        raise DeployError(f"{path}: no digest recorded at export ({digest_file(path).name}); "
                          f"re-create it with `neurofed export {path.parent}`")
    if file_sha256(path) != recorded[0]:
        raise DeployError(f"{path}: SHA-256 differs from the one recorded at export ({digest_file(path).name}): "
                          f"the network was changed after `neurofed export`; re-create it with "
                          f"`neurofed export {path.parent}`")


class RunModel(NamedTuple):
    model: torch.nn.Module  # the global model, parameters as in the kept model file, eval mode
    cfg: dict  # the run's resolved config
    dataset: object  # neurofed.data.Dataset the run trained on
    round: int  # the round whose global model this is


ROUNDS_KEPT = "best and last"


def model_file(run_dir: str | Path, model_round: str | int = "last") -> Path:
    """The kept global-model file of ``run_dir`` for ``model_round``: ``best``, ``last``, or a
    round number that is one of those two (a run keeps the best and the last round)."""
    from neurofed.rundir import LEGACY_CHECKPOINT, MODEL_BEST, MODEL_LAST, legacy_checkpoint_error, load_state

    run_dir = Path(run_dir)
    if model_round in ("best", "last"):
        path = run_dir / (MODEL_BEST if model_round == "best" else MODEL_LAST)
        if not path.is_file():
            if (run_dir / LEGACY_CHECKPOINT).is_file():
                raise legacy_checkpoint_error(run_dir)
            raise DeployError(f"{run_dir}: no {path.name}; expected the directory of a finished `neurofed run`")
        return path
    try:
        wanted = int(model_round)
    except (TypeError, ValueError):
        raise DeployError(f"--round: got {model_round!r}; expected best, last or a round number") from None
    kept = {}
    for name in ("last", "best"):
        path = model_file(run_dir, name)
        kept[int(load_state(path, "model")["round"])] = path
    if wanted not in kept:
        raise DeployError(f"--round: got {wanted}; {run_dir} keeps the global models of rounds "
                          f"{', '.join(map(str, sorted(kept)))} ({ROUNDS_KEPT})")
    return kept[wanted]


def load_global_model(run_dir: str | Path, dataset=None, model_round: str | int = "last",
                      tie_break: str | None = None) -> RunModel:
    """Rebuild the global model of ``run_dir`` from ``config.yaml`` and the kept model
    file of ``round`` (:func:`model_file`: best, last or that round's number).

    The dataset is loaded (or pass it) because the model's input shape and class
    count come from it. ``tie_break`` (``neurofed lava --tie-break``) replaces the run's
    ``model.tie_break``: an evaluation rule only, so the trained parameters are the same.
    """
    from neurofed.config import ConfigError, validate
    from neurofed.data import load_dataset
    from neurofed.training.params import ParamSpec
    from neurofed.models import build_run_model
    from neurofed.models.quantize import for_round
    from neurofed.rundir import load_state, read_run_config

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)  # as the run wrote it, defaults filled, validated
    if tie_break is not None and tie_break != cfg["model"]["tie_break"]:
        cfg["model"]["tie_break"] = tie_break
        try:
            validate(cfg)
        except ConfigError as exc:
            raise DeployError(f"--tie-break {tie_break}: {str(exc).splitlines()[0]}") from None
    path = model_file(run_dir, model_round)
    state = load_state(path, "model")
    params = state.get("params") if isinstance(state, dict) else None
    if not isinstance(params, np.ndarray) or params.dtype != np.float32 or params.ndim != 1:
        raise DeployError(f"{path}: no float32 parameter vector 'params'; not a neurofed global model")
    ds = dataset if dataset is not None else load_dataset(cfg["data"], cfg["seed"])
    try:
        model = build_run_model(cfg, ds)
    except ValueError as exc:
        if tie_break is None or "tie_break" not in str(exc):
            raise
        raise DeployError(f"--tie-break {tie_break}: {exc}") from None
    spec = ParamSpec.from_model(model)
    if params.shape != (spec.size,):
        raise DeployError(f"{path}: {params.size} parameters, but config.yaml's model has {spec.size}")
    spec.set(model, params)
    model.eval()
    rnd, rounds = int(state.get("round", 0)), int(cfg["federation"]["rounds"])
    for_round(model, rnd or rounds, rounds)  # QAT: the weights' grid as the run evaluated that round
    return RunModel(model, cfg, ds, rnd)


def export_model(model: torch.nn.Module, path: str | Path, meta: dict | None = None,
                 profile=DEFAULT_PROFILE, timesteps: int = 32, check: bool = True,
                 encoding: str = "rate") -> ConstraintReport:
    """Write ``model`` as netx HDF5 to ``path``; return the hardware constraint report.

    The file records the Lava plan (:func:`neurofed.deploy.lava_plan.plan_for`: each layer's
    lag, graded input for ``encoding: direct``, voltage readout); with graded input the first
    layer's threshold mantissa is scaled by 2^input_bits (its state is, see lava_plan).

    Refuses (DeployError) a model that violates the profile's sourced limits or
    that netx cannot express. The file is written beside ``path`` and moved into
    place, so a reader that still holds the old file open (netx keeps it open) is
    not disturbed.
    """
    from neurofed.deploy.deployable import deployable_copy

    copy = deployable_copy(model)  # batch norm and an analog pool folded, 8-bit weights: what runs
    report = check_model(copy, profile, timesteps=timesteps)
    if check:
        report.raise_for_violations()
    plan = plan_for(copy, timesteps, encoding, fitting_input_bits(copy))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as h:
        attrs = {"format": FORMAT, "input_shape": list(copy.layers[0].in_shape),
                 "layers": [l.kind for l in copy.layers], "lava_plan": plan.to_meta(), **(meta or {})}
        for key, value in attrs.items():
            h.attrs[key] = json.dumps(value)
        layers = h.create_group("layer")
        entry = layers.create_group("0")
        entry.create_dataset("type", (1,), "S10", [b"input"])
        entry.create_dataset("shape", data=np.array(copy.layers[0].in_shape))
        first = first_neuron_layer(copy)
        for i, (layer, block) in enumerate(zip(copy.layers, copy.blocks)):
            graded = plan.input_bits if i == first and plan.input_bits is not None else 0
            write_layer(layers.create_group(str(i + 1)), i, layer, block, copy.is_voltage_layer(i), graded)
    os.replace(tmp, path)
    tmp = digest_file(path).with_name(digest_file(path).name + ".tmp")
    tmp.write_text(f"{file_sha256(path)}  {path.name}\n")
    os.replace(tmp, digest_file(path))
    return report


def net_layers(model) -> list[tuple[str, tuple]]:
    """(netx type, shape) of every entry ``export_model`` writes for ``model``."""
    out = [("input", tuple(model.layers[0].in_shape))]
    for layer in model.layers:
        kind = "conv" if layer.kind == "pool" else layer.kind
        shape = (int(np.prod(layer.in_shape)), 1, 1) if layer.kind == "flatten" else tuple(layer.out_shape)
        out.append((kind, shape))
    return out


def read_net(path: str | Path, model=None) -> dict:
    """Open and validate a netx file written by :func:`export_model`; return its metadata.

    With ``model``, also check that the file holds that model's layers (a stale or
    foreign file would make every comparison meaningless).
    """
    path = Path(path)
    if not path.is_file():
        raise DeployError(f"{path}: not found; write it with `neurofed export RUN_DIR`")
    try:
        h = h5py.File(path, "r")
    except OSError:
        raise DeployError(f"{path}: not a readable HDF5 file (corrupted or truncated?); "
                          f"re-create it with `neurofed export RUN_DIR`") from None
    with h:
        try:
            meta = {k: json.loads(v) for k, v in h.attrs.items()}
        except (TypeError, ValueError):
            meta = {}
        if meta.get("format") != FORMAT:
            raise DeployError(f"{path}: not a network written by `neurofed export` "
                              f"(no {FORMAT!r} format tag); re-create it with `neurofed export RUN_DIR`")
        if "layer" not in h:
            raise DeployError(f"{path}: no 'layer' group; the file is damaged — re-run `neurofed export RUN_DIR`")
        try:
            found = []
            for i in range(len(h["layer"])):
                g = h["layer"][str(i)]
                found.append((g["type"][0].decode("ascii"), tuple(int(x) for x in g["shape"][()])))
        except (KeyError, IndexError, ValueError) as exc:
            raise DeployError(f"{path}: layer entry {len(found)} is damaged ({exc}); "
                              f"re-run `neurofed export`") from None
    if model is not None:
        expected = net_layers(model)
        if found != expected:
            diff = next((i for i, (a, b) in enumerate(zip(found, expected)) if a != b), min(len(found), len(expected)))
            got = found[diff] if diff < len(found) else "nothing"
            want = expected[diff] if diff < len(expected) else "nothing"
            raise DeployError(f"{path}: entry {diff} is {got}, the run's model has {want}; "
                              f"the file is stale or foreign — re-run `neurofed export RUN_DIR`")
    meta["net_layers"] = found
    return meta


def export_run(run_dir: str | Path, exp=None, profile=DEFAULT_PROFILE, quiet: bool = False,
               model_round: str | int = "last") -> Path:
    """Export the global model of ``run_dir`` (of ``model_round``: best, last or a kept
    round's number) to ``run_dir/model.net``; the file records the round.

    ``exp`` (the runner's Experiment, after training: the last round) saves reloading
    the dataset. Prints the hardware check; writes it to ``run_dir/hardware.json``.
    """
    run_dir = Path(run_dir)
    if exp is not None and model_round == "last":
        from neurofed.training.params import ParamSpec

        model = exp.new_model()
        ParamSpec.from_model(model).set(model, exp.server.params)
        model.eval()
        cfg = exp.cfg
        rnd = cfg["federation"]["rounds"]
    else:
        model, cfg, ds, rnd = load_global_model(run_dir, None if exp is None else exp.dataset, model_round)
    if cfg["model"].get("kind", "snn") != "snn":
        raise DeployError(f"model.kind is {cfg['model']['kind']!r}: only spiking models export to netx")
    data = cfg["data"]
    meta = {"model": cfg["model"]["name"], "width": cfg["model"]["width"], "timesteps": data["timesteps"],
            "encoding": data["encoding"], "dataset": data["name"], "quantized_training": cfg["model"]["quantize"],
            "round": int(rnd)}
    path = run_dir / NET_FILE
    from neurofed.deploy.deployable import deployable_copy, has_residual_joins

    deployable = deployable_copy(model)  # what cannot be folded is refused here, before anything is written
    if has_residual_joins(deployable):
        return _record_residual(run_dir, deployable, profile, data, rnd, quiet)
    report = check_model(deployable, profile, timesteps=data["timesteps"])
    if not report.layers:  # refused on its structure: nothing to count, nothing written
        report.raise_for_violations()
    warning = graded_state_warning(report.layers[0].max_current, data) if data["encoding"] == "direct" else None
    report.warnings += [warning] if warning else []
    (run_dir / "hardware.json").write_text(json.dumps(report.to_dict(), indent=2))
    if not quiet:
        print(report.summary())
    report.raise_for_violations()
    export_model(deployable, path, meta=meta, profile=profile, timesteps=data["timesteps"], check=False,
                 encoding=data["encoding"])
    if not quiet:
        note = "" if cfg["model"]["quantize"] else \
            " (weights quantized to 8 bits at export: trained without model.quantize)"
        print(f"netx network (global model of round {rnd}) -> {path}{note}")
    return path


def _record_residual(run_dir: Path, deployable, profile, data: dict, rnd: int, quiet: bool) -> None:
    """A residual model: no ``model.net`` (netx's HDF5 reader has no join), its graph's hardware
    use in ``hardware.json``; ``neurofed lava`` wires the graph from the model
    (:mod:`neurofed.deploy.lava_graph`)."""
    from dataclasses import asdict

    from neurofed.deploy.constraints import hardware_use

    use = hardware_use(deployable, profile, timesteps=data["timesteps"])
    record = {**use, "layers": [asdict(r) for r in use["layers"]], "round": int(rnd),
              "netx_file": None, "why": "residual joins: netx's HDF5 reader loads chains only; "
                                        "`neurofed lava` builds the Lava process graph from the model"}
    (run_dir / "hardware.json").write_text(json.dumps(record, indent=2, default=str))
    for stale in (run_dir / NET_FILE, digest_file(run_dir / NET_FILE)):
        stale.unlink(missing_ok=True)  # a file from an earlier export would not be this model
    if not quiet:
        print(f"hardware use ({use['profile']}): {use['cores']} cores, {use['chips']} chip(s), "
              f"{use['neurons']:,} neurons, {use['synapses']:,} synapses")
        print(f"residual model (global model of round {rnd}): no netx file (netx loads chains only); "
              f"`neurofed lava {run_dir}` wires its Lava graph from the model")
    return None
