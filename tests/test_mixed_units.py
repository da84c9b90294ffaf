"""Issue #61: a sweep over models of different units (an image model's images/s, a language model's tokens/s, a click
model's examples/s) and metrics (test accuracy, a test loss target, a test AUC) never puts two of them in one column,
one ranking, one plot's axis or one metric of the sweep's parent run: it is reported per kind, each kind read from
the runs' own metrics. In-process, on a sqlite store filled through MlflowClient as the runs would have filled it."""

from __future__ import annotations

import math

import pytest
from conftest import compose, markdown_rows, new_store

from runner.report.verdict import Run, decide

# model -> its unit, score, target metric and target, and two jobs (strategy, devices, rate, score, time to target)
MODELS = {
    "mlp": ("images", "accuracy", "accuracy", 0.9,
            [("single", 1, 40_000, 0.95, 3.0), ("mirrored", 2, 60_000, 0.96, 2.5)]),
    "gpt": ("tokens", "accuracy", "loss", 2.0,
            [("single", 1, 12_000, 0.40, 5.0), ("mirrored", 2, 19_000, 0.41, 4.0)]),
    "dlrm": ("examples", "auc", "auc", 0.7,
             [("single", 1, 90_000, 0.72, 1.5), ("hybrid", 2, 150_000, 0.73, 1.0)]),
}


def _sweep(tmp_path, models):
    """A sweep parent over two finished jobs of each of `models` (tiny variants), logged as such runs log, and with
    gpt a third job refused before it timed anything (no rate, no unit of its own). Returns (client, parent run id)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(new_store(tmp_path))
    experiment = client.create_experiment("mixed")
    parent = client.create_run(experiment, tags={"sweep": "parent"}).info.run_id
    for model in models:
        unit, score, target, value, jobs = MODELS[model]
        for strategy, devices, rate, scored, seconds in jobs:
            tags = {"model": model, "model.variant": "tiny", "pipeline": "split", "strategy": strategy,
                    "devices.count": str(devices), "devices.kind": "CPU", "mlflow.parentRunId": parent}
            run = client.create_run(experiment, tags=tags).info.run_id
            metrics = {f"{unit}_per_sec": rate, f"{unit}_per_sec_stderr": 5.0, "test_accuracy": scored,
                       "test_loss": 1.7 if model == "gpt" else 0.3, "train_seconds": 9.0, f"target_{target}": value,
                       f"time_to_{target}_seconds": seconds, "wall_seconds": 12.0}
            if score == "auc":
                metrics.update(test_auc=scored, test_accuracy=0.75)
            client.log_batch(run, [Metric(key, figure, 0, 0) for key, figure in metrics.items()])
            client.set_terminated(run)
    if "gpt" in models:
        failed = client.create_run(experiment, tags={"model": "gpt", "model.variant": "tiny", "pipeline": "split",
                                                      "strategy": "replicated", "devices.count": "2",
                                                      "mlflow.parentRunId": parent})
        client.set_terminated(failed.info.run_id, "FAILED")
    return client, parent


@pytest.fixture
def mixed(tmp_path):
    return _sweep(tmp_path, ["mlp", "gpt", "dlrm"])


def _report(client, parent, out, monkeypatch) -> tuple[object, dict]:
    """`runner report --experiment mixed` in this process (runner.report.table.report), its plots drawn but not
    written (test_report writes them): (the report, {file name: figure})."""
    from runner.report import plots
    from runner.report.table import Selection, report

    drawn = {}
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: (drawn.update({path.name: fig}), plt.close(fig)))
    experiment = client.get_run(parent).info.experiment_id
    return report(client, Selection("mixed", experiment, None, ""), "", out), drawn


def _tables(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """Each Markdown table of `text`: (its header line, its rows)."""
    blocks = [b for b in text.split("\n\n") if b.startswith("| model |")]
    return [(b.splitlines()[0], markdown_rows(b)) for b in blocks]


def test_a_mixed_sweeps_report_has_one_table_per_unit_and_each_score_in_its_own_column(tmp_path, mixed, monkeypatch):
    """Was: one table whose rate column was headed "examples, images, tokens/s" and whose score column, "test AUC",
    showed "-" for the image and next-token accuracies."""
    made, _ = _report(*mixed, tmp_path / "out", monkeypatch)
    tables = _tables(made.text)
    units = [[u for u in ("images/s", "tokens/s", "examples/s") if f"| {u} |" in head] for head, _ in tables]
    assert sorted(units) == [["examples/s"], ["images/s"], ["tokens/s"]], made.text
    by_model = {rows[0]["model"]: (head, rows) for head, rows in tables}
    assert {m: {r["model"] for r in rows} for m, (_, rows) in by_model.items()} == {
        "dlrm/tiny": {"dlrm/tiny"}, "gpt/tiny": {"gpt/tiny"}, "mlp/tiny": {"mlp/tiny"}}
    assert [r["test acc."] for r in by_model["mlp/tiny"][1]] == ["0.9600", "0.9500"]
    assert [r["test AUC"] for r in by_model["dlrm/tiny"][1]] == ["0.7300", "0.7200"]
    gpt = by_model["gpt/tiny"][1]
    assert [(r["strategy"], r["time to loss (s)"], r["test acc."]) for r in gpt] == [
        ("mirrored", "4.0", "0.4100"), ("replicated", "-", "-"), ("single", "5.0", "0.4000")]
    assert "test AUC" not in by_model["mlp/tiny"][0] + by_model["gpt/tiny"][0]
    assert sorted(line.split(":")[1].strip() for line in made.lines) == ["dlrm/tiny", "gpt/tiny", "mlp/tiny"]
    assert any("fastest mirrored/split x2 (4.0 s to test loss 2)" in line for line in made.lines), made.lines


def test_a_mixed_sweeps_plots_put_one_unit_on_an_axis(tmp_path, mixed, monkeypatch):
    """Was: one throughput plot ranking tokens/s bars against images/s bars on one axis. Now three of each plot, one
    per unit, each axis naming its one unit (and a click model's score plot its AUC)."""
    made, drawn = _report(*mixed, tmp_path / "out", monkeypatch)
    assert sorted(p.name for p in made.paths) == sorted(drawn) == sorted(
        f"{plot}_{unit}.png" for plot in ("scaling", "time_to_accuracy", "accuracy")
        for unit in ("examples", "images", "tokens"))
    for unit, model in (("images", "mlp/tiny"), ("tokens", "gpt/tiny"), ("examples", "dlrm/tiny")):
        throughput = drawn[f"scaling_{unit}.png"].axes[0]
        assert throughput.get_ylabel() == f"{unit}/s"
        curves = {line.get_label() for line in throughput.lines} - {"ideal (linear)"}
        assert curves and all(label.startswith(model) for label in curves), curves
        labels = [t.get_text() for t in drawn[f"accuracy_{unit}.png"].axes[0].get_yticklabels()]
        assert labels and all(label.startswith(model) for label in labels), labels
    assert drawn["accuracy_examples.png"].axes[0].get_xlabel() == "final test AUC"
    assert drawn["time_to_accuracy_tokens.png"].axes[0].get_ylabel() == "test loss"


def test_the_end_of_a_mixed_sweep_shows_one_table_per_unit(mixed):
    from runner.report.table import sweep_end

    client, parent = mixed
    text = "\n".join(sweep_end(client, parent))
    heads = [head for head, _ in _tables(text)]
    assert len(heads) == 3 and all(sum(f"| {u}/s |" in h for u in ("images", "tokens", "examples")) == 1
                                   for h in heads), text
    assert "examples, images" not in text and "images, tokens" not in text


def _parent_metrics(client, parent) -> dict[str, float]:
    from runner.sweep import _summarise_on_parent

    _summarise_on_parent(client, parent)
    return client.get_run(parent).data.metrics


def test_a_mixed_sweeps_parent_carries_each_models_figures_under_its_name(mixed):
    """Was: the parent's test_accuracy the maximum over image accuracy and next-token accuracy, and no time to a
    loss or an AUC target."""
    metrics = _parent_metrics(*mixed)
    assert metrics == {
        "mlp/tiny/images_per_sec": 60_000, "mlp/tiny/test_accuracy": 0.96, "mlp/tiny/time_to_accuracy_seconds": 2.5,
        "gpt/tiny/tokens_per_sec": 19_000, "gpt/tiny/test_accuracy": 0.41, "gpt/tiny/time_to_loss_seconds": 4.0,
        "dlrm/tiny/examples_per_sec": 150_000, "dlrm/tiny/test_auc": 0.73, "dlrm/tiny/time_to_auc_seconds": 1.0,
        "jobs_finished": 6}


@pytest.mark.parametrize("model, wanted", [
    ("gpt", {"tokens_per_sec": 19_000, "test_accuracy": 0.41, "time_to_loss_seconds": 4.0}),
    ("dlrm", {"examples_per_sec": 150_000, "test_auc": 0.73, "time_to_auc_seconds": 1.0}),
    ("mlp", {"images_per_sec": 60_000, "test_accuracy": 0.96, "time_to_accuracy_seconds": 2.5}),
])
def test_a_sweep_of_one_kind_carries_its_own_time_to_target_on_the_parent(tmp_path, model, wanted):
    """A language model's sweep: the parent's fastest time to its loss target; a click model's: to its AUC (was:
    time to accuracy only, so neither had one)."""
    assert _parent_metrics(*_sweep(tmp_path, [model])) == {**wanted, "jobs_finished": 2}


def test_one_model_on_data_of_two_units_gets_a_verdict_per_unit():
    """A user's model on images and on token ids: its images/s and tokens/s are never ranked against each other."""
    runs = [Run("mine", "split", "single", 1, 1_000, unit="images"),
            Run("mine", "split", "mirrored", 2, 1_500, unit="images"),
            Run("mine", "split", "single", 1, 30_000, unit="tokens")]
    verdicts = decide(runs)
    assert sorted((v.best.runs[0].unit, v.best.name, len(v.best.runs)) for v in verdicts) == [
        ("images", "mirrored/split x2", 1), ("tokens", "single/split x1", 1)]
    assert all(math.isnan(v.target) for v in verdicts)


def test_a_model_whose_own_jobs_count_two_units_is_summarised_per_unit_on_the_parent():
    """A user's model swept over image and token data, beside an image model: its two test accuracies (of images, of
    next tokens) are two figures under their units' names, not one overwriting the other."""
    from types import SimpleNamespace

    from runner.sweep import parent_figures

    def job(model, unit, rate, accuracy):
        return SimpleNamespace(model=model, unit=unit, rate=rate, score=accuracy, score_metric="accuracy",
                               target=math.nan, target_metric="accuracy", time_to_target=math.nan)

    jobs = [job("mine", "images", 1_000, 0.9), job("mine", "tokens", 30_000, 0.4), job("mlp", "images", 2_000, 0.8)]
    assert parent_figures(jobs) == {"mine/images/images_per_sec": 1_000, "mine/images/test_accuracy": 0.9,
                                    "mlp/images_per_sec": 2_000, "mlp/test_accuracy": 0.8,
                                    "mine/tokens/tokens_per_sec": 30_000, "mine/tokens/test_accuracy": 0.4}
    # one kind, two settings (data.path=a,b: other data, other work): was one images_per_sec from b's run beside a
    # test_mae from a's; one model alone keeps the plain names
    settings = [job("mlp/tiny data.path=/a", "images", 700, 0.9), job("mlp/tiny data.path=/b", "images", 900, 0.5)]
    a, b = "mlp/tiny data.path_/a/", "mlp/tiny data.path_/b/"
    assert parent_figures(settings) == {a + "images_per_sec": 700, a + "test_accuracy": 0.9,
                                        b + "images_per_sec": 900, b + "test_accuracy": 0.5}
    assert parent_figures(settings[:1]) == {"images_per_sec": 700, "test_accuracy": 0.9}


def test_a_run_is_sped_up_and_compared_only_against_one_device_runs_of_its_own_unit():
    """The same user's model: its 2-device run on tokens has no 1-device run on tokens, so no speedup (was: 30,000
    tokens/s over 1,000 images/s, a speedup of 30) and nothing it learns the same as."""
    from runner.report.table import Row, add_speedups

    def row(unit, devices, rate):
        return Row(run_id=f"{unit}{devices}", model="mine", pipeline="split", strategy="mirrored", devices=devices,
                   kind="CPU", simulated=True, rate=rate, stderr=1.0, score=0.9, wall_seconds=5.0, status="FINISHED",
                   unit=unit, loss=0.3)

    images, tokens = add_speedups([row("images", 1, 1_000), row("tokens", 2, 30_000), row("images", 2, 1_500)])[:2]
    assert (images.devices, images.unit, images.speedup, images.same) == (1, "images", 1.0, True)
    assert tokens.unit == "tokens" and math.isnan(tokens.speedup) and tokens.same is None


def test_only_top_keeps_the_predicted_fastest_of_each_unit():
    """Was: sweep.only_top=K kept the first K of one ranking that listed every image combination before any token
    one, so a sweep over an image model and a language model with K=1 ran the fastest image combination only."""
    from runner.predict.costs import Prediction
    from runner.predict.grid import Outcome, ranked
    from runner.sweep import top_of_each_unit

    def outcome(strategy: str, unit: str, step: float) -> Outcome:
        return Outcome([f"strategy={strategy}", f"data.unit={unit}"], strategy,
                       Prediction(strategy, 64, {"compute": step}, unit=unit))

    order = ranked([outcome("mirrored", "images", 0.02), outcome("single", "images", 0.01),
                    outcome("replicated", "tokens", 0.03), outcome("sharded_update", "tokens", 0.02),
                    Outcome(["strategy=model_parallel"], "model_parallel", error="no cost model")])
    keep, units = top_of_each_unit(order, 1)
    assert units == ["images", "tokens"]
    assert keep == {"data.unit=images strategy=single", "data.unit=tokens strategy=sharded_update"}


def test_a_users_arrays_that_are_not_images_are_counted_in_examples(tf_devices, store, tmp_path, monkeypatch):
    """A user's dataset of 8 float values an example (tests/user_models.py: OwnArrays) is not images: its spec says
    so, the MLP trains on it and the run counts examples/s (was: images/s, and a convolutional model's walk an
    IndexError)."""
    from runner.data_pipelines import Spec
    from runner.experiment import run
    from user_models import OwnArrays

    assert OwnArrays().spec().unit == "examples" and str(OwnArrays().spec()).startswith("8 float32 values an example")
    assert Spec((28, 28, 1), 10).unit == "images" and Spec((32, 32, 3), 10, "float32").images
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "own_arrays.yaml").write_text("_target_: user_models.OwnArrays\n")
    result = run(compose(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "data=own_arrays", "debug=smoke",
                         f"mlflow.tracking_uri={store}"))
    assert result["examples_per_sec"] > 0 and "images_per_sec" not in result
