"""Batch normalization in every strategy: a user's ResNet (residual adds, batch norm) on 32x32x3 data trains under
every strategy x pipeline, every copy of the model ends with the same moving statistics, and each run says what its
strategy did with them. In one process, on the logical CPU devices of the `tf_devices` fixture."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
from conftest import compose

from runner.config import validate
from runner.data_pipelines import PIPELINES
from runner.experiment import run
from runner.strategies import STRATEGIES

RESNET = ["+model._target_=user_models.resnet", "model.name=resnet", "+model.filters=4"]  # tests/user_models.py
CIFAR_LIKE = ["data=synthetic", "data.shape=[32,32,3]", "data.train_limit=256", "data.test_limit=64"]
SHORT = ["debug=smoke", "train.steps=4", "train.steps_per_call=2", "train.warmup_calls=1", "train.measure_input=false",
         "train.probe_peak=false", "train.checkpoint_every=0", "mlflow.system_metrics_interval=0"]
ONE_PROCESS = [s for s in STRATEGIES.names() if not STRATEGIES.get(s).multi_process]


def _devices(strategy: str) -> str:
    return "gpus=1" if STRATEGIES.get(strategy).max_gpus == 1 else "gpus=2"


def _extra(strategy: str) -> list[str]:
    # model_parallel as two towers here (its stages: test_stages_cut_a_resnet_between_its_residual_blocks)
    return ["strategy.split=two_tower"] if strategy == "model_parallel" else []


def _combinations() -> list:
    """Every strategy of one process x every pipeline; the default suite runs each strategy once (split) and each
    pipeline once (replicated), the rest is slow-marked."""
    quick = {(s, "split") for s in ONE_PROCESS} | {("replicated", p) for p in PIPELINES.names()}
    return [pytest.param(s, p, marks=() if (s, p) in quick else pytest.mark.slow, id=f"{s}-{p}")
            for s in ONE_PROCESS for p in PIPELINES.names()]


@pytest.mark.parametrize("strategy,pipeline", _combinations())
def test_a_resnet_with_batch_norm_trains_and_every_copy_agrees(tf_devices, store, strategy, pipeline):
    overrides = [*SHORT, *RESNET, *CIFAR_LIKE, f"strategy={strategy}", _devices(strategy), f"pipeline={pipeline}",
                 *_extra(strategy), f"mlflow.tracking_uri={store}"]
    result = run(compose(*overrides))
    row = mlflow.MlflowClient(store).get_run(result["run_id"])
    assert row.info.status == "FINISHED"
    assert row.data.tags["batch_norm.copies_equal"] == "true"
    assert row.data.tags["batch_norm"] == validate(compose(*overrides)).strategy.describe_batch_norm()
    assert np.isfinite(result["test_loss"])


def _losses(store: str, *overrides: str) -> np.ndarray:
    exact = ["pipeline.shuffle_buffer=0", "train.steps=12", "train.steps_per_call=1", "train.warmup_calls=0"]
    result = run(compose(*SHORT, *RESNET, *CIFAR_LIKE, *exact, f"mlflow.tracking_uri={store}", *overrides))
    history = mlflow.MlflowClient(store).get_metric_history(result["run_id"], "train_loss")
    return np.array([m.value for m in sorted(history, key=lambda m: m.step)])


def test_synchronized_batch_statistics_reproduce_one_device_and_per_tower_ones_do_not(tf_devices, store):
    """Unshuffled, same seed, 12 steps: mirrored with strategy.sync_batch_norm=true normalizes over the global batch,
    so it trains the single device's losses (up to float summation order); per-tower statistics (replicated's, and
    mirrored's default) normalize each half on its own, which changes the losses."""
    single = _losses(store, "strategy=single", "gpus=1")
    synced = _losses(store, "strategy=mirrored", "gpus=2", "strategy.sync_batch_norm=true")
    per_tower = _losses(store, "strategy=replicated", "gpus=2")
    assert len(single) == len(synced) == len(per_tower) == 12
    np.testing.assert_allclose(synced, single, rtol=1e-5)  # measured: 4e-7 at most
    # Random images: each half's statistics are close to the whole batch's, yet 200x further off than float noise
    assert np.max(np.abs(per_tower - single) / single) > 1e-5  # measured: 8e-5


def test_stages_cut_a_resnet_between_its_residual_blocks(tf_devices):
    """A skip connection keeps two tensors alive inside its block, so no cut falls inside: the block (its two
    convolutions, their batch normalization, the add) is in one stage, and the stages compute the model's logits."""
    import keras
    import tensorflow as tf

    from runner.strategies.common import build_model
    from runner.strategies.model_parallel import forward, stage_cells

    plan = validate(compose(*SHORT, *RESNET, *CIFAR_LIKE))
    model = build_model(plan.model, plan.spec, 0)
    cells = stage_cells(model, ("/device:CPU:0", "/device:CPU:1"))
    stage_of = {layer.name: i for i, cell in enumerate(cells) for layer in cell.layers[0].layers}
    add = next(i for i, layer in enumerate(model.layers) if isinstance(layer, keras.layers.Add))
    block = [layer.name for layer in model.layers[2:add + 1]]  # after the input and the stem convolution
    assert len(block) == 6 and len({stage_of[name] for name in block}) == 1, (block, stage_of)
    assert set(stage_of.values()) == {0, 1}
    x = tf.random.uniform((4, *plan.spec.shape)) * 255
    np.testing.assert_allclose(forward(cells, x, training=False)[-1], model(x, training=False), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_the_fused_kernel_gives_keras_outputs_gradients_and_moving_statistics(policy):
    """`common.fused_batch_norm` swaps Keras' BatchNormalization call for FusedBatchNormV3: three training steps
    then inference of the user's ResNet give Keras' own layer's logits, gradients and moving statistics, in float32
    and under mixed_float16 (both compute batch norm in float32). And the fused op is what runs."""
    import keras
    import tensorflow as tf

    from runner.strategies.common import fused_batch_norm
    from user_models import resnet

    keras.mixed_precision.set_global_policy(policy)
    try:
        models = []
        for _ in range(2):
            keras.utils.set_random_seed(3)
            models.append(resnet((4, 4, 3), 10, filters=4))
        keras_model, fused = models[0], fused_batch_norm(models[1])
        for step in range(3):
            x = tf.random.stateless_uniform((8, 4, 4, 3), (step, 0)) * 4 + step  # 128 values a channel; means move
            grads = []
            for model in (keras_model, fused):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(tf.cast(model(x, training=True), tf.float32) ** 2)
                grads.append(tape.gradient(loss, model.trainable_variables))
            # Relative to the largest gradient: a convolution's bias feeding batch norm has gradient 0 exactly (the
            # mean is subtracted); both compute rounding noise for it (measured: 3e-5 of gradients up to 30).
            largest = max(float(np.abs(g).max()) for g in grads[0])
            tol = 1e-5 if policy == "float32" else 1e-2
            for ours, theirs in zip(grads[1], grads[0]):
                np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol * largest)
        for ours, theirs in zip(fused.non_trainable_variables, keras_model.non_trainable_variables):
            assert "moving" in ours.path
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
        assert not np.allclose(keras_model.non_trainable_variables[1].numpy(), 1.0)  # the variances moved
        x = tf.random.stateless_uniform((4, 4, 4, 3), (9, 0))
        np.testing.assert_allclose(tf.cast(fused(x, training=False), tf.float32),
                                   tf.cast(keras_model(x, training=False), tf.float32), rtol=tol, atol=tol)
        graph = tf.function(lambda x: fused(x, training=True)).get_concrete_function(x).graph
        assert sum(op.type == "FusedBatchNormV3" for op in graph.get_operations()) == 2
    finally:
        keras.mixed_precision.set_global_policy("float32")
