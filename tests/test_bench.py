"""The benchmark commands, run for real on a tiny grid: fresh processes (plain Keras fit in this one), figures read back
from MLflow."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import called, compose, markdown_rows, runs

from runner.data_pipelines import PIPELINES

ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.long
@pytest.mark.slow  # 3 fresh jobs, ~40 s; the pipeline-alone rate itself is in the default run (test_train.py)
def test_pipeline_benchmark_prints_both_rates_for_every_pipeline(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "runner.bench", "pipelines", "--gpus", "2", "--strategies", "replicated",
         "--variant", "tiny", "--steps", "60", "--steps-per-call", "10", "--batch", "64", "--tracking-uri", uri],
        capture_output=True, text=True, env=ENV, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in markdown_rows(proc.stdout) if r["strategy"] == "replicated"]
    assert sorted(r["pipeline"] for r in rows) == sorted(PIPELINES.names())
    for row in rows:
        pipeline_rate = float(row["pipeline alone (batches/s)"].replace(",", ""))
        step_rate = float(row["training step (batches/s)"].replace(",", ""))
        assert pipeline_rate > 0 and step_rate > 0
        # The ratio is of the unrounded rates, printed to 0.05; the rates are printed to half a batch/s each, so the
        # printed ratio lies within the ratios those rates allow, widened by its own rounding (no fixed band: a run
        # printed 4.8x for 3420 / 705 = 4.851, which rates of 3419.5 / 705.4 give).
        low, high = (pipeline_rate - 0.5) / (step_rate + 0.5), (pipeline_rate + 0.5) / (step_rate - 0.5)
        assert low - 0.05 - 1e-9 <= float(row["ratio"].rstrip("x")) <= high + 0.05 + 1e-9
        # decided on the unrounded rates (runner.measure.hooks): within the printed figures' rounding (half a batch/s
        # each) of the 3x line, the printed ones cannot tell which side it fell (a run printed 'yes' for 3x there)
        assert row["input-bound"] in ("yes", "no")
        if abs(pipeline_rate - 3 * step_rate) > 0.5 + 3 * 0.5:
            assert row["input-bound"] == ("yes" if pipeline_rate < 3 * step_rate else "no")


def _baseline(capsys, *argv: str) -> dict:
    """Plain Keras fit (`python -m runner.bench.keras_baseline ARGV`) in this process, on the tests' TensorFlow: the
    JSON figures it prints last. The bench starts it as a fresh process per job (jobs.keras_job, the slow grid tests);
    what these tests check is what the command computes and prints."""
    from runner.bench import keras_baseline

    code, out, err = called(capsys, keras_baseline.main, *argv)
    assert code == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_keras_baseline_times_plain_fit(tf_devices, capsys):
    figures = _baseline(capsys, "--variant", "tiny", "--steps", "60", "--chunk", "10", "--batch", "64",
                        "--optimizer", "sgd")
    assert figures["images_per_sec"] > 0 and figures["timed_steps"] == 50  # first 10-step epoch excluded
    assert figures["devices"] == 1 and figures["distributed"] is False
    assert figures["optimizer"] == "SGD"  # Keras' own optimizer of the name given


def test_keras_baseline_fits_the_gpt_with_its_recipe_and_counts_tokens(tf_devices, capsys):
    """The GPT's recipe (AdamW, clipping at 1.0, from conf/model/gpt.yaml) reaches Keras fit; its rate is tokens/s:
    batch x context per step."""
    figures = _baseline(capsys, "--model", "gpt", "--variant", "tiny", "--data", "shakespeare", "--steps", "40",
                        "--chunk", "10", "--batch", "8", "--override=data.sequence_length=16")  # no --optimizer: the model's
    assert figures["optimizer"] == "AdamW" and figures["clip_norm"] == 1.0 and "images_per_sec" not in figures
    assert figures["tokens_per_sec"] == pytest.approx(8 * 16 * 1e3 / figures["step_time_ms"], rel=1e-6)


USER_MODEL = ["+model._target_=user_models.resnet", "model.name=resnet", "data.shape=[32,32,3]",
              "data.train_limit=1024", "data.test_limit=128"]  # tests/user_models.py, batch norm, 32x32x3


def test_the_bench_takes_a_users_model_and_data_for_runner_jobs_and_keras_fit_alike(tf_devices, capsys):
    """--override reaches every runner job's config and Keras fit's, which then fits the very model the runner
    builds (the user's ResNet with its batch normalization, for the data's 32x32x3 spec)."""
    from runner.bench import grid, jobs

    args = argparse.Namespace(models=["mlp"], variants=["default"], steps=40, steps_per_call=10, batch=64,
                              data="synthetic", test_limit=None, optimizer="adam", override=USER_MODEL)
    (setting,) = grid.settings(args)
    cfg = compose(*setting.overrides())
    assert cfg.model._target_ == "user_models.resnet" and list(cfg.data.shape) == [32, 32, 3]
    assert "+model._target_=user_models.resnet" in setting.name  # tables say what was measured
    command = jobs.keras_command(setting, 1, mirrored=False)
    assert command[:3] == [sys.executable, "-m", "runner.bench.keras_baseline"]
    assert _baseline(capsys, *command[3:])["timed_steps"] == 30  # tests/ is on this process's path, as PYTHONPATH


def test_grid_optimizer_reaches_runner_jobs_and_keras_fit():
    from runner.bench import grid, jobs

    args = argparse.Namespace(models=["mlp"], variants=["tiny"], steps=None, steps_per_call=None, batch=128,
                              data="mnist", test_limit=None, optimizer="momentum", override=[])
    (setting,) = grid.settings(args)
    cfg = compose(*setting.overrides())
    assert cfg.train.optimizer == "momentum" and cfg.model.variant == "tiny"
    cmd = jobs.keras_command(setting, 2, mirrored=True)
    assert cmd[cmd.index("--optimizer") + 1] == "momentum" and cmd[-1] == "--mirrored"
    assert "optimizer momentum" in grid.format_table(jobs.Table(setting, "now"))[0]
    # without --optimizer each model trains with its own (was: adam for all, which gpt's weight decay refuses)
    args.models, args.variants, args.optimizer, args.data = ["gpt"], ["tiny"], None, "shakespeare"
    (setting,) = grid.settings(args)
    assert setting.optimizer == "adamw" and compose(*setting.overrides()).train.optimizer == "adamw"
    cmd = jobs.keras_command(setting, 1, mirrored=False)
    assert cmd[cmd.index("--optimizer") + 1] == "adamw"
    assert "optimizer adamw" in grid.format_table(jobs.Table(setting, "now"))[0]  # the tables say which


GRID = ["--models", "mlp", "--variants", "tiny", "--gpus", "1,2", "--strategies", "replicated", "--pipelines",
        "split", "--steps", "60", "--steps-per-call", "10"]


def _num(cell: str) -> float:
    return float(cell.split()[0].replace(",", "").rstrip("x"))


def _table(stdout: str) -> dict[tuple[str, int], dict[str, str]]:
    """The data rows of the printed table, by (what, devices)."""
    return {(r["what"], int(r["devices"])): r for r in markdown_rows(stdout)}


def _targets(stdout: str) -> dict[str, tuple[str, str]]:
    """Summary lines `- PASS|FAIL name: detail`, by name."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith(("- PASS ", "- FAIL ")):
            name, detail = line[7:].rsplit(": ", 1)
            out[name] = (line[2:6], detail)
    return out


def _agrees(status: str, values: list[float], holds, near) -> None:
    """PASS iff every printed value holds, unless one is within the printed rounding of the threshold."""
    if not any(near(v) for v in values):
        assert status == ("PASS" if all(holds(v) for v in values) else "FAIL"), (status, values)


@pytest.mark.long
@pytest.mark.slow  # 14 fresh jobs, ~100 s; the Keras baseline and the --steps check stay in the default run
def test_grid_benchmark_prints_ratios_baselines_and_targets(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "grid.md"
    proc = subprocess.run(
        [sys.executable, "-m", "runner.bench", "grid", *GRID, "--repeats", "2", "--tracking-uri", uri,
         "--out", str(out)],
        capture_output=True, text=True, env=ENV, timeout=900, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "# benchmark grid: 14 jobs in 2 rounds (8 runner, 6 keras fit)" in proc.stdout
    assert "## mlp/tiny: global batch 128, 60 steps (10 per call" in proc.stdout and "data mnist" in proc.stdout
    assert "optimizer adam" in proc.stdout and "median (lowest-highest) of 2 runs" in proc.stdout
    rows = _table(proc.stdout)
    assert sorted(rows) == sorted([
        ("runner single (before the grid)", 1), ("runner single (after the grid)", 1), ("keras fit", 1),
        ("keras fit + MirroredStrategy", 1), ("keras fit + MirroredStrategy", 2),
        ("runner replicated / split", 1), ("runner replicated / split", 2)])
    rate = "images/s, median (lowest-highest) of 2 runs"
    assert all(_num(r["predicted images/s"]) > 0 for (what, _), r in rows.items() if what.startswith("runner"))
    before, after = rows["runner single (before the grid)", 1], rows["runner single (after the grid)", 1]
    single = (_num(before[rate]) + _num(after[rate])) / 2  # the base of "x runner single"
    keras = _num(rows["keras fit", 1][rate])
    for key, r in rows.items():
        low, high = (float(v.replace(",", "")) for v in r[rate].split()[1].strip("()").split("-"))
        assert low <= _num(r[rate]) <= high  # the median of the two runs, between them
        assert int(r["timed steps"]) == 50  # 6 calls of 10 steps, the first one warm-up
        assert abs(_num(r["x runner single"]) - _num(r[rate]) / single) <= 0.011
        assert abs(_num(r["x keras fit"]) - _num(r[rate]) / keras) <= 0.011
        assert _num(r["peak RSS (MB)"]) > 0 and _num(r["overhead (s)"]) > 0  # for Keras fit too
        alone, ratio = r["pipeline alone (batches/s)"], r["pipeline / step"]
        if key[0].startswith("runner"):
            assert abs(_num(ratio) - _num(alone) / (_num(r[rate]) / 128)) <= 0.06  # pipeline alone / step batches/s
        else:
            assert alone == ratio == "-"
    targets = _targets(proc.stdout)
    status, detail = targets["mlp/tiny: runner 1 device >= 1.5x keras fit"]
    _agrees(status, [single / keras], lambda v: v >= 1.5, lambda v: abs(v - 1.5) < 0.01)
    status, detail = targets["mlp/tiny: every data-parallel strategy x pipeline at 2 devices >= 0.9x runner single"]
    assert detail.startswith(("0 of 1 hold", "1 of 1 hold"))
    _agrees(status, [_num(rows["runner replicated / split", 2]["x runner single"])], lambda v: v >= 0.9,
            lambda v: abs(v - 0.9) < 0.01)
    runner = [r for key, r in rows.items() if key[0].startswith("runner")]
    status, detail = targets["pipeline alone >= 3x the step rate, every runner job"]
    _agrees(status, [_num(r["pipeline / step"]) for r in runner], lambda v: v >= 3, lambda v: abs(v - 3) < 0.06)
    status, detail = targets["job overhead (process start to first step) <= 10 s, every runner job"]
    _agrees(status, [_num(r["overhead (s)"]) for r in runner], lambda v: v <= 10, lambda v: abs(v - 10) < 0.06)
    status, detail = targets["peak RSS of a tiny (smoke) MLP runner job <= 1536 MB, any devices"]
    _agrees(status, [_num(r["peak RSS (MB)"]) for r in runner], lambda v: v <= 1536, lambda v: abs(v - 1536) < 1)
    status, detail = targets["at least 20 timed steps after warm-up, every job"]
    assert (status, detail) == ("PASS", "7 of 7 hold; fewest 50 (mlp/tiny runner single (before the grid) x1)")  # rows
    assert all(detail.split(" of ")[1].startswith(str(len(runner))) for name, (_, detail) in targets.items()
               if "every runner job" in name or "tiny (smoke)" in name)
    assert out.read_text().strip() == proc.stdout.strip()
    # The runner jobs are one sweep (runner.sweep.launch): a parent run closed FINISHED, its 8 jobs under it, each
    # round a config of its own; the sweep's table and verdict end the bench, and `runner report` finds it.
    table = runs(uri, "bench_grid")
    (parent,) = table[table["tags.sweep"] == "parent"].itertuples()
    children = table[table["tags.mlflow.parentRunId"] == parent.run_id]
    assert parent.status == "FINISHED" and len(children) == 8 and set(children["status"]) == {"FINISHED"}
    assert sorted(children["params.sweep.round"]) == ["0"] * 4 + ["1"] * 4
    assert "bench: 8 runner jobs, 0 failed" in proc.stderr and "verdict: mlp/tiny: fastest" in proc.stderr
    report = subprocess.run([sys.executable, "-m", "runner", "report", "--experiment", "bench_grid", "--latest-sweep", "--tracking-uri",
                             uri, "--out", str(tmp_path / "report")], capture_output=True, text=True, env=ENV,
                            cwd=tmp_path, timeout=300)
    assert report.returncode == 0 and f"(parent run {parent.run_id})" in report.stdout, report.stderr[-2000:]


def test_grid_refuses_fewer_than_20_timed_steps_and_counts_jobs(capsys, tmp_path):
    from runner.data_pipelines import PIPELINES
    from runner.bench import grid, jobs
    from runner.bench.__main__ import main

    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as exit_:
        main(["grid", "--steps", "60", "--steps-per-call", "25"])  # 2 calls, 1 timed: 25 steps in 1 call
    assert exit_.value.code == 2
    assert "times only 25 steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["pipelines", "--steps", "60", "--steps-per-call", "25"])  # the pipelines bench checks its steps too
    assert exit_.value.code == 2 and "mlp: --steps 60 --steps-per-call 25 times only 25" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # 3 towers cannot split 128 images: said once, before any job
        main(["strategies", "--gpus", "2,3", "--batch", "128"])
    assert exit_.value.code == 2 and "--gpus 3: train.global_batch_size=128 is not divisible by the 3 towers" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["strategies", "--repeats", "0"])
    assert exit_.value.code == 2 and "argument --repeats: 0 is not a positive count" in capsys.readouterr().err
    for args, said in [(["strategies", "--steps", "0"], "argument --steps: 0 is not a positive count"),
                       (["grid", "--models", "nope"], "error: model.name='nope' is not allowed; choose one of"),
                       (["floors", "--models", "nope"], "error: model.name='nope' is not allowed; choose one of"),
                       (["strategies", "--strategies", "mirrored,nope"],
                        "error: --strategies: strategy=nope is not an option of group 'strategy'; choose one of"),
                       (["pipelines", "--pipelines", "nope"],
                        "error: --pipelines: pipeline=nope is not an option of group 'pipeline'; choose one of"),
                       (["published", "--hardware", "nope"], "error: --hardware nope is not one of dgx1_p100"),
                       (["settings", "--groups", "xla,nope"], "error: --groups nope is not one of calls, "),
                       (["predicted", "--experiment", "nope", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
                        "error: --experiment nope: no such experiment in sqlite:"),  # was: exit 1
                       (["published", "--out", f"{tmp_path}/afile/x.md"],  # was a traceback after the benchmark
                        f"error: --out {tmp_path}/afile/x.md cannot hold the tables: {tmp_path}/afile is a file")]:
        with pytest.raises(SystemExit) as exit_:  # before any job, in one line (was: ignored, a traceback, jobs)
            main(args)
        assert exit_.value.code == 2 and said in capsys.readouterr().err.strip().splitlines()[-1]
    planned = grid.plan([*grid.DATA_PARALLEL, "single"], PIPELINES.names(), [1, 2, 4, 8])
    assert len(planned) == 2 + 1 + 4 + 4 * 3 * len(grid.DATA_PARALLEL) + 3  # single x2, keras x1 and x4, 3 single
    assert all(jobs.timed_steps(*jobs.DEFAULT_STEPS[key]) >= 20 for key in jobs.DEFAULT_STEPS)


def test_the_keras_baseline_refuses_an_override_in_one_line_the_grid_shows():
    from runner.bench.jobs import Setting, keras_job

    setting = Setting("mlp", "default", 600, 50, 128, "mnist", extra=("train.precision=half",))
    said = keras_job(setting, 1, mirrored=False)["error"]
    assert said.startswith("error: train.precision") and "half" in said


@pytest.mark.long
@pytest.mark.slow  # 3 fresh jobs, ~45 s: with the two above, the default run would pass 10 minutes on 2 cores
def test_settings_benchmark_puts_each_value_beside_its_default(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "runner.bench", "settings", "--groups", "fused1", "--steps", "150", "--test-limit",
         "200", "--tracking-uri", uri],
        capture_output=True, text=True, env=ENV, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in markdown_rows(proc.stdout) if r["setting"].startswith("fused")]
    assert [r["value"] for r in rows] == ["`train.fused_optimizer=true (default)`", "`train.fused_optimizer=false`",
                                          "`train.fused_optimizer=true (default), again`"]
    assert all(r["rate ± stderr"].endswith(" images/s") for r in rows)
    rates = [float(r["rate ± stderr"].split("±")[0].replace(",", "")) for r in rows]
    assert all(rate > 0 for rate in rates)
    assert rows[0]["x default"] == "1.00"
    assert float(rows[1]["x default"]) == pytest.approx(rates[1] / rates[0], abs=0.006)
    assert all(0.1 < float(r["test metric"].removeprefix("accuracy ")) <= 1 for r in rows)  # each job's accuracy


def test_repeats_combine_into_the_median_row_with_its_range():
    from runner.bench import grid, jobs

    runs = [{"rate": r, "rate_stderr": 9.0, "timed_steps": 50.0, "peak_rss_mb": rss,
             "seconds_to_first_step": t} for r, rss, t in [(300.0, 900.0, 5.0), (100.0, 950.0, 7.0), (200.0, 920.0, 6.0)]]
    row = jobs.combine(runs)
    assert row["rate"] == 200.0
    assert row["seconds_to_first_step"] == 6.0 and row["peak_rss_mb"] == 950.0 and row["repeats"] == 3
    assert row["rate_runs"] == [300.0, 100.0, 200.0]  # each round's, in order: the retest's halves
    assert jobs.combine([runs[0], {"error": "boom"}]) == {"error": "boom"}  # a failed repeat fails the row
    assert jobs.combine(runs[:1]) is runs[0]
    setting = jobs.Setting("mlp", "tiny", 60, 10, 128, "mnist")
    single = jobs.Job("baseline", 1, "runner single (before the grid)", "single", "split")
    table = jobs.Table(setting, "now", rows=[(single, row)], repeats=3)
    lines = grid.format_table(table)
    assert "images/s, median (lowest-highest) of 3 runs" in lines[4] and "median of 3 runs" in lines[2]
    (row,) = markdown_rows("\n".join(lines))
    assert (row["what"], row["devices"], row["images/s, median (lowest-highest) of 3 runs"], row["timed steps"],
            row["x runner single"]) == ("runner single (before the grid)", "1", "200 (100-300)", "50", "1.00")


def test_sharded_update_targets_compare_rows_of_the_same_pipeline_and_devices():
    from runner.bench.grid import sharded_update_targets
    from runner.bench.jobs import Job, Setting, Table

    single = {"rate": 100.0, "optimizer_state_bytes_per_device": 4000.0, "step_time_over_floor": 1.12}
    rows = [(Job("baseline", 1, "runner single"), single),
            (Job("runner", 4, "r", "replicated", "split"), {"rate": 80.0}),
            (Job("runner", 4, "s", "sharded_update", "split"), {"rate": 88.0,
                                                                 "optimizer_state_bytes_per_device": 1008.0}),
            (Job("runner", 4, "r", "replicated", "sharded"), {"rate": 90.0}),
            (Job("runner", 4, "s", "sharded_update", "sharded"), {"rate": 81.0,
                                                                   "optimizer_state_bytes_per_device": 1000.0})]
    lines = sharded_update_targets(Table(Setting("mlp", "default", 600, 50, 128, "mnist"), "now", rows))
    assert lines == [
        "- FAIL mlp/default: sharded_update >= replicated, same pipeline and devices: 1 of 2 hold; lowest 0.90x "
        "(sharded x4)",
        "- PASS mlp/default: sharded_update optimizer state per device x N <= one device's + 1%: 2 of 2 hold; "
        "highest 1.008 (split x4)",
        "- PASS mlp/default: runner single step <= 1.15x its floor: 1 of 1 hold; highest 1.12x (runner single)",
    ]
    # A run of sharded_update alone (--strategies sharded_update) has nothing to compare it with: not a failure.
    alone = [row for row in rows if row[0].strategy != "replicated"]
    lines = sharded_update_targets(Table(Setting("mlp", "default", 600, 50, 128, "mnist"), "now", alone))
    assert lines[0] == ("- n/a mlp/default: sharded_update >= replicated, same pipeline and devices: not measured in "
                        "this run")
    # One whose replicated job failed (no rate) is a failure.
    failed = [*alone, (Job("runner", 4, "r", "replicated", "split"), {"error": "boom"})]
    lines = sharded_update_targets(Table(Setting("mlp", "default", 600, 50, 128, "mnist"), "now", failed))
    assert lines[0] == ("- FAIL mlp/default: sharded_update >= replicated, same pipeline and devices: 0 of 1 hold; "
                        "1 failed")


def test_floors_rows_take_medians_over_rounds_and_judge_each_model():
    """Made-up rounds: the row's medians and ranges, the per-round runner / Keras ratio, and the three targets."""
    from runner.bench.floors import _row, targets
    from runner.bench.jobs import Setting

    runs = [{"rate": r, "step_time_ms": 1e3 * 128 / r, "floor_compute_ms": 3.0, "floor_update_ms": 0.5,
             "step_time_over_floor": f, "mfu": u, "peak_gflops": 224.0}
            for r, f, u in [(36000.0, 1.02, 0.52), (30000.0, 1.22, 1.04), (35000.0, 1.05, 0.50)]]
    fits = [{"rate": 24000.0}, {"rate": 15000.0}, {"error": "killed"}]
    setting = Setting("mlp", "default", 600, 50, 128, "mnist")
    line, figures = _row(setting, runs, fits)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0].startswith("mlp/default (1 failed: killed)") and cells[1] == "128"
    assert cells[2] == "35,000 (30,000-36,000)" and cells[3] == "19,500 (15,000-24,000)"
    assert figures["vs_keras"] == [1.5, 2.0] and cells[4] == "1.75 (1.50-2.00)"  # rounds with both jobs only
    assert cells[8] == "1.05 (1.02-1.22)" and cells[9] == "52.0% (50.0%-104.0%)"
    assert targets([(setting, figures)]) == [
        "- PASS mlp/default: one-device step <= 1.15x its floor (median): 1 of 1 hold; highest 1.05x (runner single)",
        "- PASS mlp/default: runner 1 device >= 1.5x keras fit (median of rounds): 1 of 1 hold; lowest 1.75x "
        "(runner / keras)",
        "- FAIL MFU <= 100% in every one-device runner run: 2 of 3 hold; highest 104.0% (mlp/default)",
    ]
    from runner.bench.floors import above_floor

    assert above_floor([("x1", [1.02, 0.97, 1.1]), ("mirrored x2", [0.9, 0.95, 1.01])]) == (
        "- FAIL every step >= its floor (median step / floor >= 1.0): 1 of 2 hold; lowest 0.95x (mirrored x2)")
    assert above_floor([("x1", [1.02, 0.97, 1.1])]).startswith("- PASS")
    del runs[1]["mfu"]  # left out by the run (above 1 even after a re-probe): not shown to hold
    _, figures = _row(setting, runs, fits)
    assert targets([(setting, figures)])[-1] == ("- FAIL MFU <= 100% in every one-device runner run: 2 of 3 hold; "
                                                 "highest 52.0% (mlp/default); 1 failed")


@pytest.mark.long
@pytest.mark.slow  # 2 fresh jobs, ~30 s
def test_floors_benchmark_runs_each_model_and_keras_in_rounds(tmp_path):
    out = tmp_path / "floors.md"
    proc = subprocess.run([sys.executable, "-m", "runner.bench", "floors", "--models", "mlp", "--rounds", "1",
                           "--gpus", "1,2", "--steps", "100", "--steps-per-call", "25", "--tracking-uri",
                           f"sqlite:///{tmp_path}/m.db", "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row, *multi = markdown_rows(out.read_text())
    assert row["model"] == "mlp/default" and float(row["step / floor"]) > 0.5
    assert [(r["job"], r["devices"]) for r in multi] == [("runner mirrored / split", "2"),
                                                         ("runner parameter_server / per_tower", "2")]
    assert all(r["step / floor"] == "-" and float(r["step ms"]) > 0 for r in multi)  # no floor bounds them
    assert "every step >= its floor (median step / floor >= 1.0): " in out.read_text()  # the one-device job judged
    assert "- n/a floors at x2: not measured: on 2 simulated CPU devices" in out.read_text()
    assert float(row["runner / keras (per round)"]) > 0 and float(row["MFU"].rstrip("%")) > 0
    assert "MFU <= 100% in every one-device runner run: 1 of 1 hold" in out.read_text()


@pytest.mark.slow  # a bench and its job, started and stopped (~40 s)
def test_a_bench_stopped_by_sigterm_stops_its_job_and_closes_both_runs_killed(tmp_path):
    """SIGTERM (a scheduler's, `timeout`'s) to a bench: its running job is stopped, not left running; the job's run
    and the bench's parent run end KILLED, and the bench exits 143."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    bench = subprocess.Popen(
        [sys.executable, "-m", "runner.bench", "pipelines", "--gpus", "2", "--strategies", "replicated", "--pipelines",
         "split", "--variant", "tiny", "--steps", "200000", "--steps-per-call", "50", "--tracking-uri", uri],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    deadline = time.time() + 180
    while time.time() < deadline and not _training(tmp_path):
        time.sleep(1)
    bench.send_signal(signal.SIGTERM)
    _, err = bench.communicate(timeout=180)
    assert bench.returncode == 143, err[-2000:]
    table = runs(uri, "bench_pipelines")
    assert sorted(table["status"]) == ["KILLED", "KILLED"] and "stopped (stopped by SIGTERM)" in err
    assert list(table[table["tags.sweep"] == "parent"]["status"]) == ["KILLED"]


def _training(folder) -> bool:
    """Whether the bench's first job has logged a training step (its run open, the loop running), read from the job's
    log in its sweep folder: asking the store could race the bench's creation of its schema."""
    logs = list(folder.glob("multirun/*/*-bench_pipelines/0/runner.log"))
    return bool(logs) and " - step " in logs[0].read_text()


def test_predicted_keeps_each_groups_rates_in_its_own_unit(monkeypatch, capsys):
    """Was one column 'measured /s (images, tokens or examples)' for an MLP's images/s beside a GPT's tokens/s, and a
    group of one combination 'predicted and confirmed'."""
    import argparse

    from runner.bench import predicted
    from runner.predict import grid
    from runner.predict.costs import Prediction

    runs = [("python -m runner model=mlp strategy=mirrored gpus=2", 900.0),
            ("python -m runner model=mlp strategy=replicated gpus=2", 1000.0),
            ("python -m runner model=gpt data=shakespeare strategy=mirrored gpus=2", 5000.0)]
    monkeypatch.setattr(predicted, "_runs", lambda uri, experiment: runs)

    def predict_all(combos, recalibrate=False):
        def outcome(c):
            gpt = "model=gpt" in c
            name = f"{'gpt' if gpt else 'mlp'}/default {c[-2].split('=')[1]}/split x2"
            rate = Prediction(name, 64, {"towers": 0.01}, "tokens" if gpt else "images", 64 if gpt else 1)
            return grid.Outcome(c, name, rate)
        return [outcome(c) for c in combos]

    monkeypatch.setattr(grid, "predict_all", predict_all)
    predicted.predicted(argparse.Namespace(tracking_uri=None, experiment="e", recalibrate=False, out=None))
    out = capsys.readouterr().out
    assert "| gpt/default x2, tokens/s | mirrored/split | 409,600 | 5,000 |" in out
    assert "| mlp/default x2, images/s | replicated/split | 6,400 | 1,000 |" in out
    assert "\n- prediction: gpt/default x2, tokens/s: 1 combination, error 8092%\n" in out
    assert "- prediction: mlp/default x2, images/s: 2 combinations" in out


def test_predicted_counts_a_combinations_repeats_as_runs_of_it(monkeypatch, capsys):
    """4 combinations run twice each (sweep rounds, a folder per job) printed '8 runs, 8 combinations'."""
    from runner.bench import predicted
    from runner.predict import grid
    from runner.predict.costs import Prediction

    runs = [(f"python -m runner model=mlp strategy={s} pipeline={p} gpus=2 hydra.run.dir=multirun/x/{i}"
             + (" sweep.round=1" if i >= 4 else ""), 1000.0 + i)
            for i, (s, p) in enumerate([("mirrored", "split"), ("mirrored", "sharded"), ("replicated", "split"),
                                        ("replicated", "sharded")] * 2)]
    monkeypatch.setattr(predicted, "_runs", lambda uri, experiment: runs)

    def predict_all(combos, recalibrate=False):
        named = [(c[1].split("=")[1], c[2].split("=")[1]) for c in combos]
        return [grid.Outcome(c, f"mlp/default {s}/{p} x2", Prediction(f"mlp/default {s}/{p} x2", 64,
                                                                      {"towers": 0.01}, "images", 1),
                             disturbed=0.6 if s == "replicated" else None)  # its calibration under others' load
                for c, (s, p) in zip(combos, named)]

    monkeypatch.setattr(grid, "predict_all", predict_all)
    predicted.predicted(argparse.Namespace(tracking_uri=None, experiment="e", recalibrate=False, out=None))
    out = capsys.readouterr().out
    assert "\n8 runs of 4 combinations, predicted in " in out
    assert "- prediction: mlp/default x2, images/s: 4 combinations" in out
    marks = {r["combination"]: r["calibration"] for r in markdown_rows(out)}
    assert marks == {"mirrored/split": "-", "mirrored/sharded": "-", "replicated/split": "disturbed (others used 60% "
                     "of the CPUs)", "replicated/sharded": "disturbed (others used 60% of the CPUs)"}


def test_predicted_reads_a_runs_overrides_from_its_command_line():
    from runner.bench.predicted import _overrides

    command = ("python -m runner strategy=mirrored pipeline=sharded gpus=4 model=mlp 'data.shape=[32, 32, 3]' "
               "mlflow.tracking_uri=sqlite:////tmp/b.db mlflow.experiment=bench_strategies")
    assert _overrides(command) == ["strategy=mirrored", "pipeline=sharded", "gpus=4", "model=mlp",
                                   "data.shape=[32, 32, 3]"]
    assert _overrides("runner -m strategy=single") == ["strategy=single"]
    # A sweep job's: its folder left out, the user's config folders kept as one search path.
    assert _overrides("python -m runner --config-dir /u/conf model=mine hydra.searchpath=[file:///u/more] "
                      "hydra.run.dir=/u/multirun/0") == ["model=mine", "hydra.searchpath=[file:///u/conf,file:///u/more]"]


def test_a_run_tagged_through_the_console_script_reads_as_typed(monkeypatch):
    from runner.bench.predicted import _overrides
    from runner.tracking.tags import command_line

    monkeypatch.setattr(sys, "orig_argv", ["/usr/bin/python3", "/venv/bin/runner", "model=cnn", "gpus=2"])
    assert command_line() == "runner model=cnn gpus=2" and _overrides(command_line()) == ["model=cnn", "gpus=2"]
    monkeypatch.setattr(sys, "orig_argv", ["/usr/bin/python3", "-m", "runner", "model=cnn"])
    assert command_line() == "python3 -m runner model=cnn"


def test_grid_rows_show_their_prediction_and_each_device_count_its_accuracy():
    from runner.bench import grid
    from runner.bench.jobs import Job, Setting, Table

    def row(rate, predicted, low, high):
        return {"rate": rate, "rate_runs": [low, high], "repeats": 2,
                "timed_steps": 50.0, "predicted_rate": predicted}

    rows = [(Job("baseline", 1, "runner single", "single", "split"), {"rate": 100.0, "timed_steps": 50.0,
                                                                     "rate_stderr": 1.0}),
            (Job("runner", 2, "r", "replicated", "split"), row(120.0, 110.0, 115.0, 125.0)),
            (Job("runner", 2, "p", "parameter_server", "split"), row(80.0, 90.0, 78.0, 82.0))]
    table = Table(Setting("mlp", "default", 600, 50, 128, "mnist"), "now", rows, repeats=2)
    (line,) = grid.prediction_lines(table)
    assert line.startswith("- prediction: mlp/default x2: 2 combinations, median error 10%")
    assert "1 of 1 pairs apart beyond the noise ordered right" in line
    assert line.endswith("predicted fastest replicated/split: measured the fastest by throughput, 1.50x the next "
                         "(parameter_server/split), beyond the noise: confirmed")
    cells = markdown_rows("\n".join(grid.format_table(table)))
    assert [c["predicted images/s"] for c in cells] == ["-", "110", "90"]
    rows[2][1]["predicted_disturbed"] = 0.6  # its calibration measured while others used 60% of the CPUs
    cells = markdown_rows("\n".join(grid.format_table(table)))
    assert cells[2]["predicted images/s"] == "90 (calibration disturbed: others used 60% of the CPUs)"


def test_the_peers_bench_refuses_a_folder_without_the_peer_and_its_runner_jobs_validate(tmp_path, capsys):
    """`peers` needs a tf_cnn_benchmarks checkout: a folder without one is one error line before any job; the
    runner's jobs (the user's ResNet-20 on 1 and 2 towers, XLA off and on) are configs the runner takes."""
    from runner.bench.__main__ import main
    from runner.bench.peers import peer_script, runner_overrides
    from runner.config import validate

    with pytest.raises(SystemExit) as exit_:
        main(["peers", "--peer", str(tmp_path)])
    assert exit_.value.code == 2
    assert f"--peer {tmp_path}: no tf_cnn_benchmarks.py there" in capsys.readouterr().err.strip().splitlines()[-1]
    script = tmp_path / "scripts" / "tf_cnn_benchmarks" / "tf_cnn_benchmarks.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    assert peer_script(str(tmp_path)) == script  # the repository's root or the script's folder
    for towers, xla in [(1, "auto"), (2, "true")]:
        plan = validate(compose(*runner_overrides(towers, 64, 200, xla)))
        assert plan.train.global_batch_size == 64 * towers and plan.strategy.towers(plan.gpus) == towers
        assert plan.spec.shape == (32, 32, 3) and plan.train.jit_compile == (True if xla == "true" else "auto")
