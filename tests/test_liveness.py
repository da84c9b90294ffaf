"""Runs whose process lives or is gone: a start beside a live run, a SIGKILLed sweep's report; the probe's line."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import markdown_rows, runs, start_cli, subcommand

from runner.tracking import stale

# Tiny MLP, checkpoints every 100 steps, far more steps than a test waits for: stopped by the test itself.
LONG = ["debug=smoke", "train.steps=1000000", "train.checkpoint_every=100", "train.measure_input=false",
        "train.probe_peak=false"]


def _checkpoint(cwd: Path, proc: subprocess.Popen) -> Path:
    """The run.json of the first complete checkpoint under `cwd` (written after the checkpoint itself)."""
    deadline = time.time() + 120
    while not (found := list(cwd.glob("checkpoints/*/run.json"))):
        assert proc.poll() is None, "ended before its first checkpoint: " + proc.communicate()[1][-2000:]
        assert time.time() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    return found[0]


def test_a_second_start_beside_a_live_run_of_its_config_is_refused_and_the_live_run_goes_on(tmp_path):
    first = start_cli(*LONG, cwd=tmp_path)
    try:
        saved = _checkpoint(tmp_path, first)
        second = start_cli(*LONG, cwd=tmp_path)
        try:
            _, stderr = second.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            second.kill()
            raise AssertionError("the second start trained beside the live run: " + second.communicate()[0][-2000:])
        df = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").set_index("run_id")
        live = df[df["tags.runner.pid"] == str(first.pid)].index[0]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert second.returncode == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr[-2000:]
        assert f"run {live}" in errors[0] and f"pid {first.pid}" in errors[0], errors[0]
        assert "train.checkpoint_dir" in errors[0] and "train.checkpoint_every=0" in errors[0]
        assert df.loc[df.index != live, "status"].tolist() == ["FAILED"]  # the refused start's own run
        assert df.loc[live, "status"] == "RUNNING" and first.poll() is None
        step = json.loads(saved.read_text())["step"]
        deadline = time.time() + 60
        while json.loads(saved.read_text())["step"] <= step:  # the live run checkpoints on, into its own folder
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.05)
        assert json.loads(saved.read_text())["run_id"] == live
    finally:
        first.send_signal(signal.SIGTERM)  # stops after the running call with a checkpoint, KILLED
        first.communicate(timeout=120)
    assert first.returncode == 143
    assert runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").set_index("run_id").loc[live, "status"] == "KILLED"


@pytest.mark.long
def test_report_after_a_sigkilled_sweep_shows_its_job_dead_and_closes_it_and_the_parent(tmp_path, monkeypatch, capsys):
    sweep = start_cli("-m", *LONG, "train.seed=0,1", cwd=tmp_path, start_new_session=True)
    try:
        _checkpoint(tmp_path, sweep)  # the first job is training
    finally:
        os.killpg(sweep.pid, signal.SIGKILL)  # the sweep and its job, as `kill -9` of the process group
        sweep.communicate()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert set(runs(uri, "smoke")["status"]) == {"RUNNING"}  # no one could end them

    monkeypatch.chdir(tmp_path)  # `runner report` where the sweep was started: its default store
    code, stdout, stderr = subcommand(capsys, "report")
    assert code == 0, stderr[-2000:]
    (row,) = markdown_rows(stdout)
    assert row["status"].startswith("DEAD (last wrote ") and row["status"].endswith(" ago)"), row
    df = runs(uri, "smoke").set_index("run_id")
    parent = df.index[df["tags.sweep"] == "parent"][0]
    job = df.index[df["tags.sweep"] != "parent"][0]
    assert df.loc[job, "status"] == "KILLED" and "died" in df.loc[job, "tags.error"]
    assert df.loc[parent, "status"] == "KILLED"  # its sweep was killed
    assert f"logged to parent run {parent}, closed KILLED first" in stdout
    from mlflow import MlflowClient

    logged = {Path(f.path).name for f in MlflowClient(uri).list_artifacts(parent, "report")}
    # its one job died before it measured anything: the report and no plots of empty axes (runner/report/table.py)
    assert logged == {"report.md"} and "plots: none (no run measured a rate or a test score)" in stdout


@pytest.mark.alone  # a real probe: beside another test it disturbs it (and is disturbed)
def test_the_first_peak_probe_says_what_it_does_before_it_starts_and_a_cached_peak_says_nothing(
        tmp_path, monkeypatch, caplog):
    from runner.measure import peak

    cached, empty = tmp_path / "cached", tmp_path / "empty"
    peak.write_cache(cached / peak.CACHE_FILE, {peak.cache_key(peak._cpu_description()): {"gflops": 100.0}})
    started: list[list[str]] = []  # the log so far, at each start of a probe process
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: started.append(caplog.messages[:]) or real_run(*a, **k))
    caplog.set_level(logging.INFO, logger="runner.measure.peak")

    monkeypatch.setenv("RUNNER_CACHE_DIR", str(cached))
    assert peak.cpu_peak() == 100.0 and not started and not caplog.messages  # cached: no probe, no line

    empty.mkdir()
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(empty))
    peak.cpu_peak()  # the real probe, in its own process (a busy machine may give no figure: not asserted)
    assert len(started) == 1, "the probe did not run"
    (line,) = started[0]
    assert line == (f"measuring this machine's float32 matmul peak once for MFU (cached in {empty / peak.CACHE_FILE}): "
                    f"~{peak.PROBE_SECONDS} s")


def test_a_checkpoint_folder_is_refused_only_while_the_process_that_claimed_it_lives(tmp_path):
    """The claim names its process (host, pid, start): no store is read, a later process given the same pid is not
    taken for it, and a run's end gives the folder up (a long-lived process runs others after it)."""
    from runner import checkpoints
    from runner.tracking.tags import process_tags

    folder, other = tmp_path / "folder", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    writer = folder / checkpoints.WRITER_FILE
    try:
        deadline = time.time() + 10
        while not (since := stale.started(other.pid)) and time.time() < deadline:
            time.sleep(0.01)
        folder.mkdir()
        living = {**process_tags(), "runner.pid": str(other.pid), "runner.started": since}
        writer.write_text(json.dumps({"run_id": "first", **living}))
        with pytest.raises(checkpoints.CheckpointInUse, match=rf"run first of this config .* \(pid {other.pid}\)"):
            checkpoints.claim(folder, "second")
        for gone in ({**living, "runner.started": "1"},  # its pid now another process's
                     {**process_tags(), "runner.pid": str(other.pid)}):  # its process has ended (below)
            if "runner.started" not in gone:
                other.kill()
                other.wait()
            writer.write_text(json.dumps({"run_id": "first", **gone}))
            checkpoints.claim(folder, "second")
            assert json.loads(writer.read_text())["run_id"] == "second"
    finally:
        other.kill()
    checkpoints.claim(folder, "third")  # this process's earlier run ("second") has ended: a process runs one at a time
    checkpoints.release(folder)  # the run's end gives the folder up
    assert not writer.exists()
