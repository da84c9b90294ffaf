"""Strong and weak batch scaling, measured on the batches the towers receive; learning-rate rules and warm-up."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_strategy, compose

from runner.config import ConfigError, validate
from runner.runtime.devices import Devices

MODES = {
    "strong": ["train.batch_scaling=strong", "train.global_batch_size=128"],
    "weak": ["train.batch_scaling=weak", "train.per_device_batch_size=32"],
}


def _tower_batch_sizes(n: int, mode: str) -> tuple[list[int], object]:
    from runner.data_pipelines import common

    plan = validate(compose("debug=smoke", "strategy=replicated", "pipeline=split", f"gpus={n}", *MODES[mode]))
    devices = Devices(tuple(f"/device:CPU:{i}" for i in range(n)), "CPU", n > 1, "test")
    strategy = build_strategy(plan, devices)
    ds = common.examples(np.zeros((1024, 28, 28), np.uint8), np.zeros(1024, np.int32))
    step = strategy.batches(plan.pipeline, ds, 0).next()
    return [int(x.shape[0]) for x, _ in step], plan


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("mode", ["strong", "weak"])
def test_towers_receive_the_batch_sizes_of_the_scaling_mode(tf_devices, mode, n):
    sizes, cfg = _tower_batch_sizes(n, mode)
    per_device = 128 // n if mode == "strong" else 32
    assert sizes == [per_device] * n
    assert sum(sizes) == (128 if mode == "strong" else 32 * n)
    assert (cfg.train.global_batch_size, cfg.train.per_device_batch_size) == (sum(sizes), per_device)  # both logged


def test_weak_scaling_needs_a_per_device_batch():
    with pytest.raises(ConfigError, match="per_device_batch_size"):
        validate(compose("train.batch_scaling=weak"))


def test_strong_scaling_batch_not_divisible_names_both():
    with pytest.raises(ConfigError, match=r"global_batch_size=100 is not divisible by the 3 towers .*gpus=3"):
        validate(compose("strategy=mirrored", "gpus=3", "train.global_batch_size=100"))


@pytest.mark.parametrize("rule,factor", [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_learning_rate_rule_scales_with_the_global_batch(rule, factor):
    from runner.strategies.common import effective_learning_rate

    cfg = validate(compose("train.batch_scaling=weak", "train.per_device_batch_size=64", "strategy=mirrored",
                           "gpus=4", f"train.lr_scaling={rule}", "train.lr_reference_batch=64"))
    assert cfg.train.global_batch_size == 256
    assert effective_learning_rate(cfg.train) == pytest.approx(1e-3 * factor)


def test_warm_up_ramps_to_the_effective_rate(tf_devices):
    import keras

    from runner.strategies.common import build_optimizer

    cfg = validate(compose("train.lr_scaling=linear", "train.lr_reference_batch=64", "train.lr_warmup_steps=4"))
    var = keras.Variable(np.zeros(3, np.float32))
    optimizer = build_optimizer(cfg.train, [var])
    rates = []
    for _ in range(6):
        rates.append(float(optimizer.learning_rate))
        optimizer.apply_gradients([(np.ones(3, np.float32), var)])
    np.testing.assert_allclose(rates, [0.0005, 0.001, 0.0015, 0.002, 0.002, 0.002], rtol=1e-6)


def test_effective_rate_and_scaling_are_logged(tf_devices, store, caplog):
    from conftest import runs

    from runner.experiment import run

    run(compose("debug=smoke", "strategy=replicated", "gpus=2", *MODES["weak"], "train.lr_scaling=linear",
                "train.lr_reference_batch=32", f"mlflow.tracking_uri={store}", "train.steps=20",
                "train.lr_warmup_steps=20"))
    # a warm-up as long as the run: was silent (model=gpt's 100 steps in a 60-step run learned at a fraction of its rate)
    assert "train.lr_warmup_steps=20 is not shorter than the run's 20 steps" in caplog.text
    row = runs(store, "smoke").iloc[0]
    assert float(row["params.train.effective_learning_rate"]) == pytest.approx(2e-3)
    assert (row["params.train.global_batch_size"], row["params.train.per_device_batch_size"]) == ("64", "32")
    assert row["tags.batch_scaling"] == "weak"


def test_gpus_0_runs_on_the_host_cpu_alone(tf_devices, store):
    from conftest import runs

    from runner.experiment import run

    run(compose("debug=smoke", "gpus=0", f"mlflow.tracking_uri={store}", "train.steps=20"))
    row = runs(store, "smoke").iloc[0]
    assert (row["tags.devices.requested"], row["tags.devices.kind"], row["tags.devices.count"]) == ("0", "CPU", "1")
    assert row["tags.strategy"] == "single" and row["status"] == "FINISHED"
