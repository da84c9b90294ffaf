"""The studies' own shapes as presets: each runs as its file's first line says (slow: real sizes)."""

from __future__ import annotations

import pytest
from conftest import run_cli, runs


@pytest.mark.long
@pytest.mark.slow  # two fresh jobs of 70 steps on 100x100 images, ~30 s
def test_the_conv2d_study_sweeps_devices_and_reports_the_first_call_apart(tmp_path):
    proc = run_cli("-m", "experiment=conv2d_study", "gpus=1,2", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "conv2d_study")
    jobs = table[table["tags.mlflow.parentRunId"].notna()]
    assert sorted(jobs["tags.devices.count"]) == ["1", "2"] and set(jobs["status"]) == {"FINISHED"}
    assert set(jobs["params.data.shape"]) == {"[100, 100, 1]"} and set(jobs["params.data.train_limit"]) == {"840"}
    assert (jobs["metrics.seconds_to_first_step"] > 0).all() and (jobs["metrics.images_per_sec"] > 0).all()


@pytest.mark.slow  # two NIN towers at 227x227x3: seconds per step on 2 cores, ~45 s
def test_the_two_tower_nin_runs_at_imagenet_size(tmp_path):
    proc = run_cli("experiment=nin_two_tower", "train.steps=2", "train.steps_per_call=1", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "nin_two_tower").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.strategy.split"] == "two_tower"
    assert row["params.data.shape"] == "[227, 227, 3]" and row["params.data.classes"] == "1000"
