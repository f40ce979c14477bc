"""posbench installed from a wheel, away from the source tree: the shipped tasks travel with the
package, and the current folder's tasks/ joins them (winning on a name clash)."""

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_TASK

from posbench import config, results

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') leaves it out

REPO = Path(__file__).resolve().parents[1]


def _run(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel of this checkout; torch and the rest come from the
    site-packages of the Python running the tests (a virtualenv's or the system's alike), so
    nothing is downloaded."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"  # a copy, so the build leaves no build/ or egg-info in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("posbench", "tasks"):
        shutil.copytree(REPO / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", root / "dist", source, cwd=root)
    (wheel,) = (root / "dist").glob("posbench-*.whl")
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=root)
    _see_packages_of_this_python(venv)
    _run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps",
         "--no-index", wheel, cwd=root)
    return venv


def _see_packages_of_this_python(venv: Path) -> None:
    """A .pth file in the venv naming the site-packages folders of the running Python. Its plain
    path lines are appended after the venv's own folder, so the wheel's posbench wins; the .pth
    files inside those folders (an editable posbench among them) are not run. `--system-site-packages`
    would not do: from inside a virtualenv it reaches the base Python's folders, not the
    virtualenv's."""
    folders = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    purelib = _run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                   cwd=venv).stdout.strip()
    Path(purelib, "_tests_python.pth").write_text("".join(f"{f}\n" for f in folders if Path(f).is_dir()))


def test_wheel_ships_the_tasks_and_runs_a_grid(wheel_venv, tmp_path, corpus_dir):
    where = tmp_path / "elsewhere"  # no tasks/ and no posbench/ here
    where.mkdir()
    env = {**os.environ, "PYTHONPATH": ""}
    located = _run(wheel_venv / "bin" / "python", "-c", "import posbench; print(posbench.__file__)",
                   cwd=where, env=env)
    assert Path(located.stdout.strip()).is_relative_to(wheel_venv), "not the wheel's posbench"

    # The shipped tasks are listed and valid; a task file in ./tasks/ joins them.
    (where / "tasks").mkdir()
    (where / "tasks" / "mine.toml").write_text('schemes = ["rope"]\n' + TINY_TASK.format(corpus=corpus_dir))
    posbench = wheel_venv / "bin" / "posbench"
    listed = _run(posbench, "tasks", "--validate", cwd=where, env=env).stdout
    shipped = sorted(p.stem for p in (REPO / "tasks").glob("*.toml"))
    assert shipped and all(f"\n│ {name} " in listed for name in [*shipped, "mine"]), listed
    assert "tasks/mine.toml" in listed
    _run(posbench, "run", "mine", "--no-speed", "--device", "cpu", "--out", "out", cwd=where, env=env)
    rows = results.read_rows(where / "out" / "extrapolation.csv")
    assert sorted((r["scheme"], r["eval_len"], r["status"]) for r in rows) == [
        ("rope", "16", "ok"), ("rope", "32", "ok")]
    assert (where / "out" / "report.md").exists()


def test_local_tasks_win_over_shipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "quick.toml").write_text('schemes = ["alibi"]\n')
    (tmp_path / "tasks" / "mine.toml").write_text('schemes = ["rope"]\n')
    files = config.task_files()
    assert files["quick"] == tmp_path / "tasks" / "quick.toml"
    assert files["ci"] == config.shipped_tasks_dir() / "ci.toml"
    assert config.load_task("quick").schemes == ("alibi",)
    assert config.load_task("mine").schemes == ("rope",)
