"""Config validation: every bad key or value is one line naming it, exit code 2."""

import subprocess
import sys

import pytest

from neurofed.config import ConfigError, load_config


def test_defaults_resolve_and_validate():
    cfg = load_config(None)
    assert cfg["data"]["name"] == "digits" and cfg["algorithm"]["name"] == "fedavg"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("federation.lr=-1", "federation.lr: got -1"),
        ("federation.optimizer=rmsprop", "allowed: adam, sgd"),
        ("partition.scheme=random", "partition.scheme: got 'random'"),
        ("model.name=resnet50", "model.name: got 'resnet50'"),
        ("data.name=imagenet", "data.name: got 'imagenet'"),
        ("federation.lrr=0.1", "federation.lrr: unknown key"),
        ("partition.alpha=0", "partition.alpha: got 0; expected > 0"),
        ("algorithm.name=fedfoo", "algorithm.name: got 'fedfoo'"),
        ("algorithm.mu=0.1", "algorithm.mu: unknown key for fedavg"),
        ("federation.clients_per_round=20", "federation.clients_per_round: got 20; expected <= partition.num_clients"),
        ("model.width=1.5", "model.width: got 1.5"),
        ("federation.fast_gradients=maybe", "federation.fast_gradients: got 'maybe'; expected true or false"),
    ],
)
def test_bad_values_name_the_key(override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert fragment in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["federation.lr=-1", "seed=-3"])
    assert len(str(err.value).splitlines()) == 2


def test_override_parsing_and_dotted_keys():
    cfg = load_config(None, ["partition.scheme=cnum", "partition.classes_per_client=3", "federation.lr=1e-2"])
    assert cfg["partition"]["scheme"] == "cnum" and cfg["partition"]["classes_per_client"] == 3
    assert cfg["federation"]["lr"] == pytest.approx(0.01)


def test_impossible_partition_is_a_clear_cli_error(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "neurofed.cli", "run", "examples/digits_fedavg.yaml", "--out", str(tmp_path / "r"),
         "--set", "partition.scheme=cnum", "--set", "partition.classes_per_client=11"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "classes_per_client" in res.stderr


def test_cli_bad_key_exit_code_2_one_line_and_nothing_lost(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    keep = out / "metrics.jsonl"
    keep.write_text('{"round": 1}\n')
    res = subprocess.run(
        [sys.executable, "-m", "neurofed.cli", "run", "examples/digits_fedavg.yaml", "--out", str(out),
         "--set", "federation.lr=abc"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 2
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert lines == ["neurofed: error: federation.lr: got 'abc'; expected a number"]
    assert keep.read_text() == '{"round": 1}\n'


def test_existing_run_dir_is_not_overwritten(tmp_path, tiny_cfg):
    from neurofed.fl.resume import RunDirError
    from neurofed.pipeline import run

    cfg = tiny_cfg(**{"federation.rounds": 1})
    run(cfg, tmp_path, progress=False)
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(RunDirError, match="--resume"):
        run(cfg, tmp_path, progress=False)
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("nope.yaml")
