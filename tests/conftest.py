"""Shared fixtures. TensorFlow-using tests share one process-wide device layout (4 logical CPU devices), set up
before TensorFlow initialises; tests that need another layout run the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
TEST_DEVICES = 4


@pytest.fixture(scope="session")
def tf_devices():
    """Import TensorFlow with TEST_DEVICES logical CPU devices (once per test process)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * TEST_DEVICES)
    except RuntimeError:  # already initialised by an earlier fixture use in this process
        pass
    assert len(tf.config.list_logical_devices("CPU")) == TEST_DEVICES
    return tf


@pytest.fixture
def store(tmp_path) -> str:
    """A fresh sqlite tracking URI in the test's own folder."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def compose(*overrides: str):
    """Compose the project's config through Hydra's compose API, as @hydra.main would."""
    from runner.config import compose as compose_config

    return compose_config(list(overrides))


def build_strategy(plan, devices):
    """Build the plan's strategy over `devices`, as a run does."""
    from runner.experiment import training_for

    return plan.strategy.build(devices, training_for(plan))


def cli_env(env: dict | None = None) -> dict:
    """The environment of a `python -m runner` child: this one, without the tracking URI that in-process tests
    leave behind (mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI), so the child uses its own default store."""
    full_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    return full_env


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m runner ARGS` in a fresh process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], cwd=cwd, env=cli_env(env), capture_output=True, text=True,
        timeout=timeout,
    )


def markdown_rows(text: str) -> list[dict[str, str]]:
    """Every row of every Markdown table in `text`, as {column header: cell}: tests read cells by name, so a column
    added to a table moves no assertion."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not all(set(c) <= set("-:") for c in cells):
            rows.append(dict(zip(header, cells)))
    return rows


def runs(uri: str, experiment: str):
    """All runs of `experiment` in the store at `uri`, as a DataFrame."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=[experiment])


_exit_status = 0


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Skip the interpreter's teardown once pytest is done: with TensorFlow loaded it takes minutes here (garbage
    collection of graphs and strategies) and checks nothing. The results and exit status are already final."""
    if "tensorflow" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
