"""Pipeline `per_tower`: batches of global/N examples, one get_next() per tower per step.

Each tower gets its own mini-batch from one host iterator; there is no split on the critical path, but the N
get_next() calls of a step run one after another. Through tf.distribute's input API it maps onto
`distribute_datasets_from_function`: one input pipeline per worker producing per-replica batches, handed out to
the replicas in turn, which is the same feed.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.data_pipelines import PIPELINES, PipelineOptions
from runner.data_pipelines.common import Feed, per_tower_batch


@PIPELINES.register
@dataclass
class PerTower(PipelineOptions):
    """One host iterator over tower-sized batches, one get_next() per tower per step."""

    name: str = "per_tower"

    def towers(self, examples, global_batch: int, devices: list[str], seed: int) -> Feed:
        towers = len(devices)
        it = iter(examples.shuffled(self.shuffle_buffer, seed).batched(per_tower_batch(global_batch, towers), self))
        return Feed(lambda: [next(it) for _ in range(towers)])

    def distribute(self, strategy, examples, global_batch: int, seed: int):
        def dataset_fn(ctx):
            # One pipeline per worker; several workers (multi_worker) each take a disjoint shard of the examples.
            mine = examples.shard(ctx.num_input_pipelines, ctx.input_pipeline_id) if ctx.num_input_pipelines > 1 \
                else examples
            batch = ctx.get_per_replica_batch_size(global_batch)
            return mine.shuffled(self.shuffle_buffer, seed).batched(batch, self)

        return iter(strategy.distribute_datasets_from_function(dataset_fn))
