"""Experiment configuration: defaults, loading, ``--set`` overrides and validation.

The whole config is validated before any work starts (scikit-learn style): every
problem becomes one line naming the key, the value received and what is allowed.
Algorithm-specific keys are declared by each algorithm (``Algorithm.config_defaults``)
and validated against those declarations, so a typo in ``algorithm.mu`` is caught
as surely as one in ``federation.lr``.
"""

from __future__ import annotations

import copy
import importlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from neurofed.config.checks import (Check, ConfigError, auto_or_boolean, boolean, capped, check_device, choice,
                                    number, shown, unknown_key)
from neurofed.config.yaml_io import MAX_CONFIG_BYTES, MAX_DEPTH, yaml_load
from neurofed.registry import Registry

log = logging.getLogger(__name__)


# The keys of the run itself and of federated training; the sections of components
# (data, partition, model, algorithm, energy) are declared by those components (register_section).
CORE_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "federation": {
        "rounds": 30,
        "clients_per_round": 5,
        "local_epochs": 2,
        "batch_size": 32,
        "optimizer": "adam",
        "lr": 0.001,
        "lr_decay": 1.0,  # per-round factor: round r trains with lr · lr_decay^(r−1)
        # step schedule (FedSNN Sec. IV-A: [40, 60, 80], 0.2): lr × lr_gamma after each milestone round
        "lr_milestones": [],
        "lr_gamma": 0.1,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "straggler_prob": 0.0,
        "update_noise": 0.0,  # FedSNN Fig. 8b noise strength s (see update_noise_mode)
        "update_noise_mode": "relative",  # relative: N(0,1)·s·mean|update| per tensor | absolute: N(0,1)·s
        "ldp_laplace": 0.0,  # Laplace scale b of local DP on every upload (FedLEC Eq. 16's δ)
        "ldp_clip": None,  # L1 bound C on each update before the noise: ε = 2C/b; null = Eq. 16, no ε
        "privacy_noise": "os_entropy",  # os_entropy | seeded_not_private (reproducible, no privacy)
        "target_accuracy": None,
        "logit_scale": 1.0,
        "threads": None,
        # neurofed.kernels: bit-exact fused CPU CUBA kernels. auto: stock SLAYER (one warning line) if
        # they cannot be loaded, except in a Flower app; true: a run fails without them; false: stock
        "fast_kernels": "auto",
        # with fast_kernels: same spikes, gradients equal to SLAYER's up to float32 rounding
        # (spike-driven weight gradients, inline surrogate exp); see neurofed.kernels "Fast gradients"
        "fast_gradients": False,
        # where local training and the global evaluation run (neurofed.device): auto | cpu | cuda | cuda:N
        "device": "auto",
        # CUDA float32 convolutions and matmuls (neurofed.device.configure_cuda): auto (torch's
        # defaults: TF32 convolutions) | false (IEEE float32 everywhere) | true (TF32 everywhere)
        "tf32": "auto",
        # CUBA neurons on CUDA by neurofed's fused Triton kernel (neurofed.gpu.cuba_triton;
        # needs fast_kernels): false (stock SLAYER) | true | auto (where Triton imports)
        "gpu_kernels": False,
    },
    "export": True,
    "lava": {"samples": 0, "backend": "fixed_pt"},
}

OPTIMIZERS = ("adam", "sgd")


# --------------------------------------------------------------------------- helpers


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def deep_merge(base: dict, update: dict) -> dict:
    """Return ``base`` updated recursively with ``update`` (neither is modified)."""
    out = copy.deepcopy(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_override(item: str) -> tuple[str, Any]:
    """``"a.b=value"`` -> ``("a.b", value)`` with the value parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. federation.lr=0.01")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {shown(item)}: empty key; expected KEY=VALUE")
    if key.count(".") >= MAX_DEPTH:
        raise ConfigError(f"--set {shown(key)}: a key {key.count('.') + 1} levels deep; config keys are "
                          f"section.key (a few levels at most)")
    return key, yaml_load(raw, f"--set {shown(key)}") if raw.strip() else None


def set_dotted(cfg: dict, key: str, value: Any, merge: bool = False) -> None:
    """Set dotted ``key`` (``a.b.c``) in nested ``cfg``, making the mappings on the way;
    ``merge``: a mapping value merges into the mapping already there."""
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    if merge and isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        value = deep_merge(node[parts[-1]], value)
    node[parts[-1]] = value


# --------------------------------------------------------------------------- validation


def _milestones(v):
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v) \
            and v == sorted(set(v)):
        return None
    return "expected a list of increasing round numbers >= 1 (the lr is multiplied by federation.lr_gamma after each)"


def _core_checks() -> dict[str, Check]:
    return {
        "seed": number(0, integer=True),
        "federation.rounds": number(1, integer=True),
        "federation.clients_per_round": number(1, integer=True),
        "federation.local_epochs": number(1, integer=True),
        "federation.batch_size": number(1, integer=True),
        "federation.optimizer": choice(OPTIMIZERS),
        "federation.lr": number(0, lo_open=True),
        "federation.lr_decay": number(0, 1, lo_open=True),
        "federation.lr_milestones": _milestones,
        "federation.lr_gamma": number(0, lo_open=True),
        "federation.momentum": number(0, 1),
        "federation.weight_decay": number(0),
        "federation.straggler_prob": number(0, 1),
        "federation.update_noise": number(0),
        "federation.update_noise_mode": choice(("relative", "absolute")),
        "federation.ldp_laplace": number(0),
        "federation.ldp_clip": number(0, lo_open=True, nullable=True),
        "federation.privacy_noise": choice(("os_entropy", "seeded_not_private")),
        "federation.target_accuracy": number(0, 1, nullable=True),
        "federation.logit_scale": number(0, lo_open=True),
        "federation.threads": number(1, integer=True, nullable=True),
        "federation.fast_kernels": auto_or_boolean,
        "federation.fast_gradients": boolean,
        "federation.device": check_device,
        "federation.tf32": auto_or_boolean,
        "federation.gpu_kernels": auto_or_boolean,
        "export": boolean,
        "lava.samples": number(0, integer=True),
        "lava.backend": choice(("fixed_pt", "loihi2")),
    }


def _core_cross_checks(cfg: dict) -> list[str]:
    problems = []
    p, f = cfg["partition"], cfg["federation"]
    if f["clients_per_round"] > p["num_clients"]:
        problems.append(f"federation.clients_per_round: got {f['clients_per_round']}; "
                        f"expected <= partition.num_clients ({p['num_clients']})")
    if f.get("ldp_clip") is not None and not f.get("ldp_laplace"):
        problems.append(f"federation.ldp_clip: got {f['ldp_clip']}; clipping applies only with "
                        f"federation.ldp_laplace > 0 (set both, or neither)")
    return problems


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class Section:
    """The config section a component owns: its defaults, a check per dotted key
    (built on demand: choices such as the registered data sets are known only then),
    checks across keys once every key is valid, and — for sections whose keys depend
    on a choice, like ``algorithm`` — its own resolve and validate; and ``derive``, for a key
    left null that takes its value from another section's (it fills the whole resolved config)."""

    name: str
    defaults: dict
    checks: Callable[[], dict[str, Check]] = dict
    cross_checks: Callable[[dict], list[str]] | None = None
    resolve: Callable[[dict], dict] | None = None
    derive: Callable[[dict], None] | None = None
    validate: Callable[[dict, dict], list[str]] | None = None
    # the keys a section's choice reads (``name`` included), for load_config's rule on an
    # overridden choice; None: the section's keys do not depend on a choice
    keys_for: Callable[[dict], set[str] | None] | None = None


SECTIONS = Registry("config section", "section")  # name -> Section, filled on import of SECTION_MODULES
# The modules that declare a section (register_section, on import). This layer knows
# them by name, as the command line knows its COMMAND_MODULES, and imports none of them
# in its own code: they import it.
SECTION_MODULES = ("neurofed.data", "neurofed.data.partition", "neurofed.models", "neurofed.algorithms",
                   "neurofed.energy.profiles", "neurofed.tracking")
# Order of the sections in a resolved config (and config.yaml).
_ORDER = ("seed", "data", "partition", "model", "federation", "algorithm", "export", "lava", "energy", "log")


def register_section(section: Section) -> Section:
    return SECTIONS.register(section.name, section)


def sections() -> dict[str, Section]:
    for module in SECTION_MODULES:
        importlib.import_module(module)
    return SECTIONS


def defaults() -> dict[str, Any]:
    """Every default: the core keys and each registered section's."""
    merged = {**CORE_DEFAULTS, **{name: sec.defaults for name, sec in sections().items()}}
    return copy.deepcopy({k: merged[k] for k in sorted(merged, key=lambda k: (_ORDER + (k,)).index(k))})


def __getattr__(name: str):
    if name == "DEFAULTS":  # the assembled defaults, as a module attribute
        return defaults()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def validate(cfg: dict) -> dict:
    """Check every key of ``cfg``; raise one ConfigError listing all problems."""
    secs = sections()
    problems: list[str] = []
    checks = _core_checks()
    for sec in secs.values():
        checks.update(sec.checks())
    own = {name for name, sec in secs.items() if sec.validate is not None}
    problems.extend(f"{key}: got {shown(value)}; expected a finite number" for key, value in _non_finite(cfg))
    bad = {p.split(":", 1)[0] for p in problems}
    flat = flatten({k: v for k, v in cfg.items() if k not in own})
    for key, value in flat.items():
        check = checks.get(key)
        if check is None:
            problems.append(unknown_key(key, checks))
            continue
        msg = None if key in bad else check(value)
        if msg:
            problems.append(f"{key}: got {shown(value)}; {msg}")
    for name in own:
        problems.extend(p for p in secs[name].validate(cfg.get(name, {}), cfg) if p.split(":", 1)[0] not in bad)

    if not problems:
        for sec in secs.values():
            if sec.cross_checks is not None:
                problems.extend(sec.cross_checks(cfg))
    if not problems:
        problems.extend(_core_cross_checks(cfg))
    if problems:
        raise ConfigError("\n".join(capped(problems)))
    return cfg


def _non_finite(node: Any, prefix: str = ""):
    """(dotted key, value) of every NaN or infinite float in ``node``, inside lists too."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _non_finite(v, f"{prefix}{k}.")
    elif isinstance(node, (list, tuple)):
        for v in node:
            if isinstance(v, float) and not math.isfinite(v):
                yield prefix[:-1], node
                return
            yield from _non_finite(v, prefix)
    elif isinstance(node, float) and not math.isfinite(node):
        yield prefix[:-1], node


def resolve(cfg: dict) -> dict:
    """Fill defaults (including those that depend on a choice, e.g. the algorithm's) into a partial config."""
    out = deep_merge(defaults(), cfg)
    for name, sec in sections().items():
        if sec.resolve is not None:
            out[name] = sec.resolve(out[name])
    for sec in sections().values():
        if sec.derive is not None:
            sec.derive(out)
    return out


def check_yaml_file(path: Path, what: str) -> None:
    """``path`` is a file to read: one line saying what it is instead (missing, a folder, a device)."""
    if path.is_file():
        return
    if not path.exists():
        raise ConfigError(f"{what} {str(path)!r} not found")
    kind = "a folder" if path.is_dir() else "not a regular file"
    raise ConfigError(f"{what} {str(path)!r} is {kind}; expected a YAML file")


def load_config(path: str | Path | None = None, overrides: Iterable[str] = (), data: dict | None = None) -> dict:
    """Load a YAML config (or a dict), apply ``KEY=VALUE`` overrides, fill defaults, validate."""
    cfg: dict = {}
    if path is not None:
        path = Path(path)
        check_yaml_file(path, "config file")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {str(path)!r}: {path.stat().st_size:,} bytes; a config holds at most "
                              f"{MAX_CONFIG_BYTES:,}")
        try:
            cfg = yaml_load(path.read_text(), f"config file {str(path)!r}")
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0]
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {first}") from None
        if cfg is None:
            raise ConfigError(f"config file {str(path)!r} is empty; it would run every default — give the "
                              f"sections you mean (see examples/digits_fedavg.yaml)")
        if not isinstance(cfg, dict):
            raise ConfigError(f"config file {str(path)!r}: expected a mapping of sections at top level")
        _check_sections(cfg)
    from_file = copy.deepcopy(cfg)
    given = set(flatten(data or {}))
    if data:
        cfg = deep_merge(cfg, data)
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        set_dotted(cfg, key, value)
        given.add(key)
    _check_sections(cfg)  # e.g. --set algorithm=3
    _drop_keys_of_a_replaced_choice(from_file, cfg, given)
    return validate(resolve(cfg))


def _drop_keys_of_a_replaced_choice(from_file: dict, cfg: dict, given: set[str]) -> None:
    """When an override (``--set``, a sweep point) replaces a section's choice — e.g.
    ``algorithm.name=hetero_fedavg`` on a SFedHIFI preset — the file's keys of that
    section that the new choice does not read are dropped, with a note on stderr, so that
    a paper's other rows are one ``--set`` away. Keys the override itself gives are kept
    and checked as usual: a misspelt one is still an error."""
    for name, sec in sections().items():
        if sec.keys_for is None or not isinstance(cfg.get(name), dict):
            continue
        before = from_file.get(name) if isinstance(from_file.get(name), dict) else {}
        default_choice = sec.defaults.get("name")
        if before.get("name", default_choice) == cfg[name].get("name", default_choice):
            continue
        known = sec.keys_for(cfg[name])
        if known is None:
            continue
        explicit = {k.split(".")[1] for k in given if k.startswith(name + ".") and k.count(".") >= 1}
        dropped = [k for k in before if k not in known and k not in explicit and k in cfg[name]]
        for k in dropped:
            del cfg[name][k]
        if dropped:
            log.warning("note: %s.name=%s does not read the file's %s; ignored",
                        name, cfg[name].get("name"), ", ".join(f"{name}.{k}" for k in dropped))


def _check_sections(cfg: dict) -> None:
    """A section given as something other than a mapping of keys: refused before anything reads its keys."""
    sections = [k for k, v in defaults().items() if isinstance(v, dict) and k in cfg and not isinstance(cfg[k], dict)]
    if sections:
        raise ConfigError("\n".join(f"{k}: got {shown(cfg[k])}; expected a mapping of keys (an empty section "
                                     f"runs its defaults: remove it instead)" for k in sections))


def dump_config(cfg: dict, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg, sort_keys=False))
