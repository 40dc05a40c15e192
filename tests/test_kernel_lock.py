"""The fast kernels' build cache under interruption (issue 36): a killed build leaves
nothing that holds up, or misleads, a later process.

Every test points ``NEUROFED_EXT_DIR`` into its tmp_path (the shared cache is only read,
to copy an already built variant) and loads the kernels in a fresh interpreter, as a
second ``neurofed run`` would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neurofed.kernels import variants

REPO = Path(__file__).resolve().parents[1]
LOAD = """
import sys
from neurofed import kernels
from neurofed.kernels import variants
if sys.argv[1] == "configure":
    print(kernels.configure(sys.argv[2] == "true" or sys.argv[2]))
elif sys.argv[1] == "clientapp":  # a Flower ClientApp's set-up, fast_kernels: auto
    from neurofed.config import load_config
    from neurofed.flower.client import Node
    Node(load_config("examples/digits_fedavg.yaml", []))
else:
    print("LOADED", variants.build_variant(sys.argv[1]).__file__)
"""


def load(ext_dir: Path, *args: str, timeout: float, **env) -> subprocess.CompletedProcess:
    """A fresh interpreter loading the kernels from the cache ``ext_dir``."""
    environ = {**os.environ, "NEUROFED_EXT_DIR": str(ext_dir), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, "-c", LOAD, *args], env=environ, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_stale_lock_left_by_a_killed_build_does_not_hold_up_the_next_load(tmp_path):
    """A variant already built, in a folder where a SIGKILLed process left every lock it
    takes (torch's ``lock`` baton, as 919f94d's builds left it, our ``build.lock`` naming
    a dead pid, a half-made ``build-<pid>`` folder): the next process loads it at once."""
    name = variants.default_variant()
    built = Path(variants.build_variant(name).__file__).parent  # the shared cache (built once for the suite)
    folder = tmp_path / "ext" / built.name
    shutil.copytree(built, folder, ignore=shutil.ignore_patterns("lock", "build.lock", "build-*"))
    pid = dead_pid()
    (folder / "lock").touch()
    (folder / "build.lock").write_text(f"pid {pid} on {os.uname().nodename}\n")
    (folder / f"build-{pid}").mkdir()
    (folder / f"build-{pid}" / "lock").touch()
    t0 = time.monotonic()
    try:
        res = load(tmp_path / "ext", name, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the kernel load waited on the stale lock for 120 s")
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"LOADED {folder}" in res.stdout
    assert "waiting" not in res.stderr and "compiling" not in res.stderr  # no lock taken, nothing rebuilt
    assert time.monotonic() - t0 < 60


def test_a_live_build_is_waited_for_once_aloud_then_given_up_with_the_file_to_remove(tmp_path):
    """While another process holds a variant's build lock, a load says once whom it waits
    for and gives up after NEUROFED_KERNEL_BUILD_WAIT, naming the lock file; the run
    then goes on with stock SLAYER (``auto``) or stops with one line (``true``, and
    ``auto`` in a Flower app)."""
    name = variants.default_variant()
    lock_file = tmp_path / "ext" / variants._module_name(name) / "build.lock"
    lock_file.parent.mkdir(parents=True)
    with variants.BuildLock(lock_file):  # this process plays the builder
        res = load(tmp_path / "ext", name, timeout=120, NEUROFED_KERNEL_BUILD_WAIT="2")
        assert res.returncode != 0 and "LOADED" not in res.stdout
        waiting = f"neurofed.kernels: waiting for the kernel build by pid {os.getpid()} on "
        assert res.stderr.count(waiting) == 1, res.stderr[-2000:]
        assert f"BuildLockTimeout: gave up after 2 s waiting for the kernel build by pid {os.getpid()}" in res.stderr
        assert f"remove {lock_file}" in res.stderr
        auto = load(tmp_path / "ext", "configure", "auto", timeout=120, NEUROFED_KERNEL_BUILD_WAIT="1")
        assert auto.returncode == 0, auto.stderr[-2000:]
        assert "'enabled': False" in auto.stdout and "gave up after 1 s" in auto.stdout
        assert "using stock SLAYER" in auto.stderr
        forced = load(tmp_path / "ext", "configure", "true", timeout=120, NEUROFED_KERNEL_BUILD_WAIT="1")
        assert forced.returncode != 0
        assert "ConfigError: federation.fast_kernels: the fast kernels cannot be loaded" in forced.stderr
        flower = load(tmp_path / "ext", "clientapp", timeout=120, NEUROFED_KERNEL_BUILD_WAIT="1")
        assert flower.returncode != 0
        assert "ConfigError: federation.fast_kernels: the fast kernels cannot be loaded" in flower.stderr
        assert "a Flower app needs them with auto" in flower.stderr
    assert not list(lock_file.parent.glob("*.so"))  # nobody built behind the holder's back


@pytest.mark.slow
def test_a_build_killed_midway_is_rebuilt_by_the_next_load(tmp_path):
    """SIGKILL a first build (the process group: Python, ninja, the compiler) while it
    compiles; the next load builds the variant afresh and loads it."""
    name = "generic"
    ext = tmp_path / "ext"
    folder = ext / variants._module_name(name)
    environ = {**os.environ, "NEUROFED_EXT_DIR": str(ext), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([sys.executable, "-c", LOAD, name], env=environ, cwd=REPO, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        started = lambda: list(folder.glob("build-*/build.ninja")) or (folder / "build.ninja").exists()  # 919f94d
        deadline = time.monotonic() + 120
        while not started() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started(), "the first build did not start"
        time.sleep(3)  # the compiler is running
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert not (folder / "built.json").exists() and not list(folder.glob("*.so"))
    try:
        res = load(ext, name, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("the load after a killed build hung")
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"LOADED {folder}" in res.stdout and "compiling the generic kernels" in res.stderr
    assert (folder / "built.json").exists() and not list(folder.glob("build-*"))
