"""`pipelines`: the input pipeline alone against the full training step, per pipeline x strategy x device count."""

from __future__ import annotations

import argparse
import time

from runner.bench.jobs import NO_TIMED_STEPS, run_job, sweep
from runner.report.table import markdown, markdown_row


def _cells(m: dict) -> list[str]:
    """A job's figures: pipeline alone, training step, their ratio, input-bound, rate; or why it has none."""
    if "error" not in m and "input_batches_per_sec" not in m:
        m = {"error": NO_TIMED_STEPS}
    if "error" in m:
        return [f"failed: {m['error'][:80]}", "", "", "", ""]
    alone, step = m["input_batches_per_sec"], m["step_batches_per_sec"]
    return [f"{alone:,.0f}", f"{step:,.0f}", f"{alone / step:.1f}x", "yes" if m["input_bound"] else "no",
            f"{m['rate']:,.0f}"]


def pipelines(args: argparse.Namespace) -> int:
    """The pipeline table: input-alone vs training-step batches/s for every pipeline x strategy x N."""
    print(f"# pipeline benchmark: model={args.model} variant={args.variant} steps={args.steps} "
          f"global batch={args.batch}, {time.ctime()}")
    print("\n".join(markdown(["pipeline", "strategy", "devices", "pipeline alone (batches/s)",
                              "training step (batches/s)", "ratio", "input-bound", "images/s"])))
    failed = 0
    with sweep(args.tracking_uri, "bench_pipelines") as bench:
        for gpus in args.gpus:
            for strategy in args.strategies:
                for pipeline in args.pipelines:
                    m = run_job([f"pipeline={pipeline}", f"strategy={strategy}", f"gpus={gpus}", f"model={args.model}",
                                 f"model.variant={args.variant}", f"train.steps={args.steps}",
                                 f"train.global_batch_size={args.batch}", f"data={args.data}",
                                 f"train.steps_per_call={args.steps_per_call}"], bench)
                    cells = _cells(m)
                    failed += cells[0].startswith("failed: ")
                    print(markdown_row([pipeline, strategy, str(gpus), *cells]), flush=True)
    return 1 if failed else 0
