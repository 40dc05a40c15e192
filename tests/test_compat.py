"""The compatibility module makes lava-nc and lava-dl import on this Python."""

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def assert_prints_ok(code: str) -> None:
    """``code`` runs in a fresh interpreter without error and prints exactly 'ok'."""
    res = run(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_lava_fails_without_compat_and_imports_with_it():
    # Without the fix, Python 3.11 rejects var_model's dataclass defaults...
    bare = run("import lava.magma.compiler.var_model")
    if sys.version_info >= (3, 11):
        assert bare.returncode != 0 and "mutable default" in bare.stderr
    # ...with it, the module imports and the defaults are independent instances.
    assert_prints_ok(
        "import neurofed.compat as c; c.install();"
        "import lava.magma.compiler.var_model as vm;"
        "a, b = vm.CoreEncoder(), vm.CoreEncoder(); assert a.x is not b.x; print('ok')"
    )


def test_slayer_and_netx_import_and_object_detection_explains_itself():
    res = run(
        "import neurofed.compat as c; s = c.slayer(); n = c.netx();"
        "assert hasattr(s.block.cuba, 'Dense') and hasattr(n, 'hdf5');"
        "\ntry:\n  s.obd.models\nexcept ImportError as e:\n  print('IMPORTERROR', e)\nelse:\n  print('AVAILABLE')"
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert out == "AVAILABLE" or ("IMPORTERROR" in out and "torchvision" in out)


def test_no_installed_file_is_modified():
    import importlib.util

    import neurofed.compat as c

    c.install()
    spec = importlib.util.find_spec("lava.magma.compiler.var_model")
    with open(spec.origin) as fh:
        assert "x: ByteEncoder = ByteEncoder()" in fh.read()


def test_check_environment_reports_versions():
    import neurofed.compat as c

    versions = c.check_environment()
    assert versions["lava-nc"].startswith("0.10") and versions["lava-dl"].startswith("0.6")


def test_lava_imports_after_the_multiprocessing_context_was_set():
    # tqdm (progress bars) creates a multiprocessing lock before the Lava step runs;
    # lava's own set_start_method('fork') must not fail because of it.
    assert_prints_ok(
        "import multiprocessing as mp; mp.RLock();"
        "import neurofed.compat as c;"
        "c.lava('lava.magma.runtime.message_infrastructure.multiprocessing'); print('ok')"
    )
