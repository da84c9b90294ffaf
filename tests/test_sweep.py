"""Sweeps through the real CLI: per-job processes, parent/child MLflow runs, failure summary, resume, parallel jobs,
the MLflow server's REST API over the store, and `runner report`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import compose, run_cli, runs, start_cli, subcommand

from runner.sweep import RESULT_FILE

# One job is invalid on purpose: strategy=single cannot use 2 devices. Two jobs at a time (joblib's launcher): they
# write the store the sweep has just created at once (the race of tests/test_faults.py's separate runs, in a sweep).
JOBS = ["debug=smoke", "strategy=single,mirrored", "gpus=1,2", "train.target_accuracy=0.5"]
SWEEP = ["-m", *JOBS, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


def _children(df):
    return df[df["tags.sweep"] != "parent"] if "tags.sweep" in df else df


# The tests that read `swept` run on one pytest-xdist worker (pyproject.toml: `--dist loadgroup`): a worker of its
# own would run the sweep again.
ON_THE_SWEEP = pytest.mark.xdist_group("swept")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("sweep")
    proc = run_cli(*SWEEP, cwd=cwd, store=False)  # the sweep creates the store its jobs then race to write
    return cwd, proc, f"sqlite:///{cwd / 'mlflow.db'}"


@ON_THE_SWEEP
def test_sweep_records_parent_and_children_and_reports_the_failure(swept):
    cwd, proc, uri = swept
    assert proc.returncode == 1  # a job failed
    assert "sweep: 4 jobs: 3 finished, 1 failed, 0 skipped" in proc.stderr
    assert ("FAILED debug=smoke strategy=single gpus=2 train.target_accuracy=0.5: strategy=single needs gpus from 0 "
            "to 1") in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert all("strategy=single needs gpus" in line for line in errors), errors  # the invalid job's, nothing else
    # The end of the sweep: one row per job, the verdict, the experiment and the commands to go further.
    assert "| mlp/tiny | mirrored/split x2 |" in proc.stderr and "| single/split x2 | - | - | - | FAILED |" in proc.stderr
    assert "verdict: mlp/tiny: fastest " in proc.stderr and "s to 50% test accuracy" in proc.stderr
    assert "runner report --experiment smoke --parent " in proc.stderr and "mlflow ui --backend-store-uri" in proc.stderr
    df = runs(uri, "smoke")
    parents = df[df["tags.sweep"] == "parent"]
    assert len(parents) == 1 and parents.iloc[0]["status"] == "FAILED"
    assert parents.iloc[0]["tags.sweep.overrides"] == " ".join(JOBS)  # the launcher's settings are not the sweep's
    children = _children(df)
    assert len(children) == 4
    assert set(children["tags.mlflow.parentRunId"]) == {parents.iloc[0]["run_id"]}
    assert sorted(children["status"]) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    failed = children[children["status"] == "FAILED"].iloc[0]
    assert "gpus=2" in failed["tags.error"] and failed["tags.strategy"] == "single"
    # The invalid job was checked and recorded by the sweep: only the three others started a process.
    outcomes = [json.loads(p.read_text()) for p in cwd.glob(f"multirun/*/*/*/{RESULT_FILE}")]
    started = sorted(o["status"] for o in outcomes if (Path(o["job_dir"]) / "child.stderr").exists())
    assert len(outcomes) == 4 and started == ["FINISHED"] * 3, outcomes
    # mirrored on 1 and then on 2 devices both finished: impossible in one process (TensorFlow's devices are fixed
    # when it initialises), so each job had a fresh one.
    finished = children[children["status"] == "FINISHED"]
    assert sorted(zip(finished["tags.strategy"], finished["tags.devices.count"])) == [
        ("mirrored", "1"), ("mirrored", "2"), ("single", "1"),
    ]


def test_an_invalid_job_whose_run_the_store_refuses_is_a_warning_and_its_error_stays(tmp_path, caplog):
    """The sweep records an invalid job's run itself; a store that refuses the record does not stop the sweep."""
    from runner.config import ConfigError, validate
    from runner.sweep import _record_invalid

    (tmp_path / "afile").write_text("not a folder")
    cfg = compose("debug=smoke", "strategy=single", "gpus=2", f"mlflow.tracking_uri=sqlite:///{tmp_path}/afile/m.db")
    with pytest.raises(ConfigError) as invalid:
        validate(cfg)
    _record_invalid(cfg, invalid.value, str(tmp_path))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("the invalid job's run is not in the store: ") and "afile is a file" in warning


@ON_THE_SWEEP
def test_resume_runs_only_the_combination_that_did_not_finish(swept):
    cwd, _, uri = swept
    before = len(_children(runs(uri, "smoke")))
    # Resumed under Hydra's basic launcher: a sweep is its jobs' overrides, not its launcher's settings (the parent's
    # tag above), and joblib's workers would start (7 CPU-seconds) for jobs that are all skipped or invalid.
    proc = run_cli("-m", *JOBS, "sweep.resume=true", cwd=cwd)
    assert "sweep: 4 jobs: 0 finished, 1 failed, 3 skipped (3 FINISHED before, sweep.resume: their runs in the " \
           "table)" in proc.stderr
    df = runs(uri, "smoke")
    assert len(_children(df)) == before + 1
    # The answer covers every job: the resumed sweep's table and verdict (was: an empty table, no verdict) read the
    # runs its jobs were skipped for, which its parent names
    assert proc.stderr.count("| FINISHED |") == 3 and "verdict: mlp/tiny: fastest " in proc.stderr, proc.stderr[-3000:]
    parent = df[df["tags.sweep"] == "parent"].sort_values("start_time").iloc[-1]
    assert sum(k.startswith("tags.sweep.reused.") and isinstance(v, str) for k, v in parent.items()) == 3


# Three times in a row, each on a fresh sqlite store: jobs running at once must never race to create it (only the
# first pair can race, so two jobs are enough). Slow: the default suite's sweep (`swept`) runs two jobs at a time too.
@pytest.mark.slow
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_two_parallel_jobs_on_a_fresh_store_record_every_run(tmp_path, attempt):
    jobs = ["-m", "debug=smoke", "train.seed=0,1", "train.steps=20", "train.measure_input=false"]
    proc = run_cli(*jobs, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", cwd=tmp_path, store=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep: 2 jobs: 2 finished, 0 failed" in proc.stderr
    assert not [line for line in proc.stderr.splitlines() if "error" in line.lower()], proc.stderr[-3000:]
    df = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke")
    assert list(df["tags.sweep"]).count("parent") == 1
    children = _children(df)
    assert sorted(children["params.train.seed"]) == ["0", "1"]
    assert set(children["status"]) == {"FINISHED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a real `mlflow server`, ~12 s: keeps the default run under 10 minutes on 2 cores
@ON_THE_SWEEP
def test_mlflow_server_serves_the_sweep_over_rest(swept):
    _, _, uri = swept
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        for _ in range(60):
            try:
                with urllib.request.urlopen(f"{base}/experiments/get-by-name?experiment_name=smoke", timeout=2) as r:
                    experiment_id = json.load(r)["experiment"]["experiment_id"]
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("mlflow server did not answer within 60 s")
        body = json.dumps({"experiment_ids": [experiment_id], "filter": "attributes.status = 'FINISHED'"}).encode()
        request = urllib.request.Request(f"{base}/runs/search", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as r:
            found = json.load(r)["runs"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert len(found) >= 3
    for run in found:
        params = {p["key"]: p["value"] for p in run["data"]["params"]}
        metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
        assert params["model.variant"] == "tiny"
        assert 0.1 < metrics["test_accuracy"] <= 1.0 and metrics["images_per_sec"] > 0


@ON_THE_SWEEP
def test_report_table_matches_the_runs_and_writes_pngs(swept, tmp_path, capsys):
    _, _, uri = swept
    out = tmp_path / "report"
    code, stdout, err = subcommand(capsys, "report", "--experiment", "smoke", "--tracking-uri", uri, "--out", str(out))
    assert code == 0, err
    df = _children(runs(uri, "smoke"))
    finished = df[df["status"] == "FINISHED"]
    for _, run in finished.iterrows():
        acc = f"{run['metrics.test_accuracy']:.4f}"
        ips = f"{run['metrics.images_per_sec']:,.0f}"
        assert any(acc in line and ips in line and run["tags.strategy"] in line for line in stdout.splitlines())
    assert (finished["metrics.time_to_accuracy_seconds"] > 0).all()  # every job reached 50% test accuracy
    (verdict,) = [line for line in stdout.splitlines() if line.startswith("verdict:")]
    fastest = verdict.split("fastest ")[1].split(" (")[0]  # e.g. "mirrored/split x2"
    strategy, rest = fastest.split("/")
    pipeline, devices = rest.split(" x")
    assert any(f"| {pipeline} | {strategy} | {devices} " in line for line in stdout.splitlines()), verdict
    assert "s to 50% test accuracy" in verdict and "learns the same as 1 device" in verdict
    for name in ("scaling.png", "time_to_accuracy.png", "accuracy.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def _training_child(cwd) -> bool:
    # Only once the sweep has created the store (its parent run id is written after that): opening a store that
    # does not exist yet would create its schema here, racing the sweep doing the same.
    if not list(cwd.glob("multirun/*/*/parent_run_id")):
        return False
    children = _children(runs(f"sqlite:///{cwd / 'mlflow.db'}", "smoke"))
    # A logged training loss: past start-up (TensorFlow, data, tracing) and into the training loop.
    return "metrics.train_loss" in children and bool(children["metrics.train_loss"].notna().any())


def _ctrl_c_once_training(tmp_path, *args: str) -> None:
    """Sweep `args` and press Ctrl-C once a job trains: SIGINT to the whole process group, as a terminal sends it. The
    sweep starts with SIGINT at its default disposition (this test may itself run under a shell that ignores SIGINT,
    which children would inherit); it must exit 130."""
    proc = start_cli("-m", "debug=smoke", "train.steps=100000", *args, cwd=tmp_path, start_new_session=True,
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 180
    while not _training_child(tmp_path):
        assert proc.poll() is None and time.time() < deadline, "no job started training"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]


def test_ctrl_c_ends_the_sweep_and_its_running_job_killed(tmp_path):
    _ctrl_c_once_training(tmp_path, "train.seed=0,1")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    df = runs(uri, "smoke")
    parent = df[df["tags.sweep"] == "parent"].iloc[0]
    children = _children(df)
    assert parent["status"] == "KILLED"
    assert list(children["status"]) == ["KILLED"], children[["status", "tags.error"]]  # the second job never began


def test_repeats_put_the_rounds_first_so_every_combination_runs_once_per_round():
    from runner.cli.overrides import expand_repeats

    args = ["-m", "--config-dir", "conf2", "strategy=single,replicated", "sweep.repeats=3"]
    assert expand_repeats(args) == (["-m", "--config-dir", "conf2", "sweep.round=range(3)",
                                     "strategy=single,replicated", "sweep.repeats=3"], None)
    assert expand_repeats(["-m", "strategy=single", "sweep.repeats=1"]) == (["-m", "strategy=single",
                                                                             "sweep.repeats=1"], None)
    assert expand_repeats(["-m", "sweep.repeats=x"])[1] == ("sweep.repeats=x is not allowed; expected a positive "
                                                             "number of runs per combination")
    _, error = expand_repeats(["strategy=single", "sweep.repeats=3"])
    assert error.startswith("sweep.repeats=3 runs each combination of a sweep 3 times: add -m")
    assert expand_repeats(["sweep.round=1", "sweep.repeats=3"]) == (["sweep.round=1", "sweep.repeats=3"], None)
    _, error = expand_repeats(["-m", "sweep.round=0,1", "sweep.repeats=2"])
    assert error == "sweep.round is set by the sweep from sweep.repeats; give sweep.repeats alone"


def test_a_repeat_is_a_config_of_its_own_from_the_second_round_on():
    from runner.config import validate

    def digest(*overrides):
        return validate(compose("debug=smoke", *overrides)).config_hash

    assert digest() == digest("sweep.repeats=3") == digest("sweep.repeats=3", "sweep.round=0")
    assert len({digest(), digest("sweep.round=1"), digest("sweep.round=2")}) == 3  # own checkpoints and resume


def test_sweep_repeats_refused_in_one_line():
    """The command line's own check before Hydra starts (runner.cli.main turns the error into its one line and exit
    2, as tests/test_bad_input.py's process cases show)."""
    from runner.cli.overrides import preflight

    for args, wanted in [(["-m", "debug=smoke", "sweep.repeats=0"], "sweep.repeats=0 is not allowed; expected "),
                         (["debug=smoke", "sweep.repeats=2"], "sweep.repeats=2 runs each combination")]:
        _, error = preflight(args)
        assert error and error.startswith(wanted) and "\n" not in error, error


def test_m_after_an_override_starts_the_sweep():
    """Hydra's argparse takes one run of overrides: `debug=smoke -m gpus=1,2` was its usage and 'unrecognized
    arguments: gpus=1,2'; the command line puts -m first."""
    from runner.cli.overrides import preflight

    assert preflight(["debug=smoke", "-m", "gpus=1,2"]) == (["-m", "debug=smoke", "gpus=1,2"], None)
    assert preflight(["debug=smoke", "--multirun", "sweep.repeats=2"])[0][:2] == ["--multirun", "sweep.round=range(2)"]


@pytest.mark.slow  # 4 smoke jobs and 2 more on resume, ~60 s
def test_repeats_run_in_rounds_and_the_verdict_reads_their_spread(tmp_path):
    """Two strategies on 2 devices, two rounds: the only runs of the same work are the repeats, so the verdict's
    spread is theirs. (With two one-device strategies the spread between those, a quarter on millisecond steps some
    runs, could be the larger and the one named.)"""
    sweep = ["-m", "debug=smoke", "strategy=mirrored,replicated", "gpus=2"]
    proc = run_cli(*sweep, "sweep.repeats=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    children = _children(runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke")).sort_values("start_time")
    assert list(zip(children["tags.sweep.round"], children["tags.strategy"])) == [
        ("1 of 2", "mirrored"), ("1 of 2", "replicated"), ("2 of 2", "mirrored"), ("2 of 2", "replicated")]
    assert children["tags.config_hash"].nunique() == 4
    verdict = next(line for line in proc.stderr.splitlines() if line.startswith("verdict:"))
    assert "run-to-run spread" in verdict and "repeats of " in verdict
    again = run_cli(*sweep, "sweep.repeats=3", "sweep.resume=true", cwd=tmp_path)
    assert "sweep: 6 jobs: 2 finished, 0 failed, 4 skipped" in again.stderr  # only the third round runs


@pytest.mark.slow  # a calibration and a job, ~20 s; the ranking and the cache stay in the default run
def test_only_top_runs_the_predicted_fastest_and_lists_the_rest(tmp_path):
    """sweep.only_top=1 over three combinations: one runs, one is skipped with its prediction, one (no cost model)
    is skipped saying so; the job that ran logs its prediction and the summary names the skipped."""
    proc = run_cli("-m", "debug=smoke", "strategy=replicated,parameter_server,model_parallel", "gpus=2",
                   "sweep.only_top=1", "train.predict=true", cwd=tmp_path,
                   env={"RUNNER_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sweep.only_top=1: running the 1 predicted fastest of 3 combinations" in proc.stderr
    assert "sweep: 3 jobs: 1 finished, 0 failed, 2 skipped" in proc.stderr
    skipped = [line for line in proc.stderr.splitlines() if line.startswith("  SKIPPED ")]
    assert len(skipped) == 2 and any("images/s, not in the top 1" in line for line in skipped)
    assert any("strategy=model_parallel" in line and "has no cost model" in line for line in skipped)
    children = _children(runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke"))
    assert len(children) == 1 and children.iloc[0]["status"] == "FINISHED"
    assert children.iloc[0]["metrics.predicted_images_per_sec"] > 0
    assert "| predicted images/s |" in proc.stderr  # the sweep's table shows it beside the measured rate


def test_a_job_function_stopped_by_anything_stops_its_child(tmp_path):
    """submitit's timeout handler ends the job function with SystemExit: the `python -m runner` child was left
    running on its own (its parent pid 1), its run RUNNING after the sweep ended. Whatever ends the wait, the child
    gets SIGTERM (time to checkpoint and close its run KILLED)."""
    from runner.sweep import _run_child

    pid_file, ran_on = tmp_path / "pid", tmp_path / "ran on"
    child = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(20); "
             f"open({str(ran_on)!r}, 'w')")
    before = signal.signal(signal.SIGALRM, lambda *_: sys.exit(1))  # as submitit's handler of SIGUSR2 does
    try:
        signal.setitimer(signal.ITIMER_REAL, 3)
        with pytest.raises(SystemExit):
            _run_child([sys.executable, "-c", child], dict(os.environ))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int(pid_file.read_text()), 0)
    assert not ran_on.exists()  # stopped by the signal, not waited for to its end


def test_ctrl_c_on_joblibs_launcher_leaves_no_job_running(tmp_path):
    """joblib's launcher, interrupted, SIGKILLs its workers and their `python -m runner` children (loky's
    kill_process_tree): the two training jobs' runs stayed RUNNING under a KILLED parent. The sweep now closes the
    jobs whose processes are gone."""
    _ctrl_c_once_training(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "train.seed=0,1,2")
    df = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke")
    assert "RUNNING" not in set(df["status"]), list(df["status"])
    assert set(_children(df)["status"]) == {"KILLED"}


def test_a_job_killed_by_a_signal_says_which(tmp_path):
    """A SIGKILLed job (the OOM killer, kill -9) was reported by its last log line, or as "exit status -9"."""
    from runner.sweep import launch

    dies = "import os, signal, sys; print('INFO training', file=sys.stderr, flush=True); os.kill(os.getpid(), 9)"
    outcome = launch([sys.executable, "-c", dies], str(tmp_path / "job"), None)
    assert outcome["status"] == "FAILED" and outcome["error"] == "killed by SIGKILL (its last line: INFO training)"
