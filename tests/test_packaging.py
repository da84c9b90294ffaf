"""A regular install works: the wheel and the sdist built by the standard `build` frontend carry every YAML of conf/,
and the wheel installed without -e (a fresh venv, the dependencies made visible from this environment without its
editable install of the checkout) runs from a folder outside the checkout."""

from __future__ import annotations

import glob
import os
import site
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, cli_env, runs

YAMLS = sorted(str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").rglob("*.yaml"))


# Every test here reads the one build (`dist`), on one pytest-xdist worker (`--dist loadgroup`): not built twice.
pytestmark = pytest.mark.xdist_group("packaging")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A venv with the wheel installed (no -e); the dependencies come from this interpreter's site-packages through
    a .pth line, which does not run that folder's own .pth files, so the checkout's editable finder stays out."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=False)  # this interpreter's pip installs into it (`--python`): no ensurepip, ~4 s
    python = env_dir / "bin" / "python"
    wheel = glob.glob(str(dist / "*.whl"))[0]
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                           wheel], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True).stdout.strip()
    Path(purelib, "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return env_dir


def test_wheel_and_sdist_carry_every_yaml(dist):
    wheel = zipfile.ZipFile(glob.glob(str(dist / "*.whl"))[0])
    assert sorted(n.removeprefix("runner/conf/") for n in wheel.namelist() if n.endswith(".yaml")) == YAMLS
    sdist = tarfile.open(glob.glob(str(dist / "*.tar.gz"))[0])
    in_sdist = sorted(n.split("/conf/", 1)[1] for n in sdist.getnames() if n.endswith(".yaml") and "/conf/" in n)
    assert in_sdist == YAMLS


def test_the_wheel_installs_one_import_root(dist):
    """`runner` is the only top-level name: the repository's models/ and data_pipelines/ install under it."""
    wheel = zipfile.ZipFile(glob.glob(str(dist / "*.whl"))[0])
    top_level = [n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt")]
    assert len(top_level) == 1 and wheel.read(top_level[0]).decode().split() == ["runner"]
    assert {n.split("/")[0] for n in wheel.namelist() if ".dist-info/" not in n} == {"runner"}
    assert {"runner/models/mlp.py", "runner/data_pipelines/mnist.py", "runner/cli/main.py"} <= set(wheel.namelist())
    # Every module of the checkout is in the wheel (pyproject.toml lists the packages: a new folder must be added).
    sources = {f"runner/{p.relative_to(REPO / 'runner')}" for p in (REPO / "runner").rglob("*.py")}
    assert sources <= set(wheel.namelist()), sorted(sources - set(wheel.namelist()))


def _run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = cli_env()
    env.pop("PYTHONPATH", None)
    return subprocess.run([*args], cwd=cwd, env={**env, "PATH": f"{installed / 'bin'}{os.pathsep}{env['PATH']}"},
                          capture_output=True, text=True, timeout=600)


def test_installed_wheel_runs_from_elsewhere_and_reads_nothing_from_the_checkout(installed, tmp_path):
    """From a project folder whose own `models` and `data_pipelines` packages fail if the runner imports them."""
    for name in ("models", "data_pipelines"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the runner imported the project\\'s {name}')\n")
    python = str(installed / "bin" / "python")
    where = _run(installed, tmp_path, python, "-c", "import runner.config as c, runner; print(c.CONF_DIR, runner.__version__)")
    conf_dir, version = where.stdout.split()
    assert str(installed) in conf_dir and str(REPO) not in conf_dir, where.stdout + where.stderr
    assert _run(installed, tmp_path, "runner", "--version").stdout.strip() == f"runner {version} (tf-runner)"
    proc = _run(installed, tmp_path, python, "-m", "runner", "debug=smoke", "train.steps=20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.runner.version"] == version


@pytest.mark.slow  # two more fresh jobs through the installed console script, ~30 s
def test_installed_console_script_runs_a_sweep(installed, tmp_path):
    proc = _run(installed, tmp_path, "runner", "-m", "model=mlp,cnn", "debug=smoke", "train.steps=20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke")
    children = table[table["tags.mlflow.parentRunId"].notna()]
    assert sorted(children["tags.model"]) == ["cnn", "mlp"] and set(children["status"]) == {"FINISHED"}
