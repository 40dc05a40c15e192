"""The paper presets (examples/papers/): each loads and validates, builds its model on its
dataset's shape, and trains on tiny files written in the dataset's published format
(tests/dataset_files.py), with rounds, clients, T, width and data cut down to seconds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from neurofed.config import load_config
from neurofed.data import load_dataset
from neurofed.pipeline import run
from neurofed.models import build_model, topology

import dataset_files  # tests/ is on sys.path (rootdir conftest), as conftest imports are

PAPERS = Path(__file__).resolve().parents[1] / "examples" / "papers"
PRESETS = sorted(PAPERS.glob("*.yaml"))
WRITERS = {"mnist": dataset_files.write_mnist, "fashion_mnist": dataset_files.write_fashion_mnist,
           "cifar10": dataset_files.write_cifar10, "cifar100": dataset_files.write_cifar100,
           "svhn": dataset_files.write_svhn}
SHAPES = {"mnist": (1, 28, 28), "fashion_mnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32),
          "svhn": (3, 32, 32)}
CLASSES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100, "svhn": 10}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """One folder per dataset holding its tiny files in the published layout."""
    out = {}
    for name, write in WRITERS.items():
        root = tmp_path_factory.mktemp(name)
        write(root)
        out[name] = root
    return out


def _config(path: Path, roots: dict, extra: list[str] = ()) -> dict:
    probe = load_config(path, overrides=["data.root=/nonexistent"])  # validation needs no files
    ds = probe["data"]["name"]
    return load_config(path, overrides=[f"data.root={roots[ds]}", *extra])


def test_there_is_a_preset_per_main_table_setting():
    names = {p.stem for p in PRESETS}
    assert len([n for n in names if n.startswith("fedsnn_")]) == 4  # CIFAR-10/100 x IID/non-IID (Table I)
    assert len([n for n in names if n.startswith("fedlec_")]) == 15  # 3 datasets x 5 label skews (Table 1)
    assert len([n for n in names if n.startswith("sfedca_")]) == 12  # 3 datasets x 4 splits (Table 2)
    assert len([n for n in names if n.startswith("sfedhifi_")]) == 9  # 3 datasets x 3 splits (Table 1)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_validates_and_fits_its_dataset(path, roots):
    cfg = _config(path, roots)
    text = path.read_text()
    assert "--set data.root=" in text and "Sources:" in text  # the command and the citations
    ds = load_dataset(cfg["data"], cfg["seed"])
    name = cfg["data"]["name"]
    assert ds.input_shape == SHAPES[name] and ds.num_classes == CLASSES[name]
    m = cfg["model"]
    layers = topology(m["name"], m["width"], ds.num_classes, ds.input_shape)  # the layer list it trains
    assert layers[0].in_shape == SHAPES[name] and layers[-1].out_shape == (CLASSES[name],)
    assert m["delay_shift"] is False
    # the papers train float weights, and so do the presets: export puts each layer on its own
    # exponent's 8-bit grid (neurofed.models.quantize; benchmarks/results/deploy_presets, docs/fidelity.md)
    assert m["quantize"] is False


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_partitions_its_datasets_published_training_set(path):
    # At the paper's own scale (e.g. 100 clients over MNIST's 60,000 images), not the tiny files':
    # labels in the published class counts, the preset's partition section as it is.
    from neurofed.data.image_formats import IMAGE_SETS
    from neurofed.data.partition import partition
    import numpy as np

    cfg = load_config(path, overrides=["data.root=/nonexistent"])
    image_set = IMAGE_SETS[cfg["data"]["name"]]
    train_size, classes = image_set.sizes[0], image_set.num_classes
    labels = np.arange(train_size) % classes
    parts = partition(labels, classes, cfg["partition"], np.random.default_rng(cfg["seed"]))
    sizes = np.array([len(p) for p in parts])
    assert len(sizes) == cfg["partition"]["num_clients"]
    min_size = cfg["partition"]["min_size"]
    if cfg["partition"]["scheme"] in ("dirichlet", "dir_n", "ci"):
        assert sizes.min() >= min(min_size, train_size // (2 * len(sizes)))
    else:
        assert sizes.min() > 0


def _model_and_data(path: Path) -> tuple[str, str]:
    raw = yaml.safe_load(path.read_text())
    return raw["model"]["name"], raw["data"]["name"]


@pytest.mark.parametrize("model,dataset", sorted({_model_and_data(p) for p in PRESETS}))
def test_every_preset_model_builds_at_full_size(model, dataset):
    net = build_model({"name": model, "width": 1.0, "delay_shift": False, "quantize": False},
                      SHAPES[dataset], CLASSES[dataset])
    assert all(b.delay_shift is False for b in net.blocks if hasattr(b, "neuron"))
    assert sum(p.numel() for p in net.parameters()) > 10_000


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_presets_network_passes_the_export_check(path):
    """The network each preset trains (its norm, pools, readout, delays), built as the preset
    says, is one ``neurofed run`` exports: the pipeline's structure check (folds, netx, the
    Lava graph) refuses none. Width only cut where the model has one (shapes, not structure)."""
    from neurofed.pipeline import export_refusal

    cfg = load_config(path, overrides=["data.root=/nonexistent"])
    dataset = cfg["data"]["name"]
    model_cfg = {**cfg["model"], "width": min(cfg["model"]["width"], 0.125)}
    net = build_model(model_cfg, SHAPES[dataset], CLASSES[dataset], cfg["federation"]["logit_scale"])
    assert export_refusal(net) is None, path.stem


# One preset per paper and dataset runs a real round: the paper's model, algorithm, optimizer
# and partition scheme, cut to tiny sizes.
# Three run by default (a few seconds each); the rest are slow (ResNet-18 / VGG9 at 32x32).
FAST = ["fedlec_svhn_cnum2", "sfedca_mnist_dir03", "sfedhifi_fashion_mnist_dir05"]
RUN = FAST + [pytest.param(s, marks=pytest.mark.slow) for s in (
    "fedsnn_cifar10_noniid", "fedsnn_cifar100_iid", "fedlec_cifar10_dir005", "fedlec_cifar100_cnum20",
    "sfedca_fashion_mnist_ci31", "sfedca_cifar10_2shards", "sfedhifi_cifar10_iid", "sfedhifi_cifar100_dir03")]
SMALL = ["federation.rounds=1", "federation.local_epochs=1", "federation.batch_size=4", "data.timesteps=2",
         "partition.num_clients=4", "partition.min_size=1", "data.train_subset=24", "data.test_subset=8",
         "energy.enabled=false"]


@pytest.mark.parametrize("stem", RUN)
def test_preset_trains_one_round_on_tiny_files(stem, roots, tmp_path):
    path = PAPERS / f"{stem}.yaml"
    probe = load_config(path, overrides=["data.root=/nonexistent"])
    algo = probe["algorithm"]["name"]
    extra = list(SMALL)
    if algo == "sfedhifi":
        extra += ["algorithm.widths=[0.0625, 0.125]", "model.width=0.125", "federation.clients_per_round=2",
                  "algorithm.fusion_until=null", "algorithm.rate_samples=8"]
    else:
        extra += ["model.width=0.125", "federation.clients_per_round=2"]
    if algo == "sfedca":
        extra += ["algorithm.candidates=3"]
    if probe["partition"]["scheme"] == "shards":
        extra += ["partition.num_clients=5"]  # 5 x 2 shards cover the 10 classes
    if probe["partition"]["scheme"] == "cnum" and probe["partition"]["classes_per_client"] > 10:
        extra += ["data.train_subset=200"]  # every client gets its 20 of the 100 classes
    cfg = _config(path, roots, extra)
    summary = run(cfg, tmp_path / "run", progress=False, after=False)
    assert summary["rounds"] == 1
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 1 and '"accuracy"' in metrics[0]
    ckpt = tmp_path / "run" / "checkpoint.npz"
    assert ckpt.is_file() and ckpt.stat().st_size > 0


SWEEPS = {"fedsnn_table1": 2 * 2 * 7 * 2 * 3, "fedlec_table1": 15 * 7 * 3, "sfedca_table2": 12 * 5,
          "sfedhifi_table1": 9 * 4, "sfedhifi_table2": 3 * 4, "sfedhifi_table3": 3 * 2}
# Their baselines switch algorithm.name away from sfedhifi, which the presets' fusion_until refuses
# until issue 32 item 8's rule (keys of another algorithm dropped) is merged: see the xfail below.
NEEDS_ALGORITHM_SWITCH = ("sfedhifi_table1", "sfedhifi_table3")


@pytest.mark.parametrize("stem", sorted(SWEEPS))
def test_paper_sweeps_expand(stem):
    from neurofed.sweep import load_sweep

    sweep = load_sweep(PAPERS / "sweeps" / f"{stem}.yaml")
    assert math.prod(len(d.values) for d in sweep.dims) * len(sweep.seeds) == SWEEPS[stem]


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(set(SWEEPS) - set(NEEDS_ALGORITHM_SWITCH)))
def test_paper_sweeps_points_validate(stem):
    from neurofed.sweep import load_sweep, point_configs

    assert len(point_configs(load_sweep(PAPERS / "sweeps" / f"{stem}.yaml"))) == SWEEPS[stem]


@pytest.mark.parametrize("stem", NEEDS_ALGORITHM_SWITCH)
def test_paper_sweeps_switching_algorithm_validate(stem):
    from neurofed.sweep import load_sweep, point_configs

    assert len(point_configs(load_sweep(PAPERS / "sweeps" / f"{stem}.yaml"))) == SWEEPS[stem]


def _sweep_points(stem: str) -> list[dict]:
    """Every point's merged overrides (set + point values), without validating the config."""
    from neurofed.sweep import load_sweep

    from neurofed.config import deep_merge

    path = PAPERS / "sweeps" / f"{stem}.yaml"
    sweep = load_sweep(path)
    base = yaml.safe_load((path.parent / yaml.safe_load(path.read_text())["base"]).read_text())
    return [deep_merge(base, sweep.config_data(p, sweep.seeds[0])) for p in sweep.points]


def _split(partition: dict) -> tuple:
    """A partition's identity as the presets name it (scheme and its own parameter)."""
    own = {"dirichlet": "alpha", "dir_n": "alpha", "ci": "ratio", "shards": "shards_per_client",
           "cnum": "classes_per_client", "iid": None}[partition["scheme"]]
    value = partition.get(own) if own else None
    return partition["scheme"], tuple(value) if isinstance(value, list) else value


# Each paper's main table is one sweep (issue 32 item 10): its points cover every dataset and split
# the paper's presets set, with the preset's own settings for that column.
MAIN_TABLES = {"fedsnn": "fedsnn_table1", "fedlec": "fedlec_table1", "sfedca": "sfedca_table2",
               "sfedhifi": "sfedhifi_table1"}
COLUMN_KEYS = {"fedsnn": [], "fedlec": [], "sfedca": [("model", "name"), ("federation", "optimizer"),
                                                      ("federation", "lr"), ("federation", "local_epochs"),
                                                      ("federation", "target_accuracy")],
               "sfedhifi": [("model", "name"), ("federation", "rounds"), ("federation", "lr"),
                            ("federation", "lr_milestones"), ("algorithm", "orth_lambda"),
                            ("algorithm", "fusion_until")]}


@pytest.mark.parametrize("paper", sorted(MAIN_TABLES))
def test_each_main_table_is_one_sweep_over_its_presets(paper):
    points = _sweep_points(MAIN_TABLES[paper])
    for path in (p for p in PRESETS if p.stem.startswith(paper + "_")):
        preset = yaml.safe_load(path.read_text())
        column = [pt for pt in points if pt["data"]["name"] == preset["data"]["name"]
                  and _split(pt["partition"]) == _split(preset["partition"])]
        assert column, f"{MAIN_TABLES[paper]} has no point for {path.stem}"
        for section, key in COLUMN_KEYS[paper]:
            assert {repr(pt[section][key]) for pt in column} == {repr(preset[section][key])}, (path.stem, key)


def test_sfedca_rounds_to_target_uses_table3s_target_per_column():
    # SFedCA Table 3's header, per dataset: Dir(0.3), 2Shards, Dir_100(0.3), CI(3:1; 0.3).
    table3 = {"mnist": (0.90, 0.90, 0.95, 0.90), "fashion_mnist": (0.65, 0.60, 0.65, 0.60),
              "cifar10": (0.50, 0.40, 0.60, 0.50)}
    order = ("dirichlet", "shards", "dir_n", "ci")
    for pt in _sweep_points("sfedca_table2"):
        want = table3[pt["data"]["name"]][order.index(pt["partition"]["scheme"])]
        assert pt["federation"]["target_accuracy"] == pytest.approx(want)


def test_fedsnn_presets_use_the_authors_weight_decay():
    for path in PAPERS.glob("fedsnn_*.yaml"):  # utils/options.py: --weight_decay default 1e-4
        assert yaml.safe_load(path.read_text())["federation"]["weight_decay"] == pytest.approx(1e-4), path.stem


def test_ann_rows_have_their_own_recipe():
    """Table I's ANN columns train with the paper's ANN optimizer, not the SNN's (FedSNN Sec. IV);
    SFedCA's Table 2 has an ANN FedAvg row and SFedHIFI's Table 3 an ANN row."""
    fedsnn = _sweep_points("fedsnn_table1")
    ann = [pt for pt in fedsnn if pt["model"].get("kind") == "ann"]
    snn = [pt for pt in fedsnn if pt["model"].get("kind", "snn") == "snn"]
    assert len(ann) == len(snn) > 0
    recipe = lambda pt: (pt["federation"]["optimizer"], pt["federation"]["lr"], pt["federation"]["weight_decay"])  # noqa: E731
    assert {recipe(pt) for pt in ann} == {("sgd", 0.001, 5e-4)}
    # the SNN's: the presets' (Adam, neurofed's variant of SGD lr 0.1 for a net without BNTT, issue 31)
    preset = yaml.safe_load((PAPERS / "fedsnn_cifar10_noniid.yaml").read_text())["federation"]
    assert {recipe(pt) for pt in snn} == {(preset["optimizer"], preset["lr"], preset["weight_decay"])}
    sfedca = {(pt["algorithm"]["name"], pt["model"].get("kind", "snn")) for pt in _sweep_points("sfedca_table2")}
    assert ("fedavg", "ann") in sfedca and ("fedavg", "snn") in sfedca
    table3 = {(pt["algorithm"]["name"], pt["model"].get("kind", "snn")) for pt in _sweep_points("sfedhifi_table3")}
    assert table3 == {("hetero_fedavg", "ann"), ("sfedhifi", "snn")}


# --------------------------------------------------------------------------- learning (issue 31)
# Each paper's cheapest preset, on its STAND-IN (neurofed.data.standins), cut further than the
# benchmark (benchmarks/preset_learning.py): same model family, T, encoding, neuron, readout,
# surrogate, init, optimizer and algorithm; fewer clients, rounds, samples and a narrower net.
LEARNS = {
    "fedlec_cifar10_iid": ["model.width=0.125", "partition.num_clients=2", "federation.clients_per_round=2",
                           "federation.local_epochs=3", "federation.rounds=5"],
    "sfedca_mnist_dir03": ["partition.num_clients=4", "federation.clients_per_round=2", "algorithm.candidates=3",
                           "federation.local_epochs=3", "federation.rounds=4", "data.train_subset=null"],
    "sfedhifi_fashion_mnist_iid": ["partition.num_clients=4", "federation.clients_per_round=4",
                                   "algorithm.widths=[0.5, 1.0]", "algorithm.fusion_until=null",
                                   "federation.local_epochs=2", "federation.rounds=3"],
    # 3 x 6: at 2 x 4 it reached 17 % on an AMD EPYC (23 % at 3 x 5) where it passed on an Intel Xeon;
    # lr 1e-3, the narrowed width's (preset_learning's width_lr): the preset's 3e-4 is for width 1
    "fedsnn_cifar10_iid": ["model.width=0.125", "partition.num_clients=2", "federation.clients_per_round=2",
                           "federation.local_epochs=3", "federation.rounds=6", "federation.lr=0.001"],
}


def _standin_run(stem: str, extra: list[str], tmp_path) -> tuple[dict, list[dict]]:
    """The run's summary and its rounds' metrics."""
    from neurofed.data.standins import standin_name

    path = PAPERS / f"{stem}.yaml"
    dataset = load_config(path, overrides=["data.root=/nonexistent"])["data"]["name"]
    cfg = load_config(path, overrides=[f"data.name={standin_name(dataset)}", "data.train_subset=400",
                                       "data.test_subset=200", "energy.enabled=false", "export=false",
                                       "federation.target_accuracy=null", *extra])
    summary = run(cfg, tmp_path / "run", progress=False, after=False)
    return summary, [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


SLOW_LEARNS = ("fedsnn_cifar10_iid", "sfedhifi_fashion_mnist_iid")  # ~1.5 min each on 2 cores: CI runs them (.ci/run)


@pytest.mark.parametrize("stem", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_LEARNS else s
                                  for s in sorted(LEARNS)])
def test_each_papers_smallest_preset_learns_on_its_standin(stem, tmp_path):
    summary, history = _standin_run(stem, LEARNS[stem], tmp_path)
    accuracy = [h["accuracy"] for h in history]
    chance = 0.1  # every stand-in here has 10 classes
    assert max(accuracy) >= 2 * chance, accuracy  # far above chance ...
    assert accuracy[-1] > accuracy[0] and history[-1]["loss"] < history[0]["loss"], history  # ... and rising
    assert summary["health"]["ok"] is True, summary["health"]


def test_a_silent_preset_is_reported(tmp_path):
    # the same cheapest FedLEC run with SLAYER's own initialization at a high threshold: silent
    summary, _ = _standin_run("fedlec_cifar10_iid", [*LEARNS["fedlec_cifar10_iid"], "model.init=slayer",
                                                     "model.threshold=20", "federation.rounds=1"], tmp_path)
    health = summary["health"]
    assert health["ok"] is False and health["silent_at_start"], health


def _benchmark_flags(preset_learning, **flags):
    """preset_learning's command line with no flag given but ``flags``."""
    import argparse

    return argparse.Namespace(**{**{k: None for k in preset_learning.SCALE_KEYS}, "root": None, "set": None,
                                 "threads": 1, **flags})


def test_the_learning_benchmarks_reduced_scale_is_a_valid_config_for_every_preset(monkeypatch):
    """benchmarks/preset_learning.py's SCALE patterns resolve, for every preset, to overrides
    the config validates (SFedCA's candidates between the clients per round and the clients),
    and every change of scale it makes is named in the row's 'reduced'."""
    monkeypatch.syspath_prepend(str(PAPERS.parents[1] / "benchmarks"))  # undone after the test
    import preset_learning

    flags = _benchmark_flags(preset_learning)
    for preset in PRESETS:
        cfg = load_config(preset, overrides=["data.root=/nonexistent"])
        scale = preset_learning.scale_for(preset.stem, flags)
        over, reduced = preset_learning.overrides(cfg, scale)
        reduced_cfg = load_config(preset, overrides=over)  # raises ConfigError when invalid
        fed = reduced_cfg["federation"]
        assert reduced_cfg["data"]["name"].startswith("standin_"), preset.stem
        assert fed["rounds"] == scale.rounds and reduced["rounds"].endswith(str(scale.rounds)), preset.stem
        if fed["clients_per_round"] != cfg["federation"]["clients_per_round"]:
            assert "per_round" in reduced, preset.stem
        if fed["lr"] != cfg["federation"]["lr"]:
            assert reduced.get("lr") == f"{cfg['federation']['lr']} -> {fed['lr']}", preset.stem


def test_the_learning_benchmark_sets_the_alexnets_adam_lr_only_where_it_narrows_the_net(monkeypatch):
    """The AlexNet presets' Adam lr is for their own width: preset_learning sets the lr its
    net learns with at the narrower width only when it narrows it, never for the SGD preset,
    and a --set federation.lr of the caller's wins."""
    monkeypatch.syspath_prepend(str(PAPERS.parents[1] / "benchmarks"))
    import preset_learning

    def lr_of(stem, **flags):
        args = _benchmark_flags(preset_learning, **flags)
        cfg = load_config(PAPERS / f"{stem}.yaml", overrides=["data.root=/nonexistent"])
        over, reduced = preset_learning.overrides(cfg, preset_learning.scale_for(stem, args))
        return load_config(PAPERS / f"{stem}.yaml", overrides=over)["federation"]["lr"], cfg["federation"]["lr"], reduced

    narrowed, own, reduced = lr_of("sfedca_cifar10_dir03")
    assert narrowed != own and reduced["width"].endswith("0.25") and "lr" in reduced
    assert lr_of("sfedca_cifar10_dir03", width=1.0)[0] == own  # not narrowed: the preset's lr
    assert lr_of("sfedca_cifar10_dir03", set=["federation.lr=0.002"])[0] == 0.002
    for flags, label in [({}, "adam lr 0.001"), ({"set": ["federation.lr=0.002"]}, "adam lr 0.002")]:
        args = _benchmark_flags(preset_learning, **flags)  # the row names the lr it ran with
        cfg = load_config(PAPERS / "sfedca_cifar10_dir03.yaml", overrides=["data.root=/nonexistent"])
        over, _ = preset_learning.overrides(cfg, preset_learning.scale_for("sfedca_cifar10_dir03", args))
        assert preset_learning.optimizer_label(PAPERS / "sfedca_cifar10_dir03.yaml", over) == label
    sgd, sgd_own, sgd_reduced = lr_of("sfedca_cifar10_2shards")
    assert sgd == sgd_own and "lr" not in sgd_reduced
