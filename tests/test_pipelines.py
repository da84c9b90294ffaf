"""Pipelines feed N towers disjoint mini-batches, deliver every example once per epoch, and (sharded) stage each
tower's batch on its own device. Labels carry each example's index so the tests can track it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import compose

from runner.data_pipelines import PIPELINES as REGISTRY
from runner.config import validate

PIPELINES = REGISTRY.names()
N_EXAMPLES, GLOBAL = 512, 64


def _indexed(tf):
    """512 examples whose label is their index: (uint8 (28, 28), int32 index)."""
    from runner.data_pipelines.common import examples

    return examples(np.zeros((N_EXAMPLES, 28, 28), np.uint8), np.arange(N_EXAMPLES, dtype=np.int32))


def _opts(name, **overrides):
    return validate(compose(f"pipeline={name}", *[f"pipeline.{k}={v}" for k, v in overrides.items()])).pipeline


def _epoch_of_tower_batches(tf, name, towers):
    devices = [f"/device:CPU:{i}" for i in range(towers)]
    batches = _opts(name).towers(_indexed(tf), GLOBAL, devices, 0)
    return [batches.next() for _ in range(N_EXAMPLES // GLOBAL)], devices


@pytest.mark.parametrize("towers", [2, 4])
@pytest.mark.parametrize("name", PIPELINES)
def test_towers_get_disjoint_batches_and_every_example_once_per_epoch(tf_devices, name, towers):
    steps, _ = _epoch_of_tower_batches(tf_devices, name, towers)
    seen = []
    for step in steps:
        assert len(step) == towers
        per_tower = [set(y.numpy().tolist()) for _, y in step]
        assert all(len(s) == GLOBAL // towers for s in per_tower)  # G/N distinct examples each
        assert len(set().union(*per_tower)) == GLOBAL  # disjoint across towers
        assert all(tuple(x.shape) == (GLOBAL // towers, 28, 28, 1) for x, _ in step)
        seen += [i for s in per_tower for i in s]
    assert sorted(seen) == list(range(N_EXAMPLES))  # the epoch: each example exactly once


@pytest.mark.parametrize("towers", [2, 4])
def test_sharded_batches_are_already_on_their_tower_device(tf_devices, towers):
    steps, devices = _epoch_of_tower_batches(tf_devices, "sharded", towers)
    for step in steps[:2]:
        for (x, y), device in zip(step, devices):
            assert x.device.endswith(device.removeprefix("/")), (x.device, device)
            assert y.device.endswith(device.removeprefix("/"))


@pytest.mark.parametrize("device,stages", [("/device:CPU:1", ["_PrefetchDataset"]),
                                           ("/device:GPU:0", ["_PrefetchDataset", "_CopyToDeviceDataset"])])
def test_sharded_runs_a_cpu_devices_pipeline_on_it_and_copies_batches_to_a_gpu(tf_devices, device, stages):
    # tf.data cannot run on a GPU: there the batches are copied over (prefetch_to_device). A CPU device runs its
    # shard's pipeline itself, so no copy stage (a generator dataset with a remote call per batch) is added.
    from runner.data_pipelines.sharded import staged

    source = tf_devices.data.Dataset.range(8)
    out = staged(lambda: source.batch(2), device, 2)
    names = []
    while out is not source:  # walk back from the last stage to the source
        names.append(type(out).__name__)
        out = out._input_dataset
    assert names == stages + ["_BatchDataset"]


def test_sharded_shards_are_disjoint_strides(tf_devices):
    steps, _ = _epoch_of_tower_batches(tf_devices, "sharded", 2)
    for (_, y0), (_, y1) in steps:
        assert set(y0.numpy() % 2) == {0} and set(y1.numpy() % 2) == {1}  # shard i holds i, i+N, ...


@pytest.mark.parametrize("name", PIPELINES)
def test_mirrored_input_maps_onto_tf_distribute_with_disjoint_replica_batches(tf_devices, name):
    tf = tf_devices
    strategy = tf.distribute.MirroredStrategy(["/device:CPU:0", "/device:CPU:1"])
    it = _opts(name).distribute(strategy, _indexed(tf), GLOBAL, 0)
    seen = []
    for _ in range(N_EXAMPLES // GLOBAL):
        x, y = next(it)
        ys = [set(t.numpy().tolist()) for t in strategy.experimental_local_results(y)]
        assert [len(s) for s in ys] == [GLOBAL // 2] * 2 and not ys[0] & ys[1]
        devices = [t.device for t in strategy.experimental_local_results(x)]
        assert devices[0].endswith("CPU:0") and devices[1].endswith("CPU:1")
        seen += [i for s in ys for i in s]
    assert sorted(seen) == list(range(N_EXAMPLES))


def test_shuffle_is_seeded_and_changes_every_epoch(tf_devices):
    def first_labels(seed, steps):
        b = _opts("split", shuffle_buffer=512).towers(_indexed(tf_devices), GLOBAL, ["/device:CPU:0"], seed)
        return [b.next()[0][1].numpy().tolist() for _ in range(steps)]

    a, b = first_labels(0, 16), first_labels(0, 16)
    assert a == b  # same seed, same order
    assert a[:8] != a[8:]  # epoch 2 is reshuffled
    assert first_labels(1, 1) != a[:1]


def test_in_memory_examples_are_shuffled_a_window_at_a_time_every_example_once_an_epoch(tf_devices):
    b = _opts("split", shuffle_buffer=128).towers(_indexed(tf_devices), GLOBAL, ["/device:CPU:0"], 0)
    for _ in range(2):  # two epochs, each its own permutation of each window
        stream = np.concatenate([b.next()[0][1].numpy() for _ in range(N_EXAMPLES // GLOBAL)])
        assert sorted(stream.tolist()) == list(range(N_EXAMPLES))
        assert (stream // 128 == np.arange(N_EXAMPLES) // 128).all()  # example i stays in its window of 128
        assert (stream != np.arange(N_EXAMPLES)).any()


def test_batch_not_divisible_by_towers_fails_at_config_time():
    from runner.config import ConfigError

    with pytest.raises(ConfigError, match="global_batch_size=100 is not divisible by the 3 towers"):
        validate(compose("strategy=replicated", "pipeline=sharded", "gpus=3", "train.global_batch_size=100"))


@pytest.mark.parametrize("model", ["mlp", "cnn", "nin"])
def test_split_and_per_tower_train_the_same_model(tf_devices, store, model):
    # Both hand tower i the same examples each step, so with the same seed the runs agree exactly: the same losses,
    # the same test accuracy (the slow suite's 2-epoch comparison of the pipelines leaves per_tower to this).
    # (`sharded` gives tower i examples i, i+N, ...: the same global batch when unshuffled, so MLP losses match
    # exactly — see test_strategies — but Dropout masks then fall on other examples, and shuffled its order differs.)
    from runner.experiment import run

    results = [
        run(compose("debug=smoke", f"model={model}", f"pipeline={p}", "strategy=replicated", "gpus=2",
                    f"mlflow.tracking_uri={store}", "train.measure_input=false"))
        for p in ("split", "per_tower")
    ]
    assert results[0]["test_accuracy"] > 0.2
    assert [(r["test_accuracy"], r["test_loss"], r["train_loss"]) for r in results[1:]] == \
        [(results[0]["test_accuracy"], results[0]["test_loss"], results[0]["train_loss"])]


def test_an_in_memory_test_set_keeps_its_float_batches_only_when_small(tf_devices, monkeypatch):
    """MNIST's 31 MB of float test batches are cached after the first evaluation; 10,000 synthetic 224x224x3 images
    would hold 6 GB no memory check counts: converted at every evaluation instead."""
    from runner.data_pipelines import Spec, common

    x, y = np.zeros((10, 8, 8, 1), np.uint8), np.zeros(10, np.int32)

    def cached() -> bool:
        return b"CacheDataset" in common.eval_dataset(x, y, Spec((8, 8, 1), 10))._as_serialized_graph().numpy()

    assert cached()
    monkeypatch.setattr(common, "EVAL_CACHE_BYTES", 4 * x.size - 1)
    assert not cached()
