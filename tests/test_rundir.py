"""Run files hold data only (neurofed.rundir): nothing read from a run directory
executes code, damaged or foreign files give one line naming the file (exit 2), the
best and the last global model are kept, and configs that would silently run
something else are refused."""

import json
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_overrides
from neurofed.cli import main
from neurofed.config import ConfigError, load_config
from neurofed.rundir import (CHECKPOINT, MODEL_BEST, MODEL_LAST, RunFileError, convert_legacy, load_state,
                               save_state)


class Payload:
    """Unpickling this touches ``path``: proof that a loader executed code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-round run (the model files of best and last round)."""
    from neurofed.pipeline import run

    out = tmp_path_factory.mktemp("run") / "r"
    run(load_config(None, tiny_overrides(**{"federation.rounds": 3})), out, progress=False, after=False)
    return out


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def resume_argv(run_dir):
    return ["run", run_dir / "config.yaml", "--out", run_dir, "--resume", "--quiet"]


# --------------------------------------------------------------------------- the format


def test_states_round_trip_as_data(tmp_path):
    state = {"round": 3, "clients": {0: {"c_i": np.arange(3, dtype=np.float32)}, 7: {}},
             "pair": (1, "a", None), "scalar": np.float32(2.5), "nan": float("nan"), "flag": True,
             "nested": [{"$odd": 1}, np.zeros((2, 2), np.int64)]}
    save_state(tmp_path / "s.npz", state, "checkpoint")
    back = load_state(tmp_path / "s.npz", "checkpoint")
    assert set(back["clients"]) == {0, 7} and back["clients"][0]["c_i"].dtype == np.float32
    assert np.array_equal(back["clients"][0]["c_i"], [0, 1, 2]) and back["clients"][7] == {}
    assert back["pair"] == (1, "a", None) and back["scalar"] == np.float32(2.5)
    assert type(back["scalar"]) is np.float32 and math_isnan(back["nan"]) and back["flag"] is True
    assert back["nested"][0] == {"$odd": 1} and back["nested"][1].dtype == np.int64
    with pytest.raises(TypeError, match="not data"):
        save_state(tmp_path / "x.npz", {"f": print}, "checkpoint")


def math_isnan(x):
    return x != x


def test_crafted_pickles_are_never_executed(run_dir, tmp_path, capsys):
    marker = tmp_path / "executed"
    evil = pickle.dumps({"round": 1, "server": {"params": Payload(marker)}})
    # 1) a bare pickle in place of every run file a command reads
    for name in (CHECKPOINT, MODEL_LAST, MODEL_BEST):
        (run_dir / name).write_bytes(evil)
    # 2) an .npz with a proper-looking header whose member is a pickled object array
    inner = tmp_path / "inner.npz"
    save_state(inner, {"round": 1, "params": np.zeros(3, np.float32)}, "model")
    with zipfile.ZipFile(inner) as zf:
        members = {n[:-4]: np.load(zf.open(n)) for n in zf.namelist() if not n.startswith("a0")}
    members["a0"] = np.array([Payload(marker)], dtype=object)
    np.savez(tmp_path / "objects.npz", **members)  # np.savez pickles the object array
    with pytest.raises(RunFileError, match="pickled"):
        load_state(tmp_path / "objects.npz", "model")
    # every reader refuses with one line and exit 2; the payload never runs
    assert cli(capsys, "export", run_dir) == (2, [f"neurofed: error: {run_dir / MODEL_LAST}: not a readable neurofed "
                                                   f"model file (truncated or not an .npz archive: BadZipFile)"])
    assert cli(capsys, "energy", run_dir, "--round", "best")[0] == 2
    code, err = cli(capsys, *resume_argv(run_dir))
    assert code == 2 and len(err) == 1 and str(run_dir / CHECKPOINT) in err[0]
    shutil.copy(tmp_path / "objects.npz", run_dir / MODEL_LAST)
    code, err = cli(capsys, "export", run_dir)
    assert code == 2 and len(err) == 1 and "pickled (object) data, refused" in err[0]
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "foreign", "bytes", "tampered", "wrong kind"])
def test_damaged_files_give_one_line_and_exit_2(run_dir, capsys, damage):
    ckpt, model = run_dir / CHECKPOINT, run_dir / MODEL_LAST
    if damage == "truncated":
        for p in (ckpt, model):
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        expect = "truncated or not an .npz archive"
    elif damage == "foreign":
        for p in (ckpt, model):
            with open(p, "wb") as fh:
                np.savez(fh, weights=np.ones(4))
        expect = "foreign .npz file (no neurofed header)"
    elif damage == "bytes":
        for p in (ckpt, model):
            p.write_bytes(b"\x89HDF\r\n" + bytes(range(256)) * 4)
        expect = "truncated or not an .npz archive"
    elif damage == "tampered":  # a value changed and the archive rewritten consistently, digest left as it was
        for p, kind in ((ckpt, "checkpoint"), (model, "model")):
            with zipfile.ZipFile(p) as zf:
                members = {n[:-4]: np.load(zf.open(n)) for n in zf.namelist()}
            members["a0"] = members["a0"] + 1
            with open(p, "wb") as fh:
                np.savez(fh, **members)
        expect = "checksum mismatch"
    else:
        shutil.copy(ckpt, model)
        shutil.copy(run_dir / MODEL_BEST, ckpt)
        expect = "holds a 'checkpoint', expected a 'model'"
    code, err = cli(capsys, "export", run_dir)
    assert code == 2 and len(err) == 1 and str(model) in err[0] and expect in err[0], err
    code, err = cli(capsys, *resume_argv(run_dir))
    assert code == 2 and len(err) == 1 and str(ckpt) in err[0], err


def test_bytes_flipped_in_place_are_caught(run_dir):
    raw = bytearray((run_dir / MODEL_LAST).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (run_dir / MODEL_LAST).write_bytes(bytes(raw))
    with pytest.raises(RunFileError, match=r"model_last\.npz: .*(CRC|checksum|truncated)"):
        load_state(run_dir / MODEL_LAST, "model")


def test_an_old_pickle_run_is_named_not_loaded(run_dir, tmp_path, capsys):
    marker = tmp_path / "executed"
    for name in (CHECKPOINT, MODEL_LAST, MODEL_BEST):
        (run_dir / name).unlink()
    (run_dir / "checkpoint.pkl").write_bytes(pickle.dumps({"round": 1, "x": Payload(marker)}))
    for argv in (["export", run_dir], ["lava", run_dir], ["energy", run_dir], resume_argv(run_dir)):
        code, err = cli(capsys, *argv)
        assert code == 2 and len(err) == 1, (argv, err)
        assert "checkpoint.pkl: pickle checkpoint from an older neurofed, not loaded" in err[0]
        assert "re-run" in err[0] and "convert-legacy" in err[0]
    assert not marker.exists()
    # a fresh run refuses to write over it either
    code, err = cli(capsys, "run", run_dir / "config.yaml", "--out", run_dir, "--quiet")
    assert code == 2 and "checkpoint.pkl" in err[0]


def test_legacy_conversion_is_explicit(finished, tmp_path):
    """The converter is the one place that unpickles, on request, for trusted files."""
    out = tmp_path / "old"
    shutil.copytree(finished, out)
    state = load_state(out / CHECKPOINT, "checkpoint")
    state.pop("best")
    for name in (CHECKPOINT, MODEL_LAST, MODEL_BEST):
        (out / name).unlink()
    (out / "checkpoint.pkl").write_bytes(pickle.dumps(state))
    from neurofed.rundir import main as rundir_main

    assert rundir_main(["convert-legacy", str(out)]) == 2  # refused without --trusted
    assert not (out / CHECKPOINT).exists()
    assert rundir_main(["convert-legacy", str(out), "--trusted"]) == 0
    back = load_state(out / CHECKPOINT, "checkpoint")
    assert np.array_equal(back["server"]["params"], state["server"]["params"])
    assert load_state(out / MODEL_LAST, "model")["round"] == 3
    convert_legacy  # the function the command runs


# --------------------------------------------------------------------------- best and last


def test_best_and_last_round_are_kept(run_dir, capsys):
    import h5py

    summary = json.loads((run_dir / "summary.json").read_text())
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accs = [l["accuracy"] for l in lines]
    best_round = lines[int(np.argmax(accs))]["round"]
    assert summary["best_round"] == best_round
    best, last = load_state(run_dir / MODEL_BEST, "model"), load_state(run_dir / MODEL_LAST, "model")
    assert (best["round"], best["accuracy"]) == (best_round, max(accs))
    assert (last["round"], last["accuracy"]) == (3, accs[-1])
    ckpt = load_state(run_dir / CHECKPOINT, "checkpoint")
    assert np.array_equal(last["params"], ckpt["server"]["params"])
    assert np.array_equal(best["params"], ckpt["best"]["params"])

    for sel, rnd in (("best", best_round), ("last", 3), (str(best_round), best_round)):
        code, _ = cli(capsys, "export", run_dir, "--round", sel)
        assert code == 0
        with h5py.File(run_dir / "model.net") as h:
            assert json.loads(h.attrs["round"]) == rnd
    missing = next(r for r in (1, 2, 3) if r not in (best_round, 3))
    code, err = cli(capsys, "export", run_dir, "--round", missing)
    assert code == 2 and err == [f"neurofed: error: --round: got {missing}; {run_dir} keeps the global models of "
                                 f"rounds {', '.join(map(str, sorted({best_round, 3})))} (best and last)"]


def test_lava_and_energy_take_the_round(run_dir, capsys):
    import h5py

    best = json.loads((run_dir / "summary.json").read_text())["best_round"]
    assert cli(capsys, "lava", run_dir, "--samples", 2, "--quiet", "--round", "best")[0] == 0
    assert json.loads((run_dir / "lava.json").read_text())["round"] == best
    with h5py.File(run_dir / "model.net") as h:  # exported for that round
        assert json.loads(h.attrs["round"]) == best
    assert cli(capsys, "energy", run_dir, "--round", "best", "--samples", 4)[0] == 0
    assert json.loads((run_dir / "energy.json").read_text())["run"]["round"] == best
    if best != 3:  # lava.json of another round is not priced as this one
        code, err = cli(capsys, "energy", run_dir, "--round", "last", "--spikes", "lava")
        assert code == 2 and len(err) == 1 and f"is of round {best}, not 3" in err[0]


def test_the_model_of_the_round_asked_for_is_the_one_evaluated(run_dir):
    from neurofed.deploy.export import load_global_model
    from neurofed.seeds import seed_for
    from neurofed.training.local import evaluate
    import torch

    for sel in ("best", "last"):
        rm = load_global_model(run_dir, model_round=sel)
        kept = load_state(run_dir / (MODEL_BEST if sel == "best" else MODEL_LAST), "model")
        ev = evaluate(rm.model, torch.as_tensor(np.asarray(rm.dataset.x_test, dtype=np.float32)),
                      torch.as_tensor(rm.dataset.y_test), rm.cfg, seed_for(rm.cfg["seed"], "eval"))
        assert rm.round == kept["round"] and ev["accuracy"] == pytest.approx(kept["accuracy"], abs=1e-9)


def test_a_kill_between_files_loses_no_best_model(tmp_path):
    """model_best.npz is restored from the checkpoint at resume, so a kill after a
    best-round model file was written (but before its checkpoint) changes nothing."""
    from neurofed.pipeline import run

    cfg = load_config(None, tiny_overrides(**{"federation.rounds": 3, "federation.privacy_noise": "seeded_not_private"}))
    short = json.loads(json.dumps(cfg))
    short["federation"]["rounds"] = 2
    run(short, tmp_path / "cut", progress=False, after=False)
    ckpt = load_state(tmp_path / "cut" / CHECKPOINT, "checkpoint")
    save_state(tmp_path / "cut" / MODEL_BEST, {**ckpt["best"], "round": 99, "accuracy": 1.0}, "model")  # stale
    summary = run(cfg, tmp_path / "cut", resume=True, progress=False, after=False)
    best = load_state(tmp_path / "cut" / MODEL_BEST, "model")
    assert best["round"] == summary["best_round"] and best["accuracy"] == summary["best_accuracy"]


# --------------------------------------------------------------------------- configs


def test_configs_that_would_run_something_else_are_refused(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here yet\n")
    with pytest.raises(ConfigError, match=r"empty\.yaml' is empty; it would run every default"):
        load_config(empty)
    twice = tmp_path / "twice.yaml"
    twice.write_text("federation:\n  lr: 0.1\n  rounds: 3\n  lr: 0.001\n")
    with pytest.raises(ConfigError, match=r"key 'lr' given twice \(line 4\)"):
        load_config(twice)
    section = tmp_path / "section.yaml"
    section.write_text("algorithm: fedprox\nfederation:\n")
    with pytest.raises(ConfigError) as exc:
        load_config(section)
    assert str(exc.value).splitlines() == [
        "federation: got None; expected a mapping of keys (an empty section runs its defaults: remove it instead)",
        "algorithm: got 'fedprox'; expected a mapping of keys (an empty section runs its defaults: remove it instead)"]


def test_a_sweep_file_with_a_key_given_twice_is_refused(tmp_path):
    from neurofed.sweep.grid import load_sweep

    base = Path(__file__).resolve().parents[1] / "examples" / "digits_fedavg.yaml"
    sweep = tmp_path / "dup.yaml"
    sweep.write_text(f"name: dup\nbase: {base}\ngrid:\n  federation.lr: [0.1]\n  federation.lr: [0.2]\n")
    with pytest.raises(ConfigError, match=r"key 'federation\.lr' given twice \(line 5\)"):
        load_sweep(sweep)


def test_clipping_without_noise_is_refused():
    with pytest.raises(ConfigError, match=r"^federation\.ldp_clip: got 1\.0; clipping applies only with "
                                          r"federation\.ldp_laplace > 0"):
        load_config(None, ["federation.ldp_clip=1.0"])


def test_cli_refuses_an_empty_config_with_exit_2(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("")
    code, err = cli(capsys, "run", tmp_path / "c.yaml", "--out", tmp_path / "o")
    assert code == 2 and len(err) == 1 and "is empty" in err[0]
    assert not (tmp_path / "o").exists()


def test_resume_without_a_checkpoint_is_announced(tmp_path, capsys):
    from neurofed.fl.resume import prepare_run_dir

    cfg = load_config(None, tiny_overrides())
    assert prepare_run_dir(tmp_path / "new", cfg, resume=True) is None
    assert "holds no checkpoint.npz; starting from round 1" in capsys.readouterr().err


def test_a_sigterm_while_a_round_is_written_waits_for_the_round_then_stops_the_run(tmp_path):
    # A SIGTERM between a round's metrics line and its checkpoint left a folder --resume refused.
    import signal
    import subprocess
    import sys

    child = ("import os, signal, sys; from pathlib import Path; from neurofed.fl.resume import signals_held\n"
             "out = Path(sys.argv[1])\n"
             "with signals_held():\n"
             "    (out / 'metrics.jsonl').write_text('{}\\n')\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n"
             "    (out / 'checkpoint.npz').write_text('')\n"
             "(out / 'after').write_text('')\n")
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path)], timeout=120)
    assert done.returncode == -signal.SIGTERM  # it still stops as SIGTERM stops it
    assert (tmp_path / "checkpoint.npz").exists() and not (tmp_path / "after").exists()
