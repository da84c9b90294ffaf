"""Ctrl-C never cuts an MLflow write in half: the run's closing write must still get the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import compose
from mlflow.tracking import MlflowClient

from runner import tracking
from runner.config import validate


def _interrupted_mid_call(method):
    """`method`, with a SIGINT (what Ctrl-C sends) delivered to this process once it has begun."""

    def call(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # without the hold, KeyboardInterrupt is raised here, before the write
        return method(*args, **kwargs)

    return call


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt, as in a terminal, even when pytest was started where SIGINT is ignored (a
    background job of a non-interactive shell): Python then installs no handler of its own."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_a_metric_write_lets_the_write_finish_then_ends_the_run_killed(store, ctrl_c_raises):
    cfg = validate(compose("debug=smoke", f"mlflow.tracking_uri={store}"))
    with pytest.raises(KeyboardInterrupt):
        with tracking.tracked(store, cfg) as run:
            run.client.log_batch = _interrupted_mid_call(run.client.log_batch)
            run.metrics({"train_loss": 0.5}, 7)
            pytest.fail("the held Ctrl-C was not raised after the write")  # pragma: no cover
    client = MlflowClient(store)
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "train_loss")] == [(7, 0.5)]
    info = client.get_run(run.run_id)
    assert info.info.status == "KILLED"
    assert info.data.tags["error"] == "interrupted (KeyboardInterrupt)"


def test_ctrl_c_during_run_creation_still_ends_the_new_run_killed(store, ctrl_c_raises):
    cfg = validate(compose("debug=smoke", f"mlflow.tracking_uri={store}"))
    original = MlflowClient.create_run  # Run makes its own client: patch the class
    MlflowClient.create_run = _interrupted_mid_call(original)
    try:
        with pytest.raises(KeyboardInterrupt):
            with tracking.tracked(store, cfg):
                pytest.fail("the held Ctrl-C was not raised once the run existed")  # pragma: no cover
    finally:
        MlflowClient.create_run = original
    runs = MlflowClient(store).search_runs([MlflowClient(store).get_experiment_by_name("smoke").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT)])
def test_a_signal_held_during_a_write_goes_to_the_handler_that_was_installed(first, second):
    """Ctrl-C, and SIGTERM (what Kubernetes and SLURM send; the runner raises Terminated for it): held while a write
    runs, the first delivered once right after, a second one meanwhile dropped."""
    seen = []

    def handler(signum, frame):
        seen.append(signum)

    previous = {s: signal.signal(s, handler) for s in {first, second}}
    try:
        with tracking.whole_write():
            os.kill(os.getpid(), first)
            os.kill(os.getpid(), second)
            assert seen == []  # held while the write runs
        assert seen == [first]  # delivered once, right after
        assert all(signal.getsignal(s) is handler for s in previous)  # and the handlers are back in place
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def test_whole_write_off_the_main_thread_changes_nothing():
    errors = []

    def write():
        try:
            with tracking.whole_write():  # signal.signal would raise ValueError here off the main thread
                pass
        except Exception as e:  # pragma: no cover - the failure this test exists to catch
            errors.append(e)

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    assert errors == []


def test_run_and_norun_each_implement_every_method_of_the_recorder_contract():
    """No catch-all: NoRun answers the contract's methods with no-ops and nothing else (an unknown attribute is an
    AttributeError, `experiment_id` is None on a worker that logs nothing)."""
    methods = {n for n, v in vars(tracking.Recorder).items() if callable(v) and not n.startswith("_")}
    assert methods >= {"params", "tags", "metrics", "text", "file", "dataset", "copy_history", "end"}
    for cls in (tracking.Run, tracking.NoRun, tracking.WriterRun):
        assert tracking.Recorder in cls.__mro__  # implemented explicitly
        assert methods <= set(vars(cls)), f"{cls.__name__} lacks {sorted(methods - set(vars(cls)))}"
    quiet = tracking.NoRun()
    assert quiet.run_id is None and getattr(quiet, "experiment_id", "missing") is None
    assert quiet.metrics({"loss": 1.0}, 3) is None
    with pytest.raises(AttributeError):
        quiet.monitor  # noqa: B018 - an attribute outside the contract


@pytest.mark.parametrize("wait,tries", [(0, 1), (1, 2)])
def test_a_store_that_cannot_be_written_at_the_end_is_tried_for_mlflow_final_wait_seconds(store, monkeypatch, wait,
                                                                                          tries):
    """At its end a run keeps trying its store for mlflow.final_wait seconds (a server restarting), then names its
    journal; the writes stay in it (nothing lost)."""
    from runner.tracking import run as run_module

    plan = validate(compose("debug=smoke", f"mlflow.tracking_uri={store}", f"mlflow.final_wait={wait}"))
    attempts = []

    def refused(*_):
        attempts.append(1)
        raise OSError("the store is restarting")

    with pytest.raises(tracking.StoreError, match="unsent writes are in memory only: once the store works") as error:
        with tracking.tracked(store, plan):
            monkeypatch.setattr(run_module, "send", refused)
    assert len(attempts) == tries and "the store is restarting" in str(error.value)


def test_a_job_opens_and_writes_its_run_from_a_writer_process_and_never_imports_mlflow(tmp_path, store):
    """MLflow's import and the store's opening overlap TensorFlow's import in the writer process: the training
    process records every write of the run (params, config, tags, datasets, metrics, the log's artifact) without
    importing MLflow."""
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from runner.config import compose\n"
        "from runner.experiment import run\n"
        f"result = run(compose(['debug=smoke', 'mlflow.tracking_uri={store}', 'train.measure_input=false']))\n"
        "print(result['run_id'], 'mlflow' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id, imported = proc.stdout.split()[-2:]
    assert imported == "False"
    client = MlflowClient(store)
    record = client.get_run(run_id)
    assert record.info.status == "FINISHED"
    assert record.data.params["train.steps"] == "60" and record.data.tags["runner.pid"].isdigit()
    assert {"train_loss", "test_accuracy", "seconds_to_first_step"} <= set(record.data.metrics)
    assert [d.dataset.name for d in record.inputs.dataset_inputs] == ["mnist", "mnist"]
    assert "config.yaml" in [a.path for a in client.list_artifacts(run_id)]
    assert f"MLflow run {run_id} in {store}" in proc.stderr  # the writer's log line, logged by the job


def test_a_run_written_by_a_writer_process_ends_as_a_run_written_here_does(store):
    cfg = validate(compose("debug=smoke", f"mlflow.tracking_uri={store}"))
    with tracking.tracked(store, cfg, writer=True) as run:
        run.metrics({"train_loss": 0.5}, 7)
        run.tags({"where": "writer"})
    with pytest.raises(ValueError, match="bad data"):
        with tracking.tracked(store, cfg, writer=True) as failed:
            raise ValueError("bad data")
    client = MlflowClient(store)
    done, bad = client.get_run(run.run_id), client.get_run(failed.run_id)
    assert done.info.status == "FINISHED" and done.data.tags["where"] == "writer"
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "train_loss")] == [(7, 0.5)]
    assert bad.info.status == "FAILED" and bad.data.tags["error"] == "ValueError: bad data"


@pytest.mark.parametrize("writer", [False, True])
def test_resuming_a_run_this_store_does_not_hold_ends_the_run_finished(store, writer, caplog):
    """A checkpoint left by a run of another store (mlflow.tracking_uri is not in the config hash): copying its
    history raised in the writer process, which died; the run stayed RUNNING and its result was lost."""
    cfg = validate(compose("debug=smoke", f"mlflow.tracking_uri={store}"))
    with tracking.tracked(store, cfg, writer=writer) as run:
        run.copy_history("0123456789abcdef0123456789abcdef", 440)
        run.metrics({"train_loss": 0.5}, 441)
    record = MlflowClient(store).get_run(run.run_id)
    assert record.info.status == "FINISHED" and record.data.metrics["train_loss"] == 0.5
    if not writer:  # the writer process logs it to its own stderr
        assert "which this store does not hold" in caplog.text


def test_replaying_a_journal_whose_run_the_store_lacks_says_retrying_cannot_help(store, tmp_path, capsys):
    """A store deleted mid-run: the replay said "run the same command again once it works", which it never can."""
    from runner.cli.replay import main
    from runner.tracking.journal import Journal

    journal = Journal(tmp_path / "mlflow_journal.jsonl", {"uri": store, "run_id": "0123456789abcdef0123456789abcdef"})
    journal.append("tags", tags={"lost": "yes"})
    assert main([str(tmp_path / "mlflow_journal.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the journal's run is not in its store (the store was deleted, or is another one)")
    assert "once it works" not in err and err.count("\n") == 1


def test_a_store_that_cannot_be_opened_is_the_same_one_line_from_a_writer_process(tmp_path):
    (tmp_path / "afile").write_text("")
    uri = f"sqlite:///{tmp_path / 'afile' / 'mlflow.db'}"
    cfg = validate(compose("debug=smoke", f"mlflow.tracking_uri={uri}"))
    said = []
    for writer in (False, True):
        with pytest.raises(tracking.StoreError) as error:
            with tracking.tracked(uri, cfg, writer=writer) as run:
                run.tags({"never": "written"})
        said.append(str(error.value))
    assert said[0] == said[1] and "is a file, not a directory" in said[0]


@pytest.fixture
def runner_signals():
    """The runner's handlers (runtime.signals.install) for this test, the process's own restored after it."""
    from runner.runtime import signals

    before = {s: signal.getsignal(s) for s in signals.HANDLED}
    signals.install()
    yield signals
    signals.acted()
    for s, handler in before.items():
        signal.signal(s, handler)


class _FreedWhileStopped:
    """An object whose `__del__` gets a SIGTERM (TensorFlow frees functions in `__del__`): Python prints what the
    handler raises there and drops it."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # the handler runs here, inside __del__


def test_a_signal_whose_exception_a_del_drops_still_ends_the_run_killed(store, runner_signals):
    cfg = validate(compose("debug=smoke", f"mlflow.tracking_uri={store}"))
    with pytest.raises(runner_signals.Terminated, match="SIGTERM"):
        with tracking.tracked(store, cfg) as run:
            _FreedWhileStopped()  # freed at once: its Terminated is dropped, and the block goes on to its end
    info = MlflowClient(store).get_run(run.run_id)
    assert info.info.status == "KILLED" and "SIGTERM" in info.data.tags["error"]
    assert runner_signals.requested() is None  # acted on, not raised again by a later run of this process


def test_a_dropped_signal_stops_the_training_loop_at_its_next_call_boundary(runner_signals):
    with runner_signals.at_call_boundaries():
        _FreedWhileStopped()
        assert runner_signals.requested() == signal.SIGTERM  # what the loop reads after each call (train._run_calls)
        with pytest.raises(runner_signals.Terminated):
            runner_signals.raise_noted()


def test_sighup_is_handled_unless_it_was_ignored_as_nohup_does(runner_signals):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    runner_signals.install()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    runner_signals.install()
    with pytest.raises(runner_signals.Terminated, match="SIGHUP") as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        sum(range(1000))
    assert runner_signals.exit_code(stop.value) == 129


def test_a_dead_run_of_the_config_in_another_experiment_is_closed_as_its_config_starts(store):
    """Resumed under another mlflow.experiment (the config hash leaves it out), the run's new start closed dead runs
    of its own experiment only: the SIGKILLed one it continues stayed RUNNING."""
    import socket

    from runner.tracking.stale import close_dead_runs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid whose process is gone
    client = MlflowClient(store)
    tags = {"config_hash": "abc", "runner.host": socket.gethostname(), "runner.pid": str(gone.pid),
            "runner.started": "1"}
    dead = client.create_run(client.create_experiment("first"), tags=tags).info.run_id
    other = client.create_run(client.create_experiment("second"), tags={**tags, "config_hash": "xyz"}).info.run_id
    close_dead_runs(store, "abc")
    assert client.get_run(dead).info.status == "KILLED" and "died" in client.get_run(dead).data.tags["error"]
    assert client.get_run(other).info.status == "RUNNING"  # another config's: not this start's to close
