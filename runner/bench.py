"""Benchmarks: every measurement in a fresh `python -m runner` process, results read back from MLflow.

    python -m runner.bench pipelines [--gpus 1,2,4] [--strategies replicated,mirrored] [--model mlp] [--steps 400]

prints, for each pipeline x strategy x device count, the batches/s of the input pipeline alone and of the full
training step, their ratio, and whether the run is input-bound (pipeline under 3x the step rate). Each job is a
normal runner run, so its figures are also in the MLflow experiment `bench_pipelines` beside its config and devices.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

PIPELINES = ("split", "per_tower", "sharded")


def run_job(overrides: list[str], uri: str, experiment: str) -> dict:
    """Run one job in a fresh process; return its final MLflow metrics, or {'error': ...} if it failed."""
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [sys.executable, "-m", "runner", *overrides, f"mlflow.tracking_uri={uri}", f"mlflow.experiment={experiment}"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    match = re.search(r"mlflow run ([0-9a-f]{32})", proc.stdout)
    if proc.returncode != 0 or not match:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    return dict(MlflowClient(uri).get_run(match.group(1)).data.metrics)


def _row(pipeline: str, strategy: str, gpus: int, m: dict) -> str:
    if "error" in m:
        return f"| {pipeline} | {strategy} | {gpus} | failed: {m['error'][:80]} | | | | |"
    ratio = m["input_batches_per_sec"] / m["step_batches_per_sec"]
    return (
        f"| {pipeline} | {strategy} | {gpus} | {m['input_batches_per_sec']:,.0f} | {m['step_batches_per_sec']:,.0f} "
        f"| {ratio:.1f}x | {'yes' if m['input_bound'] else 'no'} | {m['images_per_sec']:,.0f} |"
    )


def pipelines(args: argparse.Namespace) -> int:
    """The pipeline table: input-alone vs training-step batches/s for every pipeline x strategy x N."""
    uri = args.tracking_uri or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"
    from runner.tracking import ensure_experiment

    ensure_experiment(uri, "bench_pipelines")  # create the store once, before the jobs
    print(f"# pipeline benchmark: model={args.model} steps={args.steps} global batch={args.batch}, {time.ctime()}")
    print("| pipeline | strategy | devices | pipeline alone (batches/s) | training step (batches/s) | ratio "
          "| input-bound | images/s |")
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for gpus in args.gpus:
        for strategy in args.strategies:
            for pipeline in PIPELINES:
                overrides = [
                    f"pipeline={pipeline}", f"strategy={strategy}", f"gpus={gpus}", f"model={args.model}",
                    f"model.variant={args.variant}", f"train.steps={args.steps}", f"train.global_batch_size={args.batch}",
                    f"data={args.data}",
                ]
                metrics = run_job(overrides, uri, "bench_pipelines")
                failed += "error" in metrics
                print(_row(pipeline, strategy, gpus, metrics), flush=True)
    return 1 if failed else 0


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    """Command line of the benchmarks."""
    parser = argparse.ArgumentParser(prog="python -m runner.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pipelines", help="input pipeline alone vs training step, per pipeline x strategy x N")
    p.add_argument("--gpus", type=_ints, default=[1, 2, 4])
    p.add_argument("--strategies", type=lambda s: s.split(","), default=["replicated", "mirrored"])
    p.add_argument("--model", default="mlp")
    p.add_argument("--variant", default="default")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--data", default="mnist", choices=["mnist", "synthetic"])
    p.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    return pipelines(args)


if __name__ == "__main__":
    sys.exit(main())
