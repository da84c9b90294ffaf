"""`runner check` on simulated CPU devices: the table, the verdict line, the exit status and the MLflow record,
for real strategies and for a deliberately broken one brought in through `--config-dir`."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import mlflow
import pytest
from conftest import REPO, compose, markdown_rows, run_cli, subcommand

from runner.cli.check import Outcome, judge
from runner.config import validate

# A test-only strategy with the classic data-parallel bug: every copy applies its own tower's gradient, never the
# average over towers. It runs, it learns, and it does not learn what one device learns. And one that takes its
# process down as it is built (a crash in TensorFlow's C++ would), with the combinations after it.
BROKEN = '''
import io
import json
import os
from dataclasses import dataclass

import tensorflow as tf

from runner.strategies.common import steps_loop
from runner.strategies.replicated import Replicated, Towers, tower_gradients


class OwnGradients(Towers):
    def train_loop(self, batches):
        def step():
            losses = []
            for i, (x, y) in enumerate(batches.next()):
                loss, grads = tower_gradients(self.models[i], x, y, self.devices[i], self.loss_scale, self.training)
                with tf.device(self.devices[i]):
                    self.optimizers[i].apply_gradients(zip(grads, self.models[i].trainable_variables))
                losses.append(loss)
            return tf.add_n(losses) / len(losses)

        return steps_loop(step)


@dataclass
class NoAverage(Replicated):
    name: str = "no_average"

    def build(self, devices, training):
        return OwnGradients(list(devices.names), training)


@dataclass
class Crashes(Replicated):
    name: str = "crashes"

    def build(self, devices, training):
        os._exit(3)
'''


@pytest.fixture
def broken(tmp_path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "broken_strategy.py").write_text(BROKEN)
    (tmp_path / "conf" / "strategy").mkdir(parents=True)
    (tmp_path / "conf" / "strategy" / "no_average.yaml").write_text("_target_: broken_strategy.NoAverage\n")
    (tmp_path / "conf" / "strategy" / "crashes.yaml").write_text("_target_: broken_strategy.Crashes\n")
    return tmp_path


def _check(folder: Path, *args: str):
    env = {"PYTHONPATH": os.pathsep.join([str(folder / "code"), str(REPO)])}
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    return run_cli("check", *args, f"mlflow.tracking_uri={uri}", cwd=folder, env=env, timeout=900), uri


def _rows(stdout: str) -> dict[str, dict[str, str]]:
    """The table's rows by combination."""
    return {row["combination"]: row for row in markdown_rows(stdout)}


@pytest.mark.slow  # three combinations checked end to end, in two processes: ~25 s
def test_check_fails_a_strategy_that_skips_the_gradient_average_and_passes_the_real_one(broken):
    """The combinations share a process: a strategy that takes it down fails its own row, and a new process measures
    the ones after it (placement counted per combination, as in a process of its own)."""
    proc, uri = _check(broken, "--config-dir", str(broken / "conf"), "gpus=2", "strategy=no_average,crashes,replicated",
                       "pipeline=split")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = _rows(proc.stdout)
    assert rows["replicated / split"]["result"] == "OK"
    assert rows["replicated / split"]["matmuls/convs per device"] == "CPU:0 8, CPU:1 8"
    assert rows["no_average / split"]["result"].startswith("loss differs from one device by")  # placement is fine
    assert rows["no_average / split"]["matmuls/convs per device"] == "CPU:0 8, CPU:1 8"  # a tower's matmuls on each device
    assert rows["crashes / split"]["result"].startswith("exit 3")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("check: 1 of 3 combinations OK; failed: no_average / split, crashes / split"), last
    run = mlflow.MlflowClient(uri).get_run(last.rsplit("mlflow run ", 1)[1].rstrip(")"))
    assert run.info.status == "FINISHED" and run.data.metrics["combinations_ok"] == 1
    assert run.data.tags["devices.count"] == "2" and run.data.tags["devices.simulated"] == "true"
    metrics = run.data.metrics
    assert metrics["max_loss_diff.no_average_split"] > 1e-3 > metrics["max_loss_diff.replicated_split"]
    text = Path(mlflow.MlflowClient(uri).download_artifacts(run.info.run_id, "check.md", str(broken))).read_text()
    assert "| no_average / split |" in text


# Every combination at 4 devices (18, in one process). At 2 devices `runner check` itself is tested above
# (a broken strategy fails, the real one passes), and every strategy x pipeline's loss sequence against one device's
# is the default suite's (tests/test_strategies.py, tests/test_pipelines.py, tests/test_text.py).
@pytest.mark.long
@pytest.mark.slow
def test_check_on_simulated_devices_prints_the_table_and_exits_0(tmp_path):
    from runner.data_pipelines import PIPELINES
    from runner.strategies import STRATEGIES

    gpus = 4
    proc, _ = _check(tmp_path, f"gpus={gpus}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(proc.stdout)
    devices = [f"CPU:{i}" for i in range(gpus)]
    for label, row in rows.items():
        if label.startswith("one device"):
            continue
        assert row["result"] == "OK", row
        assert [part.split()[0] for part in row["matmuls/convs per device"].split(", ")] == devices  # every device computes
    # every strategy of one process that takes 4 devices (not single) with every pipeline: 6 x 3
    takers = [n for n in STRATEGIES.names() if STRATEGIES.get(n).takes(gpus) and not STRATEGIES.get(n).multi_process]
    expected = len(takers) * len(PIPELINES.names())
    assert expected == 18 and len(rows) == expected + 1
    assert f"check: {expected} of {expected} combinations OK" in proc.stdout


def test_judge_names_idle_devices_stray_compute_and_loss_drift():
    reference = Outcome("one", losses=[2.0, 1.0])
    good = Outcome("a", losses=[2.0, 1.0 + 1e-6], devices=["GPU:0", "GPU:1"], compute={"GPU:0": 8, "GPU:1": 8},
                   variables=["GPU:0", "GPU:1"])
    judge(good, reference, 1e-4)
    assert good.ok and good.diff == pytest.approx(1e-6)
    fell_back = Outcome("b", losses=[2.0, 1.0], devices=["GPU:0", "GPU:1"], compute={"GPU:0": 8, "CPU:0": 8},
                        variables=["GPU:0", "GPU:1"])
    judge(fell_back, reference, 1e-4)
    assert fell_back.problems == ["no compute on GPU:1", "compute on CPU:0, not a device of the run"]
    drifted = Outcome("c", losses=[2.0, 1.1], devices=["GPU:0"], compute={"GPU:0": 8}, variables=["GPU:0"])
    judge(drifted, reference, 1e-4)
    assert drifted.problems == ["loss differs from one device by 1.0e-01 (tolerance 0.0001)"]


def test_a_model_computing_per_tower_is_checked_on_placement_and_rate_and_says_why():
    """A user's model with Dropout (or batch normalization) failed every row, 'loss differs from one device', which
    the README calls a bug to report: its towers draw their own masks and batch statistics."""
    reference = Outcome("one", losses=[2.0, 1.0], per_tower=["Dropout"])
    noisy = Outcome("a", losses=[2.0, 1.2], devices=["GPU:0", "GPU:1"], compute={"GPU:0": 8, "GPU:1": 8},
                    variables=["GPU:0", "GPU:1"], per_tower=["Dropout"])
    judge(noisy, reference, 1e-4)
    assert noisy.ok and noisy.note == ("losses not compared: the model's Dropout computes per tower (dropout masks, "
                                       "batch statistics)")
    idle = Outcome("b", losses=[2.0, 1.2], devices=["GPU:0", "GPU:1"], compute={"GPU:0": 8}, per_tower=["Dropout"])
    judge(idle, reference, 1e-4)
    assert idle.problems == ["no compute on GPU:1"]  # placement is still checked


def test_the_layers_computing_per_tower_are_found_in_a_users_model(tf_devices):
    from runner.cli.check import per_tower_layers

    plan = validate(compose("debug=smoke", "+model._target_=user_models.dropout_mlp"))
    assert per_tower_layers(plan) == ["Dropout"]
    assert per_tower_layers(validate(compose("debug=smoke"))) == []


@pytest.mark.parametrize("args, said", [
    (["gpus=2,4"], "error: gpus=2,4: runner check takes one device count"),
    (["gpus=abc"], "error: gpus=abc is not allowed; expected an integer from 0 to 16"),  # was: 'one device count'
    (["gpus=99"], "error: gpus=99 is not allowed; expected an integer from 0 to 16"),  # was: 0 of 0 checked
    (["train.stepz=5"], "error: "),
    (["strategy=single", "gpus=2"],  # was: the reference ran, then 'check: 0 of 0 combinations OK', exit 1
     "error: nothing to check with gpus=2: single (every pipeline checked): strategy=single needs gpus from 0 to 1"),
    # was: 'nothing to check', then the same refusal once per strategy (nine times)
    (["train.precision=float8"], "error: train.precision='float8' is not allowed; choose one of: float32,"),
    (["hardware=dgx1_p100"], "error: hardware=dgx1_p100 is a spec sheet that `runner predict` prices; a run trains"),
])
def test_a_bad_override_of_runner_check_is_one_line(capsys, args, said):
    code, _, err = subcommand(capsys, "check", *args)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and err.startswith(said), err


@pytest.mark.parametrize("args, said", [
    (["--tolerance", "-1"], "argument --tolerance: -1 is not a finite number >= 0"),
    (["--tolerance", "nan"], "argument --tolerance: nan is not a finite number >= 0"),
    (["--steps", "0"], "argument --steps: 0 is not a positive count"),
    (["--timed", "-5"], "argument --timed: -5 is not a positive count"),
])
def test_a_tolerance_or_count_runner_check_cannot_use_is_refused_before_anything_runs(capsys, args, said):
    """Was: every combination ran (about a minute), then all failed (a negative or NaN tolerance, no steps), or a
    negative timed call passed silently."""
    code, out, err = subcommand(capsys, "check", *args)
    assert code == 2 and out == "" and err.strip() == f"error: {said}", err  # was after argparse's usage


PLACED = "I0000 placer.cc:162] {node}: ({op}): /job:localhost/replica:0/task:0/device:{device}\n"


class _LaggingChild:
    """A stand-in for the child process whose stdout brings both results while its stderr holds the first
    combination's placer log only: the second's has not reached the file yet (a busy host)."""

    def __init__(self, cmd, stdin, stdout, stderr, text, env):
        from runner.cli.check import BEGIN, RESULT

        stderr.write(f"{BEGIN}first\n" + PLACED.format(node="a", op="MatMul", device="CPU:0"))
        stderr.flush()
        results = [{"losses": [1.0], "compute": {"CPU:0": 1}}, {"losses": [1.0], "compute": {"CPU:1": 2}}]
        self.stdin, self.returncode = io.StringIO(), 0
        self.stdout = io.StringIO("".join(RESULT + json.dumps(r) + "\n" for r in results))

    def wait(self) -> int:
        return 0


def test_placements_come_with_each_result_not_from_a_log_the_child_may_still_be_writing(monkeypatch):
    """#61 item 11: `runner check gpus=2` died at its 17th of 18 combinations (IndexError) reading the child's
    placer log for a combination whose part had not reached the file."""
    from runner.cli import check

    monkeypatch.setattr(check.subprocess, "Popen", _LaggingChild)
    found = [check.Combination("first", []), check.Combination("second", [])]
    outcomes = list(check._one_process(found, steps=1, timed=1))
    assert [(o.label, o.compute, o.error) for o in outcomes] == [("first", {"CPU:0": 1}, ""),
                                                                  ("second", {"CPU:1": 2}, "")]


def test_the_child_counts_the_placements_logged_while_its_combination_ran(tmp_path, monkeypatch):
    """What the child carries in a RESULT: the matmuls and convolutions placed after the combination began, none
    of an earlier combination's, and the error of one that failed with what it placed before failing."""
    from runner.cli import check

    log_path = tmp_path / "stderr.log"
    log_path.write_text(PLACED.format(node="old", op="MatMul", device="CPU:3"))  # an earlier combination's

    def measure(overrides, steps, timed):
        with log_path.open("a") as stderr:  # TensorFlow's placer, writing to the child's stderr
            stderr.write(PLACED.format(node="m", op="MatMul", device="CPU:0")
                         + PLACED.format(node="c", op="Conv2D", device="CPU:1")
                         + PLACED.format(node="r", op="Relu", device="CPU:1"))
        if overrides == ["bad"]:
            raise ValueError("no such thing")
        return {"losses": [0.5]}

    monkeypatch.setattr(check, "measure", measure)
    with log_path.open() as log:
        good = check.measured(["good"], 1, 1, log)
        bad = check.measured(["bad"], 1, 1, log)
    assert good == {"losses": [0.5], "compute": {"CPU:0": 1, "CPU:1": 1}}
    assert bad == {"error": "ValueError: no such thing", "compute": {"CPU:0": 1, "CPU:1": 1}}


TOKENS = ["model=gpt", "data=synthetic", "data.task=next_token", "data.vocabulary_size=50", "data.sequence_length=16"]


def test_a_language_models_check_counts_tokens_per_second_in_its_table_and_its_record(tf_devices, monkeypatch,
                                                                                       store):
    """#61 item 4: a GPT's 64 sequences of 16 tokens a step were shown as 'images/s'. Each call of the stand-in
    loop takes 1 s of the check's clock."""
    import argparse
    import types

    from runner import experiment
    from runner.cli import check

    clock = types.SimpleNamespace(now=0.0)

    def loop(n):
        clock.now += 1.0
        return 1.0, int(n)

    strategy = types.SimpleNamespace(batches=lambda *a: None, train_loop=lambda batches: loop,
                                     variable_devices=lambda: {"w": "/device:CPU:0"}, describe=lambda: {})
    devices = types.SimpleNamespace(names=("/device:CPU:0",), as_tags=lambda: {"devices.count": "1"})
    monkeypatch.setattr(experiment, "build", lambda plan, run, log_placement: types.SimpleNamespace(
        strategy=strategy, devices=devices, examples=None))
    monkeypatch.setattr(check, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    result = check.measure([*check.BASE, *TOKENS, *check.one_device()], steps=2, timed=3)
    assert (result["unit"], result["rate"]) == ("tokens", 3 * 64 * 16)  # 3 steps of 64 sequences of 16 tokens in 1 s

    reference = check.Outcome("one device: single / split", **{k: result[k] for k in ("losses", "rate", "unit")})
    text = check.table([], reference)
    assert markdown_rows(text)[0]["tokens/s (1 call)"] == "3,072" and "images" not in text
    args = argparse.Namespace(steps=2, timed=3, tolerance=1e-3, overrides=TOKENS)
    run_id = check._record([], reference, text, args, 1, [*check.BASE, f"mlflow.tracking_uri={store}"])
    metrics = mlflow.MlflowClient(store).get_run(run_id).data.metrics
    assert metrics["tokens_per_sec.one_device_single_split"] == 3072 and not any("images" in k for k in metrics)
