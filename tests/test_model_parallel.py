"""strategy=model_parallel: the same losses as `single` (width, stages), every part's variables and its forward and
backward ops on its own device, two_tower learning, and end-to-end runs through `run(cfg)`.

Everything runs in the test process on the 4 logical CPU devices of the `tf_devices` fixture; strategies are built
once per (model, devices, split) and shared by the tests that inspect them.
"""

from __future__ import annotations

import collections
import functools
import re

import numpy as np
import pytest
from conftest import build_strategy, compose, runs

from runner.config import validate
from runner.experiment import run

# A part's scope in variable paths and op names: `stage1/`, `part0/`, `tower1/`, possibly uniquified (`part0_1/`).
PART = re.compile(r"(?:^|/)(?:stage|part|tower)(\d+)(?:_\d+)?/")
# Its optimizer updates and gradient reductions run in `<part>_backward/`.
PART_BACKWARD = re.compile(r"(?:^|/)(?:stage|part|tower)(\d+)_backward(?:_\d+)?/")
FORWARD_OPS = {"MatMul", "Conv2D"}
GRADIENT_OPS = {"MatMul", "Conv2DBackpropInput", "Conv2DBackpropFilter", "BiasAddGrad"}
UPDATE_OPS = {"ResourceApplyAdam", "ResourceApplyKerasMomentum", "AssignSubVariableOp", "AssignAddVariableOp", "AddN"}


def _where(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' or '/device:CPU:1' -> 'CPU:1'; '' (unplaced) -> ''."""
    return device.rsplit("device:", 1)[-1] if device else ""


@functools.cache
def _trained(model: str, gpus: int, split: str | None, calls: int = 20, steps_per_call: int = 1):
    """Build strategy `model_parallel` (`single` if split is None) on a 1024-example unshuffled MNIST slice and run
    `calls` compiled calls; returns (strategy, loop, per-call losses, (test loss, test accuracy))."""
    import tensorflow as tf

    from runner.data_pipelines import common
    from runner.runtime import devices

    name = "model_parallel" if split else "single"
    overrides = [f"model={model}", f"strategy={name}", f"gpus={gpus}", "data.train_limit=1024", "pipeline=split"]
    if split:
        overrides.append(f"strategy.split={split}")
    plan = validate(compose("debug=smoke", "pipeline.shuffle_buffer=0", *overrides))
    strategy = build_strategy(plan, devices.setup(gpus))
    arrays = plan.data.load(plan.train.seed)
    batches = strategy.batches(plan.pipeline, common.examples(arrays.x_train, arrays.y_train), plan.train.seed)
    loop = strategy.train_loop(batches)
    losses = []
    for _ in range(calls):
        mean_loss, done = loop(tf.constant(steps_per_call))  # the loop stops early at a non-finite loss
        assert int(done) == steps_per_call, losses
        losses.append(float(mean_loss))
    return strategy, loop, losses, strategy.evaluate(common.eval_dataset(arrays.x_test, arrays.y_test))


@pytest.mark.parametrize(
    "model,split,gpus", [("mlp", "width", 2), ("mlp", "width", 4), ("mlp", "stages", 2), ("cnn", "stages", 2),
                         ("cnn", "stages", 4)],
)
def test_width_and_stages_train_the_same_losses_as_single(tf_devices, model, split, gpus):
    """Same seed, weights and batches: 20 one-step calls give single's losses, and evaluation (run through the
    placed parts) gives single's test loss and accuracy.

    Dropout stays on for the CNN: each stage's Dropout is a copy carrying the reference layer's seed-generator
    state, so it draws the very masks `single` draws; nothing is disabled. Tolerance 1e-5 relative (tighter than
    mirrored's 1e-4): stages run the same ops on the same values; width only changes the summation order of the
    input gradients (a sum over parts), about 1e-7 here.
    """
    *_, single_losses, single_eval = _trained(model, 1, None)
    *_, losses, evaluation = _trained(model, gpus, split)
    assert losses == pytest.approx(single_losses, rel=1e-5)
    assert losses[-1] < losses[0]  # and it learns
    assert evaluation == pytest.approx(single_eval, rel=1e-5)


def _nodes(loop) -> list:
    """Every node of the compiled loop's graph, the functions of its library (the while-loop body) included."""
    import tensorflow as tf

    graph = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def()
    return list(graph.node) + [node for function in graph.library.function for node in function.node_def]


@pytest.mark.parametrize("model,split,gpus", [("mlp", "width", 2), ("mlp", "width", 4), ("cnn", "stages", 2),
                                              ("cnn", "stages", 4)])
def test_every_part_keeps_its_variables_forward_and_backward_ops_on_its_device(tf_devices, model, split, gpus):
    strategy, loop, *_ = _trained(model, gpus, split)
    names = [_where(n) for n in strategy.devices.names]
    variables = strategy.variable_devices()
    parts = {path: int(PART.search(path)[1]) for path in variables}
    assert sorted(set(parts.values())) == list(range(gpus))  # every device holds a part
    assert {path: _where(d) for path, d in variables.items()} == {path: names[i] for path, i in parts.items()}

    seen: collections.Counter = collections.Counter()
    for node in _nodes(loop):
        gradient = node.name.startswith("gradient_tape/")
        update = PART_BACKWARD.search(node.name)
        part = PART.search(node.name)
        if update and node.op in UPDATE_OPS:
            kind, i = "update", int(update[1])
        elif part and node.op in (GRADIENT_OPS if gradient else FORWARD_OPS):
            kind, i = "backward" if gradient else "forward", int(part[1])
        else:
            continue
        assert _where(node.device) == names[i], (kind, node.name, node.op, node.device)
        seen[kind, names[i]] += 1
    # Each device runs forward, gradient and update ops: the backward pass is not all on device 0.
    assert {(kind, n) for kind in ("forward", "backward", "update") for n in names} <= set(seen), seen


def test_two_tower_nin_learns_with_one_full_copy_per_device(tf_devices):
    strategy, _, losses, _ = _trained("nin", 2, "two_tower", calls=4, steps_per_call=10)
    assert losses[-1] < losses[0] - 0.02, losses  # mean loss of steps 31-40 below that of steps 1-10
    towers = collections.defaultdict(list)
    for path, device in strategy.variable_devices().items():
        towers[int(PART.search(path)[1]), _where(device)].append(path)
    assert sorted(towers) == [(0, "CPU:0"), (1, "CPU:1")]  # tower i wholly on device i
    assert len(towers[0, "CPU:0"]) == len(towers[1, "CPU:1"]) == 20  # 9 convs' kernel and bias, 2 dropout seeds


def test_width_slices_reassemble_the_reference_weights_even_when_uneven(tf_devices):
    import keras

    from runner.models.mlp import MLP
    from runner.strategies.model_parallel import width_cells

    keras.utils.set_random_seed(0)
    reference = MLP(variant="tiny").build()  # Flatten, Dense 64, Dense 64, Dense 10
    devices = tuple(f"/device:CPU:{i}" for i in range(3))
    cells = width_cells(reference, devices)
    assert [c.device for c in cells] == [*devices, *devices, devices[0]]  # the output layer stays whole on 0
    for dense, group in zip(reference.layers[1:], (cells[0:3], cells[3:6], cells[6:])):
        parts = [c.layers[-1] for c in group]
        assert [p.units for p in parts] == ([22, 21, 21] if len(group) == 3 else [10])
        np.testing.assert_array_equal(np.concatenate([p.kernel.numpy() for p in parts], 1), dense.kernel.numpy())
        np.testing.assert_array_equal(np.concatenate([p.bias.numpy() for p in parts]), dense.bias.numpy())


def test_stage_cuts_minimise_the_largest_stage():
    from runner.strategies.model_parallel import _stage_cuts

    assert _stage_cuts([1, 10, 1, 1], 2) == (2,)  # [1, 10] | [1, 1]: 11, not [1] | [10, 1, 1]: 12
    assert _stage_cuts([5, 1, 1, 5], 3) == (1, 3)  # [5] | [1, 1] | [5]
    assert _stage_cuts([1, 1, 1], 3) == (1, 2)


def test_impossible_splits_are_refused(tf_devices):
    from runner.models.cnn import CNN
    from runner.models.mlp import MLP
    from runner.strategies.model_parallel import stage_cells, width_cells

    devices = tuple(f"/device:CPU:{i}" for i in range(4))
    with pytest.raises(ValueError, match="at least 4 layers with weights"):
        stage_cells(MLP(variant="tiny").build(), devices)  # 3 Dense layers
    with pytest.raises(ValueError, match="split=width needs Flatten and Dense layers only"):
        width_cells(CNN(variant="tiny").build(), devices[:2])


@pytest.mark.parametrize("model,split", [("mlp", "width"), ("cnn", "stages"), ("nin", "stages")])
def test_smoke_run_on_two_devices_finishes_and_learns(tf_devices, store, model, split):
    result = run(compose("debug=smoke", "strategy=model_parallel", "gpus=2", f"mlflow.tracking_uri={store}",
                         f"model={model}"))
    assert result["test_accuracy"] > 0.2, result  # chance is 0.1
    assert result["images_per_sec"] > 0
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FINISHED"
    assert (row["tags.strategy"], row["tags.strategy.split"]) == ("model_parallel", split)  # split=auto resolved
    assert (row["tags.devices.count"], row["tags.devices.simulated"]) == ("2", "true")


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["gpus=1"], ["strategy=model_parallel", "gpus=1", "2"]),
        (["gpus=2", "model=cnn", "strategy.split=width"], ["strategy.split", "width", "cnn", "stages", "two_tower"]),
        (["gpus=4", "strategy.split=stages"], ["strategy.split", "stages", "gpus=4", "3", "two_tower"]),
        (["gpus=10", "model=nin"], ["strategy.split", "auto", "gpus=10", "9", "two_tower"]),
        (["gpus=2", "strategy.split=diagonal"], ["strategy.split", "diagonal", "width", "stages", "two_tower"]),
    ],
)
def test_bad_splits_fail_validation_with_one_line_naming_value_and_choices(overrides, words):
    from runner.config import ConfigError

    with pytest.raises(ConfigError) as error:
        validate(compose("strategy=model_parallel", *overrides))
    message = str(error.value)
    assert "\n" not in message and all(w in message for w in words), message
