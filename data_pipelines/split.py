"""Pipeline `split`: one global batch per step, one get_next(), then tf.split into one sub-batch per tower.

The simplest feed: a single host iterator, and the split sits on the step's critical path. Through tf.distribute's
input API (`strategy.input=distribute`, multi_worker) it maps onto `experimental_distribute_dataset`, which splits
each global batch across the replicas the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.data_pipelines import PIPELINES, PipelineOptions
from runner.data_pipelines.common import batched, shuffled


class Batches:
    """Per-step tower batches; `next()` is called inside the compiled training loop."""

    def __init__(self, ds, global_batch: int, towers: int, opts: PipelineOptions, seed: int):
        self.towers = towers
        self._it = iter(batched(shuffled(ds, opts.shuffle_buffer, seed), global_batch, opts))

    def next(self) -> list[tuple[Any, Any]]:
        """One batch per tower: `towers` pairs of ((global/towers, H, W, C) images, (global/towers,) labels)."""
        import tensorflow as tf

        x, y = next(self._it)  # (G, H, W, C) (or a dict of named features (G, ...)), (G,)
        parts = [tf.split(t, self.towers) for t in tf.nest.flatten(x)]  # each feature's N sub-batches
        xs = [tf.nest.pack_sequence_as(x, [p[i] for p in parts]) for i in range(self.towers)]
        return list(zip(xs, tf.split(y, self.towers)))


@PIPELINES.register
@dataclass
class Split(PipelineOptions):
    """One iterator over global batches, split into the towers' shares inside the step."""

    name: str = "split"

    def towers(self, examples, global_batch: int, devices: list[str], seed: int) -> Batches:
        """Feed len(devices) towers from one iterator over global batches."""
        return Batches(examples, global_batch, len(devices), self, seed)

    def distribute(self, strategy, examples, global_batch: int, seed: int):
        """The same feed through tf.distribute: an iterator of per-replica batches of global/replicas examples."""
        import tensorflow as tf

        global_batches = batched(shuffled(examples, self.shuffle_buffer, seed), global_batch, self)
        # Several workers (multi_worker): each keeps its own share of every global batch. In-memory data has no
        # files to shard by, so say DATA instead of letting AUTO try FILE first and warn.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return iter(strategy.experimental_distribute_dataset(global_batches.with_options(options)))
