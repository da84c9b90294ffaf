"""train.precision=mixed_float16: float16 compute with dynamic loss scaling, in every strategy's own step.

Runs in-process on the shared simulated CPU devices (float16 is slow on a CPU but computes the same way); the
accuracy claims compare against float32 runs of the same smoke config (same seed, same data order)."""

from __future__ import annotations

import math

import mlflow
import pytest
from conftest import compose, run_cli, runs

from runner.experiment import run

# The smoke CNN reaches ~0.92 in 200 steps; at 60 steps it sits on the steep part of its curve, where any change of
# rounding moves the test accuracy by a few points.
CNN = ("model=cnn", "train.steps=200", "data.test_limit=10000")
MULTI = (["strategy=mirrored", "gpus=2"], ["strategy=replicated", "gpus=2"], ["strategy=model_parallel", "gpus=2"])


@pytest.fixture(autouse=True)
def float32_after():
    """Each run sets the Keras policy and op fusion itself; leave float32's behind for the next test either way."""
    yield
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_dtype_policy("float32")
    tf.config.optimizer.set_experimental_options({"remapping": True})


def _smoke(store, *overrides):
    # No target accuracy: its checks (every call) are most of a float16 run's time on a CPU, and no test here reads them.
    return run(compose("debug=smoke", f"mlflow.tracking_uri={store}", "train.target_accuracy=null", *overrides))


def _learns_like_float32(store, model: tuple[str, ...], strategies) -> None:
    import keras

    full = _smoke(store, *model)
    for strategy in strategies:
        half = _smoke(store, *model, "train.precision=mixed_float16", *strategy)
        assert keras.mixed_precision.dtype_policy().name == "mixed_float16"
        assert math.isfinite(half["train_loss"])
        assert abs(half["test_accuracy"] - full["test_accuracy"]) <= 0.02, (strategy, half["test_accuracy"], full)
        assert half["skipped_steps"] == 0  # Keras' start (2**15) never overflows these small models


def test_float16_mlp_learns_like_float32_under_every_kind_of_strategy(tf_devices, store):
    _learns_like_float32(store, (), [["strategy=single"], *MULTI])


def test_float16_on_cpus_runs_its_ops_unfused_and_float32_fused(tf_devices, store):
    """oneDNN's fused float16 MatMul + BiasAdd is 100x slower on CPUs than the ops apart (runtime/devices.fuse_ops)."""
    import tensorflow as tf

    _smoke(store, "train.precision=mixed_float16", "train.steps=2")
    assert tf.config.optimizer.get_experimental_options()["remapping"] is False
    _smoke(store, "train.steps=2")
    assert tf.config.optimizer.get_experimental_options()["remapping"] is True


def _processes_learn_like_float32(tmp_path, strategies) -> None:
    """The CNN in fresh processes, as a user starts it: the runner turns oneDNN off for float16 before TensorFlow
    starts (runtime/devices.float16_kernels), which an in-process run cannot do (the float16 smoke CNN step: 449 ms
    with oneDNN's filter gradient, 32 ms without). One float32 run, then float16 under each strategy, two at a time."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [("train.precision=float32",)] + [("train.precision=mixed_float16", *s) for s in strategies]

    def command(i: int, job: tuple[str, ...]):
        return run_cli("debug=smoke", *CNN, "train.target_accuracy=null", *job, f"hydra.run.dir={tmp_path}/out/{i}",
                       cwd=tmp_path, timeout=600)

    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(command, range(len(jobs)), jobs))
    assert [p.returncode for p in procs] == [0] * len(jobs), [p.stderr[-2000:] for p in procs]
    df = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke")
    assert set(df["status"]) == {"FINISHED"} and len(df) == len(jobs)
    full = df[df["params.train.precision"] == "float32"].iloc[0]
    half = df[df["params.train.precision"] == "mixed_float16"]
    assert sorted(half["tags.strategy"]) == sorted(s[0].split("=")[1] for s in strategies)
    assert set(half["tags.tensorflow.onednn"]) == {"off"}  # set before TensorFlow started
    for _, row in half.iterrows():
        assert math.isfinite(row["metrics.train_loss"])
        assert abs(row["metrics.test_accuracy"] - full["metrics.test_accuracy"]) <= 0.02, (row["tags.strategy"], full)
        assert row["metrics.skipped_steps"] == 0  # Keras' start (2**15) never overflows these small models


@pytest.mark.slow  # 200 CNN steps, float32 then float16, in two processes
def test_float16_cnn_learns_like_float32_on_one_device(tmp_path):
    _processes_learn_like_float32(tmp_path, [["strategy=single"]])


@pytest.mark.long
@pytest.mark.slow
def test_float16_cnn_learns_like_float32_on_two_devices(tmp_path):
    _processes_learn_like_float32(tmp_path, MULTI)


@pytest.mark.parametrize("strategy", [["strategy=single"], ["strategy=mirrored", "gpus=2"],
                                      ["strategy=sharded_update", "gpus=2"]], ids=lambda s: s[0].split("=")[1])
def test_an_overflowing_loss_scale_is_halved_and_the_skipped_steps_counted(tf_devices, store, strategy):
    """2**40 times the loss overflows float16's gradients (max 65504): each such step is skipped and the scale
    halved until the gradients fit; the period is longer than the run, so the scale never doubles back."""
    start = 2.0**40
    result = _smoke(store, "train.precision=mixed_float16", f"train.loss_scale={start}",
                    "train.loss_scale_period=1000", *strategy)
    skipped = result["skipped_steps"]
    assert 0 < skipped < 60 and result["steps"] == 60  # skipped steps are not a failure: the run goes on
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FINISHED"
    history = mlflow.MlflowClient(store).get_metric_history(row["run_id"], "loss_scale")
    assert history[-1].value == start / 2**skipped  # halved once per skipped step, exactly
    assert history[0].value < start  # the first step already overflowed
    assert result["test_accuracy"] > 0.5  # and it learned after the scale came down


def test_the_steps_loop_stops_only_after_patience_non_finite_losses_in_a_row(tf_devices):
    import tensorflow as tf

    from runner.strategies.common import steps_loop

    nan = float("nan")
    losses = tf.constant([1.0, nan, nan, 3.0, nan, nan, nan, 5.0])
    i = tf.Variable(0)

    def step():
        loss = tf.gather(losses, i)
        with tf.control_dependencies([loss]):
            i.assign_add(1)
        return loss

    mean, run_steps = steps_loop(step, patience=3)(tf.constant(8))
    assert int(run_steps) == 4 and float(mean) == 2.0  # stopped after 3 NaNs from step 5: 4 steps ran before them
    i.assign(0)
    mean, run_steps = steps_loop(step, patience=1)(tf.constant(8))
    assert int(run_steps) == 1 and float(mean) == 1.0  # float32: the first NaN stops
    i.assign(0)
    mean, run_steps = steps_loop(step, patience=4)(tf.constant(8))
    assert int(run_steps) == 8 and float(mean) == 3.0  # never 4 in a row: all 8 run, the mean over finite ones
