"""`pipelines`: the input pipeline alone against the full training step, per pipeline x strategy x device count."""

from __future__ import annotations

import argparse
import time
from typing import Iterator

from runner.bench.jobs import NO_TIMED_STEPS, Sweep, run_job, sweep


def _row(pipeline: str, strategy: str, gpus: int, m: dict) -> str:
    if "error" not in m and "input_batches_per_sec" not in m:
        m = {"error": NO_TIMED_STEPS}
    if "error" in m:
        return f"| {pipeline} | {strategy} | {gpus} | failed: {m['error'][:80]} | | | | |"
    ratio = m["input_batches_per_sec"] / m["step_batches_per_sec"]
    return (
        f"| {pipeline} | {strategy} | {gpus} | {m['input_batches_per_sec']:,.0f} | {m['step_batches_per_sec']:,.0f} "
        f"| {ratio:.1f}x | {'yes' if m['input_bound'] else 'no'} | {m['rate']:,.0f} |"
    )


def pipelines(args: argparse.Namespace) -> int:
    """The pipeline table: input-alone vs training-step batches/s for every pipeline x strategy x N."""
    print(f"# pipeline benchmark: model={args.model} steps={args.steps} global batch={args.batch}, {time.ctime()}")
    print("| pipeline | strategy | devices | pipeline alone (batches/s) | training step (batches/s) | ratio "
          "| input-bound | images/s |")
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    with sweep(args.tracking_uri, "bench_pipelines") as bench:
        for row in _rows(args, bench):
            failed += "| failed: " in row
            print(row, flush=True)
    return 1 if failed else 0


def _rows(args: argparse.Namespace, bench: Sweep) -> Iterator[str]:
    """Each combination's row, as its job ends."""
    for gpus in args.gpus:
        for strategy in args.strategies:
            for pipeline in args.pipelines:
                overrides = [
                    f"pipeline={pipeline}", f"strategy={strategy}", f"gpus={gpus}", f"model={args.model}",
                    f"model.variant={args.variant}", f"train.steps={args.steps}",
                    f"train.global_batch_size={args.batch}",
                    f"data={args.data}", f"train.steps_per_call={args.steps_per_call}",
                ]
                yield _row(pipeline, strategy, gpus, run_job(overrides, bench))
