"""What fails after validation: the tracking store (a real sqlite store raced by separate processes, a real
`mlflow server` killed mid-run, a real full tmpfs), signals (real SIGTERM), checkpoints (a truncated file, a full
disk), the launch folder (a read-only mount). Each test asserts the promise: the run ends FINISHED, FAILED or
KILLED, never RUNNING; its metrics are all in the store (or replayed into it); a failure is one `error:` line and
no traceback. Every run is a fresh `python -m runner` process, as a user starts it."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import conftest
import pytest
from conftest import cli_env

from runner.train import call_size

# Each test here makes its store's fault itself (a full or read-only disk, a dead server): children start without
# a prepared store.
run_cli = functools.partial(conftest.run_cli, store=False)
start_cli = functools.partial(conftest.start_cli, store=False)

# A run long enough to break into (~10 s of training on one CPU core), with one metric point per 20-step call.
LONG = ["debug=smoke", "train.steps=6000", "train.steps_per_call=20", "train.probe_peak=false",
        "train.measure_input=false"]


def calls(steps: int, steps_per_call: int) -> int:
    """How many compiled calls (so train_loss points) a run of `steps` makes."""
    done = count = 0
    while done < steps:
        done += min(call_size(done, steps_per_call), steps - done)
        count += 1
    return count


def wait_for(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def points(uri: str, run_id: str | None = None, key: str = "train_loss") -> int:
    """How many points of `key` the only (or the given) run of the store holds; 0 before any run exists."""
    from mlflow import MlflowClient

    from runner.tracking import schema_lock

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return 0  # opening it here would create the store's schema while the run does
    with schema_lock(uri):
        client = MlflowClient(uri)
    with contextlib.suppress(Exception):
        if run_id is None:
            found = client.search_runs([e.experiment_id for e in client.search_experiments()])
            run_id = found[0].info.run_id if found else None
        return len(client.get_metric_history(run_id, key)) if run_id else 0
    return 0


def only_run(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


def _said(cwd: Path, words: str) -> bool:
    """Whether a run started in `cwd` has written `words` to its log file (outputs/<date>/<time>/runner.log)."""
    return any(words in log.read_text() for log in cwd.glob("outputs/*/*/runner.log"))


def errors(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@contextlib.contextmanager
def mlflow_server(folder: Path, port: int) -> Iterator[subprocess.Popen]:
    """A real tracking server on 127.0.0.1:`port` with a sqlite backend in `folder`, stopped on leaving."""
    proc = start_server(folder, port)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def start_server(folder: Path, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
               "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]
    proc = subprocess.Popen(command, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def up() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    wait_for("the mlflow server", up, timeout=90)
    return proc


def kill_server(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # already killed: a failed assertion must not be hidden by this
        os.killpg(proc.pid, signal.SIGKILL)  # the server and its worker processes
    proc.wait()


@contextlib.contextmanager
def tmpfs(path: Path, size: str, readonly: bool = False) -> Iterator[Path]:
    """A real small filesystem at `path` (root may mount one; this project's machines and CI run as root)."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if readonly else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> Path:
    """Write a file into `folder` until its filesystem is full; returns the file (delete it to free the space)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 1 << 12, 1):  # down to the last byte
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    return filler


# Three times in a row, each on a fresh store, `slow` (~14 s each): the default suite has the same race with two
# jobs of a parallel sweep (tests/test_sweep.py).
@pytest.mark.slow
@pytest.mark.parametrize("attempt", [0, 1, 2])
def test_separate_runs_started_at_once_on_a_fresh_store_all_finish(tmp_path, attempt):
    """4 separate `python -m runner` processes started at once on a fresh sqlite store: every run recorded."""
    from mlflow import MlflowClient

    procs = [start_cli("debug=smoke", "train.steps=1", "train.probe_peak=false", "train.measure_input=false",
                       "data=synthetic", "data.train_limit=256", "data.test_limit=64", f"train.seed={i}", cwd=tmp_path)
             for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-1500:] for _, err in outs]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    found = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    assert sorted(r.info.status for r in found) == ["FINISHED"] * 4


def test_a_dead_tracking_server_at_start_fails_in_one_line_within_30_s(tmp_path):
    t0 = time.monotonic()
    proc = run_cli("debug=smoke", f"mlflow.tracking_uri=http://127.0.0.1:{free_port()}", cwd=tmp_path)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 2
    (line,) = errors(proc.stderr)
    assert "cannot be opened" in line and "Connection refused" in line


def test_a_sweep_whose_store_is_dead_at_start_fails_in_one_line_and_runs_no_job(tmp_path):
    """Hydra turns an exception of a sweep's start callback into a warning and goes on: it must end the sweep."""
    proc = run_cli("-m", "debug=smoke", "gpus=1,2", f"mlflow.tracking_uri=http://127.0.0.1:{free_port()}",
                   "hydra.sweep.dir=multirun", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = errors(proc.stderr)
    assert "cannot be opened" in line and "Connection refused" in line
    assert "UserWarning" not in proc.stderr and not list((tmp_path / "multirun").glob("*/result.json"))


@pytest.mark.parametrize("named_in", ["config", "environment", "report"])
def test_a_folder_store_is_refused_in_one_line_before_anything_starts_unless_mlflow_is_told_to_open_it(tmp_path,
                                                                                                     named_in):
    """MLflow 3.17 refuses a folder (its file store) unless MLFLOW_ALLOW_FILE_STORE=true, in a paragraph, and a run
    met it only after loading its data and devices: the runner says so at once, naming the ways out."""
    args, env = {"config": (["debug=smoke", "mlflow.tracking_uri=mlruns"], {}),
                 "environment": (["debug=smoke"], {"MLFLOW_TRACKING_URI": f"file://{tmp_path}/mlruns"}),
                 "report": (["report", "--tracking-uri", "./mlruns"], {})}[named_in]

    def run(**more: str) -> subprocess.CompletedProcess:  # cli_env drops MLFLOW_TRACKING_URI: put it back
        return subprocess.run([sys.executable, "-m", "runner", *args], cwd=tmp_path, env={**cli_env(more), **env},
                              capture_output=True, text=True, timeout=300)

    if named_in == "report":  # a report reads a store that is there (a missing folder is 'no store at': test_report)
        (tmp_path / "mlruns").mkdir()
    proc = run()
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = errors(proc.stderr)
    assert "is a folder (MLflow's file store)" in line and "MLFLOW_ALLOW_FILE_STORE=true" in line, line
    assert "devices:" not in proc.stdout + proc.stderr  # refused before anything started (the log is on stdout)
    assert not (tmp_path / "mlruns").exists() or not any((tmp_path / "mlruns").iterdir())  # nothing written
    if named_in == "config":  # told to, MLflow opens the folder and the run lands there (one run proves it)
        proc = run(MLFLOW_ALLOW_FILE_STORE="true")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert list((tmp_path / "mlruns").glob("*/*/meta.yaml")), "no run in the folder"


# slow (~35 s): the default suite covers the same offline journal with a store whose disk fills mid-run.
@pytest.mark.long
@pytest.mark.slow
def test_a_tracking_server_killed_mid_run_loses_nothing_once_it_is_back(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    run = start_cli(*LONG, f"mlflow.tracking_uri={uri}", cwd=tmp_path)
    try:
        wait_for("the first points", lambda: points(uri) >= 5)
        kill_server(server)
        wait_for("the run to find its store gone", lambda: _said(tmp_path, "cannot be written"))  # it goes on...
        server = start_server(tmp_path, port)  # ...until it is back (the run sends its backlog at the latest at the end)
        record = _finished_with_every_point(run, uri, "answers again")
        assert "test_accuracy" in record.data.metrics
    finally:
        run.kill()
        kill_server(server)


@pytest.mark.long
@pytest.mark.slow  # two server starts and a replay, ~60 s
def test_a_server_gone_at_the_end_leaves_a_journal_that_runner_replay_sends(tmp_path):
    """The run keeps trying the store for mlflow.final_wait seconds at its end (5 here, 30 by default), then names
    its journal."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    run = start_cli(*LONG, f"mlflow.tracking_uri={uri}", "mlflow.final_wait=5", cwd=tmp_path)
    try:
        wait_for("the first points", lambda: points(uri) >= 5)
        kill_server(server)
        out, err = run.communicate(timeout=300)
        assert run.returncode == 2
        (line,) = errors(err)
        journal = line.split("`runner replay ")[1].rstrip("`")
        assert Path(journal).is_file() and "could not be written" in line
        server = start_server(tmp_path, port)
        replay = run_cli("replay", journal, cwd=tmp_path, timeout=120)
        assert replay.returncode == 0, replay.stderr[-2000:]
        record = only_run(uri)
        assert record.info.status == "FINISHED"
        assert points(uri, record.info.run_id) == calls(6000, 20)
    finally:
        run.kill()
        kill_server(server)


@pytest.mark.long
def test_a_store_on_a_disk_that_fills_mid_run_loses_nothing_once_space_is_freed(tmp_path):
    with tmpfs(tmp_path / "small", "4m") as disk:
        uri = f"sqlite:///{disk / 'mlflow.db'}"
        run = start_cli(*LONG, f"mlflow.tracking_uri={uri}", cwd=tmp_path)
        wait_for("the first points", lambda: points(uri) >= 5)
        filler = fill(disk)
        wait_for("the run to find its store full", lambda: _said(tmp_path, "cannot be written"))  # it goes on
        assert run.poll() is None, "the run ended before its store was full"
        filler.unlink()  # space is back: the run sends its backlog (at the latest when it ends)
        _finished_with_every_point(run, uri, "full")


@pytest.mark.slow  # ~14 s; the store's full-disk test stays in the default run
def test_an_output_folder_on_a_disk_that_fills_mid_run_is_one_warning_and_the_store_keeps_everything(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with tmpfs(tmp_path / "small", "1m") as disk:
        out = disk / "out"
        run = start_cli(*LONG, f"hydra.run.dir={out}", f"mlflow.tracking_uri={uri}", cwd=tmp_path)
        wait_for("the first points", lambda: points(uri) >= 5)
        fill(disk)
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-3000:]
        said = [line for line in (stdout + stderr).splitlines() if "cannot be written" in line]
        assert len(said) == 1 and f"output folder {out} cannot be written" in said[0], said
        assert "No space left on device" in said[0] and "journal and log file" in said[0]
        assert "Logging error" not in stderr and errors(stderr) == []
        assert not (out / "mlflow_journal.jsonl").exists()  # the store has every write: no partial journal left
    record = only_run(uri)
    assert record.info.status == "FINISHED"
    assert points(uri, record.info.run_id) == calls(6000, 20)


@pytest.mark.long
def test_sigterm_ends_the_run_killed_with_a_checkpoint_that_the_next_start_resumes(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*LONG, "train.steps=60000", "train.checkpoint_every=100000"]
    run = start_cli(*args, cwd=tmp_path)
    wait_for("the first points", lambda: points(uri) >= 5)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 143, err[-3000:]
    assert errors(err) == [] and "terminated (stopped by SIGTERM)" in err
    killed = only_run(uri)
    assert killed.info.status == "KILLED" and "SIGTERM" in killed.data.tags["error"]
    (saved,) = (tmp_path / "checkpoints").glob("*/ckpt-*.index")  # the step reached, not a multiple of 100000
    step = int(saved.stem.split("-")[1])
    assert points(uri, killed.info.run_id) == calls(step, 20)  # every point up to the step reached is stored
    again = start_cli(*args, cwd=tmp_path)  # the same config, started again (as a requeued job is)
    wait_for("the resumed run", lambda: points(uri) > calls(step, 20))
    again.send_signal(signal.SIGTERM)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 143 and f"at step {step}" in out + err
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    resumed = client.search_runs([client.get_experiment_by_name("smoke").experiment_id], order_by=["start_time DESC"])
    assert resumed[0].data.tags["resumed_from_step"] == str(step)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR2], ids=["SIGHUP", "SIGUSR2"])
def test_sighup_of_a_closed_terminal_or_slurms_usr2_ends_the_run_killed_with_its_checkpoint(tmp_path, signum):
    """SIGHUP (a closed terminal) left the run RUNNING; SIGUSR2 (submitit's `--signal=USR2@120` before the time
    limit) killed it outright: no checkpoint of the step reached, the run RUNNING."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = start_cli(*LONG, "train.steps=60000", "train.checkpoint_every=100000", cwd=tmp_path)
    wait_for("the first points", lambda: points(uri) >= 5)
    run.send_signal(signum)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signum, err[-3000:]  # the shell's code
    name = signal.Signals(signum).name
    assert errors(err) == [] and f"terminated (stopped by {name})" in err
    killed = only_run(uri)
    assert killed.info.status == "KILLED" and name in killed.data.tags["error"]
    assert list((tmp_path / "checkpoints").glob("*/ckpt-*.index"))  # the step reached, for a start again


def test_a_resume_on_data_changed_since_the_checkpoint_is_one_line_and_keeps_it(tmp_path):
    """y rewritten as 3y + 5 between a SIGTERM and the start again: the run resumed silently (loss from 0.02 to 69.3)
    and claimed its target from the first part. The checkpoint records the training data's digest."""
    import numpy as np

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 2048), ("test", 256)):
        x = rng.integers(0, 256, (n, 8, 8, 1), dtype=np.uint8)
        np.save(data / f"x_{split}.npy", x)
        np.save(data / f"y_{split}.npy", x.reshape(n, -1)[:, :4].mean(axis=1) / 255.0)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*LONG, "data=files", f"data.path={data}", "train.steps=60000", "train.checkpoint_every=100000"]
    run = start_cli(*args, cwd=tmp_path)
    wait_for("the first points", lambda: points(uri) >= 5)
    run.send_signal(signal.SIGTERM)
    assert run.communicate(timeout=120) and run.returncode == 143
    (saved,) = (tmp_path / "checkpoints").glob("*/ckpt-*.index")
    np.save(data / "y_train.npy", 3 * np.load(data / "y_train.npy") + 5)
    again = run_cli(*args, cwd=tmp_path)
    (line,) = errors(again.stderr)
    assert again.returncode == 2 and "were written training on other data" in line and "remove that folder" in line
    assert saved.exists()  # nothing lost: the data put back resumes from it


@pytest.mark.long
def test_a_signal_during_the_last_call_saves_the_last_step_and_a_start_again_trains_nothing(tmp_path):
    """SIGINT during the last call ended the run KILLED with its checkpoint from 1000s of steps before (the last
    call never saved): a start again trained them all over. Now the step reached is saved, whichever call it ends."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*LONG, "train.steps_per_call=6000"]  # calls of 1 step, then the 5,999 others: the last
    run = start_cli(*args, cwd=tmp_path)
    wait_for("the first step", lambda: points(uri) >= 1)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130 and "stopping at step 6000 of 6000" in out, err[-3000:]
    assert [p.name for p in (tmp_path / "checkpoints").glob("*/ckpt-*.index")] == ["ckpt-6000.index"]
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0 and "resuming from checkpoint" in again.stdout, again.stderr[-3000:]
    assert "images/s not measured: resumed at step 6000 of 6000, no step was left to time" in again.stdout
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    finished, killed = client.search_runs([client.get_experiment_by_name("smoke").experiment_id],
                                          order_by=["start_time DESC"])
    assert (finished.info.status, killed.info.status) == ("FINISHED", "KILLED")
    assert finished.data.tags["resumed_from_step"] == "6000" and "test_accuracy" in finished.data.metrics


def listed(folder: Path) -> list[Path]:
    """The checkpoints the `checkpoint` state files under `folder` list, oldest first (as TensorFlow reads them)."""
    return [state.parent / line.split('"')[1] for state in folder.glob("*/checkpoint")
            for line in state.read_text().splitlines() if line.startswith("all_model_checkpoint_paths")]


@pytest.mark.slow  # ~16 s; resuming from a checkpoint is in the default suite's SIGTERM and SIGKILL tests
def test_a_truncated_newest_checkpoint_is_named_and_the_older_one_resumes(tmp_path):
    args = [*LONG, "train.steps=4000", "train.checkpoint_every=1000"]
    run = start_cli(*args, cwd=tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    folder = tmp_path / "checkpoints"
    wait_for("two checkpoints", lambda: len(listed(folder)) >= 2, timeout=240)
    run.kill()  # SIGKILL: nothing is cleaned up
    run.communicate()
    # the newest the run resumes from is the newest its `checkpoint` file lists: a kill between writing the next
    # one's files and listing it leaves files no run reads
    newest = next(listed(folder)[-1].parent.glob(f"{listed(folder)[-1].name}.data-*"))
    older_step = int(newest.name.split("-")[1].split(".")[0]) - 1000
    newest.write_bytes(newest.read_bytes()[:100])
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert f"{newest.with_suffix('').with_suffix('')}" in log or newest.name.split(".")[0] in log
    assert "is damaged" in log and f"at step {older_step}" in log
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id], "attributes.status = 'FINISHED'")
    assert [r.data.tags["resumed_from_step"] for r in runs] == [str(older_step)]


def test_a_checkpoint_on_a_full_disk_is_one_line_and_the_run_ends_failed_with_its_metrics(tmp_path):
    with tmpfs(tmp_path / "small", "1m") as disk:
        fill(disk)
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        proc = run_cli("debug=smoke", "train.steps=200", "train.checkpoint_every=100", f"train.checkpoint_dir={disk}",
                       cwd=tmp_path)
        assert proc.returncode == 2
        (line,) = errors(proc.stderr)
        assert "checkpoint at step 100 could not be written" in line and str(disk) in line
        failed = only_run(uri)
        assert failed.info.status == "FAILED"
        assert points(uri, failed.info.run_id) == calls(100, 10)  # every point up to the failed save


def test_a_read_only_launch_folder_or_checkpoint_folder_is_one_line(tmp_path):
    with tmpfs(tmp_path / "ro", "1m", readonly=True) as folder:
        proc = run_cli("debug=smoke", cwd=folder)
        assert proc.returncode == 2
        (line,) = errors(proc.stderr)
        assert "launch directory cannot be written" in line and str(folder) in line
        proc = run_cli("debug=smoke", f"train.checkpoint_dir={folder}/ckpt", cwd=tmp_path)
        assert proc.returncode == 2
        (line,) = errors(proc.stderr)
        assert "train.checkpoint_dir" in line and "not writable" in line
        assert not (tmp_path / "mlflow.db").exists()  # refused before any run opened


@pytest.mark.parametrize("args", [["train.steps=1"], ["train.warmup_calls=100", "train.profile=true"],
                                  ["train.steps=null", "train.epochs=0.0001"]], ids=lambda a: a[-1])
def test_a_run_too_short_to_time_says_why_in_one_line_and_in_a_tag(tf_devices, store, caplog, args):
    """In-process: the run's last line (runner.cli.main.result_line, what `python -m runner` prints) and its log."""
    from runner.cli.main import result_line
    from runner.experiment import run

    last = result_line(run(conftest.compose("debug=smoke", *args, f"mlflow.tracking_uri={store}")))
    assert "images/s not measured" in last and "nan" not in last
    assert ("train.profile=true traced nothing" in caplog.text) == ("train.profile=true" in args)
    record = only_run(store)
    assert "images_per_sec" not in record.data.metrics
    assert "timing needs train.steps >=" in record.data.tags["images_per_sec.missing"]


def _lonely_worker(tmp_path: Path, *extra: str) -> subprocess.Popen:
    """Worker 0 of a 2-worker cluster whose worker 1 never starts (its own process group, as from a terminal)."""
    ports = [free_port(), free_port()]
    args = ["debug=smoke", "strategy=multi_worker", "gpus=1",
            f"strategy.workers=[127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}]", *extra]
    proc = start_cli(*args, cwd=tmp_path, start_new_session=True)
    proc.missing = f"127.0.0.1:{ports[1]}"
    return proc


@pytest.mark.slow  # waits out the bounded peer wait: ~13 s
def test_a_missing_peer_is_given_up_after_the_bounded_wait_in_one_line(tmp_path):
    proc = _lonely_worker(tmp_path, "strategy.peer_timeout=5")
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert time.monotonic() - t0 < 60 and proc.returncode != 0
    (line,) = errors(err)
    assert f"worker0 waited 5 s for {proc.missing} and gave up" in line and "strategy.peer_timeout" in line
    record = only_run(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert record.info.status == "FAILED" and proc.missing in record.data.tags["error"]


@pytest.mark.slow  # ~11 s; the bounded wait for a missing peer stays in the default run
def test_ctrl_c_stops_a_worker_waiting_for_its_peers(tmp_path):
    proc = _lonely_worker(tmp_path)  # the default wait: 300 s
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def waiting() -> bool:  # its log says it joins its peers (the store is not read before the job has made it: a
        # client opening a store that does not exist yet creates its schema, racing the job doing the same)
        return _said(tmp_path, "joining 2 workers")

    wait_for("the worker to start waiting", waiting)
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "interrupted (SIGINT) while waiting for" in err
    record = only_run(uri)
    assert record.info.status == "KILLED"


def _finished_with_every_point(run, uri: str, said: str):
    """The run, left to end, exited 0 having said its store could not be written and then `said` (the store back),
    with no error line; its one MLflow run FINISHED holding every point of its 6,000 steps. Returns that run."""
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    assert "cannot be written" in out + err and said in out + err and errors(err) == []
    record = only_run(uri)
    assert record.info.status == "FINISHED"
    assert points(uri, record.info.run_id) == calls(6000, 20)
    return record
