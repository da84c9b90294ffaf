"""The benchmark commands, run for real on a tiny grid: fresh processes, figures read back from MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}


def test_pipeline_benchmark_prints_both_rates_for_every_pipeline(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "runner.bench", "pipelines", "--gpus", "2", "--strategies", "replicated",
         "--variant", "tiny", "--steps", "60", "--steps-per-call", "10", "--batch", "64", "--tracking-uri", uri],
        capture_output=True, text=True, env=ENV, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "replicated" in line]
    assert [row.split("|")[1].strip() for row in rows] == ["split", "per_tower", "sharded"]
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        pipeline_rate, step_rate = (float(c.replace(",", "")) for c in cells[3:5])
        assert pipeline_rate > 0 and step_rate > 0
        assert cells[5] == f"{pipeline_rate / step_rate:.1f}x"
        assert cells[6] == ("yes" if pipeline_rate < 3 * step_rate else "no")


def test_keras_baseline_times_plain_fit(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "runner.keras_baseline", "--variant", "tiny", "--steps", "60", "--chunk", "10",
         "--batch", "64"],
        capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["images_per_sec"] > 0 and figures["timed_steps"] == 50  # first 10-step epoch excluded
    assert figures["devices"] == 1 and figures["mirrored"] is False
