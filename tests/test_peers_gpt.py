"""`peers --gpt` (runner/bench/nanogpt.py) without torch: the prepare.py layout it writes for nanoGPT is the runner's
own text, vocabulary and split; nanoGPT's flags are the runner's recipe; its job is parsed as described; bad
arguments are one `error:` line, exit 2. The bench itself needs a nanoGPT checkout and a torch venv: not here."""

from __future__ import annotations

import pickle
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import called

from runner.bench import nanogpt
from runner.bench.__main__ import main


def _fake_checkout(folder: Path, train: str = "") -> Path:
    """A folder with the files the bench looks for; `train` is train.py's text."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.py", "configurator.py"):
        (folder / name).write_text("")
    (folder / "train.py").write_text(train)
    return folder


def test_the_written_layout_decodes_to_the_runners_own_split_and_vocabulary(tmp_path):
    from runner.data_pipelines import shakespeare_files
    from runner.data_pipelines.shakespeare import VOCABULARY

    plan = nanogpt.runner_plan(nanogpt.runner_overrides(2000, []))
    folder, windows = nanogpt.prepare(tmp_path, plan)
    assert folder == tmp_path / "data" / nanogpt.DATASET
    meta = pickle.loads((folder / "meta.pkl").read_bytes())
    assert meta["vocab_size"] == len(VOCABULARY) == 84
    assert "".join(meta["itos"][i] for i in range(84)) == VOCABULARY
    assert all(meta["stoi"][c] == i for i, c in enumerate(VOCABULARY))
    decoded = {name: "".join(meta["itos"][int(i)] for i in np.fromfile(folder / f"{name}.bin", dtype=np.uint16))
               for name in ("train", "val")}
    text = shakespeare_files.complete_works()
    cut = int(len(text) * (1 - 0.1))  # data_pipelines/text.py's split_by_position: the first 90% trains
    assert decoded["train"] == text[:cut] and decoded["val"] == text[cut:]
    assert windows == (len(text) - cut - 1) // 64  # every consecutive validation window the runner evaluates


def test_nanogpts_flags_are_the_runners_recipe():
    plan = nanogpt.runner_plan(nanogpt.runner_overrides(2000, []))
    assert (plan.train.steps, plan.train.steps_per_call, plan.train.lr_warmup_steps) == (2000, 50, 100)
    flags = set(nanogpt.nanogpt_flags(plan, "false", "/tmp/out"))
    assert {"--device=cpu", "--dtype=float32", "--compile=False", "--block_size=64", "--batch_size=12",
            "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0", "--learning_rate=0.001",
            "--min_lr=0.0001", "--beta2=0.99", "--weight_decay=0.1", "--grad_clip=1.0", "--warmup_iters=100",
            "--max_iters=2000", "--lr_decay_iters=2000", "--eval_interval=2000", "--always_save_checkpoint=True",
            "--dataset=runner_shakespeare", "--out_dir=/tmp/out", "--gradient_accumulation_steps=1"} <= flags
    tiny = nanogpt.runner_plan(nanogpt.runner_overrides(30, ["model.variant=tiny"]))
    assert {"--n_layer=2", "--n_embd=32", "--max_iters=30", "--warmup_iters=1", "--compile=True"} <= set(
        nanogpt.nanogpt_flags(tiny, "true", "o"))
    assert tiny.train.steps_per_call == nanogpt.per_call(30) == 6


def test_nanogpts_rate_counts_the_runners_timed_steps_only():
    lines = [f"iter {i}: loss 3.5000, time {5000 if i in (0, 4) else 10}.00ms, mfu 0.01%" for i in range(5)]
    out = "step 0: train loss 4.4, val loss 4.4\n" + "\n".join(lines)
    assert nanogpt.timed_rate(out, 1, 4, 768) == pytest.approx(3 * 768 / 0.030)  # iterations 1-3
    assert nanogpt.timed_rate("no iterations", 1, 4, 768) is None


FAKE_TRAIN = textwrap.dedent("""
    import os, sys
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    assert flags["dataset"] == "runner_shakespeare" and os.path.isfile("data/runner_shakespeare/val.bin")
    for i in range(int(flags["max_iters"]) + 1):
        print(f"iter {i}: loss 3.0, time {'900' if i in (0, int(flags['max_iters'])) else '20'}.00ms, mfu 1.00%")
    open(os.path.join(flags["out_dir"], "ckpt.pt"), "w").write("")
""")


def test_a_nanogpt_job_trains_scores_and_reports_in_fresh_processes(tmp_path, monkeypatch):
    repo = _fake_checkout(tmp_path / "nanoGPT", FAKE_TRAIN)
    plan = nanogpt.runner_plan(nanogpt.runner_overrides(30, ["data.test_limit=10"]))
    _, windows = nanogpt.prepare(repo, plan)
    score = tmp_path / "score.py"  # nanogpt_eval.py needs torch: a stand-in that checks what it is given
    score.write_text("import json, sys, os\nargs = sys.argv[1:]\n"
                     "assert os.path.isfile(args[args.index('--ckpt') + 1])\n"
                     "print(json.dumps({'loss': 2.5, 'windows': int(args[args.index('--windows') + 1])}))\n")
    monkeypatch.setattr(nanogpt, "EVAL_SCRIPT", score)
    got = nanogpt.nanogpt_job(sys.executable, repo, plan, "false", windows)
    assert windows == 10 and got == {"rate": pytest.approx(768 / 0.020), "unit": "tokens", "test_loss": 2.5}
    (repo / "train.py").write_text("import sys\nsys.exit('compile failed: no C++ compiler')\n")
    assert nanogpt.nanogpt_job(sys.executable, repo, plan, "true", windows) == {
        "error": "compile failed: no C++ compiler"}


def test_the_table_names_the_faster_setting_and_a_failed_one():
    got = {"runner": [{"rate": 110.0, "test_loss": 1.89}, {"rate": 90.0, "test_loss": 1.87}],
           "nanoGPT --compile=False": [{"rate": 100.0, "test_loss": 1.88}, {"rate": 100.0, "test_loss": 1.88}],
           "nanoGPT --compile=True": [{"error": "torch._inductor failed"}, {"error": "torch._inductor failed"}]}
    rows, ratios = nanogpt.round_rows(got)
    assert ratios == [1.1, 0.9] and rows[0] == "| 1 | 110 | 100 | - | 1.10 | 1.8900 | 1.8800 | - |"
    assert rows[-1].startswith("| median | 100 (90-110) | 100 (100-100) | - | 1.00 (0.90-1.10) |")
    lines, ok = nanogpt.verdict(got, ratios)
    assert "- nanoGPT --compile=True failed here: torch._inductor failed" in lines
    assert "faster setting here: --compile=False" in lines[1] and lines[-1].endswith("PASS") and ok


@pytest.mark.parametrize("argv, says", [
    (["--nanogpt", "{tmp}/missing", "--python", sys.executable], "--nanogpt {tmp}/missing: no train.py there"),
    (["--nanogpt", "{tmp}/nanoGPT", "--python", "{tmp}/venv/bin/python"], "--python {tmp}/venv/bin/python: no such"),
    (["--python", sys.executable], "--gpt needs --nanogpt DIR"),
    (["--nanogpt", "{tmp}/nanoGPT"], "--gpt needs --python PATH"),
])
def test_bad_arguments_are_one_error_line(tmp_path, capsys, argv, says):
    _fake_checkout(tmp_path / "nanoGPT")
    code, out, err = called(capsys, main, "peers", "--gpt", *[a.format(tmp=tmp_path) for a in argv])
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and says.format(tmp=tmp_path) in errors[0] and not out
