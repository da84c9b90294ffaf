"""Figures that say what they are (#61): a resumed run's time to target counts every part's training time (or the
run says it cannot be timed), and what `runner check`, the MLflow UI's view and the README show of a run reads its
own unit and target."""

from __future__ import annotations

import json
import signal
import time
import types

import mlflow
import pytest
from conftest import compose, runs, start_cli

STEPS, EVERY, KILLED_AT = 100, 20, 70  # a run of 100 steps, checkpoints every 20, a kill at step 70


class Killed(Exception):
    """The process died mid-call (SIGKILL, a lost node): nothing after it runs."""


class Clock:
    """runner.train's perf_counter, advanced by the fake strategy alone: a training step takes 1 s and an evaluation
    100 s, so every training time below is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Strategy:
    """Just what `train.fit` calls: a loop of 1-s steps that dies at `killed_at`, and evaluations whose accuracy
    reaches 0.9 from step `reached_at` on (0.1 before)."""

    def __init__(self, clock: Clock, step: int, reached_at: int, killed_at: int | None = None):
        self.clock, self.step, self.reached_at, self.killed_at = clock, step, reached_at, killed_at

    def train_loop(self, batches):
        def loop(n):
            if self.killed_at is not None and self.step + int(n) > self.killed_at:
                raise Killed(f"killed at step {self.killed_at}")
            self.clock.now += int(n)
            self.step += int(n)
            return 0.5, int(n)

        return loop

    def input_loop(self, batches):
        return lambda n: (0.0, int(n))

    def evaluate(self, dataset):
        self.clock.now += 100.0
        return {"loss": 1.0, "accuracy": 0.9 if self.step >= self.reached_at else 0.1}


@pytest.fixture
def clock(monkeypatch) -> Clock:
    from runner import train

    fake = Clock()
    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=fake, time=time.time,
                                                              monotonic=time.monotonic))
    return fake


def _part(tmp_path, clock: Clock, reached_at: int, killed_at: int | None = None):
    """One process's part of a run with checkpoints (resumed from the folder's newest, if any): (its result, or
    None where it was killed; its Evaluations)."""
    import tensorflow as tf

    from runner.checkpoints import Checkpointer
    from runner.config import validate
    from runner.train import Evaluations, Target, fit

    plan = validate(compose("debug=smoke", f"train.steps={STEPS}", "train.steps_per_call=10"))
    checkpointer = Checkpointer(tmp_path, EVERY, {"model": tf.Variable([0.0])}, "part")
    start, _ = checkpointer.restore()
    strategy = Strategy(clock, start, reached_at, killed_at)
    evals = Evaluations(strategy, "full", "checks", lambda metrics, step: None, Target("accuracy", 0.5), 0, 10)
    try:
        return fit(strategy, None, evals, plan.train, STEPS, evals.record, start, [checkpointer]), evals
    except Killed:
        return None, evals


def test_a_run_killed_after_its_target_and_resumed_reports_the_first_parts_time(tf_devices, tmp_path, clock):
    """Reached at step 30 after 30 s of training; killed at step 70, resumed from the checkpoint at step 60. Was:
    the resumed part's first check (step 70, 10 s into the part) timed the run."""
    killed, _ = _part(tmp_path, clock, reached_at=30, killed_at=KILLED_AT)
    assert killed is None
    resumed, evals = _part(tmp_path, clock, reached_at=30)
    assert resumed["resumed_from_step"] == 60 and resumed["steps_to_accuracy"] == 30
    assert resumed["time_to_accuracy_seconds"] == 30.0
    assert evals.tags() == {"target.reached": "true"}


def test_a_target_met_at_a_runs_first_check_is_said_and_a_later_or_resumed_one_not(tf_devices, tmp_path, clock):
    """The report ranks nothing by a time to target every run met at its first check (the start-up's time): the
    run says so (`tasks.FIRST_CHECK`), not of a later check, nor of a resumed part's first one (steps 61-70)."""
    from runner.tasks import FIRST_CHECK

    first, _ = _part(tmp_path / "a", clock, reached_at=10)
    later, _ = _part(tmp_path / "b", clock, reached_at=30)
    assert (first["steps_to_accuracy"], first[FIRST_CHECK]) == (10, 1.0) and later[FIRST_CHECK] == 0.0
    _part(tmp_path / "c", clock, reached_at=KILLED_AT, killed_at=KILLED_AT)
    resumed, _ = _part(tmp_path / "c", clock, reached_at=KILLED_AT)
    assert resumed["resumed_from_step"] == 60 and (resumed["steps_to_accuracy"], resumed[FIRST_CHECK]) == (70, 0.0)


def test_a_target_reached_after_a_resume_counts_every_parts_training_time(tf_devices, tmp_path, clock):
    """60 s of training saved with the checkpoint at step 60, then 20 s to the target at step 80 (was: 20 s)."""
    _part(tmp_path, clock, reached_at=80, killed_at=KILLED_AT)
    resumed, _ = _part(tmp_path, clock, reached_at=80)
    assert (resumed["steps_to_accuracy"], resumed["time_to_accuracy_seconds"]) == (80, 80.0)
    assert resumed["train_seconds"] == 40.0  # this part's own training: steps 61 to 100


def test_a_run_resumed_from_a_checkpoint_without_its_training_time_says_it_cannot_be_timed(tf_devices, tmp_path,
                                                                                           clock, caplog):
    """A checkpoint an older runner saved (the state without the time): the target's step, and no seconds."""
    import tensorflow as tf

    from runner.cli.main import result_line

    tf.train.CheckpointManager(tf.train.Checkpoint(step=tf.Variable(60, dtype=tf.int64), model=tf.Variable([0.0])),
                               str(tmp_path), max_to_keep=2).save(checkpoint_number=60)
    resumed, evals = _part(tmp_path, clock, reached_at=30)
    assert resumed["resumed_from_step"] == 60 and resumed["steps_to_accuracy"] == 70
    assert "time_to_accuracy_seconds" not in resumed and resumed["target_accuracy"] == 0.5
    tags = evals.tags()
    assert tags["target.reached"] == "true" and "holds no training time" in tags["target.untimed"]
    assert "time to test accuracy 0.5 not measured: checkpoint" in caplog.text
    last = result_line({**resumed, "unit": "images", "run_id": "r", "wall_seconds": 1.0})
    assert "target 50% reached in 70 steps (time not known)" in last


def test_a_run_says_its_target_to_the_digit_it_was_given():
    """train.target_accuracy=0.995 read "target 0.99 reached": not the level the run was timed to."""
    from runner.cli.main import result_line

    last = result_line({"unit": "images", "images_per_sec": 900.0, "target_accuracy": 0.995, "test_accuracy": 0.9952,
                        "time_to_accuracy_seconds": 3.0, "steps_to_accuracy": 40, "test_loss": 0.02, "steps": 50,
                        "wall_seconds": 4.0, "run_id": "r"})
    assert "test accuracy 0.9952" in last and "target 99.5% reached in 3.0 s (40 steps)" in last


def _first_part_until_checkpoint_after_target(folder, args) -> None:
    """Start the run, SIGKILL it once a checkpoint is saved after the target was reached."""
    proc = start_cli(*args, cwd=folder)
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None and time.time() < deadline, "the run ended before its second checkpoint"
        saved = list(folder.glob("checkpoints/*/run.json"))
        if saved and json.loads(saved[0].read_text())["step"] >= 200:  # the target (accuracy 0.6) by step ~60
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


def run_to_end(folder, args) -> str:
    """Run the same config again in `folder` (it resumes from the checkpoint) to its end: its MLflow run id."""
    from conftest import run_cli

    done = run_cli(*args, cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().rsplit("mlflow run ", 1)[1].split()[0]


@pytest.mark.slow  # a run SIGKILLed after its target and its resume, two processes: ~15 s
def test_a_sigkilled_run_resumed_is_timed_to_where_its_first_part_reached_the_target(tmp_path):
    args = ["debug=smoke", "train.steps=2000", "train.checkpoint_every=100", "train.measure_input=false",
            "train.target_accuracy=0.6", "train.check_every=10", "train.check_examples=256"]
    _first_part_until_checkpoint_after_target(tmp_path, args)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (killed,) = runs(uri, "smoke")["run_id"]
    client = mlflow.MlflowClient(uri)
    full = {m.step: m.value for m in client.get_metric_history(killed, "test_accuracy")}
    reached = min(step for step, value in full.items() if value >= 0.6)
    seconds = {m.step: m.value for m in client.get_metric_history(killed, "check_train_seconds")}[reached]

    resumed = run_to_end(tmp_path, args)
    metrics = client.get_run(resumed).data.metrics
    assert metrics["resumed_from_step"] >= 200 and metrics["steps_to_accuracy"] == reached
    assert metrics["time_to_accuracy_seconds"] == pytest.approx(seconds)
    assert client.get_run(resumed).data.tags["target.reached"] == "true"


def _view(uri: str, experiment: str) -> list[str]:
    """The columns of the experiment's runs view `runner`, as the MLflow UI reads them."""
    from runner.tracking import ui

    tag = mlflow.MlflowClient(uri).get_experiment_by_name(experiment).tags[ui.VIEW_TAG]
    return json.loads(json.loads(tag)["state"])["selectedColumns"]


GPT = ("model=gpt", "data=synthetic", "data.task=next_token", "data.vocabulary_size=50", "data.sequence_length=16",
       "train.target_loss=3.5")
TAGS = ["tags.`model`", "tags.`pipeline`", "tags.`strategy`", "tags.`devices.count`", "tags.`devices.kind`"]


def test_the_ui_view_shows_each_runs_own_rate_score_and_time_to_its_target(store):
    """#61 item 4: the view's columns were images/s, test accuracy and time to accuracy whatever the run. A language
    model's run shows tokens/s, its next-token accuracy, its validation loss and its time to that loss; a click
    model's run then adds examples/s, its AUC and its time to an AUC; an image classifier's adds its own."""
    from runner.config import validate
    from runner.tracking import tracked

    for overrides in (GPT, ("model=dlrm", "data=clicks", "train.target_auc=0.7"), ()):
        with tracked(store, validate(compose("debug=smoke", f"mlflow.tracking_uri={store}", *overrides))):
            pass
        if overrides == GPT:
            assert _view(store, "smoke") == ["metrics.`tokens_per_sec`", "metrics.`test_accuracy`",
                                             "metrics.`test_loss`", "metrics.`time_to_loss_seconds`", *TAGS]
    assert _view(store, "smoke") == [
        "metrics.`tokens_per_sec`", "metrics.`test_accuracy`", "metrics.`test_loss`", "metrics.`time_to_loss_seconds`",
        "metrics.`examples_per_sec`", "metrics.`test_auc`", "metrics.`time_to_auc_seconds`",
        "metrics.`images_per_sec`", "metrics.`time_to_accuracy_seconds`", *TAGS]


def test_an_experiment_with_the_old_view_gets_a_runs_own_columns_and_keeps_its_own(store):
    """An experiment whose view an older runner saved (images/s, accuracy, time to accuracy) gains a language
    model's columns when one of its runs starts (its validation loss, which its last line leads with, even without
    a target: was left out); one without a target gets no time column."""
    from runner.tasks import TASKS
    from runner.tracking import ui
    from runner.tracking.store import ensure_experiment

    old = ("metrics.`images_per_sec`", "metrics.`test_accuracy`", "metrics.`time_to_accuracy_seconds`")
    experiment = mlflow.MlflowClient(store).create_experiment("old", tags={ui.VIEW_TAG: ui.view_tag_value(old)})
    assert ensure_experiment(store, "old", ui.figures("tokens", TASKS["next_token"], None)) == experiment
    assert _view(store, "old") == [*old, "metrics.`tokens_per_sec`", "metrics.`test_loss`", *TAGS]


def test_a_sweeps_view_shows_the_keys_it_varies_besides_its_combinations(store, tmp_path):
    """Two jobs of one combination differing in train.precision had nothing to tell them apart in the view; the
    parent adds a column per such key (a group's choice by its name; not strategy or gpus, which the tags show)."""
    from runner import sweep

    overrides = ["debug=smoke", "strategy=mirrored,replicated", "gpus=2", "data=mnist,synthetic",
                 "train.precision=float32,mixed_bfloat16", "train.steps=20"]
    parent = sweep.open_parent(store, "swept", overrides, tmp_path / "sweep")
    sweep.close_open_parent("FINISHED")
    sweep.show_swept(store, parent, overrides)
    assert _view(store, "swept") == ["params.`data.name`", "params.`train.precision`", *TAGS]
