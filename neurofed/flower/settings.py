"""The Flower run config of the neurofed app (``[tool.flwr.app.config]`` in
pyproject.toml, overridden with ``flwr run --run-config``).

``neurofed-config``  experiment YAML; a relative path is looked up in the app
                     directory (the repository, or the installed FAB) first
``neurofed-set``     ``--set``-style overrides, whitespace-separated
                     (``"federation.rounds=3 model.width=0.25"``; quote a value
                     holding spaces: ``"'partition.ratio=[3, 1]'"``)
``out``              run directory (empty: ``runs/flower-<config>-seed<seed>``
                     under the ServerApp's working directory)
``resume``           continue the run in ``out`` from its checkpoint
``round-timeout``    seconds to wait for a round's replies
``node-timeout``     seconds to wait for SuperNodes serving the selected partitions
``reply-poll``       seconds between the ServerApp's pulls of replies (Flower's own
                     ``send_and_receive`` waits 3 s in a deployment)
"""

from __future__ import annotations

import shlex
from pathlib import Path

from neurofed.config import ConfigError, load_config

RUN_CONFIG = {
    "neurofed-config": "examples/digits_fedavg.yaml",
    "neurofed-set": "",
    "out": "",
    "resume": False,
    "round-timeout": 3600.0,
    "node-timeout": 120.0,
    "reply-poll": 0.1,
}

# The app's root: the repository, or the directory Flower installed the FAB into.
APP_DIR = Path(__file__).resolve().parents[2]


def settings(run_config, defaults: dict | None = None) -> dict:
    """RUN_CONFIG, then ``defaults`` (e.g. from :func:`neurofed.flower.app.flower_apps`),
    then the run's config; unknown keys are an error."""
    s = {**RUN_CONFIG, **(defaults or {}), **dict(run_config or {})}
    unknown = sorted(set(s) - set(RUN_CONFIG))
    if unknown:
        raise ConfigError(f"Flower run config: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(RUN_CONFIG)}")
    return s


def config_path(value: str) -> Path:
    p = Path(value).expanduser()
    if p.is_absolute():
        return p
    return next((c for c in (APP_DIR / p, Path.cwd() / p) if c.is_file()), APP_DIR / p)


def experiment_config(s: dict) -> dict:
    """The validated neurofed config the run config names."""
    try:
        overrides = shlex.split(str(s["neurofed-set"]))
    except ValueError as exc:
        raise ConfigError(f"neurofed-set: {exc}; expected KEY=VALUE items separated by spaces") from None
    return load_config(config_path(str(s["neurofed-config"])), overrides)


def run_dir(s: dict, cfg: dict) -> Path:
    out = Path(str(s["out"])) if s["out"] else Path("runs") / f"flower-{Path(str(s['neurofed-config'])).stem}-seed{cfg['seed']}"
    return out.expanduser().resolve()
