"""Experiment configuration: defaults, loading, ``--set`` overrides and validation.

The whole config is validated before any work starts (scikit-learn style): every
problem becomes one line naming the key, the value received and what is allowed.
Algorithm-specific keys are declared by each algorithm (``Algorithm.config_defaults``)
and validated against those declarations, so a typo in ``algorithm.mu`` is caught
as surely as one in ``federation.lr``.
"""

from __future__ import annotations

import copy
import re
import numbers
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml


class ConfigError(ValueError):
    """Invalid configuration; the message has one line per problem."""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` as a string; configs mean a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def _mapping_without_duplicates(loader, node, deep=False):
    """A YAML mapping, refusing a key given twice (YAML would silently keep the last)."""
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice (line {key_node.start_mark.line + 1}); "
                f"YAML would silently keep only the last", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def yaml_load(text: str):
    return yaml.load(text, Loader=_Loader)


DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "data": {
        "name": "digits",
        "root": None,  # local folder for datasets that are not embedded
        "encoding": "rate",  # rate (Poisson) | direct (analog current) | events
        "timesteps": 16,
        "max_rate": 1.0,  # spike probability per step of a pixel at full intensity
        "test_fraction": 0.25,
        # event data sets (neurofed.data.events); data.encoding must be "events" for them
        "bin_by": "time",  # T frames of equal duration (time) or equal event count (count)
        "downsample": 1,  # integer spatial downsampling factor of event data (1 = full size)
        "denoise_us": None,  # tonic Denoise filter_time in µs; null = off
        "contrast_threshold": 0.15,  # log-intensity threshold of the synthetic event camera
        "cache": None,  # folder for decoded images / binned event frames; null = <root>/.neurofed_cache
        # a stratified, seeded slice of a split: a count (>= 1) or a fraction in (0, 1]; null = all
        "train_subset": None,
        "test_subset": None,
        "cifar100_labels": "fine",  # cifar100: fine (100 classes) | coarse (20 superclasses)
        "svhn_extra": False,  # svhn: append extra_32x32.mat to the training split
        # direct encoding / ANN twin: per-channel (pixel in [0, 1] - mean) / std; null = none
        "mean": None,
        "std": None,
    },
    "partition": {
        "scheme": "iid",
        "num_clients": 10,
        "alpha": 0.5,
        "classes_per_client": 2,
        "shards_per_client": 2,
        "ratio": [3, 1],
        "min_size": 10,
    },
    "model": {
        "name": "cnn",
        "kind": "snn",  # snn | ann (the ANN twin: same topology, ReLU)
        "width": 1.0,
        "threshold": 1.25,
        "current_decay": 0.25,
        "voltage_decay": 0.03,
        "tau_grad": 0.1,
        "scale_grad": 1.0,
        "weight_norm": False,
        "quantize": True,  # 8-bit weights as on Loihi (SLAYER's quantize_8bit hook)
        "dropout": 0.0,
        "delay_shift": True,  # SLAYER's one-step delay per block (Lava's timing); false: the papers' T
        # factorized convolutions (hifi_cnn; SFedHIFI Eq. 4): bank elements per width-1 output
        # channel, channels per group per width-1 channel (the authors' values); factorization:
        # output (Eq. 4: B groups output channels) | input (the authors' code: input channels)
        "bank_fraction": 0.25,
        "group_fraction": 0.125,
        "factorization": "output",
    },
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
        "fast_kernels": True,  # neurofed.models.fast_cuba: bit-exact fused CPU CUBA kernels
        # with fast_kernels: same spikes, gradients equal to SLAYER's up to float32 rounding
        # (spike-driven weight gradients, inline surrogate exp); see fast_cuba "Fast gradients"
        "fast_gradients": False,
        # where local training and the global evaluation run (neurofed.device): auto | cpu | cuda | cuda:N
        "device": "auto",
    },
    "algorithm": {"name": "fedavg"},
    "export": True,
    "lava": {"samples": 0, "backend": "fixed_pt"},
    # After training (and export/Lava): energy.json per hw profile; the first is the headline.
    "energy": {"enabled": True, "profiles": ["cmos45_int", "cmos45_fp32", "loihi", "truenorth", "loihi2"],
               "spikes": "torch",  # torch: exact per-position counts on the test set; lava: lava.json
               # exact: measured synaptic ops | paper: the headline by the algorithm's paper's formula
               # (FedSNN Sec. IV-F, SFedCA Eq. 13, SFedHIFI Eq. 15-16; neurofed.energy.conventions)
               "convention": "exact"},
}

OPTIMIZERS = ("adam", "sgd")
ENCODINGS = ("rate", "direct", "events")


# --------------------------------------------------------------------------- helpers


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
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
        raise ConfigError(f"--set {item!r}: empty key; expected KEY=VALUE")
    return key, yaml_load(raw) if raw.strip() else None


def set_dotted(cfg: dict, key: str, value: Any) -> None:
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def get_dotted(cfg: dict, key: str, default: Any = None) -> Any:
    node = cfg
    for p in key.split("."):
        if not isinstance(node, dict) or p not in node:
            return default
        node = node[p]
    return node


# --------------------------------------------------------------------------- validation

Check = Callable[[Any], str | None]


def number(lo=None, hi=None, *, integer=False, lo_open=False, nullable=False) -> Check:
    def check(v):
        if v is None and nullable:
            return None
        kind = numbers.Integral if integer else numbers.Real
        if isinstance(v, bool) or not isinstance(v, kind):
            return f"expected {'an integer' if integer else 'a number'}"
        if lo is not None and (v <= lo if lo_open else v < lo):
            return f"expected {'>' if lo_open else '>='} {lo}"
        if hi is not None and v > hi:
            return f"expected <= {hi}"
        return None

    return check


def choice(options: Iterable[str]) -> Check:
    options = tuple(options)

    def check(v):
        return None if v in options else f"allowed: {', '.join(map(str, options))}"

    return check


def boolean(v):
    return None if isinstance(v, bool) else "expected true or false"


def _ratio(v):
    if (
        isinstance(v, (list, tuple))
        and len(v) == 2
        and all(isinstance(x, numbers.Real) and not isinstance(x, bool) and x > 0 for x in v)
    ):
        return None
    return "expected two positive numbers [n1, n2]"


def _milestones(v):
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v) \
            and v == sorted(set(v)):
        return None
    return "expected a list of increasing round numbers >= 1 (the lr is multiplied by federation.lr_gamma after each)"


def _subset(v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return "expected a count >= 1, a fraction in (0, 1], or null (all)"
    if isinstance(v, numbers.Integral):
        return None if v >= 1 else "expected a count >= 1, a fraction in (0, 1], or null (all)"
    return None if 0 < v <= 1 else "expected a fraction in (0, 1], a count >= 1, or null (all)"


def _channel_values(positive: bool) -> Check:
    def check(v):
        if v is None:
            return None
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            v = [v]
        if (not isinstance(v, (list, tuple)) or not v
                or not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in v)):
            return "expected a number or a list of one number per input channel, or null"
        if positive and any(x <= 0 for x in v):
            return "expected values > 0"
        return None

    return check


def _data_cross_checks(d: dict) -> list[str]:
    """Keys that only make sense together with others (the load checks the rest)."""
    problems = []
    if (d.get("mean") is not None or d.get("std") is not None) and d.get("encoding") not in ("direct",):
        problems.append(f"data.mean / data.std: set with data.encoding {d.get('encoding')!r}; normalisation "
                        "applies to direct (analog) input only: rate coding needs pixels in [0, 1] as spike "
                        "probabilities")
    if d.get("cifar100_labels") == "coarse" and d.get("name") != "cifar100":
        problems.append(f"data.cifar100_labels: got 'coarse'; only cifar100 has coarse labels "
                        f"(data.name is {d.get('name')!r})")
    if d.get("svhn_extra") is True and d.get("name") != "svhn":
        problems.append(f"data.svhn_extra: got true; only svhn has an extra split (data.name is {d.get('name')!r})")
    return problems


def _optional_str(v):
    return None if v is None or isinstance(v, str) else "expected a path or null"


def _energy_profiles(v):
    from neurofed.energy.profiles import check_profile_refs

    return check_profile_refs(v)


def _checks() -> dict[str, Check]:
    from neurofed.data import dataset_names
    from neurofed.device import check_device
    from neurofed.data.partition import SCHEMES
    from neurofed.models import model_names

    return {
        "seed": number(0, integer=True),
        "data.name": choice(dataset_names()),
        "data.root": _optional_str,
        "data.encoding": choice(ENCODINGS),
        "data.timesteps": number(1, 10_000, integer=True),
        "data.max_rate": number(0, 1, lo_open=True),
        "data.test_fraction": number(0, 1, lo_open=True),
        "data.bin_by": choice(("time", "count")),
        "data.downsample": number(1, integer=True),
        "data.denoise_us": number(0, lo_open=True, nullable=True),
        "data.contrast_threshold": number(0, lo_open=True),
        "data.cache": _optional_str,
        "data.train_subset": _subset,
        "data.test_subset": _subset,
        "data.cifar100_labels": choice(("fine", "coarse")),
        "data.svhn_extra": boolean,
        "data.mean": _channel_values(False),
        "data.std": _channel_values(True),
        "partition.scheme": choice(SCHEMES),
        "partition.num_clients": number(1, integer=True),
        "partition.alpha": number(0, lo_open=True),
        "partition.classes_per_client": number(1, integer=True),
        "partition.shards_per_client": number(1, integer=True),
        "partition.ratio": _ratio,
        "partition.min_size": number(0, integer=True),
        "model.name": choice(model_names()),
        "model.kind": choice(("snn", "ann")),
        "model.width": number(0, 1, lo_open=True),
        "model.threshold": number(0, lo_open=True),
        "model.current_decay": number(0, 1),
        "model.voltage_decay": number(0, 1),
        "model.tau_grad": number(0, lo_open=True),
        "model.scale_grad": number(0, lo_open=True),
        "model.weight_norm": boolean,
        "model.quantize": boolean,
        "model.dropout": number(0, 1),
        "model.delay_shift": boolean,
        "model.bank_fraction": number(0, 1, lo_open=True),
        "model.group_fraction": number(0, 1, lo_open=True),
        "model.factorization": choice(("output", "input")),
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
        "federation.fast_kernels": boolean,
        "federation.fast_gradients": boolean,
        "federation.device": check_device,
        "export": boolean,
        "lava.samples": number(0, integer=True),
        "lava.backend": choice(("fixed_pt", "loihi2")),
        "energy.enabled": boolean,
        "energy.profiles": _energy_profiles,
        "energy.spikes": choice(("auto", "torch", "lava")),
        "energy.convention": choice(("exact", "paper")),
    }


def validate(cfg: dict) -> dict:
    """Check every key of ``cfg``; raise one ConfigError listing all problems."""
    from neurofed.algorithms import get_algorithm_class, algorithm_names

    problems: list[str] = []
    checks = _checks()
    flat = _flatten({k: v for k, v in cfg.items() if k != "algorithm"})
    for key, value in flat.items():
        check = checks.get(key)
        if check is None:
            allowed = sorted(k for k in checks if k.rsplit(".", 1)[0] == key.rsplit(".", 1)[0])
            hint = f"; allowed here: {', '.join(allowed)}" if allowed else ""
            problems.append(f"{key}: unknown key{hint}")
            continue
        msg = check(value)
        if msg:
            problems.append(f"{key}: got {value!r}; {msg}")

    algo = cfg.get("algorithm", {})
    name = algo.get("name")
    if name not in algorithm_names():
        problems.append(f"algorithm.name: got {name!r}; allowed: {', '.join(algorithm_names())}")
    else:
        problems.extend(get_algorithm_class(name).validate_config(algo, cfg))

    if not problems:
        problems.extend(_data_cross_checks(cfg.get("data", {})))
    if not problems:
        p, f = cfg["partition"], cfg["federation"]
        if f["clients_per_round"] > p["num_clients"]:
            problems.append(
                f"federation.clients_per_round: got {f['clients_per_round']}; "
                f"expected <= partition.num_clients ({p['num_clients']})"
            )
        if f.get("ldp_clip") is not None and not f.get("ldp_laplace"):
            problems.append(f"federation.ldp_clip: got {f['ldp_clip']}; clipping applies only with "
                            f"federation.ldp_laplace > 0 (set both, or neither)")
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


def resolve(cfg: dict) -> dict:
    """Fill defaults (including the chosen algorithm's) into a partial config."""
    from neurofed.algorithms import algorithm_names, get_algorithm_class

    out = deep_merge(DEFAULTS, cfg)
    name = out["algorithm"].get("name")
    if name in algorithm_names():
        algo_defaults = get_algorithm_class(name).config_defaults
        out["algorithm"] = deep_merge({"name": name, **algo_defaults}, out["algorithm"])
    return out


def load_config(path: str | Path | None = None, overrides: Iterable[str] = (), data: dict | None = None) -> dict:
    """Load a YAML config (or a dict), apply ``KEY=VALUE`` overrides, fill defaults, validate."""
    cfg: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} not found")
        try:
            cfg = yaml_load(path.read_text())
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0]
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {first}") from None
        if cfg is None:
            raise ConfigError(f"config file {str(path)!r} is empty; it would run every default — give the "
                              f"sections you mean (see examples/digits_fedavg.yaml)")
        if not isinstance(cfg, dict):
            raise ConfigError(f"config file {str(path)!r}: expected a mapping of sections at top level")
        sections = [k for k, v in DEFAULTS.items() if isinstance(v, dict) and k in cfg and not isinstance(cfg[k], dict)]
        if sections:
            raise ConfigError("\n".join(f"{k}: got {cfg[k]!r}; expected a mapping of keys (an empty section runs "
                                         f"its defaults: remove it instead)" for k in sections))
    if data:
        cfg = deep_merge(cfg, data)
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        set_dotted(cfg, key, value)
    return validate(resolve(cfg))


def dump_config(cfg: dict, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg, sort_keys=False))
