"""Pipeline `sharded`: one iterator per device over Dataset.shard(N, i), the next batches staged on the device.

Shard i holds examples i, i+N, i+2N, ...; sharding comes before shuffling, so the shards stay disjoint and every
example is delivered once per epoch. Each shard's next batches wait on the tower's device, filled while the current
step runs. Through tf.distribute's input API it maps onto `distribute_datasets_from_function` in PER_REPLICA mode
with fetch-to-device: one sharded pipeline per replica, prefetched onto that replica's device.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, ClassVar

from runner.data_pipelines import PIPELINES, PipelineOptions
from runner.data_pipelines.common import Feed, per_tower_batch
from runner.errors import ConfigError
from runner.registry import Rule, positive


def shard(ds, index: int, shards: int, batch: int, opts: PipelineOptions, seed: int):
    """Shard `index` of `shards`: shuffled (its share of the buffer, its own seed), in batches of `batch` (a tower's
    share of the global batch), host-side."""
    buffer = max(1, opts.shuffle_buffer // shards) if opts.shuffle_buffer else 0  # never silently 0 (= no shuffle)
    return ds.shard(shards, index).shuffled(buffer, seed + index).batched(batch, opts)


def staged(build: Callable[[], Any], device: str, buffer: int):
    """The batches `build()` returns, with the next `buffer` of them held on `device`, filled while a step runs.

    A CPU device runs the whole pipeline itself, built under the device (`prefetch_to_device` there would copy
    nothing and add a remote call per batch); tf.data cannot run on a GPU, so there the pipeline stays on the host
    and `prefetch_to_device` copies each batch over.
    """
    import tensorflow as tf

    if tf.DeviceSpec.from_string(device).device_type == "CPU":
        with tf.device(device):
            return build().prefetch(buffer)
    return build().apply(tf.data.experimental.prefetch_to_device(device, buffer))


@PIPELINES.register
@dataclass
class Sharded(PipelineOptions):
    """One iterator per device over its own shard, the next `device_buffer` batches staged on the device.

    N iterators cost N times the host threads and shuffle memory: the shuffle buffer is split between them, and
    `private_threads` sizes each one's pool.
    """

    name: str = "sharded"
    shuffle_buffer: int = 10000  # examples in all; each of the N shards shuffles with shuffle_buffer / N
    device_buffer: int = 2  # batches staged on each device ahead of the step

    RULES: ClassVar[dict[str, Rule]] = {
        **PipelineOptions.RULES, "device_buffer": (positive, "a positive number of batches"),
    }

    def check(self, towers: int, train_examples: int | None) -> None:
        """Every shard needs at least one example."""
        if train_examples is not None and train_examples < towers:
            raise ConfigError(
                f"pipeline=sharded splits the {train_examples} training examples into {towers} shards, one per tower; "
                f"it needs at least {towers} (more data, or a higher data.train_limit) or use pipeline=split"
            )

    def towers(self, examples, global_batch: int, devices: list[str], seed: int) -> Feed:
        import tensorflow as tf

        its = []
        for i, device in enumerate(devices):
            build = partial(shard, examples, i, len(devices), per_tower_batch(global_batch, len(devices)), self, seed)
            with tf.device(device):
                its.append(iter(staged(build, device, self.device_buffer)))
        return Feed(lambda: [next(it) for it in its])

    def distribute(self, strategy, examples, global_batch: int, seed: int):
        import tensorflow as tf

        def dataset_fn(ctx):
            batch = ctx.get_per_replica_batch_size(global_batch)
            return shard(examples, ctx.input_pipeline_id, ctx.num_input_pipelines, batch, self, seed)

        # PER_REPLICA (a pipeline per device) exists for MirroredStrategy only; across workers (multi_worker) each
        # worker gets one shard, batched per replica and still fetched onto its device ahead of the step.
        per_replica = isinstance(strategy, tf.distribute.MirroredStrategy)
        mode = tf.distribute.InputReplicationMode
        options = tf.distribute.InputOptions(
            experimental_replication_mode=mode.PER_REPLICA if per_replica else mode.PER_WORKER,
            experimental_fetch_to_device=True,
            experimental_per_replica_buffer_size=self.device_buffer,
        )
        return iter(strategy.distribute_datasets_from_function(dataset_fn, options))
