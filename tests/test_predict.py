"""The cost model (runner/predict/): each strategy's traffic counted by hand, the terms priced from calibrations,
the calibration cache, and `runner predict`'s table and one-line errors."""

from __future__ import annotations

import json

import pytest
from conftest import compose, markdown_rows, subcommand

from runner.config import ConfigError, validate
from runner.config import TOUCHED
from runner.paths import read_cache, write_cache
from runner.predict import calibrate, grid
from runner.predict.costs import TERMS, predict
from runner.strategies import STRATEGIES, Rows, Traffic, predictable


@pytest.mark.parametrize("name, n, wanted", [
    # W = 1000 bytes of weights in V = 3 variables.
    ("single", 1, Traffic(update_copies=1, update_devices=1, reduce_bytes=0, reduce_devices=1, moved_bytes=0,
                          messages=0, ops=3)),
    # Sum of N (read N, write 1) and mean (read 1, write 1) per variable; N - 1 gradients in, the mean out to N - 1.
    ("replicated", 2, Traffic(update_copies=2, update_devices=2, reduce_bytes=5000, reduce_devices=2,
                              moved_bytes=2000, messages=6, ops=12)),
    # The same reduction, on one device (reduce_to_one_device).
    ("mirrored", 4, Traffic(update_copies=4, update_devices=4, reduce_bytes=7000, reduce_devices=1, moved_bytes=6000,
                            messages=18, ops=18)),
    # One copy: every tower's gradients in, the weights out to every tower; one update.
    ("parameter_server", 2, Traffic(update_copies=1, update_devices=1, reduce_bytes=5000, reduce_devices=1,
                                    moved_bytes=4000, messages=12, ops=9)),
    # Slices (2NW), sums and means of the slices ((N + 3)W), assembling and writing the copies (4NW); 1 update.
    ("sharded_update", 4, Traffic(update_copies=1, update_devices=4, reduce_bytes=7000, reduce_devices=4,
                                  moved_bytes=6000, messages=24, ops=4 * (3 + 4) + 12 + 36, copy_bytes=24000)),
])
def test_each_strategy_counts_its_own_traffic(name, n, wanted):
    assert STRATEGIES.get(name)().traffic(n, 1000, 3) == wanted


# A table's rows at N = 2 devices: R = 100 bytes looked up per tower, T = 2 tables (Rows), beside the dense part above
# (W = 1000, V = 3). Concatenating N R rows reads and writes them (2 N R), dividing them too (2 N R).
ROWS_AT_2 = {
    # Applied once; unique and segment sum before each table's update.
    "single": Traffic(update_copies=0, update_devices=1, reduce_bytes=0, reduce_devices=1, moved_bytes=0, messages=0,
                      ops=4, rows_applied=100),
    # Gathered on one device (R in), sent to the other copy (N R out); each copy applies N R: N N R.
    "replicated": Traffic(update_copies=0, update_devices=1, reduce_bytes=400, reduce_devices=1, copy_bytes=400,
                          moved_bytes=100 + 200, messages=4, ops=2 * (2 + 6), rows_applied=400, rows_devices=2),
    # To and from the one copy: N R each way; one update of N R.
    "parameter_server": Traffic(update_copies=0, update_devices=1, reduce_bytes=400, reduce_devices=1, copy_bytes=400,
                                moved_bytes=400, messages=8, ops=10, rows_applied=200, rows_devices=1),
    # Half of each tower's rows live on the other device: (N - 1) R each way; each owner applies its tables' rows.
    "hybrid": Traffic(update_copies=0, update_devices=1, reduce_bytes=400, reduce_devices=2, copy_bytes=400,
                      moved_bytes=200, messages=4, ops=10, rows_applied=200, rows_devices=2),
    # Partitioned by owner (2 N R), concatenated at the owners (2 N R), the changed rows put together (2 N R) and
    # written into both copies (2 N N R); (N - 1) R to the owners, (N - 1) R put together, (N - 1) N R to the copies.
    # Ops: 2 towers x (5 x 2 tables + 5), 2 owners x (5 + 6), 3 to put together, 2 copies x (2 + 2 tables).
    "sharded_update": Traffic(update_copies=0, update_devices=1, reduce_bytes=400, reduce_devices=2,
                              copy_bytes=400 + 400 + 400 + 800, moved_bytes=100 + 100 + 200, messages=4 + 6,
                              ops=2 * 15 + 2 * 11 + 3 + 2 * 4, rows_applied=200, rows_devices=2),
}


@pytest.mark.parametrize("name", sorted(ROWS_AT_2))
def test_each_strategy_counts_its_tables_rows_beside_its_dense_traffic(name):
    dense = STRATEGIES.get("replicated" if name == "hybrid" else name)().traffic(2, 1000, 3)
    assert STRATEGIES.get(name)().traffic(2, 1000, 3, Rows(100, 2)) == dense + ROWS_AT_2[name]
    spread = STRATEGIES.get("parameter_server")(tables="spread").traffic(2, 1000, 3, Rows(100, 2))
    assert spread == STRATEGIES.get("parameter_server")().traffic(2, 1000, 3) + ROWS_AT_2["hybrid"]
    mirrored = STRATEGIES.get("mirrored")().traffic(2, 1000, 3, Rows(100, 2))  # tf.distribute: replicated's rows
    assert mirrored == STRATEGIES.get("mirrored")().traffic(2, 1000, 3) + ROWS_AT_2["replicated"]


def test_strategies_without_a_cost_model_say_so_in_one_line():
    assert set(predictable()) == {"single", "replicated", "mirrored", "parameter_server", "sharded_update", "hybrid"}
    with pytest.raises(ConfigError,
                       match="^strategy=model_parallel has no cost model .*: hybrid, mirrored, parameter_"):
        STRATEGIES.get("model_parallel")().traffic(2, 1000, 3)


def test_a_refusal_is_a_row_and_a_bug_in_a_cost_model_is_raised(monkeypatch):
    """plan_for: a strategy without a cost model is that combination's row (or raised, asked to); a TypeError out of
    a strategy's traffic is a bug, raised, never printed as a row a user reads as a refusal."""
    assert "no cost model" in grid.plan_for(["strategy=model_parallel", "gpus=2"])[2]
    with pytest.raises(ConfigError, match="no cost model"):
        grid.plan_for(["strategy=model_parallel", "gpus=2"], refusals_raise=True)

    def bug(*args):
        raise TypeError("bug in traffic")

    monkeypatch.setattr(STRATEGIES.get("mirrored"), "traffic", bug)
    for refusals_raise in (False, True):
        with pytest.raises(TypeError, match="bug in traffic"):
            grid.plan_for(["strategy=mirrored", "gpus=2"], refusals_raise=refusals_raise)


MACHINE = {"op_seconds": 2e-6, "send_latency_s": 1e-5, "send_bytes_per_s": 1e9}
TOWERS = {"seconds": 0.004, "weight_bytes": 2_000_000, "variables": 6, "update_bytes_per_s_one": 1e10,
          "update_bytes_per_s_all": 3e10, "reduce_bytes_per_s_one": 2e10, "reduce_bytes_per_s_all": 5e10,
          "copy_bytes_per_s_all": 1e10}


def test_a_language_models_prediction_counts_tokens():
    """The same terms; the rate is the global batch's tokens (sequences x context) per predicted step."""
    plan = validate(compose("model=gpt", "data=shakespeare", "model.variant=tiny", "data.sequence_length=32",
                            "strategy=mirrored", "gpus=2"))
    p = predict(plan, MACHINE, TOWERS, {"seconds": 0.0005})
    assert p.unit == "tokens" and p.rate == pytest.approx(plan.train.global_batch_size * 32 / p.step_seconds)
    assert set(p.metrics()) >= {"predicted_tokens_per_sec", "predicted_step_ms"}
    assert "predicted_images_per_sec" not in p.metrics()


TABLES = {**TOWERS, "table_bytes": 50_000_000, "tables": 26, "row_bytes": 400_000, "rows_bytes_per_s_one": 1e9,
          "rows_bytes_per_s_all": 1.5e9}


def test_a_recommenders_rows_are_priced_by_the_sparse_update_and_adams_tables_whole():
    """Adagrad: each copy applies its rows at the calibrated sparse-update rate (replicated: N copies of N R on N
    devices at once). Adam: its slots move every row, so the update is dense over the tables too. An optimizer per
    part (train.table_optimizer) prices each part by its own optimizer."""
    overrides = ("model=dlrm", "data=clicks", "model.variant=tiny", "data.tables=tiny", "strategy=replicated",
                 "gpus=2")
    adagrad = predict(validate(compose(*overrides, "train.optimizer=adagrad")), MACHINE, TABLES, {"seconds": 1e-3})
    dense = 2 * TOUCHED["adagrad"] * 2_000_000 / 3e10
    assert adagrad.terms["update"] == pytest.approx(dense + 2 * 2 * 400_000 / 1.5e9)
    assert adagrad.unit == "examples"
    adam = predict(validate(compose(*overrides, "train.optimizer=adam")), MACHINE, TABLES, {"seconds": 1e-3})
    assert adam.terms["update"] == pytest.approx(2 * TOUCHED["adam"] * (2_000_000 + 50_000_000) / 3e10)
    # an optimizer per part: Adam's dense update of the MLPs, SGD's rows of the tables; and the other way round
    parts = predict(validate(compose(*overrides, "train.optimizer=adam", "train.table_optimizer=sgd")), MACHINE,
                    TABLES, {"seconds": 1e-3})
    assert parts.terms["update"] == pytest.approx(2 * TOUCHED["adam"] * 2_000_000 / 3e10 + 2 * 2 * 400_000 / 1.5e9)
    slots = predict(validate(compose(*overrides, "train.optimizer=sgd", "train.table_optimizer=adam")), MACHINE,
                    TABLES, {"seconds": 1e-3})
    assert slots.terms["update"] == pytest.approx(2 * (TOUCHED["sgd"] * 2_000_000 + TOUCHED["adam"] * 50_000_000)
                                                  / 3e10)


def test_looked_up_rows_are_read_off_the_tables_sparse_gradients(tf_devices):
    from runner.measure.floor import random_batch
    from runner.strategies.common import tower_models

    plan = validate(compose("model=dlrm", "data=clicks", "model.variant=tiny", "data.tables=tiny"))
    model = tower_models(plan.model, plan.spec, 0, ["/device:CPU:0"])[0]
    batches = [random_batch(model, 32), random_batch(model, 32)]
    ids = calibrate.looked_up(model, batches)  # [table][batch] -> the ids that batch looked up in that table
    assert len(ids) == 26 and all(len(t) == 2 and [int(i.shape[0]) for i in t] == [32, 32] for t in ids)
    categorical = next(x for name, x in batches[1][0].items() if x.dtype.is_integer)  # (32, 26) ids
    assert sorted(ids[0][1].numpy()) == sorted(categorical[:, 0].numpy())  # one id per table per example


def test_terms_price_the_traffic_with_the_calibrations():
    plan = validate(compose("model=mlp", "strategy=replicated", "gpus=4", "train.optimizer=sgd"))
    p = predict(plan, MACHINE, TOWERS, {"seconds": 0.0005})
    traffic = plan.strategy.traffic(4, 2_000_000, 6)
    assert set(p.terms) == set(TERMS)
    assert p.terms["towers"] == 0.004 and p.terms["input"] == 0.0005
    assert p.terms["update"] == pytest.approx(4 * TOUCHED["sgd"] * 2_000_000 / 3e10)  # 4 copies on 4 devices at once
    assert p.terms["reduce"] == pytest.approx(7 * 2_000_000 / 5e10 + 6 * 2_000_000 / 1e9 + traffic.messages * 1e-5)
    assert p.terms["ops"] == pytest.approx(traffic.ops * 2e-6)
    assert p.rate == pytest.approx(128 / sum(p.terms.values()))
    assert p.dominant == f"reduce {p.terms['reduce'] / p.step_seconds:.0%}"  # the slow sends: the largest term
    assert p.combination == "mlp/default replicated/split x4"
    server = predict(validate(compose("model=mlp", "strategy=parameter_server", "gpus=4", "train.optimizer=sgd")),
                     MACHINE, TOWERS, {"seconds": 0.0005})
    assert server.terms["update"] == pytest.approx(TOUCHED["sgd"] * 2_000_000 / 1e10)  # one copy on one device
    assert server.terms["reduce"] == pytest.approx(7 * 2_000_000 / 2e10 + 8 * 2_000_000 / 1e9 + 8 * 6 * 1e-5)
    assert server.metrics()["predicted_images_per_sec"] == server.rate
    sharded = predict(validate(compose("model=mlp", "strategy=sharded_update", "gpus=4", "train.optimizer=sgd")),
                      MACHINE, TOWERS, {"seconds": 0.0005})  # sums at the warm rate on 4, slices at the copy rate
    assert sharded.terms["reduce"] == pytest.approx(7 * 2e6 / 5e10 + 24 * 2e6 / 1e10 + 6 * 2e6 / 1e9 + 24 * 1e-5)
    assert server.metrics()["predicted_towers_ms"] == pytest.approx(4.0)


def test_the_cache_keeps_calibrations_per_host_and_device_set(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path))  # not this machine's XLA decisions: they key the towers
    plans = [validate(compose("model=mlp", f"strategy={s}", "gpus=2")) for s in ("replicated", "sharded_update")]
    assert calibrate.machine_key(plans[0]) == calibrate.machine_key(plans[1])  # one device set
    assert calibrate.towers_key(plans[0]) == calibrate.towers_key(plans[1])  # same model, same per-tower batch
    assert calibrate.towers_key(validate(compose("model=mlp", "gpus=4", "strategy=replicated"))) != \
        calibrate.towers_key(plans[0])
    # One tower on 2 devices is another measurement than 2 towers, with the same batches: its own entries.
    one = validate(compose("model=mlp", "strategy=model_parallel", "gpus=2", "train.batch_scaling=weak",
                            "train.per_device_batch_size=64"))
    weak = validate(compose("model=mlp", "strategy=replicated", "gpus=2", "train.batch_scaling=weak",
                            "train.per_device_batch_size=64"))
    assert one.train.per_device_batch_size == weak.train.per_device_batch_size
    assert calibrate.towers_key(one) != calibrate.towers_key(weak)
    one = validate(compose("model=mlp", "strategy=model_parallel", "gpus=2"))
    assert one.train.global_batch_size == plans[0].train.global_batch_size
    assert calibrate.input_key(one) != calibrate.input_key(plans[0])
    entries = {calibrate.machine_key(plans[0]): MACHINE,
               calibrate.towers_key(plans[0]): TOWERS,
               calibrate.input_key(plans[0]): {"seconds": 0.0004}, calibrate.input_key(plans[1]): {"seconds": 0.0004}}
    path = calibrate.cache_path(tmp_path)
    write_cache(path, entries)
    assert read_cache(path) == entries

    def no_child(overrides, wanted):
        raise AssertionError(f"calibrated {wanted} although cached")

    monkeypatch.setattr(grid, "_calibrate", no_child)
    outcomes = grid.predict_all([["model=mlp", "strategy=replicated", "gpus=2"],
                                 ["model=mlp", "strategy=sharded_update", "gpus=2"]], cache_dir=tmp_path)
    assert [o.prediction.combination for o in grid.ranked(outcomes)] == [
        "mlp/default replicated/split x2", "mlp/default sharded_update/split x2"]
    # A calibration taken while other processes used the CPUs is used once and never cached.
    monkeypatch.setattr(grid, "_calibrate", lambda overrides, wanted: {k: {**entries.get(k, MACHINE), "seconds": 1.0,
                                                                           "others_cpu_share": 0.6} for k in wanted})
    outcomes = grid.predict_all([["model=mlp", "strategy=replicated", "gpus=2"]], recalibrate=True, cache_dir=tmp_path)
    assert outcomes[0].prediction.terms["towers"] == 1.0 and "calibration disturbed" in caplog.text
    assert read_cache(path) == entries
    path.write_text("{not json")
    assert read_cache(path) == {}


def test_predictions_from_a_disturbed_calibration_are_marked_and_claim_no_direction(tmp_path, monkeypatch, caplog):
    """Was 'calibration disturbed ... these predictions are too slow' where they came out above the measured rates,
    and nothing in the table said which predictions rested on it."""
    plan = validate(compose("model=mlp", "strategy=replicated", "gpus=2"))
    entries = {calibrate.machine_key(plan): MACHINE, calibrate.towers_key(plan): TOWERS,
               calibrate.input_key(plan): {"seconds": 0.0004}}
    monkeypatch.setattr(grid, "_calibrate", lambda overrides, wanted: {k: {**entries[k], "others_cpu_share": 0.6}
                                                                       for k in wanted})
    outcomes = grid.predict_all([["model=mlp", "strategy=replicated", "gpus=2"]], cache_dir=tmp_path)
    assert outcomes[0].disturbed == 0.6 and outcomes[0].prediction is not None
    assert "calibration disturbed" in caplog.text and "too slow" not in caplog.text
    assert "may be off either way" in caplog.text
    (row,) = markdown_rows("\n".join(grid.table(outcomes)))
    assert row["calibration"] == "disturbed (others used 60% of the CPUs)"
    assert grid.records(outcomes)[0]["calibration_disturbed"] == 0.6
    write_cache(calibrate.cache_path(tmp_path), entries)  # an undisturbed one: no column
    clean = grid.predict_all([["model=mlp", "strategy=replicated", "gpus=2"]], cache_dir=tmp_path)
    assert clean[0].disturbed is None and "calibration" not in markdown_rows("\n".join(grid.table(clean)))[0]


def test_the_calibration_child_gets_one_combination_per_calibration_it_lacks(tmp_path, monkeypatch):
    grid_ = [["model=mlp", f"strategy={s}", f"pipeline={p}", "gpus=2"]
             for s in ("replicated", "parameter_server") for p in ("split", "sharded")]
    children = []

    def child(overrides, wanted):  # what the fresh process is asked to compose and measure
        children.append((overrides, wanted))
        return {k: {**MACHINE, **TOWERS, "seconds": 0.001} for k in wanted}

    monkeypatch.setattr(grid, "_calibrate", child)
    assert all(o.prediction for o in grid.predict_all(grid_, cache_dir=tmp_path))
    (overrides, wanted), = children  # one device set: one child
    assert len(wanted) == 4 and overrides == grid_[:2]  # machine, towers (shared), the two pipelines' inputs


def test_a_strategy_without_a_cost_model_is_named_and_never_calibrated(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path))  # not this machine's XLA decisions: they key the towers
    asked = []
    monkeypatch.setattr(grid, "_calibrate", lambda overrides, wanted: asked.append((overrides, wanted)) or
                        {k: {**MACHINE, **TOWERS, "seconds": 0.001} for k in wanted})
    priced, blocked = grid.predict_all([["model=mlp", "strategy=replicated", "gpus=2"],
                                        ["model=mlp", "strategy=model_parallel", "gpus=2"]], cache_dir=tmp_path)
    assert priced.prediction and blocked.prediction is None and "has no cost model" in blocked.error
    assert blocked.label == "mlp/default model_parallel/split x2"
    (overrides, wanted), = asked
    assert overrides == [["model=mlp", "strategy=replicated", "gpus=2"]] and wanted == grid.keys(
        validate(compose("model=mlp", "strategy=replicated", "gpus=2")))


def test_expand_enumerates_a_sweeps_combinations_in_its_order():
    assert grid.expand(["-m", "strategy=a,b", "gpus=2,4", "hydra.launcher.n_jobs=2"]) == [
        ["strategy=a", "gpus=2"], ["strategy=a", "gpus=4"], ["strategy=b", "gpus=2"], ["strategy=b", "gpus=4"]]
    assert grid.expand([]) == [[]]


@pytest.mark.long
def test_runner_predict_prints_each_combination_and_the_fastest(tmp_path, monkeypatch, capsys, caplog):
    """A real calibration (a fresh process with 2 simulated devices), then the cache; `runner predict` itself through
    the command's edge (tests/test_hostile_input.py starts it as a process)."""
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "cache"))
    args = ["-m", "debug=smoke", "strategy=replicated,sharded_update,model_parallel", "gpus=2"]
    code, stdout, stderr = subcommand(capsys, "predict", *args)
    assert code == 0, stderr[-2000:]
    rows = {r["combination"]: r for r in markdown_rows(stdout)}
    batch = compose("debug=smoke").train.global_batch_size
    assert set(rows) == {"mlp/tiny replicated/split x2", "mlp/tiny sharded_update/split x2",
                         "mlp/tiny model_parallel/split x2"}
    for name in ("mlp/tiny replicated/split x2", "mlp/tiny sharded_update/split x2"):
        terms, step = [float(rows[name][f"{t} ms"]) for t in TERMS], float(rows[name]["step ms"])
        assert all(t >= 0 for t in terms) and float(rows[name]["towers ms"]) > 0
        # Every figure is printed to 0.01 ms: the five terms and the step each up to 0.005 off what was computed.
        assert step == pytest.approx(sum(terms), abs=6 * 0.005 + 1e-9)
        assert float(rows[name]["predicted images/s"].replace(",", "")) == pytest.approx(
            batch / step * 1e3, rel=0.005 / step + 1e-3)
    blocked = [r for name, r in rows.items() if "model_parallel" in name][0]
    assert "has no cost model" in blocked["not predicted"]
    assert "predicted fastest: mlp/tiny " in stdout
    path = tmp_path / "cache" / calibrate.CACHE_FILE
    if "calibration disturbed" in caplog.text:  # other processes used the CPUs meanwhile: nothing was cached
        assert not path.exists()
        return
    cache = json.loads(path.read_text())
    assert sum("|machine" in k for k in cache) == 1 and all("measured" in e and "devices" in e for e in cache.values())
    again = subcommand(capsys, "predict", *args)[1]
    # read from the cache: the same figures (the combination not predicted has its own table, and no figure)
    assert [r.get("predicted images/s") for r in markdown_rows(again)] == \
        [r.get("predicted images/s") for r in markdown_rows(stdout)]


@pytest.mark.parametrize("args, wanted", [
    (["predict", "model=nope"], "error: model=nope is not an option of group 'model'"),
    (["predict", "--bogus"], "error: --bogus is not an option of runner predict"),
    (["predict", "-m", "strategy=replicated", "foo"], "error: Error parsing override 'foo'"),
])
def test_runner_predict_refuses_bad_input_in_one_line(capsys, args, wanted):
    code, out, err = subcommand(capsys, *args)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and out == "", err
    assert err.startswith(wanted)


def test_a_calibration_child_out_of_time_is_its_groups_error():
    assert grid._child(["-c", "import time; time.sleep(30)"], timeout=1) == {"error": "timed out after 1 s"}


def test_the_accuracy_of_a_groups_predictions_in_figures_and_words():
    from runner.report.prediction import combine, judge, line

    # Two runs each: the largest spread is b's 10%; a and b are 5% apart (within it), c far below.
    rows = [("a", 110.0, 100.0), ("b", 100.0, 95.0), ("c", 60.0, 50.0),
            ("a", 110.0, 100.0), ("b", 100.0, 104.5), ("c", 60.0, 50.0)]
    combos = combine(rows)
    assert [c.label for c in combos] == ["a", "b", "c"] and combos[1].rates == [95.0, 104.5]
    j = judge(combos)
    assert j.spread == pytest.approx(9.5 / 99.75) and j.pairs == 2 and j.pairs_ordered == 2  # a-c and b-c
    assert j.median_error == pytest.approx(0.10) and j.spearman == pytest.approx(1.0)
    # The retest: first runs order c < b < a, second runs c < a < b: one swap of three, 1 - 6 * 2 / 24.
    assert j.retest == pytest.approx(0.5)
    # a measured the fastest by throughput, but only 1.00x b, within the 10% spread: not confirmed (was "predicted
    # and confirmed")
    assert j.predicted_fastest == "a" == j.measured_fastest and j.verdict == "not refuted" and not j.confirmed
    assert line("mlp x2", j) == ("prediction: mlp x2: 3 combinations, median error 10%, Spearman 1.00 (the repeats "
                                 "against each other 0.50), 2 of 2 pairs apart beyond the noise ordered right "
                                 "(run-to-run spread 10%); predicted fastest a (a tie: b predicted within 10% of it): "
                                 "measured the fastest by throughput, 1.00x the next (b): not refuted (within the "
                                 "noise)")
    wrong = judge(combine([("a", 90.0, 100.0), ("b", 120.0, 70.0), ("c", 50.0, 50.0)]))  # single runs
    assert wrong.spread is None and wrong.retest is None and wrong.pairs == 3 and wrong.pairs_ordered == 2
    assert wrong.verdict == "undecided"  # one run each: no noise to call 0.70x wrong (or a fastest right) by
    assert line("cnn x4", wrong).endswith("predicted fastest b: measured 0.70x the throughput of the fastest (a): "
                                          "undecided (single runs)")
    # no repeats: no pair is "beyond the noise" (was said of single runs beside "noise unknown")
    assert "2 of 3 pairs ordered right (single runs: noise unknown, every pair counts)" in line("cnn x4", wrong)
    alone = judge(combine([("a", 120.0, 100.0), ("b", 90.0, 50.0)]))  # the fastest, twice the next, in single runs
    assert line("cnn x2", alone).endswith("predicted fastest a: measured the fastest by throughput, 2.00x the next "
                                          "(b): undecided (single runs)")  # was "predicted and confirmed"
    assert line("lenet x1", judge(combine([("a", 90.0, 100.0)]))) == "prediction: lenet x1: 1 combination, error 10%"
    # predicted alike (x1: one device, the same prediction): no order claimed, so none right or wrong (was "0 of 1
    # pairs ordered right" beside "predicted fastest ... measured the fastest")
    tie = judge(combine([("hybrid", 34594.0, 29766.0), ("mirrored", 34594.0, 27457.0), ("single", 10000.0, 9000.0)]))
    assert (tie.pairs, tie.pairs_ordered, tie.pairs_tied) == (2, 2, 1)
    assert "2 of 2 pairs ordered right, 1 predicted within 10% (a tie) left out" in line("dlrm x1", tie)
    two = judge(combine([("hybrid", 34594.0, 29766.0), ("mirrored", 34594.0, 27457.0)]))
    assert "no pair to order: those measured apart were predicted within 10% (a tie)" in line("dlrm x1", two)
    tie = judge(combine([("a", 100.0, 100.0), ("b", 101.0, 98.0), ("a", 100.0, 90.0), ("b", 101.0, 97.0)]))
    assert tie.pairs == 0 and "every combination within the noise of the others (a tie)" in line("nin x2", tie)
    assert tie.verdict == "not refuted"  # b is predicted fastest; it measured within the noise of a


def test_a_predicted_fastest_is_confirmed_only_by_repeats_measuring_it_fastest_beyond_the_noise():
    """The tester's group: the predicted fastest (a predicted tie) measured 0.77x the fastest, within a 30% spread,
    was called 'confirmed'; it is not refuted. Repeats that measure it the fastest beyond the spread confirm it; ones
    that measure another faster beyond the spread refute it."""
    from runner.report.prediction import combine, judge, line

    loose = judge(combine([("ps/split", 105.0, 77.0), ("ps/per_tower", 100.0, 120.0),
                           ("ps/split", 105.0, 77.0), ("ps/per_tower", 100.0, 80.0)]))
    assert loose.spread == pytest.approx(0.4) and loose.verdict == "not refuted" and not loose.confirmed
    assert line("dlrm x4", loose).endswith("predicted fastest ps/split (a tie: ps/per_tower predicted within 10% of "
                                           "it): measured 0.77x the throughput of the fastest (ps/per_tower): not "
                                           "refuted (within the noise)")
    sure = judge(combine([("a", 110.0, 100.0), ("b", 80.0, 80.0), ("a", 110.0, 102.0), ("b", 80.0, 81.0)]))
    assert sure.verdict == "confirmed" and line("x2", sure).endswith(
        "predicted fastest a: measured the fastest by throughput, 1.25x the next (b), beyond the noise: confirmed")
    refuted = judge(combine([("a", 110.0, 80.0), ("b", 80.0, 100.0), ("a", 110.0, 81.0), ("b", 80.0, 102.0)]))
    assert refuted.verdict == "refuted" and line("x2", refuted).endswith(
        "predicted fastest a: measured 0.80x the throughput of the fastest (b), beyond the noise: refuted (the model "
        "was wrong by 20%)")


def test_a_calibration_is_announced_before_it_runs_and_not_when_cached(tmp_path, monkeypatch, capsys):
    """A ResNet-50 calibrated on 8 simulated devices ran 600 s with nothing said; the line comes first."""
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path))
    plan = validate(compose("model=mlp", "strategy=replicated", "gpus=2"))
    entries = {calibrate.machine_key(plan): MACHINE, calibrate.towers_key(plan): TOWERS,
               calibrate.input_key(plan): {"seconds": 0.0004}}
    said = []
    monkeypatch.setattr(grid, "_calibrate", lambda overrides, wanted: said.append(capsys.readouterr().err)
                        or {k: entries[k] for k in wanted})
    combo = [["model=mlp", "strategy=replicated", "gpus=2"]]
    assert grid.predict_all(combo, cache_dir=tmp_path)[0].prediction
    assert said == [f"calibrating this machine at gpus=2 for 1 combinations (3 measurements, a fresh process; cached "
                    f"in {calibrate.cache_path(tmp_path)})\n"], said
    assert grid.predict_all(combo, cache_dir=tmp_path)[0].prediction and "calibrating" not in capsys.readouterr().err
