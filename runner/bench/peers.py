"""`peers`: a user's ResNet-20 in the runner against tf_cnn_benchmarks' `resnet20`, the same network, batch and devices.

Each round runs, per tower count, the runner with XLA off and on and the peer with `--xla` off and on, each in a
fresh process; a round's ratio is the runner's default over the faster of the peer's two. The peer is not a
dependency: `--peer` is its checkout (github.com/tensorflow/benchmarks), on TensorFlow's legacy Keras
(`pip install --no-deps tf-keras==<TensorFlow's version>`). `peers --gpt`: runner/bench/nanogpt.py. Details:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from runner.bench.jobs import Progress, emit, failed, median_range, run_job, save, stamp, sweep
from runner.bench.nanogpt import gpt_peers
from runner.errors import ConfigError, last_line
from runner.report.table import markdown, markdown_row
from runner.strategies import baseline, doing

RESNET = ["+model._target_=runner.bench.user_resnet.resnet20", "model.name=resnet20", "data=synthetic",
          "data.shape=[32,32,3]", "data.classes=10", "data.test_limit=256", "train.optimizer=sgd",
          "train.learning_rate=0.01", "train.target_accuracy=null", "train.predict=false",
          "train.checkpoint_every=0"]
PEER_MODE = "--variable_update=replicated"  # the peer's on more than one tower; the runner's strategy doing it
TARGET = 1.0  # runner / peer, median of the rounds, at every tower count (issue #48)


def peer_script(folder: str) -> Path:
    """tf_cnn_benchmarks.py in `folder` (the repository or its scripts/tf_cnn_benchmarks), or a one-line refusal."""
    for candidate in (Path(folder), Path(folder) / "scripts" / "tf_cnn_benchmarks"):
        if (candidate / "tf_cnn_benchmarks.py").is_file():
            return candidate / "tf_cnn_benchmarks.py"
    raise ConfigError(f"--peer {folder}: no tf_cnn_benchmarks.py there or in scripts/tf_cnn_benchmarks; clone "
                      "github.com/tensorflow/benchmarks and give its folder")


def peer_job(script: Path, towers: int, batch: int, steps: int, xla: bool) -> dict:
    """tf_cnn_benchmarks' resnet20 in a fresh process: {'rate': its total images/s, 'unit': 'images'}, or
    {'error': ...}."""
    args = [sys.executable, script.name, "--model=resnet20", "--data_name=cifar10", "--device=cpu",
            "--data_format=NHWC", PEER_MODE, "--optimizer=sgd", f"--batch_size={batch}",
            f"--num_gpus={towers}", f"--num_batches={steps}", "--num_warmup_batches=10", f"--xla={xla}"]
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(args, cwd=script.parent, capture_output=True, text=True, env=env)
    found = re.search(r"total images/sec: ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not found:
        return {"error": last_line(proc.stderr + proc.stdout, f"exit {proc.returncode}")}
    return {"rate": float(found.group(1)), "unit": "images"}


def runner_overrides(towers: int, batch: int, steps: int, xla: str) -> list[str]:
    """The runner's job: the user's ResNet-20 on `towers` devices, `batch` images per tower."""
    strategy = [f"strategy={baseline()}"] if towers == 1 else doing(PEER_MODE)
    return [*RESNET, *strategy, f"gpus={towers}",
            f"train.global_batch_size={batch * towers}", f"data.train_limit={max(4096, batch * towers * 8)}",
            f"train.steps={steps}", "train.steps_per_call=10", f"train.jit_compile={xla}"]


def peers(args: argparse.Namespace) -> int:
    """With --gpt the GPT against nanoGPT (2 rounds by default); else the runner's ResNet-20 against
    tf_cnn_benchmarks' in `args.rounds` (default 3) interleaved rounds. 0 when the target is met, else 1."""
    if args.gpt:
        args.rounds = args.rounds or 2  # the two interleaved rounds
        return gpt_peers(args)
    if not args.peer:
        raise ConfigError("peers needs --peer DIR (a checkout of github.com/tensorflow/benchmarks), or --gpt")
    args.rounds = args.rounds or 3
    script = peer_script(args.peer)
    jobs = {"runner": "auto", "runner xla": "true", "peer": False, "peer xla": True}
    progress, t0 = Progress(len(args.towers) * len(jobs) * args.rounds), time.perf_counter()
    rates: dict[tuple[int, str], list[dict]] = {(n, j): [] for n in args.towers for j in jobs}
    with sweep(args.tracking_uri, "bench_peers") as bench:
        for r in range(args.rounds):
            for n in args.towers:
                for name, setting in jobs.items():
                    if name.startswith("peer"):
                        run = lambda: peer_job(script, n, args.batch, args.steps, setting)  # noqa: E731
                    else:
                        overrides = runner_overrides(n, args.batch, args.steps, setting)
                        run = lambda: run_job(overrides, bench, r)  # noqa: E731
                    rates[n, name].append(progress.run(f"resnet20 {name} x{n}", run))
    out: list[str] = []
    emit(out, [f"## A user's ResNet-20 against tf_cnn_benchmarks' resnet20: {args.rounds} rounds, {stamp()}", "",
               f"Synthetic 32x32x3 images, SGD, {args.batch} images per tower, NHWC; the runner: single on one device, "
               "replicated on more; the peer: --variable_update=replicated --device=cpu; each job a fresh process, "
               f"{len(args.towers) * len(jobs) * args.rounds} jobs in {time.perf_counter() - t0:.0f} s. Medians over "
               "the rounds (lowest-highest); the ratio is per round, the runner's default over the faster peer.", "",
               *markdown(["towers", "runner images/s", "runner XLA", "tf_cnn_benchmarks", "tf_cnn_benchmarks --xla",
                          "runner / faster peer (per round)"])])
    ok = True
    for n in args.towers:
        got = {name: [m.get("rate") for m in rates[n, name]] for name in jobs}
        ratios = [ours / max(peer or 0.0, xla or 0.0)  # per round: the runner's default over the faster peer setting
                  for ours, peer, xla in zip(got["runner"], got["peer"], got["peer xla"]) if ours and (peer or xla)]
        cells = [median_range([v for v in got[name] if v], ",.0f") for name in jobs]
        errors = [m["error"] for name in jobs for m in rates[n, name] if "error" in m]
        ok = ok and bool(ratios) and statistics.median(ratios) >= TARGET
        emit(out, [markdown_row([f"{n}{failed(errors, 80)}", *cells, median_range(ratios, ".2f")])])
    emit(out, ["", f"Target: runner / faster peer >= {TARGET:.2f} at every tower count: {'PASS' if ok else 'FAIL'}"])
    save(out, args.out)
    return 0 if ok else 1
