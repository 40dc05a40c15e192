"""neurofed as a package: the wheel and the sdist carry what the code reads at run time
(the kernels' C++, the hardware profiles, the presets and examples), found through
``neurofed.resources``; presets by name; one version. scripts/check_installed.sh (CI)
installs the wheel into a fresh environment and runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import neurofed
from neurofed.cli import main
from neurofed.presets import describe, presets
from neurofed.resources import examples_dir, kernel_sources, profiles_dir

ROOT = Path(__file__).resolve().parents[1]
BUILT_FROM = ("pyproject.toml", "README.md", "MANIFEST.in", "CHANGELOG.md", "neurofed", "hw_profiles", "examples",
              "notebooks")


def _shipped() -> set[str]:
    """What must be inside the package: paths as an installed neurofed holds them."""
    def rel(folder: Path, under: str) -> set[str]:
        return {f"{under}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*") if p.is_file()}

    return (rel(ROOT / "neurofed" / "kernels" / "csrc", "neurofed/kernels/csrc")
            | rel(ROOT / "hw_profiles", "neurofed/_data/hw_profiles") | rel(ROOT / "examples", "neurofed/_data/examples"))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of what the package is built from (pip builds in the source folder)."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILT_FROM:
        (shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
         if (ROOT / name).is_dir() else shutil.copy2(ROOT / name, src / name))
    return src


def test_the_wheel_holds_the_kernel_sources_profiles_and_presets(source, tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("neurofed-*.whl")
    assert wheel.name.startswith(f"neurofed-{neurofed.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = _shipped()
    assert {"neurofed/kernels/csrc/module.cpp", "neurofed/_data/hw_profiles/loihi2.yaml",
            "neurofed/_data/examples/papers/sfedca_mnist_dir03.yaml",
            "neurofed/_data/examples/papers/sweeps/fedlec_table1.yaml"} <= wanted
    assert not wanted - names, sorted(wanted - names)[:5]


def test_the_sdist_holds_them_too(source, tmp_path):
    from setuptools import build_meta

    here = os.getcwd()
    os.chdir(source)
    try:
        sdist = tmp_path / build_meta.build_sdist(str(tmp_path))
    finally:
        os.chdir(here)
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert not _shipped() - names, sorted(_shipped() - names)[:5]
    assert {"hw_profiles/loihi2.yaml", "examples/digits_fedavg.yaml", "CHANGELOG.md"} <= names


def test_resources_are_the_repositorys_files():
    assert {p.name for p in profiles_dir().glob("*.yaml")} == {p.name for p in (ROOT / "hw_profiles").glob("*.yaml")}
    assert (examples_dir() / "papers" / "fedlec_cifar10_dir01.yaml").read_text() == \
        (ROOT / "examples" / "papers" / "fedlec_cifar10_dir01.yaml").read_text()
    assert (kernel_sources() / "module.cpp").is_file()


def test_presets_list_every_paper_preset_with_paper_table_dataset_and_split(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out.splitlines()
    papers = sorted(p.stem for p in (ROOT / "examples" / "papers").glob("*.yaml"))
    assert len(out) == 1 + len(presets()) and set(papers) <= set(presets())
    row = next(line for line in out if line.startswith("fedlec_cifar10_dir01 "))
    assert "FedLEC (Yu et al. 2025)" in row and "Table 1" in row and "cifar10" in row and "dirichlet (alpha 0.1)" in row
    assert describe(presets()["sfedca_mnist_2shards"])["dataset"] == "mnist"


def test_presets_copy_writes_one_out_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["presets", "copy", "digits_fedavg", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "digits_fedavg.yaml").read_text() == (ROOT / "examples" / "digits_fedavg.yaml").read_text()
    assert main(["presets", "copy", "digits_fedavg", str(tmp_path / "mine")]) == 2
    assert "exists" in capsys.readouterr().err


def test_run_takes_a_preset_name_and_a_bad_name_says_how_to_list_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no examples/ here: the name alone finds the preset
    assert main(["partition", "digits_fedavg", "--png", "p.png"]) == 0 and (tmp_path / "p.png").is_file()
    capsys.readouterr()
    assert main(["run", "digits_fedavg_typo"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "digits_fedavg_typo" in line and "neurofed presets" in line


def test_version_is_defined_once_and_reported_as_it(capsys):
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert neurofed.__version__ == version  # read from pyproject.toml, its one definition
    assert "__version__ =" in (ROOT / "neurofed" / "__init__.py").read_text() and \
        version not in (ROOT / "neurofed" / "__init__.py").read_text()
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith(f"neurofed {version}")


def test_energy_takes_a_preset_name_for_its_training_free_numbers(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["energy", "sfedca_mnist_dir03"]) == 0
    out = capsys.readouterr().out
    assert "sfedca_mnist on mnist" in out and "13.478" in out  # SFedCA Table 4's 13.478 uJ on 45 nm FP32
