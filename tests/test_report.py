"""`runner report`: the verdict's choice and its noise rule on made-up run tables, and the command's defaults and
errors on a real sqlite store filled through MlflowClient (in-process; the store's refusals as real processes)."""

from __future__ import annotations

import math

import pytest
from conftest import new_store, subcommand

from runner.report.verdict import Run, Tolerance, _combinations, decide, learns_same, one_device


def run(strategy, devices, ips=1000.0, stderr=10.0, tta=math.nan, acc=0.95, loss=0.2, pipeline="split", model="mlp"):
    return Run(model, pipeline, strategy, devices, ips, stderr, acc, loss, tta, 0.9)


def test_the_fastest_to_the_target_wins_even_with_fewer_images_per_second():
    runs = [run("single", 1, ips=1000, tta=20.0), run("mirrored", 2, ips=1800, tta=16.0),
            run("replicated", 2, ips=1900, tta=10.0)]
    (v,) = decide(runs)
    assert (v.basis, v.best.name, v.runner_up.name) == ("time to target", "replicated/split x2", "mirrored/split x2")
    assert v.over_runner_up == pytest.approx(1.6) and v.over_one_device == pytest.approx(2.0)
    assert v.beyond_noise is None and "noise unknown" in v.line()  # single runs: time has no measured noise
    assert v.line().startswith("verdict: mlp: fastest replicated/split x2 (10.0 s to 90% test accuracy)")


def test_a_target_every_run_met_at_its_first_check_ranks_nothing_by_time():
    """A GPT timed to a loss above an untrained one's met it at the first check in every run: the ranking by time was
    the first call's start-up (x1 '1.63x' x2 'beyond the noise', x2 running at 1.6x its tokens/s)."""
    import dataclasses

    runs = [dataclasses.replace(run("mirrored", 1, ips=1000, tta=1.2), first_check=True),
            dataclasses.replace(run("mirrored", 2, ips=1600, tta=2.0), first_check=True)]
    (v,) = decide(runs)
    assert (v.basis, v.best.name) == ("throughput", "mirrored/split x2")
    assert "by throughput: every run met 90% test accuracy at its first check (its time to it is start-up's" in v.line()
    runs[1] = dataclasses.replace(runs[1], first_check=False)  # one reached it later: time ranks them again
    assert decide(runs)[0].basis == "time to target"


def test_a_target_accuracy_is_said_to_the_digit_it_was_given():
    """0.995 is 99.5%, not "100% test accuracy" (a target no run can beat, said of one it reached)."""
    (v,) = decide([Run("mlp", "split", "single", 1, 1000.0, 10.0, 0.996, 0.1, 12.0, 0.995)])
    assert "(12.0 s to 99.5% test accuracy)" in v.line()


def test_a_lone_one_device_run_and_a_run_without_a_target_are_said_as_they_are():
    """Was 'learns the same: no 1-device run to compare with' of the 1-device run itself, and a language model without
    a target 'no target accuracy was set' (its target would be train.target_loss)."""
    (v,) = decide([Run("gpt", "split", "single", 1, 5000.0, 10.0, 0.4, 1.9, unit="tokens")])
    assert "by throughput: no target was set" in v.line()
    assert v.line().endswith("learns the same: no other run to compare with the 1-device run (single/split x1)")
    (two,) = decide([run("mirrored", 2, ips=1500)])
    assert two.line().endswith("learns the same: no 1-device run to compare with")


def test_a_run_learns_the_same_as_the_one_device_run_of_its_own_seed():
    """A sweep over train.seed=0,1,2 of one combination read "learns the same as 1 device: 0 of 2": the other seeds'
    one-device runs judged against seed 0's."""
    def seeded(strategy, devices, seed, acc):
        return Run("mlp", "split", strategy, devices, 1000.0, 10.0, acc, 0.2, math.nan, 0.9, seed=str(seed))

    (alone,) = decide([seeded("single", 1, 0, 0.95), seeded("single", 1, 1, 0.90), seeded("single", 1, 2, 0.85)])
    assert alone.same == (0, 0) and "learns the same: no other run to compare with" in alone.line()
    (both,) = decide([seeded("single", 1, 0, 0.95), seeded("single", 1, 1, 0.90),
                      seeded("mirrored", 2, 0, 0.951), seeded("mirrored", 2, 1, 0.899)])
    assert both.same == (2, 2)  # each mirrored run against the single run of its seed (was 1 of 3)


def test_a_fastest_run_on_one_device_names_the_run_it_is_faster_than_and_sub_second_times_keep_two_digits():
    """The verdict read "fastest mirrored/split x1 (0.3 s ...); ...; 1.01x 1 device" of a 1-device run against another
    1-device run, and 0.34 s and 0.31 s both as 0.3 s."""
    runs = [run("single", 1, ips=1000, tta=0.34), run("mirrored", 1, ips=1010, tta=0.31)]
    (v,) = decide(runs)
    assert v.line().startswith("verdict: mlp: fastest mirrored/split x1 (0.31 s to 90% test accuracy)")
    assert v.line().count("1.10x single/split x1") == 1 and "x 1 device" not in v.line()  # the runner-up, said once


def test_runs_that_never_reached_the_target_are_not_ranked_on_time():
    runs = [run("single", 1, ips=1000, tta=20.0), run("mirrored", 2, ips=5000)]  # mirrored: never reached
    (v,) = decide(runs)
    assert v.best.name == "single/split x1" and v.runner_up is None and v.reached == 1


def test_no_run_reached_the_target_falls_back_to_throughput_and_says_so():
    runs = [run("single", 1, ips=1000), run("mirrored", 2, ips=1500), run("replicated", 2, ips=1400)]
    (v,) = decide(runs)
    assert v.basis == "throughput" and v.best.name == "mirrored/split x2"
    assert "by throughput: no run reached 90% test accuracy" in v.line()
    assert v.over_one_device == pytest.approx(1.5)


def test_a_small_stderr_within_each_run_says_nothing_about_the_noise_between_runs():
    """Each run's calls agree closely (stderr 5), yet nothing here measured how much a whole run moves."""
    (v,) = decide([run("mirrored", 2, ips=1500, stderr=5), run("replicated", 2, ips=1400, stderr=5)])
    assert v.beyond_noise is None and v.spread is None and "noise unknown" in v.line()


def test_one_device_runs_of_different_strategies_measure_the_noise_for_the_rest():
    """The issue's sweep: the two 1-device rows did the same work and measured 36,009 and 30,496 images/s (18% apart),
    so a 5% margin at 2 devices is within the noise, whatever each run's own stderr; a 30% one is beyond it."""
    rows = [run("mirrored", 1, ips=36_009, stderr=368), run("replicated", 1, ips=30_496, stderr=644)]
    close = decide([*rows, run("replicated", 2, ips=38_000, stderr=300), run("mirrored", 2, ips=36_400, stderr=300)])[0]
    assert close.best.name == "replicated/split x2" and close.beyond_noise is False
    assert close.spread.relative == pytest.approx((36_009 - 30_496) / 33_252.5)
    assert "within the noise (run-to-run spread 17%, 2 one-device runs)" in close.line()
    far = decide([*rows, run("replicated", 2, ips=50_000), run("mirrored", 2, ips=38_000)])[0]
    assert far.best.name == "replicated/split x2" and far.beyond_noise is True and "beyond the noise" in far.line()


def test_the_two_runs_compared_are_not_their_own_noise():
    """Issue #61: when the fastest and the runner-up are a model's only two one-device runs, their own difference is
    no measure of the noise (max/min - 1 always exceeds (max - min)/median): the verdict cannot tell, and says how to
    know. Nor does a compared run measure it with one other one-device run."""
    (v,) = decide([run("mirrored", 1, ips=1010), run("replicated", 1, ips=1000), run("mirrored", 2, ips=900)])
    assert (v.best.name, v.runner_up.name) == ("mirrored/split x1", "replicated/split x1")
    assert v.beyond_noise is None and v.spread is None
    assert "beyond the noise" not in v.line() and "noise unknown (single runs: repeat them, sweep.repeats=3" in v.line()
    (v,) = decide([run("mirrored", 1, ips=1100), run("replicated", 2, ips=1000), run("replicated", 1, ips=900)])
    assert v.runner_up.name == "replicated/split x2" and v.beyond_noise is None and v.spread is None


def test_repeats_of_the_compared_runs_still_tell_a_margin_beyond_their_spread():
    """The same two one-device combinations, each run twice: the repeats measure the noise, their ranges do not
    overlap, so the margin is real; with the runner-up run once, the best's repeats (1% apart) judge its 10%."""
    repeated = [run("mirrored", 1, ips=v) for v in (1100, 1110)] + [run("replicated", 1, ips=v) for v in (1000, 1004)]
    (v,) = decide(repeated)
    assert v.best.name == "mirrored/split x1" and v.beyond_noise is True and "beyond the noise" in v.line()
    (v,) = decide(repeated[:3])
    assert v.beyond_noise is True and v.spread.source == "repeats of mirrored/split x1"
    assert "beyond the noise (run-to-run spread 1%, repeats of mirrored/split x1)" in v.line()


def test_repeats_whose_ranges_part_by_chance_keep_a_margin_under_the_spread_said_within_the_noise():
    """A tester's GPT sweep (sweep.repeats=2): '1.17x replicated/split x2; beyond the noise (run-to-run spread 21%,
    repeats of replicated/split x2)': two repeats each, ranges apart (one time in three by chance), the margin under
    the spread printed beside it. Beyond the noise now needs both; the single-run verdicts name their 1-device run."""
    runs = [run("mirrored", 2, ips=v) for v in (1160, 1180)] + [run("replicated", 2, ips=v) for v in (900, 1110)]
    (v,) = decide([*runs, run("single", 1, ips=600)])
    assert v.best.name == "mirrored/split x2" and v.over_runner_up == pytest.approx(1170 / 1005)
    assert v.beyond_noise is False and "within the noise (run-to-run spread 21%, repeats of replicated/split x2)" \
        in v.line() and "1.95x single/split x1" in v.line()  # was '1.95x 1 device': which of them unsaid
    runs[2:] = [run("replicated", 2, ips=v) for v in (1000, 1010)]  # a 16% margin over 2% repeats: beyond
    (v,) = decide(runs)
    assert v.beyond_noise is True and "beyond the noise (run-to-run spread 2%" in v.line()


def test_one_combination_is_the_only_one_not_the_fastest():
    """A sweep stopped after one run: 'verdict: cnn/tiny: fastest mirrored/split x1 (7,364 images/s)' of nothing."""
    (v,) = decide([run("mirrored", 1, ips=7364)])
    assert v.line().startswith("verdict: mlp: only mirrored/split x1 (7,364 images/s), no other combination finished")
    assert "fastest" not in v.line()


def test_repeats_that_differ_keep_a_margin_within_the_noise_and_repeats_that_agree_let_it_count():
    noisy = [run("mirrored", 2, ips=v) for v in (1000, 1300)] + [run("replicated", 2, ips=1100, stderr=1)]
    (v,) = decide(noisy)
    assert v.best.name == "mirrored/split x2" and v.beyond_noise is False  # 1150 / 1100: 5% < the repeats' 26%
    steady = [run("mirrored", 2, ips=v) for v in (1200, 1210)] + [run("replicated", 2, ips=1100)]
    (v,) = decide(steady)
    assert v.beyond_noise is True and "run-to-run spread 1%, repeats of mirrored/split x2" in v.line()


def test_weak_scaling_and_the_host_cpu_are_other_work_than_strong_scaling_on_the_devices():
    """Strong and weak runs on 2 devices are not repeats of one combination, nor a gpus=0 run one on 1 device."""
    runs = [run("replicated", 2, ips=30_000), run("single", 1, ips=20_000),
            Run("mlp", "split", "replicated", 2, 60_000, 10.0, 0.95, 0.2, math.nan, 0.9, scaling="weak"),
            Run("mlp", "split", "single", 1, 9_000, 10.0, 0.95, 0.2, math.nan, 0.9, host_only=True)]
    (v,) = decide(runs)
    assert v.best.name == "replicated/split x2 (weak)" and v.runner_up.name == "replicated/split x2"
    assert v.best.median("rate") == 60_000 and v.spread is None  # no two runs did the same work
    assert one_device(runs) is runs[1]  # the device, not the host CPU
    assert "single/split x1 on the host CPU" in {c.name for c in _combinations(runs)}


def test_repeats_are_combined_by_their_median_and_judged_by_their_ranges():
    runs = [run("mirrored", 2, tta=t) for t in (10.0, 11.0, 12.0)] + [run("replicated", 2, tta=t)
                                                                       for t in (11.5, 13.0, 14.0)]
    (v,) = decide(runs)
    assert v.best.name == "mirrored/split x2" and v.best.median("time_to_target") == 11.0
    assert v.beyond_noise is False  # ranges 10-12 and 11.5-14 overlap
    runs[3].time_to_target = 12.5
    assert decide(runs)[0].beyond_noise is True  # 10-12 against 12.5-14


def test_ties_go_to_the_first_combination_by_name_and_are_not_beyond_the_noise():
    (v,) = decide([run("replicated", 2, tta=10.0), run("mirrored", 2, tta=10.0)])
    assert v.best.name == "mirrored/split x2" and v.over_runner_up == 1.0 and v.beyond_noise is None


def test_learns_the_same_within_the_stated_tolerance():
    base = run("single", 1, acc=0.95, loss=0.20)
    assert learns_same(run("mirrored", 2, acc=0.945, loss=0.21), base, Tolerance()) is True
    assert learns_same(run("mirrored", 2, acc=0.93, loss=0.20), base, Tolerance()) is False  # accuracy 0.02 off
    assert learns_same(run("mirrored", 2, acc=0.95, loss=0.25), base, Tolerance()) is False  # loss 25% off
    assert learns_same(run("mirrored", 2), None, Tolerance()) is None
    (v,) = decide([base, run("mirrored", 2, acc=0.945, loss=0.21, tta=5.0), run("replicated", 2, acc=0.9, tta=6.0)])
    assert v.same == (1, 2) and "learns the same as 1 device: 1 of 2" in v.line()


def test_one_verdict_per_model():
    lines = [v.line() for v in decide([run("single", 1, model="cnn"), run("single", 1), run("mirrored", 2)])]
    assert [line.split(":")[1].strip() for line in lines] == ["cnn", "mlp"]


@pytest.fixture
def store(tmp_path):
    """Experiments 'alpha' (two plain runs) and 'beta' (a sweep parent with two children), made through MLflow."""
    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)

    def job(experiment, strategy, devices, ips, parent=None, model="mlp", unit="images"):
        tags = {"model": model, "pipeline": "split", "strategy": strategy, "devices.count": str(devices),
                "devices.kind": "CPU", **({"mlflow.parentRunId": parent} if parent else {})}
        rid = client.create_run(experiment, tags=tags).info.run_id
        for key, value in {f"{unit}_per_sec": ips, f"{unit}_per_sec_stderr": 5.0, "test_accuracy": 0.9,
                           "test_loss": 0.3, "train_seconds": 3.0, "target_accuracy": 0.8}.items():
            client.log_metric(rid, key, value)
        client.set_terminated(rid)
        return rid

    alpha = client.create_experiment("alpha")
    job(alpha, "single", 1, 1000)
    job(alpha, "mirrored", 2, 1500)
    beta = client.create_experiment("beta")
    parent = client.create_run(beta, tags={"sweep": "parent", "mlflow.runName": "sweep 2026/x"}).info.run_id
    job(beta, "single", 1, 900, parent)
    job(beta, "replicated", 2, 1700, parent)
    client.set_terminated(parent)
    text = client.create_experiment("text")  # a language model's runs: tokens/s, no images/s
    job(text, "single", 1, 12_000, model="gpt", unit="tokens")
    job(text, "mirrored", 2, 19_000, model="gpt", unit="tokens")
    failed = client.create_run(text, tags={"model": "gpt", "strategy": "replicated", "devices.count": "2"})
    client.set_terminated(failed.info.run_id, "FAILED")  # refused before it timed anything: no rate, no unit
    return uri, parent


def test_a_language_models_report_compares_tokens_per_second(tmp_path, store, capsys):
    from runner.cli.report import main

    uri, _ = store
    assert main(["--tracking-uri", uri, "--experiment", "text", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "| tokens/s | ± stderr |" in out and "| 19,000 | 5 |" in out and "| 1.58 |" in out  # the speedup
    (line,) = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert "fastest mirrored/split x2 (19,000 tokens/s)" in line and "1.58x single/split x1" in line


def _report(tmp_path, uri, capsys, *args) -> tuple[int, str, str]:
    """`runner report` in this process: (exit status, stdout, stderr)."""
    from runner.cli.report import main

    capsys.readouterr()  # what came before
    code = main(["--tracking-uri", uri, "--out", str(tmp_path / "out"), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_no_arguments_report_the_newest_sweep_and_say_so(tmp_path, store, capsys):
    uri, parent = store
    code, out, err = _report(tmp_path, uri, capsys)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("report: sweep 2026/x") and parent in first and "'beta'" in first
    assert "| replicated |" in out and "| mirrored |" not in out  # the sweep's children only
    (verdict,) = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert "fastest replicated/split x2 (1,700 images/s), by throughput: no run reached 80%" in verdict
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == ["accuracy.png", "scaling.png",
                                                                         "time_to_accuracy.png"]
    assert all(p.stat().st_size > 10_000 for p in (tmp_path / "out").glob("*.png"))


def test_an_experiment_without_a_sweep_reports_its_runs_and_latest_sweep_there_is_an_error(tmp_path, store, capsys):
    uri, _ = store
    code, out, _ = _report(tmp_path, uri, capsys, "--experiment", "alpha")
    assert code == 0 and out.splitlines()[0] == "report: all runs of experiment 'alpha'"
    code, _, err = _report(tmp_path, uri, capsys, "--experiment", "alpha", "--latest-sweep")
    assert code == 2
    assert err.strip().splitlines() == [err.strip()] and "no sweep in experiment 'alpha'" in err


def test_failed_runs_alone_are_tabled_without_empty_plots(tmp_path, capsys):
    """Was three PNGs of empty axes (0 to 1, no data) and nothing said."""
    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    failed = client.create_run(client.create_experiment("fails"), tags={"model": "mlp", "strategy": "mirrored",
                                                                        "devices.count": "2"}).info.run_id
    client.set_terminated(failed, "FAILED")
    (tmp_path / "out").mkdir()  # an earlier report's plots (of other kinds), which read as this one's
    for name in ("scaling_tokens.png", "accuracy_examples_auc_auc.png", "notes.txt"):
        (tmp_path / "out" / name).write_bytes(b"earlier")
    code, out, _ = _report(tmp_path, uri, capsys, "--experiment", "fails")
    assert code == 0 and "| FAILED |" in out and "plots: none (no run measured a rate or a test score)" in out
    assert not list((tmp_path / "out").glob("*.png")) and (tmp_path / "out" / "notes.txt").exists()


def test_a_parent_of_another_experiment_than_the_one_given_is_one_line(tmp_path, store, capsys):
    """Was the parent's sweep, reported as if --experiment had not been given."""
    uri, parent = store
    code, _, err = _report(tmp_path, uri, capsys, "--experiment", "alpha", "--parent", parent)
    assert code == 2 and err.strip() == f"error: --parent {parent} is a run of experiment 'beta', not 'alpha'; give " \
                                        "either"


def test_an_unknown_experiment_names_the_ones_that_exist(tmp_path, store, capsys):
    uri, _ = store
    code, _, err = _report(tmp_path, uri, capsys, "--experiment", "gamma")
    assert code == 2
    assert err.strip() == f"error: no experiment 'gamma' in {uri}; experiments: alpha, beta, text"


def test_a_store_that_is_not_there_is_one_line_and_not_made(tmp_path, capsys):
    """A mistyped path (or `runner report` in a folder without runs) made the folders and a 1 MB store, then said
    'no experiments'; a server that does not answer was '[Errno 111] Connection refused' without the store."""
    from runner.cli.report import main

    missing = tmp_path / "typo" / "mlflow.db"
    assert main(["--tracking-uri", f"sqlite:///{missing}", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: no store at sqlite:///{missing}: nothing to report; give the "
                                               "store your runs wrote (--tracking-uri, or run from their folder)")
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("args, said", [
    (["--parent", "0123456789abcdef"], "error: --parent 0123456789abcdef: no run with that id in sqlite:"),
    (["--experiment", "alpha", "--filter", "bogus"], "error: --filter 'bogus': "),  # was: MLflow's words alone
])
def test_a_parent_or_filter_the_store_refuses_is_one_line(tmp_path, store, capsys, args, said):
    """The store's refusal of a parent id or a filter is one line naming the option (through the command's edge,
    runner.cli.main, which the cases above, calling report's main, do not pass)."""
    uri, _ = store
    code, _, err = subcommand(capsys, "report", "--tracking-uri", uri, "--out", str(tmp_path / "out"), *args)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and err.startswith(said), err


@pytest.mark.parametrize("args, said", [
    (["--accuracy-tolerance", "-1"], "argument --accuracy-tolerance: -1 is not a finite number >= 0"),
    (["--loss-tolerance", "nan"], "argument --loss-tolerance: nan is not a finite number >= 0"),
    (["--bogus"], "error: unrecognized arguments: --bogus; `runner report --help` lists them"),  # was argparse's usage
    (["--out", "/proc/report"], "error: --out /proc/report cannot hold the report: No such file or directory"),
    (["--out", "{file}"], "error: --out {file} cannot hold the report: {file} is a file, not a directory"),
    (["--filter", "tags.model = 'none'"],
     "error: no runs matching --filter \"tags.model = 'none'\" to report in experiment 'alpha'"),
])
def test_a_tolerance_folder_or_filter_that_cannot_serve_is_one_line_and_writes_nothing(tmp_path, store, capsys,
                                                                                    args, said):
    """A negative or non-finite tolerance (was taken: every pair of runs then differs), a folder the report cannot
    be written to (was a traceback after reading the store), a filter nothing matches, an option it lacks: one line
    (argparse's refusals came after its usage, four lines)."""
    uri, _ = store
    file = tmp_path / "file"
    file.write_text("")
    args, said = [a.replace("{file}", str(file)) for a in args], said.replace("{file}", str(file))
    out = ["--out", str(tmp_path / "out")] if "--out" not in args else []
    code, stdout, err = subcommand(capsys, "report", "--tracking-uri", uri, "--experiment", "alpha", *out, *args)
    assert code == 2 and stdout == "" and err.strip().splitlines() == [err.strip()] and err.startswith("error: ")
    assert said in err and not (tmp_path / "out").exists(), err


def test_every_option_has_help():
    from runner.cli.report import parser

    assert all(action.help for action in parser()._actions)


def test_the_time_to_accuracy_plot_stars_only_the_confirmed_targets(monkeypatch, tmp_path):
    """A curve of checks on a slice can touch the target line while the full test set did not confirm it: only the
    confirmed point (the run's time to the target) gets a star."""
    from types import SimpleNamespace

    from runner.report import plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: drawn.append(fig))
    figures = dict(rate=math.nan, unit="images", score=math.nan, score_metric="accuracy")  # (the plot reads their kind)
    rows = [SimpleNamespace(run_id="a", model="mlp", strategy="replicated", pipeline="split", devices=2, target=0.98,
                            time_to_target=5.7, target_metric="accuracy", **figures),
            SimpleNamespace(run_id="b", model="mlp", strategy="mirrored", pipeline="split", devices=2, target=0.98,
                            time_to_target=math.nan, target_metric="accuracy", **figures)]
    curves = {"a": [(1, 0.9), (5.7, 0.981)], "b": [(1, 0.88), (7, 0.9801), (9, 0.979)]}  # b touches, unconfirmed
    plots.time_to_accuracy(rows, curves, tmp_path / "t.png")
    stars = [line for line in drawn[0].axes[0].lines if line.get_marker() == "*" and len(line.get_xdata())]
    assert [(list(s.get_xdata()), list(s.get_ydata())) for s in stars] == [([5.7], [0.98])]
    labels = [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
    assert "target confirmed on the full test set" in labels


def test_runs_of_another_setting_are_other_work_and_seeds_are_repeats(tmp_path, capsys):
    """A sweep over train.precision: its runs of one combination were taken as repeats, a median of both settings
    'beyond the noise'. Keys that vary within a combination name each run's setting (a value most runs share only
    where a run's differs); the seed, the batch the scaling derives and what changes nothing computed do not."""
    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("precision")

    def job(precision, strategy, devices, seed, ips):
        tags = {"model": "mlp", "pipeline": "split", "strategy": strategy, "devices.count": str(devices),
                "devices.kind": "CPU"}
        rid = client.create_run(experiment, tags=tags).info.run_id
        for key, value in {"train.precision": precision, "train.seed": seed, "train.global_batch_size": 128,
                           "train.per_device_batch_size": 128 // devices, "mlflow.final_wait": seed,
                           **({"train.later": 1} if seed else {})}.items():  # a key an older runner did not log
            client.log_param(rid, key, value)
        for key, value in {"images_per_sec": ips, "test_accuracy": 0.9, "test_loss": 0.3}.items():
            client.log_metric(rid, key, value)
        client.set_terminated(rid)

    for args in [("float32", "single", 1, 0, 1000), ("float32", "mirrored", 2, 0, 1500),
                 ("float32", "mirrored", 2, 1, 1480), ("mixed_bfloat16", "single", 1, 0, 1010),
                 ("mixed_bfloat16", "mirrored", 2, 0, 1400)]:
        job(*args)
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "precision")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert [line.split(": fastest")[0] for line in lines] == ["verdict: mlp",  # 3 of 5 runs: float32
                                                             "verdict: mlp train.precision=mixed_bfloat16"]
    assert "fastest mirrored/split x2 (1,490 images/s)" in lines[0] and "1.49x single/split x1" in lines[0]
    assert "fastest mirrored/split x2 (1,400 images/s)" in lines[1] and "noise unknown" in lines[1]
    assert "| mlp train.precision=mixed_bfloat16 | split | mirrored | 2 CPU |" in out
    job("mixed_bfloat16", "mirrored", 2, 1, 1420)  # 3 and 3: the key on every run
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "precision")
    assert [line.split(": fastest")[0] for line in out.splitlines() if line.startswith("verdict:")] == [
        "verdict: mlp train.precision=float32", "verdict: mlp train.precision=mixed_bfloat16"]


def test_runs_of_one_model_on_other_data_are_other_work_and_a_regression_says_mae(tmp_path, capsys):
    """An MNIST run (mirrored x2) and a regression on a user's files (single x1), both model=mlp: the MNIST row got
    speedup 0.43, efficiency 0.21 and "learns same: no" against the regression; and the regression, timed to
    nothing, showed a "time to acc." column. Keys outside a combination's own are compared across the model's runs."""
    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("mixed")

    def job(data, strategy, devices, task, metrics):
        tags = {"model": "mlp", "pipeline": "split", "strategy": strategy, "devices.count": str(devices),
                "devices.kind": "CPU", "task": task}
        rid = client.create_run(experiment, tags=tags).info.run_id
        for key, value in {"data.name": data, "strategy.name": strategy, "gpus": devices}.items():
            client.log_param(rid, key, value)
        for key, value in metrics.items():
            client.log_metric(rid, key, value)
        client.set_terminated(rid)

    job("mnist", "mirrored", 2, "class", {"images_per_sec": 1500, "test_accuracy": 0.97, "test_loss": 0.1})
    job("files", "single", 1, "regression", {"images_per_sec": 3500, "test_mae": 0.12, "test_loss": 0.02})
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "mixed")
    assert code == 0, err
    assert "| mlp data.name=mnist | split | mirrored | 2 CPU | strong | 1,500 | - | - | - | - |" in out
    assert "| mlp data.name=files | split | single | 1 CPU | strong | 3,500 | - | - | 1.00 | 1.00 | - | 0.1200 |" in out
    assert "time to MAE (s)" in out and "test MAE" in out


def test_repeats_are_compared_with_the_median_of_the_baselines_repeats_and_plotted_as_one_point_each(
        tmp_path, capsys, monkeypatch):
    """sweep.repeats=2: the table's speedups were over the first-listed 1-device repeat (mirrored x1 read 1.00 and
    0.82) where the verdict takes medians; the scaling plot joined the repeats in a zigzag, the score plot drew them
    on one label. Now the median of the baseline's repeats, one point per device count (their range as error bars)
    and numbered repeats."""
    from mlflow import MlflowClient

    from runner.report import plots

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: drawn.setdefault(path.name, fig))
    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("repeats")
    for devices, round_, ips in [(1, 0, 1000), (1, 1, 1200), (2, 0, 1500), (2, 1, 1900)]:
        tags = {"model": "mlp", "pipeline": "split", "strategy": "mirrored", "devices.count": str(devices),
                "devices.kind": "CPU"}
        rid = client.create_run(experiment, tags=tags).info.run_id
        client.log_param(rid, "sweep.round", round_)
        for key, value in {"images_per_sec": ips, "test_accuracy": 0.9, "test_loss": 0.3}.items():
            client.log_metric(rid, key, value)
        client.set_terminated(rid)
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "repeats")
    assert code == 0, err
    speedups = [line.split(" | ")[8] for line in out.splitlines() if line.startswith("| mlp |")]
    assert sorted(speedups) == ["0.91", "1.09", "1.36", "1.73"]  # over 1,100 images/s, the 1-device median
    throughput = drawn["scaling.png"].axes[0]
    (curve,) = [line for line in throughput.lines if line.get_label() == "mlp mirrored/split"]
    assert list(curve.get_xdata()) == [1, 2] and list(curve.get_ydata()) == [1100, 1700]
    assert throughput.get_title() == "Throughput (median, range of repeats)"
    labels = [t.get_text() for t in drawn["accuracy.png"].axes[0].get_yticklabels()]
    assert sorted(labels) == [f"mlp mirrored/split x{d} #{i}" for d in (1, 2) for i in (1, 2)]


def test_a_setting_is_named_as_an_override_spells_it(tmp_path, capsys):
    """MLflow holds Python's `False`; the report named the setting `train.reuse_freed_memory=False`, which the bench's
    table and the config spell `false`, and a model function's `model.hidden=48` as `model.kwargs.hidden=48`."""
    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("spelling")
    for value in (True, False, None):
        rid = client.create_run(experiment, tags={"model": "mlp", "pipeline": "split", "strategy": "single",
                                                  "devices.count": "1", "devices.kind": "CPU"}).info.run_id
        client.log_param(rid, "train.reuse_freed_memory", value)
        client.log_param(rid, "model.kwargs.hidden", 48 if value else 64)  # a model function's `model.hidden=48`
        client.log_metric(rid, "images_per_sec", 1000)
        client.set_terminated(rid)
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "spelling")
    assert code == 0 and "=False" not in out and "=None" not in out and "kwargs" not in out, out
    named = ["model.hidden=48 train.reuse_freed_memory=true", "train.reuse_freed_memory=false",  # 64: most runs'
             "train.reuse_freed_memory=null"]
    assert {f"| mlp {setting} |" in out for setting in named} == {True}, out


def test_a_clusters_run_counts_every_workers_devices(tmp_path, capsys):
    """A 2-worker job (one CPU each) read as `1 CPU`, speedup 1.00 and "the 1-device run" beside single x1."""
    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("cluster")
    for strategy, workers, ips in (("single", "1", 1000), ("multi_worker", "2", 1600)):
        rid = client.create_run(experiment, tags={"model": "mlp", "pipeline": "split", "strategy": strategy,
                                                  "devices.count": "1", "devices.workers": workers,
                                                  "devices.kind": "CPU"}).info.run_id
        client.log_metric(rid, "images_per_sec", ips)
        client.set_terminated(rid)
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "cluster")
    assert code == 0, err
    assert "| mlp | split | multi_worker | 2 CPU | strong | 1,600 | - | - | 1.60 | 0.80 |" in out
    assert "fastest multi_worker/split x2" in out


def test_mlflows_default_experiment_is_reported_when_asked_for_by_name(tmp_path, capsys):
    """Runs logged without an experiment land in MLflow's 'Default': `--experiment Default` said "no experiment
    'Default'" (it is left out only when the report chooses the newest experiment itself)."""
    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    rid = client.create_run("0", tags={"model": "mlp", "pipeline": "split", "strategy": "single",
                                       "devices.count": "1", "devices.kind": "CPU"}).info.run_id
    client.log_metric(rid, "images_per_sec", 1000)
    client.set_terminated(rid)
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "Default")
    assert code == 0 and "| mlp | split | single | 1 CPU |" in out, err


def test_an_experiments_report_closes_a_sweep_parent_its_dead_sweep_left_running(tmp_path, capsys):
    """`runner report` (the newest sweep) closed a killed sweep's parent; `--experiment X` left it RUNNING."""
    import socket
    import subprocess
    import sys

    from mlflow import MlflowClient

    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("killed")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    parent = client.create_run(experiment, tags={"sweep": "parent", "runner.host": socket.gethostname(),
                                                 "runner.pid": str(gone.pid), "runner.started": "1"}).info.run_id
    job = client.create_run(experiment, tags={"model": "mlp", "pipeline": "split", "strategy": "single",
                                              "devices.count": "1", "devices.kind": "CPU",
                                              "mlflow.parentRunId": parent}).info.run_id
    client.log_metric(job, "images_per_sec", 1000)
    client.set_terminated(job)
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "killed")
    assert code == 0, err
    assert client.get_run(parent).info.status == "KILLED"


def test_a_setting_is_what_a_run_was_given_not_what_its_devices_derive():
    """The batch a scaling derives (a strong run's per-device batch) names no setting, even where a weak-scaling sweep
    varies that key; a refused run (no params) has none; a key an older run did not log still tells the others apart."""
    from runner.report.table import Row, settings

    def row(devices: int, scaling: str = "strong") -> Row:
        return Row(run_id="", kind="CPU", simulated=False, wall_seconds=1.0, model="mlp", pipeline="split",
                   strategy="mirrored", devices=devices, scaling=scaling)

    runs = [(row(1), {"train.per_device_batch_size": "128", "train.global_batch_size": "128"}),
            (row(2), {"train.per_device_batch_size": "64", "train.global_batch_size": "128"}),
            (row(4), {"train.per_device_batch_size": "32", "train.global_batch_size": "128"}),
            *[(row(d, "weak"), {"train.per_device_batch_size": str(b), "train.global_batch_size": str(b * d)})
              for d in (1, 2) for b in (32, 64)],
            (row(2), {}),  # refused before it started
            (row(2), {"train.per_device_batch_size": "64", "train.global_batch_size": "128", "train.later": "a"}),
            (row(2), {"train.per_device_batch_size": "64", "train.global_batch_size": "128", "train.later": "b"})]
    assert settings([p for _, p in runs], [r for r, _ in runs]) == [
        "", "", "", *[f"train.per_device_batch_size={b}" for _ in (1, 2) for b in (32, 64)], "",
        "train.later=a", "train.later=b"]


def test_a_parent_is_found_by_a_unique_prefix_of_its_id_and_an_ambiguous_one_names_its_runs(tmp_path, store,
                                                                                            capsys):
    """`--parent` took only a full 32-digit id; the 8 characters the UI and logs show were 'no run with that id'.
    A prefix is taken as git takes a commit's: a unique one is the run, an ambiguous one is one line naming a few."""
    from collections import Counter

    from mlflow import MlflowClient

    uri, parent = store
    code, out, err = _report(tmp_path, uri, capsys, "--parent", parent[:8])
    assert code == 0, err
    assert out.splitlines()[0] == f"report: sweep parent run {parent}" and "| replicated |" in out
    code, out, err = _report(tmp_path, uri, capsys, "--experiment", "beta", "--parent", parent[:8].upper())
    assert code == 0 and out.splitlines()[0] == f"report: sweep parent run {parent}", err
    client = MlflowClient(uri)
    more = client.create_experiment("more")
    for _ in range(17):  # 17 ids: two of them at least start with the same digit
        client.create_run(more)
    (digit, _), = Counter(r.info.run_id[0] for r in client.search_runs([more], max_results=100)).most_common(1)
    code, _, err = _report(tmp_path, uri, capsys, "--parent", digit)
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    assert err.startswith(f"error: --parent {digit}: the ids of several runs start with it (")
    named = err.split("(")[1].split(")")[0].removesuffix(", ...").split(", ")
    assert 2 <= len(named) <= 5 and all(len(i) == 32 and i.startswith(digit) for i in named), err
    for missing in ("fedcba9876543210", "not-an-id"):  # was: 'the store cannot be read: Invalid value'
        code, _, err = _report(tmp_path, uri, capsys, "--parent", missing)
        assert code == 2 and err.strip() == f"error: --parent {missing}: no run with that id in {uri}", err


def test_runs_that_differ_only_in_their_seed_show_it_in_both_tables_in_its_order():
    """A sweep over train.seed: its runs of one combination are repeats (one model, one verdict), and their rows
    were alike but for their figures; both the report's table and a sweep's end show a seed column where seeds
    differ (and none where they do not)."""
    from runner.report.kinds import Kind
    from runner.report.table import Row, add_speedups, compact, table

    def row(devices: int, seed: str, rate: float) -> Row:
        return Row(run_id="", kind="CPU", simulated=False, wall_seconds=1.0, model="mlp", pipeline="split",
                   strategy="mirrored", devices=devices, seed=seed, rate=rate)

    rows = add_speedups([row(1, "10", 1000), row(1, "2", 1100), row(2, "10", 1900), row(2, "2", 2000), row(2, "", 0)])
    assert [r.seed for r in rows] == ["2", "10", "", "2", "10"]
    full, short = table(rows, Kind()).splitlines(), compact(rows, Kind()).splitlines()
    assert full[0].startswith("| model | pipeline | strategy | devices | scaling | seed | images/s |")
    assert full[2].startswith("| mlp | split | mirrored | 1 CPU | strong | 2 | 1,100 |")
    assert full[4].startswith("| mlp | split | mirrored | 2 CPU | strong | - | 0 |")
    assert short[0].startswith("| model | combination | seed | images/s |")
    assert short[3].startswith("| mlp | mirrored/split x1 | 10 | 1,000 |")
    alike = [row(1, "0", 1000), row(1, "0", 1100), row(2, "", 0)]  # repeats of one seed (sweep.repeats)
    assert "seed" not in table(alike, Kind()) and "seed" not in compact(alike, Kind())


def test_a_filtered_report_of_a_sweep_is_not_logged_over_its_parents_and_names_its_filter(tmp_path, store, capsys):
    """`--parent ... --filter ...` said 'logged to parent run' and replaced the parent's report/ of the whole sweep
    with the filtered rows."""
    from mlflow import MlflowClient

    uri, parent = store
    code, out, err = _report(tmp_path, uri, capsys, "--parent", parent, "--filter", "tags.strategy = 'replicated'")
    assert code == 0, err
    assert out.strip().splitlines()[-1].endswith(f"; not logged to parent run {parent}: a --filter'ed report would "
                                                 "replace its sweep's whole one (leave out --filter to log it)")
    assert MlflowClient(uri).list_artifacts(parent) == []
    report_md = (tmp_path / "out" / "report.md").read_text().splitlines()
    assert report_md[0] == "runs matching --filter \"tags.strategy = 'replicated'\" only"
    assert "| single |" not in "\n".join(report_md)
    code, out, err = _report(tmp_path, uri, capsys, "--parent", parent)
    assert code == 0 and out.strip().endswith(f"; logged to parent run {parent}"), err
    assert [a.path for a in MlflowClient(uri).list_artifacts(parent)] == ["report"]


def _row(devices=1, seed="", round="", **figures):
    from runner.report.table import Row

    return Row(run_id="", kind="CPU", simulated=False, wall_seconds=1.0, model="mlp", pipeline="split",
               strategy="mirrored", devices=devices, seed=seed, round=round, **figures)


def test_a_language_models_table_shows_its_test_loss_and_a_loss_target_its_loss_beside_the_score():
    """A language model (model=gpt data=shakespeare) showed `time to loss (s) | test acc.`: never its test loss in
    nats per token, the figure it is timed to and reports; image, click and regression tables are as they were."""
    from runner.report.kinds import Kind
    from runner.report.table import compact, table

    gpt = [_row(task="next_token", unit="tokens", rate=100.0, loss=3.7682, score=0.1438, target_metric=target)
           for target in ("loss", "accuracy")]
    for rows, kind in (([gpt[0]], Kind("tokens", "accuracy", "loss")), ([gpt[1]], Kind("tokens"))):
        full, short = table(rows, kind).splitlines(), compact(rows, kind).splitlines()
        time = "loss" if kind.target == "loss" else "acc."
        assert f"| time to {time} (s) | test loss (nats/token) | test acc. |" in full[0]
        assert "| - | 3.7682 | 0.1438 |" in full[2] and "| test loss (nats/token) | test acc. |" in short[0]
    timed = [_row(task="class", rate=1.0, loss=0.25, score=0.9)]  # an image model timed to its loss
    assert "| time to loss (s) | test loss | test acc. |" in table(timed, Kind(target="loss"))
    for task, kind in (("class", Kind()), ("binary", Kind("examples", "auc", "auc")),
                       ("regression", Kind("images", "mae", "mae"))):
        head = table([_row(task=task, rate=1.0, loss=0.2, score=0.5)], kind).splitlines()[0]
        assert "loss" not in head and f"| test {'acc.' if task == 'class' else kind.score.upper()} |" in head


def test_repeats_of_a_sweep_show_their_round_and_plots_name_seeds_by_seed():
    """sweep.repeats=2 made rows alike but for their figures (each run is tagged sweep.round '2 of 2'), and plots
    labelled runs of seeds 0 and 1 '#1' and '#2' as if they were repeats."""
    from runner.report.kinds import Kind
    from runner.report.plots import _labels
    from runner.report.table import add_speedups, compact, table

    rows = add_speedups([_row(1, "0", "2 of 2", rate=900.0), _row(1, "0", "1 of 2", rate=1000.0),
                         _row(2, "0", "", rate=1500.0)])
    assert [r.round for r in rows] == ["1 of 2", "2 of 2", ""]
    full, short = table(rows, Kind()).splitlines(), compact(rows, Kind()).splitlines()
    assert full[0].startswith("| model | pipeline | strategy | devices | scaling | round | images/s |")
    assert full[3].startswith("| mlp | split | mirrored | 1 CPU | strong | 2 of 2 | 900 |")
    assert short[0].startswith("| model | combination | round | images/s |") and "| - | 1,500 |" in short[4]
    once = [_row(1, "0", "1 of 1", rate=1.0), _row(2, "0", "1 of 1", rate=2.0)]  # one round each: nothing to tell
    assert "round" not in table(once, Kind()) and "round" not in compact(once, Kind())
    assert _labels(rows[:2]) == ["mlp mirrored/split x1 #1", "mlp mirrored/split x1 #2"]
    assert _labels([_row(1, "0"), _row(1, "1", "2 of 2"), _row(1, "1", "1 of 2")]) == [
        "mlp mirrored/split x1 seed 0", "mlp mirrored/split x1 seed 1 #2", "mlp mirrored/split x1 seed 1 #1"]


def test_a_missing_folder_store_and_a_jobs_id_as_parent_say_what_they_are(tmp_path, store, capsys):
    """`file:///missing` was 'a folder (MLflow's file store)', and --parent <a job's id> 'no runs to report in sweep
    parent run ...'."""
    from runner.cli.report import main

    missing = tmp_path / "nothere"
    for given in (f"file://{missing}", str(missing)):
        assert main(["--tracking-uri", given, "--out", str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err.strip() == (f"error: no store at {given}: nothing to report; give the store "
                                                   "your runs wrote (--tracking-uri, or run from their folder)")
    uri, parent = store
    from mlflow import MlflowClient

    (job, *_) = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("beta").experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    code, _, err = _report(tmp_path, uri, capsys, "--parent", job.info.run_id[:8])
    assert code == 2 and err.strip() == (f"error: --parent {job.info.run_id[:8]}: run {job.info.run_id} is a job of "
                                         f"sweep {parent}, not a sweep's parent; report with --parent {parent}")
