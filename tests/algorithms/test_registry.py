"""neurofed.algorithms: the registry, each algorithm's config keys and defaults, the papers' rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from algorithm_helpers import LABEL_SKEW, PAPER_ROWS
from neurofed.algorithms import algorithm_names, get_algorithm_class
from neurofed.config import ConfigError, load_config


def test_registered_with_their_config_keys(tiny_cfg):
    assert set(LABEL_SKEW) <= set(algorithm_names())
    expected = {"fedprox": {"mu"}, "scaffold": {"global_lr"}, "fednova": set(), "fedlc": {"tau"},
                "fedrs": {"alpha"}, "fedlec": {"lambda", "temperature", "prior_smoothing", "lc_form", "ld_form"}}
    for name, keys in expected.items():
        cls = get_algorithm_class(name)
        assert cls.name == name and set(cls.config_defaults) == keys
        assert set(tiny_cfg(**{"algorithm.name": name})["algorithm"]) == keys | {"name"}


def test_baseline_defaults_are_the_fedlec_experiments():
    # The FedLEC authors' main.py: -mu 0.01, -tau 0.01, -strength 0.5, -lamda 0.1.
    assert get_algorithm_class("fedprox").config_defaults["mu"] == 0.01
    assert get_algorithm_class("fedlc").config_defaults["tau"] == 0.01
    assert get_algorithm_class("fedrs").config_defaults["alpha"] == 0.5
    # FedLEC: the authors' -lamda 0.1 with their L_d (the softmax over the missing labels) and
    # Eq. 8 over the held labels, the form that gives the paper's effect (docs/fidelity.md)
    fedlec = get_algorithm_class("fedlec").config_defaults
    assert (fedlec["lambda"], fedlec["lc_form"], fedlec["ld_form"]) == (0.1, "eq8_held", "restricted")
    assert get_algorithm_class("scaffold").config_defaults["global_lr"] == 1.0


def test_bad_algorithm_keys_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"^algorithm\.mu: got -1; expected >= 0$"):
        load_config(None, ["algorithm.name=fedprox", "algorithm.mu=-1"])
    with pytest.raises(ConfigError, match=r"algorithm\.lambda: got 1\.5; expected <= 1"):
        load_config(None, ["algorithm.name=fedlec", "algorithm.lambda=1.5"])
    with pytest.raises(ConfigError, match=r"algorithm\.mu: unknown key for fedlec; allowed: lambda, lc_form, ld_form, prior_smoothing, temperature"):
        load_config(None, ["algorithm.name=fedlec", "algorithm.mu=0.1"])
    with pytest.raises(ConfigError, match=r"federation\.ldp_laplace: got -0\.1; expected >= 0"):
        load_config(None, ["federation.ldp_laplace=-0.1"])


@pytest.mark.parametrize("paper", sorted(PAPER_ROWS))
def test_every_paper_row_is_one_set_away_from_each_preset(paper, caplog):
    import yaml

    presets = sorted((Path(__file__).resolve().parents[2] / "examples" / "papers").glob(f"{paper}_*.yaml"))
    assert presets
    for preset in presets:
        given = yaml.safe_load(preset.read_text())["algorithm"]
        for row in PAPER_ROWS[paper]:
            algo = load_config(preset, [f"algorithm.name={row}"])["algorithm"]
            assert set(algo) == {"name", *get_algorithm_class(row).config_defaults} and algo["name"] == row
            assert all(algo[k] == v for k, v in given.items() if k in algo and k != "name")  # shared keys kept
    if paper == "sfedhifi":  # its presets set fusion_until, which the baselines do not read
        assert "does not read the file's algorithm.fusion_until; ignored" in caplog.text
        with pytest.raises(ConfigError, match="algorithm.fusion_until: unknown key for hetero_fedavg"):
            load_config(presets[0], ["algorithm.name=hetero_fedavg", "algorithm.fusion_until=3"])  # explicit: checked
