"""The README and docs/ say what the code does: every command block in them is run here,
or marked ``<!-- not run: reason -->`` on the line before it; links point at files that
exist; the README's three commands are the Makefile's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_LANGS = ("bash", "sh", "python")
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks(page: Path) -> list[tuple[str, str, str | None, int]]:
    """(language, code, not-run reason or None, line) of every fenced block of ``page``."""
    text = page.read_text()
    out = []
    for m in BLOCK.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(before)
        out.append((m.group(1), m.group(2), reason.group(1) if reason else None, text.count("\n", 0, m.start()) + 1))
    return out


RUNNABLE = [pytest.param(lang, code, id=f"{page.name}:{line}")
            for page in PAGES for lang, code, reason, line in blocks(page)
            if lang in COMMAND_LANGS and reason is None]


def test_docs_exist_and_every_command_block_is_run_or_says_why_not():
    assert (ROOT / "docs").is_dir() and len(PAGES) > 10
    for page in PAGES:
        for lang, code, reason, line in blocks(page):
            if lang in COMMAND_LANGS and reason is not None:
                assert len(reason) > 8, f"{page.name}:{line}: say why the block is not run"
    assert len(RUNNABLE) >= 2  # some commands are run, not all marked


def test_links_between_pages_point_at_files():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: link to missing {target}"


def test_readme_is_short_and_its_three_commands_are_the_makefiles():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 80  # the reference lives in docs/
    makefile = (ROOT / "Makefile").read_text()
    for target in ("setup", "run", "test"):
        assert f"make {target}" in readme and re.search(rf"^{target}:", makefile, re.M)
    run_recipe = re.search(r"^run:.*\n\t(.*)", makefile, re.M).group(1)
    out = re.search(r"--out (\S+)", run_recipe).group(1)
    assert f"{out}/" in readme  # the run directory the README names is the one `make run` writes


@pytest.mark.slow
@pytest.mark.parametrize("lang,code", RUNNABLE)
def test_command_block_runs(lang, code, tmp_path):
    """In a scratch folder holding the repository's examples and profiles; ``neurofed``
    is this interpreter's module, so the checkout under test runs."""
    for name in ("examples", "hw_profiles"):
        (tmp_path / name).symlink_to(ROOT / name)
    bin_dir = tmp_path / "_bin"
    bin_dir.mkdir()
    shim = bin_dir / "neurofed"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m neurofed.cli \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    if lang == "python":
        argv, stdin = [sys.executable, "-"], code
    else:
        argv, stdin = [shutil.which("bash") or "/bin/bash", "-e", "-c", code], None
    done = subprocess.run(argv, input=stdin, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
