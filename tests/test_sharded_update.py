"""strategy=sharded_update: replicated's losses with 1/N of the optimizer state per device, its slices where it says,
and checkpoints that resume exactly (in one process on the 4 logical CPU devices of `tf_devices`)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_strategy, compose

from runner.config import validate
from runner.runtime.devices import Devices

EXACT = ["pipeline.shuffle_buffer=0", "train.steps=20", "train.steps_per_call=1", "data.train_limit=1024"]


def _built(name: str, n: int, *overrides: str):
    plan = validate(compose("debug=smoke", f"strategy={name}", f"gpus={n}", *EXACT, *overrides))
    return build_strategy(plan, Devices(tuple(f"/device:CPU:{i}" for i in range(n)), "CPU", n > 1, "test")), plan


def _losses(tf, strategy, plan, calls: int = 20) -> list[float]:
    from runner.data_pipelines import common

    arrays = plan.data.load(plan.train.seed)
    batches = strategy.batches(plan.pipeline, common.examples(arrays.x_train, arrays.y_train), plan.train.seed)
    loop = strategy.train_loop(batches)
    return [float(loop(tf.constant(1))[0]) for _ in range(calls)]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("optimizer", ["adam", "momentum", "rmsprop"])
def test_sharded_update_trains_replicateds_losses(tf_devices, n, optimizer):
    """Unshuffled, same seed: the same averaged gradient and the same element-wise update, sliced."""
    replicated, replicated_plan = _built("replicated", n, f"train.optimizer={optimizer}")
    sharded, plan = _built("sharded_update", n, f"train.optimizer={optimizer}")
    losses = _losses(tf_devices, sharded, plan)
    np.testing.assert_allclose(losses, _losses(tf_devices, replicated, replicated_plan), rtol=1e-4)
    copies = [np.concatenate([v.numpy().ravel() for v in m.trainable_variables]) for m in sharded.models]
    assert all(np.array_equal(copies[0], c) for c in copies[1:])  # every device's copy holds the gathered weights
    if optimizer == "adam":
        _one_slice_and_1_over_n_of_the_state(sharded, replicated, n)


def _one_slice_and_1_over_n_of_the_state(sharded, replicated, n: int) -> None:
    """Each device holds one slice of the flat weights and 1/N of the optimizer state (the test above, with Adam)."""
    from runner.strategies.common import optimizer_state_bytes

    params = sum(int(np.prod(v.shape)) for v in sharded.models[0].trainable_variables)
    slices = {s.value.device.rsplit("device:", 1)[1]: int(np.prod(s.shape)) for s in sharded.shards}
    assert sorted(slices) == [f"CPU:{i}" for i in range(n)] and set(slices.values()) == {-(-params // n)}
    per_device, full = optimizer_state_bytes(sharded), optimizer_state_bytes(replicated)
    assert len(per_device) == len(full) == n
    # Adam: two slots of P/N floats (plus its step counter) against two of P on every device of replicated.
    assert max(per_device.values()) <= max(full.values()) / n + 64
    assert max(per_device.values()) >= 2 * 4 * (params // n)


def test_a_restored_checkpoint_continues_exactly_and_names_its_device_count(tf_devices, tmp_path):
    from runner.checkpoints import Checkpointer

    first, plan = _built("sharded_update", 2)
    assert any(name.endswith("_of_2") for name in first.checkpoint_objects())
    losses = _losses(tf_devices, first, plan, calls=5)
    Checkpointer(tmp_path, 1000, first.checkpoint_objects(), "r").save(5)
    second, _ = _built("sharded_update", 2)
    assert Checkpointer(tmp_path, 1000, second.checkpoint_objects(), "r").restore() == (5, "r")
    for a, b in zip(first.shards + first.models[1].trainable_variables,
                    second.shards + second.models[1].trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert len(losses) == 5


def test_a_checkpoint_of_another_device_count_is_refused_in_one_line(tf_devices, tmp_path):
    from runner.checkpoints import Checkpointer, CheckpointError

    two, _ = _built("sharded_update", 2)
    Checkpointer(tmp_path, 1000, two.checkpoint_objects(), "r").save(3)
    four, _ = _built("sharded_update", 4)
    with pytest.raises(CheckpointError, match="does not fit this run's variables") as error:
        Checkpointer(tmp_path, 1000, four.checkpoint_objects(), "r").restore()
    assert "\n" not in str(error.value) and "ckpt-3" in str(error.value)
