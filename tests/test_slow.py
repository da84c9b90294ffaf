"""Long end-to-end runs, excluded from the default suite: `python -m pytest -q -m slow`."""

from __future__ import annotations

import pytest
from conftest import run_cli, runs


@pytest.mark.slow
def test_default_run_reaches_97_percent_on_full_mnist(tmp_path):
    proc = run_cli(cwd=tmp_path, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "runner").iloc[0]
    assert row["status"] == "FINISHED"
    assert row["params.data.train_limit"] == "None"  # the full 60k training set
    assert row["metrics.test_accuracy"] >= 0.97
