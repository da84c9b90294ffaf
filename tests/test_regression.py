"""A regression target, issue #63's proof that a new kind of target is one task: float labels, mean squared error, the
mean absolute error as the score and as a target (`train.target_mae`), end to end through every layer: training
under two strategies, the run's last line and tags, the report's table and verdict, predictions; on synthetic data
(`data.task=regression`) and on a user's .npy folder whose y files hold floats. The task itself is runner/tasks.py's
`Regression`; besides it only config.py's `target_mae` and synthetic.py's `data.task=regression` changed."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import compose, markdown_rows, runs, subcommand

from runner.config import ConfigError, validate
from runner.experiment import run

REGRESSION = ["data=synthetic", "data.task=regression", "data.train_limit=4096", "data.test_limit=512",
              "model=mlp", "model.variant=default", "train.global_batch_size=128", "train.steps=300",
              "train.steps_per_call=20", "train.checkpoint_every=0", "mlflow.system_metrics_interval=0",
              "train.predict=false", "train.target_mae=0.5", "mlflow.experiment=regression"]


def test_a_regression_trains_to_its_mae_target_under_two_strategies_and_is_reported_in_mae(tf_devices, store,
                                                                                          tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from runner.report import plots
    from runner.report.table import Selection, report

    results = [run(compose(*REGRESSION, f"mlflow.tracking_uri={store}", *strategy))
               for strategy in (["strategy=single"], ["strategy=replicated", "gpus=2"])]
    for result in results:  # the value is a linear function of the pixels: learnt well below a constant's ~0.8
        assert result["test_mae"] < 0.5 and result["time_to_mae_seconds"] > 0 and "test_accuracy" not in result
    table = runs(store, "regression")
    assert set(table["tags.task"]) == {"regression"} and set(table["status"]) == {"FINISHED"}

    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: plt.close(fig))  # drawn, not written
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("regression").experiment_id
    made = report(client, Selection("regression", experiment, None, ""), "", tmp_path)
    rows = markdown_rows(made.text)
    assert len(rows) == 2 and all(float(r["test MAE"]) < 0.5 and float(r["time to MAE (s)"]) > 0 for r in rows)
    (line,) = made.lines[:1]
    assert "s to test MAE 0.5" in line and "|Δ test MAE| <= 10%" in line, line


def test_the_last_line_names_the_mae_and_its_target(tf_devices, store):
    from runner.cli.main import result_line

    result = run(compose(*REGRESSION, f"mlflow.tracking_uri={store}", "train.steps=40"))
    line = result_line(result)
    assert line.startswith("test MAE ") and "  test loss " in line and "images/s  target MAE 0.5 " in line, line
    assert "(40 steps, " in line and " s wall)  mlflow run " in line  # the run's wall time, said as such


def test_a_users_npy_folder_with_float_labels_is_a_regression(tf_devices, store, tmp_path):
    """y files of float64 values (numpy's default): the regression task's labels, cast to float32; one output."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 2048), ("test", 256)):
        x = rng.integers(0, 256, (n, 8, 8, 1), dtype=np.uint8)
        np.save(tmp_path / f"x_{split}.npy", x)
        np.save(tmp_path / f"y_{split}.npy", x.reshape(n, -1)[:, :4].mean(axis=1) / 255.0)  # float64 (n,)
    overrides = ["data=files", f"data.path={tmp_path}", "model=mlp", "train.steps=200", "train.steps_per_call=20",
                 "train.global_batch_size=64", "train.checkpoint_every=0", "mlflow.system_metrics_interval=0",
                 "train.predict=false"]
    plan = validate(compose(*overrides))
    assert plan.spec.target == "regression" and plan.spec.outputs_shape == (1,)
    result = run(compose(*overrides, f"mlflow.tracking_uri={store}"))
    assert result["test_mae"] < 0.1  # the mean of four pixels in [0, 1]: a constant guess is ~0.15 off


@pytest.mark.parametrize("overrides, said", [
    (["data=synthetic", "data.task=regression", "train.target_accuracy=0.9"],
     "train.target_accuracy=0.9: data=synthetic gives 28x28x1 uint8 images, a value, whose runs are timed to "
     "train.target_loss or train.target_mae"),
    (["train.target_mae=0.1"], "train.target_mae=0.1: data=mnist gives 28x28x1 uint8 images, 10 classes, whose runs "
                               "are timed to train.target_loss or train.target_accuracy; mae is timed on data with "
                               "float32 labels (a value)"),
    (["data=synthetic", "data.task=regression", "train.target_mae=-1"], "train.target_mae=-1"),
])
def test_a_target_the_task_has_not_is_one_line_naming_those_it_has(overrides, said):
    with pytest.raises(ConfigError) as err:
        validate(compose(*overrides))
    assert said in str(err.value) and "\n" not in str(err.value)


def _npy(folder, x_train, y_train):
    """A data=files folder of `x_train`, `y_train` and test arrays of their kind (the first 16 examples)."""
    for name, array in (("x_train", x_train), ("y_train", y_train), ("x_test", x_train[:16]), ("y_test", y_train[:16])):
        np.save(folder / f"{name}.npy", array)
    return ["data=files", f"data.path={folder}", "model=mlp"]


def test_labels_meant_as_values_or_as_classes_are_told_how_to_be_stored(tmp_path, caplog):
    """Integer values to regress read "data.classes=13 needs them from 0 to 12" (no data.classes was set); class
    labels saved as floats (0.0 to 9.0) trained as a regression without a word; rows of features (n, 16) were
    refused without the layout that takes them."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 8, 8, 1), dtype=np.uint8)
    with pytest.raises(ConfigError) as err:
        validate(compose(*_npy(tmp_path, images, rng.integers(-13, 13, 64)), "train.target_mae=0.5"))
    assert "labels from -13 to 12; integer labels are class ids from 0" in str(err.value)
    assert "a value to regress is stored as floats (y.astype(np.float32))" in str(err.value)
    assert "data.classes" not in str(err.value)
    plan = validate(compose(*_npy(tmp_path, images, rng.integers(0, 10, 64).astype(np.float32))))
    assert plan.spec.target == "regression"
    assert "float32 values that are all whole numbers (0 to 9): trained as a regression" in caplog.text
    with pytest.raises(ConfigError) as err:
        validate(compose(*_npy(tmp_path, rng.random((64, 16), np.float32), rng.random(64, np.float32))))
    assert "rows of features: store them as (n, features, 1)" in str(err.value)


def test_a_regression_is_predicted_on_a_spec_sheet(capsys):
    code, out, err = subcommand(capsys, "predict", "-m", "hardware=dgx1_v100", "data=synthetic",
                                "data.task=regression", "model=mlp", "strategy=mirrored", "gpus=1,8")
    assert code == 0, err
    rows = markdown_rows(out)
    assert len(rows) == 2 and all(float(r["predicted images/s"].replace(",", "")) > 0 for r in rows)
