"""Pipeline `per_tower`: batches of global/N examples, one get_next() per tower per step.

Each tower gets its own mini-batch from one host iterator; there is no split on the critical path, but the N
get_next() calls of a step run one after another. Through tf.distribute's input API it maps onto
`distribute_datasets_from_function`: one input pipeline per worker producing per-replica batches, handed out to
the replicas in turn, which is the same feed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.data_pipelines import PIPELINES, PipelineOptions
from runner.data_pipelines.common import batched, per_tower_batch, shuffled


class Batches:
    """Per-step tower batches; `next()` is called inside the compiled training loop."""

    def __init__(self, ds, global_batch: int, towers: int, opts: PipelineOptions, seed: int):
        self.towers = towers
        self._it = iter(batched(shuffled(ds, opts.shuffle_buffer, seed), per_tower_batch(global_batch, towers), opts))

    def next(self) -> list[tuple[Any, Any]]:
        """`towers` consecutive batches of ((global/towers, H, W, C) images, (global/towers,) labels)."""
        return [next(self._it) for _ in range(self.towers)]


@PIPELINES.register
@dataclass
class PerTower(PipelineOptions):
    """One host iterator over tower-sized batches, one get_next() per tower per step."""

    name: str = "per_tower"

    def towers(self, examples, global_batch: int, devices: list[str], seed: int) -> Batches:
        """Feed len(devices) towers, one get_next() each."""
        return Batches(examples, global_batch, len(devices), self, seed)

    def distribute(self, strategy, examples, global_batch: int, seed: int):
        """tf.distribute's per-worker input function: per-replica batches from one pipeline."""

        def dataset_fn(ctx):
            # One pipeline per worker; several workers (multi_worker) each take a disjoint shard of the examples.
            mine = examples.shard(ctx.num_input_pipelines, ctx.input_pipeline_id) if ctx.num_input_pipelines > 1 \
                else examples
            batch = ctx.get_per_replica_batch_size(global_batch)
            return batched(shuffled(mine, self.shuffle_buffer, seed), batch, self)

        return iter(strategy.distribute_datasets_from_function(dataset_fn))
