"""`peers --gpt`: the runner's GPT against nanoGPT (github.com/karpathy/nanoGPT) on the runner's own Shakespeare.

Both sides train the recipe of the runner's composed config (`model=gpt data=shakespeare`, nanoGPT's CPU recipe),
float32, for `--iters` steps, each job a fresh process, in interleaved rounds; nanoGPT reads its `prepare.py` layout
written here from the runner's own text, vocabulary and split. tokens/s is taken over the same steps on both sides
(after the runner's warm-up calls); the validation loss is each side's final model on the runner's validation
windows (nanoGPT's checkpoint scored by `nanogpt_eval.py` in its own Python). The peer is not a dependency:
`--nanogpt` is its checkout, `--python` the Python of a venv with torch and numpy. Details: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from runner.bench.jobs import Progress, cell, emit, median_range, medians, run_job, save, stamp, sweep
from runner.config import compose, validate
from runner.data_pipelines.shakespeare import VOCABULARY
from runner.errors import ConfigError, last_line
from runner.models.gpt import SIZES
from runner.report.table import markdown, markdown_row

DATASET = "runner_shakespeare"  # nanoGPT's data/<name>/, written from the runner's Shakespeare
EVAL_SCRIPT = Path(__file__).with_name("nanogpt_eval.py")
ITERATION = re.compile(r"^iter (\d+): loss \S+, time ([\d.]+)ms", re.M)  # nanoGPT's line per iteration
MIN_ITERS = 10
LOSS_MARGIN = 0.02  # the runner's validation loss may be at most this above nanoGPT's (issue #64)
TARGET = 1.0  # runner / nanoGPT's faster setting, median of the rounds


def checkout(folder: str | None) -> Path:
    """nanoGPT's checkout (train.py, model.py, configurator.py), or a one-line refusal."""
    if not folder:
        raise ConfigError("--gpt needs --nanogpt DIR: a checkout of github.com/karpathy/nanoGPT")
    missing = [name for name in ("train.py", "model.py", "configurator.py") if not (Path(folder) / name).is_file()]
    if missing:
        raise ConfigError(f"--nanogpt {folder}: no {missing[0]} there; give a checkout of "
                          "github.com/karpathy/nanoGPT")
    return Path(folder).resolve()


def interpreter(python: str | None) -> tuple[str, str]:
    """The venv's Python and its torch version, or a one-line refusal (missing, or torch and numpy not there)."""
    if not python:
        raise ConfigError("--gpt needs --python PATH: the Python of a venv with torch and numpy (nanoGPT's)")
    if not (Path(python).is_file() and os.access(python, os.X_OK)):
        raise ConfigError(f"--python {python}: no such executable; make a venv (python -m venv DIR; "
                          "DIR/bin/pip install torch numpy) and give DIR/bin/python")
    proc = subprocess.run([python, "-c", "import numpy, torch; print(torch.__version__)"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        last = last_line(proc.stderr.strip(), f"exit {proc.returncode}")
        raise ConfigError(f"--python {python}: cannot import torch and numpy ({last}); pip install them there")
    return python, proc.stdout.strip()


def per_call(iters: int) -> int:
    """The runner's steps per compiled call: its preset's 50, fewer for a short run (at least 4 timed calls)."""
    return min(50, max(1, iters // 5))


def runner_overrides(iters: int, extra: list[str]) -> list[str]:
    """The runner's GPT job: nanoGPT's CPU recipe (conf/model/gpt.yaml) for `iters` steps, warm-up scaled to them
    (the recipe's 100 of 2,000), no mid-run checkpoints (nanoGPT saves once, untimed), then the user's overrides."""
    return ["model=gpt", "data=shakespeare", f"train.steps={iters}", f"train.steps_per_call={per_call(iters)}",
            f"train.lr_warmup_steps={min(100, iters // 20)}", "train.checkpoint_every=0", "train.predict=false",
            *extra]


def runner_plan(overrides: list[str]) -> Any:
    """The runner's validated plan for its job, refused in one line where nanoGPT cannot train the same."""
    plan = validate(compose(overrides))
    train = plan.train
    problems = [f"{key}={value} (nanoGPT: {want})" for key, value, want in [
        ("data", plan.data.name, "shakespeare"), ("model", plan.model.name, "gpt"),
        ("train.optimizer", train.optimizer, "adamw"), ("train.precision", train.precision, "float32"),
        ("gpus", plan.gpus, 1), ("train.lr_scaling", train.lr_scaling, "none")] if value != want]
    if problems:
        raise ConfigError(f"--gpt compares one recipe on both sides; not {problems[0]}")
    return plan


def prepare(repo: Path, plan: Any) -> tuple[Path, int]:
    """Write the runner's split into the checkout's data/DATASET in nanoGPT's prepare.py layout: train.bin and val.bin
    (uint16 ids) and meta.pkl (vocab_size, stoi, itos), from the runner's own streams and vocabulary; return the folder
    and the validation windows the runner evaluates (all, or data.test_limit)."""
    stream, folder = plan.data.load(plan.train.seed), repo / "data" / DATASET
    windows = min(stream.test_size, plan.data.test_limit or stream.test_size)
    meta = {"vocab_size": len(VOCABULARY), "itos": dict(enumerate(VOCABULARY)),
            "stoi": {c: i for i, c in enumerate(VOCABULARY)}}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stream.train_ids.astype(np.uint16).tofile(folder / "train.bin")
        stream.test_ids.astype(np.uint16).tofile(folder / "val.bin")
        (folder / "meta.pkl").write_bytes(pickle.dumps(meta))
    except OSError as e:
        raise ConfigError(f"--nanogpt {repo}: cannot write data/{DATASET} there ({e.strerror}); give a writable "
                          "checkout") from None
    return folder, windows


def nanogpt_flags(plan: Any, compile_: str, out_dir: str) -> list[str]:
    """nanoGPT's train.py flags for the runner's recipe (its README's CPU run, float32), saving one checkpoint
    after the last step and evaluating (its own random windows, untimed) only at the start and the end."""
    train, iters = plan.train, int(plan.train.steps)
    layers, heads, channels, dropout = SIZES[plan.model.variant]
    recipe = {"dataset": DATASET, "device": "cpu", "dtype": "float32", "compile": compile_.capitalize(),
              "batch_size": train.global_batch_size, "block_size": plan.data.sequence_length,
              "gradient_accumulation_steps": 1, "n_layer": layers, "n_head": heads, "n_embd": channels,
              "dropout": dropout, "bias": False, "learning_rate": train.learning_rate,
              "min_lr": train.min_learning_rate, "beta2": train.beta2, "weight_decay": train.weight_decay,
              "grad_clip": train.clip_norm or 0.0, "warmup_iters": train.lr_warmup_steps,
              "decay_lr": train.lr_schedule == "cosine", "max_iters": iters, "lr_decay_iters": iters,
              "eval_interval": iters, "eval_iters": 20, "log_interval": 1, "always_save_checkpoint": True,
              "out_dir": out_dir, "wandb_log": False}
    return [f"--{key}={value}" for key, value in recipe.items()]


def timed_rate(stdout: str, warmup: int, iters: int, tokens_per_iter: int) -> float | None:
    """nanoGPT's tokens/s over its iterations warmup..iters-1 (their printed ms), None if it printed none of them."""
    ms = [float(t) for i, t in ITERATION.findall(stdout) if warmup <= int(i) < iters]
    return len(ms) * tokens_per_iter / (sum(ms) / 1000) if ms and sum(ms) > 0 else None


def nanogpt_job(python: str, repo: Path, plan: Any, compile_: str, windows: int) -> dict:
    """nanoGPT's train.py in a fresh process, then its checkpoint on the runner's validation windows:
    {'rate', 'unit', 'test_loss'}, or {'error': ...}."""
    iters, length = int(plan.train.steps), int(plan.data.sequence_length)
    with tempfile.TemporaryDirectory(prefix="nanogpt-") as out_dir:
        proc = subprocess.run([python, "train.py", *nanogpt_flags(plan, compile_, out_dir)], cwd=repo,
                              capture_output=True, text=True)
        rate = timed_rate(proc.stdout, per_call(iters), iters, plan.train.global_batch_size * length)
        if proc.returncode != 0:
            return {"error": last_line(proc.stderr + proc.stdout, f"exit {proc.returncode}").strip()}
        if rate is None:
            return {"error": f"train.py printed no iteration times for iterations {per_call(iters)}-{iters - 1}"}
        score = subprocess.run([python, str(EVAL_SCRIPT), "--checkout", str(repo), "--ckpt",
                                str(Path(out_dir) / "ckpt.pt"), "--val", str(repo / "data" / DATASET / "val.bin"),
                                "--length", str(length), "--windows", str(windows)], capture_output=True, text=True)
        if score.returncode != 0:
            return {"error": last_line(score.stderr + score.stdout, f"exit {score.returncode}").strip()}
    return {"rate": rate, "unit": "tokens", "test_loss": json.loads(score.stdout.strip().splitlines()[-1])["loss"]}


def _measure(args: argparse.Namespace, repo: Path, python: str, plan: Any, windows: int) -> dict[str, list[dict]]:
    """Every round: the runner, then nanoGPT at each --compile setting, each in a fresh process."""
    overrides = runner_overrides(args.iters, args.override)
    names = ["runner", *(peer_name(setting) for setting in args.compile)]
    progress, got = Progress(len(names) * args.rounds), {name: [] for name in names}
    with sweep(args.tracking_uri, "bench_peers") as bench:
        for r in range(args.rounds):
            got["runner"].append(progress.run("gpt runner", lambda: run_job(overrides, bench, r)))
            for setting in args.compile:
                run = lambda: nanogpt_job(python, repo, plan, setting, windows)  # noqa: E731
                got[peer_name(setting)].append(progress.run(f"gpt {peer_name(setting)}", run))
    return got


def peer_name(setting: str) -> str:
    """A nanoGPT setting's column name."""
    return f"nanoGPT --compile={setting.capitalize()}"


def round_rows(got: dict[str, list[dict]]) -> tuple[list[str], list[float]]:
    """One table row per round (tokens/s of each, runner / faster nanoGPT, validation loss of each), then the rounds'
    medians (lowest-highest); and the rounds' ratios."""
    peers_, figures = [name for name in got if name != "runner"], (("rate", ",.0f"), ("test_loss", ".4f"))
    rows, ratios = [], []
    for i, ours in enumerate(got["runner"]):
        theirs = [got[name][i].get("rate") for name in peers_]
        ratio = ours["rate"] / max(r for r in theirs if r) if ours.get("rate") and any(theirs) else None
        ratios += [ratio] if ratio else []
        rates, losses = ([cell(got[name][i], key, fmt) for name in got] for key, fmt in figures)
        rows.append(markdown_row([str(i + 1), *rates, f"{ratio:.2f}" if ratio else "-", *losses]))
    rates, losses = ([medians(runs, figure)[0] for runs in got.values()] for figure in figures)
    return [*rows, markdown_row(["median", *rates, median_range(ratios, ".2f"), *losses])], ratios


def _medians(got: dict[str, list[dict]], key: str) -> dict[str, float]:
    """Each job's median of `key` over the rounds where it measured it."""
    found = {name: [m[key] for m in runs if key in m] for name, runs in got.items()}
    return {name: statistics.median(vals) for name, vals in found.items() if vals}


def verdict(got: dict[str, list[dict]], ratios: list[float]) -> tuple[list[str], bool]:
    """Which nanoGPT setting is faster here (or which failed), and the target: runner / faster nanoGPT >= TARGET by
    median and the runner's validation loss within LOSS_MARGIN of that setting's."""
    rates, losses = _medians(got, "rate"), _medians(got, "test_loss")
    lines = [f"- {name} failed here: {errors[0][:160]}" for name, runs in got.items()
             if (errors := [m["error"] for m in runs if "error" in m])]
    peers_ = {name: rate for name, rate in rates.items() if name != "runner"}
    if not peers_ or "runner" not in rates or not ratios:
        return [*lines, "Target: nothing to compare: FAIL"], False
    fastest = max(peers_, key=peers_.get)
    lines.append(f"- nanoGPT's faster setting here: {fastest.removeprefix('nanoGPT ')} (median "
                 + ", ".join(f"{name.removeprefix('nanoGPT ')} {rate:,.0f}" for name, rate in peers_.items())
                 + " tokens/s)")
    ok_speed = statistics.median(ratios) >= TARGET
    ok_loss = "runner" in losses and fastest in losses and losses["runner"] <= losses[fastest] + LOSS_MARGIN
    lines.append(f"Target: runner / {fastest} >= {TARGET:.2f} by median ({statistics.median(ratios):.2f}) and "
                 f"validation loss <= its + {LOSS_MARGIN} ({cell(losses, 'runner', '.4f')} vs "
                 f"{cell(losses, fastest, '.4f')}): {'PASS' if ok_speed and ok_loss else 'FAIL'}")
    return lines, ok_speed and ok_loss


def gpt_peers(args: argparse.Namespace) -> int:
    """The runner's GPT against nanoGPT in `args.rounds` interleaved rounds; 0 when the target is met, else 1."""
    repo = checkout(args.nanogpt)  # every refusal before any job
    python, torch_version = interpreter(args.python)
    if args.iters < MIN_ITERS:
        raise ConfigError(f"--iters {args.iters}: at least {MIN_ITERS} (the first steps are warm-up)")
    if not args.compile or any(v not in ("false", "true") for v in args.compile):
        raise ConfigError(f"--compile {','.join(args.compile)}: a list of false and true (nanoGPT's --compile)")
    plan = runner_plan(runner_overrides(args.iters, args.override))
    folder, windows = prepare(repo, plan)
    t0 = time.perf_counter()
    got = _measure(args, repo, python, plan, windows)
    rows, ratios = round_rows(got)
    warmup, length, batch = per_call(args.iters), plan.data.sequence_length, plan.train.global_batch_size
    out: list[str] = []
    emit(out, [f"## The runner's GPT against nanoGPT: {args.rounds} rounds, {stamp()}", "",
               f"gpt/{plan.model.variant} on the runner's Shakespeare ({folder}), {args.iters} steps of {batch} x "
               f"{length} tokens, float32, the same recipe on both sides; nanoGPT {repo} on torch {torch_version}; "
               f"each job a fresh process, {len(got) * args.rounds} jobs in {time.perf_counter() - t0:.0f} s. "
               f"tokens/s: steps {warmup}-{args.iters - 1} (the runner's timed calls; nanoGPT's printed iteration "
               f"times). Validation loss: the mean over all {windows * length:,} tokens of the runner's {windows:,} "
               "validation windows, nanoGPT's checkpoint scored on the same. The ratio is per round, the runner "
               "over the faster nanoGPT setting.", "",
               *markdown(["round", *(f"{name} tokens/s" for name in got), "runner / faster nanoGPT",
                          *(f"{name} val loss" for name in got)]), *rows])
    lines, ok = verdict(got, ratios)
    emit(out, ["", *lines])
    save(out, args.out)
    return 0 if ok else 1
