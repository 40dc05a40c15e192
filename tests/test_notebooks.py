"""The notebooks run from top to bottom (executed with nbclient, so they never rot), and
are stored executed, with their figures, for a reader browsing the repository; running
them here never rewrites the stored files.

The quickstart takes about a minute on a busy 2-core machine, the energy notebook about
two, so both stay in the default (fast) suite."""

from __future__ import annotations

from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, tmp_path, monkeypatch, timeout: int = 900):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NEUROFED_QUICKSTART_OUT", str(tmp_path / "run"))
    monkeypatch.setenv("NEUROFED_ENERGY_OUT", str(tmp_path / "runs"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    stored = (NOTEBOOKS / name).read_bytes()
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    assert (NOTEBOOKS / name).read_bytes() == stored  # executed in memory; the stored file is as it was
    return nb


def _text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def _figures(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_notebooks_are_stored_executed_with_their_figures():
    import nbformat

    for name, figures in (("quickstart.ipynb", 4), ("energy.ipynb", 2)):
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), f"{name}: a cell was not executed"
        assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", [])), name
        assert _figures(nb) >= figures, f"{name}: {_figures(nb)} figures stored"


def test_quickstart_runs_end_to_end(tmp_path, monkeypatch):
    nb = execute("quickstart.ipynb", tmp_path, monkeypatch)
    run = tmp_path / "run"
    for f in ("model.net", "lava.json", "energy.json", "plots/energy_layers.png", "partition.png"):
        assert (run / f).is_file(), f
    text = _text(nb)
    assert "spike for spike: True" in text
    assert "cmos45_int" in text and "ANN/SNN" in text


def test_energy_notebook_prices_each_run_per_layer_and_profile(tmp_path, monkeypatch):
    nb = execute("energy.ipynb", tmp_path, monkeypatch)
    for preset in ("digits_fedavg", "digits_events_fedlec", "sfedca_mnist_dir03"):
        assert (tmp_path / "runs" / preset / "energy.json").is_file(), preset
    text = _text(nb)
    for label in ("digits", "events", "SFedCA MNIST net (stand-in)"):
        assert label in text
    for profile in ("cmos45_int", "cmos45_fp32", "loihi", "truenorth"):
        assert profile in text
    assert "counts only (no published per-operation energies): loihi2" in text
