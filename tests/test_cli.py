"""The command line as a user runs it: `python -m runner ...` in a fresh process, checked through MLflow."""

from __future__ import annotations

import mlflow
import pytest
from conftest import run_cli, runs

from runner.runtime.devices import onednn


def _store(cwd) -> str:
    return f"sqlite:///{cwd / 'mlflow.db'}"


def test_smoke_run_from_cli_lands_in_the_default_store_after_few_lines(tmp_path):
    """Run as a user would: stdout and stderr on one terminal, TensorFlow's own log level untouched. Its start-up noise
    is filtered (runner/runtime/quiet.py); on a machine without GPUs no CUDA error shows; the run lands in the default
    store with its metrics, artifacts, datasets and MLflow's system metrics."""
    proc = run_cli("debug=smoke", "mlflow.system_metrics_interval=0.5", cwd=tmp_path,
                   env={"TF_CPP_MIN_LOG_LEVEL": None}, merged=True, store=False)  # the store made by the run
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "test accuracy" in proc.stdout
    lines = proc.stdout.splitlines()
    first_progress = next(i for i, line in enumerate(lines) if "step 1/60" in line)
    assert first_progress <= 8, "\n".join(lines[:first_progress])
    assert not [line for line in lines if "cuInit" in line or "CUDA error" in line]
    assert "no GPU found: training on the CPU" in proc.stdout
    second = next(i for i, line in enumerate(lines) if "step 10/60" in line)
    assert "elapsed" in lines[first_progress] and "left" not in lines[first_progress]  # its time holds the tracing
    assert "elapsed" in lines[second] and "left" in lines[second]  # elapsed time and ETA, timed from step 1
    df = runs(_store(tmp_path), "smoke")  # default store: mlflow.db in the launch directory
    assert list(df["status"]) == ["FINISHED"]
    run_id = df.iloc[0]["run_id"]
    client = mlflow.MlflowClient(_store(tmp_path))
    assert len(client.get_metric_history(run_id, "train_loss")) == 7  # after step 1, then every 10 of 60
    artifacts = [a.path for a in client.list_artifacts(run_id)]
    assert "config.yaml" in artifacts and "runner.log" in artifacts
    assert df.iloc[0]["params.model.variant"] == "tiny"
    assert df.iloc[0]["tags.tensorflow.version"].startswith("2.21")
    assert df.iloc[0]["tags.tensorflow.onednn"] == onednn()  # TensorFlow's own choice for this CPU
    run = client.get_run(run_id)
    assert "system/cpu_utilization_percentage" in run.data.metrics  # MLflow's system metrics, sampled
    inputs = {[t.value for t in d.tags][0]: d.dataset for d in run.inputs.dataset_inputs}
    assert sorted(inputs) == ["test", "train"] and inputs["train"].name == "mnist"
    assert '"examples": 4096' in inputs["train"].profile  # the smoke preset's slice
    assert run.data.tags["mlflow.source.name"].endswith("-m runner debug=smoke mlflow.system_metrics_interval=0.5")
    experiment = client.get_experiment(run.info.experiment_id)
    assert "mlflow.sharedViewState.runner" in experiment.tags and "mlflow.note.content" in experiment.tags
    assert f"#/experiments/{run.info.experiment_id}/runs?viewStateShareKey=runner" in proc.stdout


def test_mirrored_on_two_simulated_devices_says_so(tmp_path):
    proc = run_cli("debug=smoke", "strategy=mirrored", "gpus=2", cwd=tmp_path, env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stdout + proc.stderr
    assert "simulated devices: 2 logical CPU devices" in log
    assert "global batch 64 (32 per tower, strong scaling)" in log
    row = runs(_store(tmp_path), "smoke").iloc[0]
    assert (row["tags.devices.count"], row["tags.devices.simulated"], row["tags.devices.kind"]) == ("2", "true", "CPU")
    assert row["tags.tensorflow.onednn"] == "off"  # the user's TF_ENABLE_ONEDNN_OPTS=0 is recorded


def test_hydra_cfg_job_prints_the_composed_config(tmp_path):
    proc = run_cli("--cfg", "job", "model=cnn", cwd=tmp_path)
    assert proc.returncode == 0
    assert "name: cnn" in proc.stdout and "global_batch_size: 128" in proc.stdout


def test_help_names_every_subcommand(tmp_path):
    """`--help` said `runner report | runner replay` alone: predict and check, two of the four, went unnamed."""
    from runner.cli.main import SUBCOMMANDS

    proc = run_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0 and all(f"runner {name}" in proc.stdout for name in SUBCOMMANDS), proc.stdout[:600]

TF_AT_THE_TOP = """import tensorflow as tf  # a user's module importing TensorFlow first, as many do


def net(input_shape, classes):
    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(), tf.keras.layers.Dense(classes)])
"""


@pytest.mark.parametrize("model", [["model=mlp"], ["+model._target_=tf_at_the_top.net", "model.name=net"]])
def test_a_spec_sheet_prediction_shows_its_table_without_tensorflows_start_up_lines(tmp_path, model):
    """`runner predict hardware=...` builds the model with Keras to read its layers, and a user's model module may
    import TensorFlow as validation finds it: TensorFlow's C++ start-up lines (oneDNN, CUDA drivers, cuInit) are
    filtered there as in a run, with TensorFlow's own log level untouched (the user's module: were printed)."""
    (tmp_path / "tf_at_the_top.py").write_text(TF_AT_THE_TOP)
    proc = run_cli("predict", "hardware=dgx1_p100", "gpus=8", "strategy=mirrored", *model, cwd=tmp_path,
                   env={"TF_CPP_MIN_LOG_LEVEL": None, "PYTHONPATH": str(tmp_path)}, merged=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "predicted fastest: " in proc.stdout and " mirrored/split x8" in proc.stdout
    assert not [line for line in proc.stdout.splitlines()
                if "oneDNN" in line or "cuda" in line.lower() or "absl::InitializeLog" in line], proc.stdout


def test_a_misspelled_subcommand_is_one_line_naming_the_subcommands(tmp_path):
    """`runner predikt ...` (was Hydra's "Error parsing override 'predikt' missing EQUAL at '<EOF>'")."""
    proc = run_cli("predikt", "hardware=dgx1_p100", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: 'predikt' is not a subcommand (report, check, predict, replay) or a config override KEY=VALUE")


@pytest.mark.parametrize("command", [["--config-dir", "{missing}", "model=resnet"],
                                     ["predict", "--config-dir", "{missing}", "model=cnn"]], ids=["run", "predict"])
def test_a_config_folder_that_does_not_exist_is_one_line(tmp_path, command):
    """Hydra skips a missing --config-dir without a word: a run said 'model=resnet is not an option of group
    model', and runner predict printed the built-in options' predictions, exit 0."""
    missing = tmp_path / "conf"
    proc = run_cli(*[c.format(missing=missing) for c in command], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: config folder {missing} does not exist (--config-dir or hydra.searchpath); give the folder that "
        "holds your <group>/<option>.yaml files"), proc.stderr
