"""Pipeline `split`: one global batch per step, one get_next(), then tf.split into one sub-batch per tower.

The simplest feed: a single host iterator, and the split sits on the step's critical path. Through tf.distribute's
input API (`strategy.input=distribute`, multi_worker) it maps onto `experimental_distribute_dataset`, which splits
each global batch across the replicas the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.data_pipelines import PIPELINES, PipelineOptions
from runner.data_pipelines.common import Feed


@PIPELINES.register
@dataclass
class Split(PipelineOptions):
    """One iterator over global batches, split into the towers' shares inside the step."""

    name: str = "split"

    def towers(self, examples, global_batch: int, devices: list[str], seed: int) -> Feed:
        import tensorflow as tf

        towers = len(devices)
        it = iter(examples.shuffled(self.shuffle_buffer, seed).batched(global_batch, self))

        def next_batches() -> list[tuple[Any, Any]]:
            x, y = next(it)  # (G, H, W, C) (or a dict of named features (G, ...)), (G,)
            parts = [tf.split(t, towers) for t in tf.nest.flatten(x)]  # each feature's N sub-batches
            xs = [tf.nest.pack_sequence_as(x, [p[i] for p in parts]) for i in range(towers)]
            return list(zip(xs, tf.split(y, towers)))

        return Feed(next_batches)

    def distribute(self, strategy, examples, global_batch: int, seed: int):
        import tensorflow as tf

        global_batches = examples.shuffled(self.shuffle_buffer, seed).batched(global_batch, self)
        # Several workers (multi_worker): each keeps its own share of every global batch. In-memory data has no
        # files to shard by, so say DATA instead of letting AUTO try FILE first and warn.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return iter(strategy.experimental_distribute_dataset(global_batches.with_options(options)))
