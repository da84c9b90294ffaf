"""Benchmarks: every measurement in a fresh process; runner jobs are normal runs, read back from MLflow.

    python -m runner.bench pipelines [--gpus 1,2,4] [--strategies replicated,mirrored] [--model mlp] [--steps 400]

prints, for each pipeline x strategy x device count, the batches/s of the input pipeline alone and of the full
training step, their ratio, and whether the run is input-bound (pipeline under 3x the step rate).

    python -m runner.bench strategies [--gpus 2,4] [--model mlp --variant default] [--steps 600]

prints images/s ± standard error of every data-parallel strategy x pipeline on each device count, beside the
runner's own single-device rate (measured before and after the grid), plain Keras `fit` on one device and Keras
`fit` under MirroredStrategy on the same devices, as ratios to the runner's single-device rate. Runner jobs land in
the MLflow experiment `bench_<command>` with their config and devices.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

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
    if "error" not in m and "input_batches_per_sec" not in m:
        m = {"error": "no timed steps: raise --steps to a few times --steps-per-call"}
    if "error" in m:
        return f"| {pipeline} | {strategy} | {gpus} | failed: {m['error'][:80]} | | | | |"
    ratio = m["input_batches_per_sec"] / m["step_batches_per_sec"]
    return (
        f"| {pipeline} | {strategy} | {gpus} | {m['input_batches_per_sec']:,.0f} | {m['step_batches_per_sec']:,.0f} "
        f"| {ratio:.1f}x | {'yes' if m['input_bound'] else 'no'} | {m['images_per_sec']:,.0f} |"
    )


def pipelines(args: argparse.Namespace) -> int:
    """The pipeline table: input-alone vs training-step batches/s for every pipeline x strategy x N."""
    from runner.tracking import ensure_experiment, resolve_uri

    uri = resolve_uri(args.tracking_uri)
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
                    f"model.variant={args.variant}", f"train.steps={args.steps}",
                    f"train.global_batch_size={args.batch}",
                    f"data={args.data}", f"train.steps_per_call={args.steps_per_call}",
                ]
                metrics = run_job(overrides, uri, "bench_pipelines")
                failed += "error" in metrics
                print(_row(pipeline, strategy, gpus, metrics), flush=True)
    return 1 if failed else 0


def keras_job(model: str, variant: str, gpus: int, mirrored: bool, args: argparse.Namespace) -> dict:
    """Plain Keras fit in a fresh process (runner.keras_baseline); its JSON figures, or {'error': ...}."""
    cmd = [sys.executable, "-m", "runner.keras_baseline", "--model", model, "--variant", variant, "--gpus", str(gpus),
           "--batch", str(args.batch), "--steps", str(args.steps), "--data", args.data,
           "--chunk", str(args.steps_per_call)]
    proc = subprocess.run(cmd + (["--mirrored"] if mirrored else []), capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rate_row(label: str, devices: int, m: dict, base: float) -> str:
    if "error" in m:
        return f"| {label} | {devices} | failed: {m['error'][:80]} | | |"
    ips, se = m["images_per_sec"], m["images_per_sec_stderr"]
    return f"| {label} | {devices} | {ips:,.0f} ± {se:,.0f} | {ips / base:.2f} |"


def strategies(args: argparse.Namespace) -> int:
    """Data-parallel strategies x pipelines against the runner's single device and Keras fit."""
    from runner.tracking import ensure_experiment, resolve_uri

    uri = resolve_uri(args.tracking_uri)
    ensure_experiment(uri, "bench_strategies")
    common = [f"model={args.model}", f"model.variant={args.variant}", f"train.steps={args.steps}",
              f"train.global_batch_size={args.batch}", f"data={args.data}",
              f"train.steps_per_call={args.steps_per_call}"]
    single_before = run_job(["strategy=single", "gpus=1", *common], uri, "bench_strategies")
    rows: list[tuple[str, int, dict]] = [("keras fit", 1, keras_job(args.model, args.variant, 1, False, args))]
    for gpus in args.gpus:
        rows.append(("keras fit + MirroredStrategy", gpus, keras_job(args.model, args.variant, gpus, True, args)))
        for strategy in args.strategies:
            for pipeline in PIPELINES:
                job = [f"strategy={strategy}", f"pipeline={pipeline}", f"gpus={gpus}", *common]
                rows.append((f"runner {strategy} / {pipeline}", gpus, run_job(job, uri, "bench_strategies")))
    single_after = run_job(["strategy=single", "gpus=1", *common], uri, "bench_strategies")
    singles = [m for m in (single_before, single_after) if "error" not in m]
    if not singles:
        print(f"error: the single-device baseline failed: {single_before['error']}", file=sys.stderr)
        return 1
    base = sum(m["images_per_sec"] for m in singles) / len(singles)
    print(f"# strategy benchmark: model={args.model}/{args.variant} global batch={args.batch} steps={args.steps} "
          f"data={args.data}, {time.ctime()}")
    print("| what | devices | images/s ± stderr | x runner single |\n|---|---|---|---|")
    for m in singles:
        print(_rate_row("runner single (before/after the grid)", 1, m, base))
    for label, gpus, m in rows:
        print(_rate_row(label, gpus, m, base), flush=True)
    return 1 if any("error" in m for _, _, m in rows) else 0


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    """Command line of the benchmarks."""
    parser = argparse.ArgumentParser(prog="python -m runner.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pipelines", help="input pipeline alone vs training step, per pipeline x strategy x N")
    p.add_argument("--gpus", type=_ints, default=[1, 2, 4])
    p.add_argument("--strategies", type=lambda s: s.split(","), default=["replicated", "mirrored"])
    p.add_argument("--steps", type=int, default=400)
    s = sub.add_parser("strategies", help="data-parallel strategies x pipelines vs single device and Keras fit")
    s.add_argument("--gpus", type=_ints, default=[2, 4])
    s.add_argument("--strategies", type=lambda v: v.split(","), default=["mirrored", "replicated", "parameter_server"])
    for parsed in (p, s):
        parsed.add_argument("--model", default="mlp")
        parsed.add_argument("--variant", default="default")
        parsed.add_argument("--batch", type=int, default=128)
        parsed.add_argument("--data", default="mnist", choices=["mnist", "synthetic"])
        parsed.add_argument("--tracking-uri", default=None)
        parsed.add_argument("--steps-per-call", type=int, default=50)
    s.add_argument("--steps", type=int, default=600)
    args = parser.parse_args(argv)
    return pipelines(args) if args.command == "pipelines" else strategies(args)


if __name__ == "__main__":
    sys.exit(main())
