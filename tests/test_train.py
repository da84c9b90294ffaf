"""One-process training runs through `run(cfg)`: real MNIST slice, real MLflow store, simulated devices."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
from conftest import compose, runs

from runner.config import validate
from runner.runtime.devices import host_cpu
from runner.experiment import run


def _smoke(store, *overrides):
    return run(compose("debug=smoke", f"mlflow.tracking_uri={store}", *overrides))


def test_smoke_run_is_logged_finished_with_params_metrics_and_config(tf_devices, store):
    result = _smoke(store)
    assert result["test_accuracy"] > 0.5  # tiny MLP, 60 steps: well above chance (0.1)
    assert result["images_per_sec"] > 0 and result["steps"] == 60
    df = runs(store, "smoke")
    assert len(df) == 1
    row = df.iloc[0]
    assert row["status"] == "FINISHED"
    assert row["params.model.name"] == "mlp" and row["params.train.global_batch_size"] == "64"
    assert row["tags.devices.kind"] == "CPU" and row["tags.devices.count"] == "1"
    assert row["tags.devices.simulated"] == "false"
    assert row["tags.devices.host_cpu"] == host_cpu() and "(family " in row["tags.devices.host_cpu"]
    assert row["metrics.test_accuracy"] == pytest.approx(result["test_accuracy"])
    client = mlflow.MlflowClient(store)
    history = client.get_metric_history(row["run_id"], "train_loss")
    # The first call runs one step (its end is the job-overhead mark), then calls end on multiples of 10.
    assert [m.step for m in history] == [1, 10, 20, 30, 40, 50, 60]
    assert history[-1].value < history[0].value  # it learns
    assert "config.yaml" in [a.path for a in client.list_artifacts(row["run_id"])]


def test_calls_are_one_step_first_then_end_on_multiples_of_steps_per_call():
    from runner.train import call_size

    sizes, done = [], 0
    while done < 45:
        sizes.append(min(call_size(done, 10), 45 - done))
        done += sizes[-1]
    assert sizes == [1, 9, 10, 10, 10, 5]
    assert [call_size(d, 1) for d in (0, 1, 2)] == [1, 1, 1]


def test_one_timed_call_has_no_standard_error():
    """Was "± stderr 0" in runner report for a run of one timed call: nothing measured its spread."""
    from runner.train import Timer

    timer = Timer(warmup_calls=1, steps_per_call=10)
    for seconds in (5.0, 0.1):
        timer.add(10, seconds)
    one = timer.summary(per_step=64)
    assert one["images_per_sec"] == pytest.approx(6400) and "images_per_sec_stderr" not in one
    timer.add(10, 0.2)
    assert timer.summary(per_step=64)["images_per_sec_stderr"] == pytest.approx(1600)


@pytest.mark.parametrize("model", ["cnn", "nin"])
def test_conv_models_learn_in_the_smoke_preset(tf_devices, store, model):
    result = _smoke(store, f"model={model}")
    assert result["test_accuracy"] > 0.2, result


def test_mirrored_on_two_simulated_devices_matches_single(tf_devices, store):
    single = _smoke(store, "train.steps=10")
    mirrored = _smoke(store, "strategy=mirrored", "gpus=2", "train.steps=10")
    # Same seed, weights and data order: the mean loss over two half batches equals the full-batch loss.
    assert mirrored["train_loss"] == pytest.approx(single["train_loss"], rel=1e-4)
    assert mirrored["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=1e-3)
    row = runs(store, "smoke").set_index("run_id").loc[mirrored["run_id"]]
    assert (row["tags.devices.count"], row["tags.devices.simulated"]) == ("2", "true")
    assert row["tags.strategy"] == "mirrored"


def test_eval_every_logs_intermediate_test_metrics(tf_devices, store):
    result = _smoke(store, "train.eval_every=20")
    history = mlflow.MlflowClient(store).get_metric_history(result["run_id"], "test_accuracy")
    assert [m.step for m in history] == [20, 40, 60]


def test_synthetic_data_is_marked(tf_devices, store):
    result = _smoke(store, "data=synthetic", "data.train_limit=2048", "data.test_limit=500")
    row = runs(store, "smoke").set_index("run_id").loc[result["run_id"]]
    assert row["tags.data.synthetic"] == "true" and row["tags.data"] == "synthetic"


def test_failure_inside_training_marks_the_run_failed(tf_devices, store, tmp_path):
    from runner.data_pipelines.mnist_files import DataError

    with pytest.raises(DataError):
        _smoke(store, f"data.path={tmp_path / 'nowhere'}")
    df = runs(store, "smoke")
    assert list(df["status"]) == ["FAILED"]
    assert "nowhere" in df.iloc[0]["tags.error"]


def test_non_finite_loss_stops_the_run_at_that_step_and_fails_it(tf_devices, store):
    from runner.train import NonFiniteLoss

    with pytest.raises(NonFiniteLoss, match=r"not finite at step \d+; stopped there \(look for NaN or infinite "
                                            r"values in the data, or lower train.learning_rate\)"):
        _smoke(store, "train.optimizer=sgd", "train.learning_rate=1e30")
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FAILED" and "not finite at step" in row["tags.error"]
    history = mlflow.MlflowClient(store).get_metric_history(row["run_id"], "train_loss")
    assert all(np.isfinite(m.value) for m in history)  # nothing non-finite was logged as a result


@pytest.mark.parametrize("strategy", ["single", "replicated"])
def test_a_model_op_xla_cannot_compile_stops_the_run_in_one_line_and_fails_it(tf_devices, store, strategy):
    from runner.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^train.jit_compile: XLA cannot compile the model's op PyFunc \(no XLA "
                                          r"kernel\); set train.jit_compile=false$"):
        _smoke(store, "+model._target_=user_models.with_python_step", "model.name=python_step",
               f"strategy={strategy}", "gpus=2" if strategy == "replicated" else "gpus=1", "train.jit_compile=true")
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FAILED" and "XLA cannot compile" in row["tags.error"]


def test_input_pipeline_rate_is_measured_beside_the_step_rate(tf_devices, store):
    result = _smoke(store, "pipeline=sharded", "strategy=replicated", "gpus=2", "train.measure_input=true")
    assert result["input_batches_per_sec"] > 0 and result["step_batches_per_sec"] > 0
    assert result["input_bound"] == float(result["input_batches_per_sec"] < 3 * result["step_batches_per_sec"])
    row = runs(store, "smoke").iloc[0]
    assert row["tags.input_bound"] == str(bool(result["input_bound"])).lower()


def test_mixed_bfloat16_computes_in_bfloat16_and_learns_like_float32(tf_devices, store, caplog):
    import keras

    full = _smoke(store)
    assert "without bfloat16 instructions" not in caplog.text
    assert keras.mixed_precision.dtype_policy().name == "float32"
    for strategy in (["strategy=single"], ["strategy=model_parallel", "gpus=2"]):
        mixed = _smoke(store, "train.precision=mixed_bfloat16", *strategy)
        assert keras.mixed_precision.dtype_policy().name == "mixed_bfloat16"  # bfloat16 compute, float32 variables
        assert abs(mixed["test_accuracy"] - full["test_accuracy"]) < 0.05, (mixed["test_accuracy"], full)
    # The warning is logged exactly when this host lacks bfloat16 instructions (on this project's AVX2 hosts: yes).
    slow_host = not any(isa in host_cpu() for isa in ("avx512_bf16", "amx_bf16"))
    assert ("without bfloat16 instructions" in caplog.text) == slow_host, host_cpu()
    _smoke(store)  # the next float32 run is float32 again: the policy is set per run, not left over
    assert keras.mixed_precision.dtype_policy().name == "float32"


def test_profile_traces_one_call_and_logs_time_per_op_kind(tf_devices, store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside Hydra the trace goes to the working directory
    result = _smoke(store, "train.profile=true")
    assert result["profile_steps"] == 10
    assert result["timed_steps"] == 40  # 60 steps: the warm-up call and the traced call are not timed
    assert list(tmp_path.glob("profile/plugins/profile/*/*.xplane.pb"))
    client = mlflow.MlflowClient(store)
    run_id = runs(store, "smoke").iloc[0]["run_id"]
    text = Path(client.download_artifacts(run_id, "profile.md", str(tmp_path))).read_text()
    assert "| matmul |" in text and "ms/step" in text
    m = client.get_run(run_id).data.metrics
    kinds = [v for k, v in m.items() if k.startswith("profile_ms_")]
    assert m["profile_ms_matmul"] > 0 and sum(kinds) == pytest.approx(m["profile_op_ms_per_step"])
    # One device, ops on TensorFlow's 2 inter-op threads: matmul spans cannot add up to more than 2 x the wall time
    # (a nested op counted twice would break this long before).
    assert m["profile_ms_matmul"] <= 2 * m["profile_wall_ms_per_step"]


def test_profile_counts_onednns_and_grapplers_kernels_as_their_ops_kind():
    """On a host with oneDNN a ResNet's step ran `_MklNativeConv2DBackpropFilter` and `_MklNativeFusedBatchNormEx`:
    98% of its op time was 'other' before these names were read as their ops'."""
    from runner.measure.profile import kind_of

    kinds = {op: kind_of(op) for op in ("_MklNativeConv2DBackpropFilter", "_FusedConv2D", "Conv2D", "_MklFusedMatMul",
                                        "_MklNativeFusedBatchNormEx", "FusedBatchNormGradV3", "_Send", "AddV2")}
    assert kinds == {"_MklNativeConv2DBackpropFilter": "convolution", "_FusedConv2D": "convolution",
                     "Conv2D": "convolution", "_MklFusedMatMul": "matmul", "_MklNativeFusedBatchNormEx": "batch norm",
                     "FusedBatchNormGradV3": "batch norm", "_Send": "cross-device reduce", "AddV2": "other"}


def test_time_to_accuracy_is_training_time_to_the_first_full_test_set_at_the_target(tf_devices, store):
    """Checks on the first 256 test examples every 10 steps; one at or over 0.6 is confirmed on the full test set."""
    result = _smoke(store, "train.target_accuracy=0.6", "train.check_every=10", "train.check_examples=256")
    client = mlflow.MlflowClient(store)
    checks = {m.step: m.value for m in client.get_metric_history(result["run_id"], "check_accuracy")}
    seconds = {m.step: m.value for m in client.get_metric_history(result["run_id"], "check_train_seconds")}
    full = {m.step: m.value for m in client.get_metric_history(result["run_id"], "test_accuracy")}
    reached = int(result["steps_to_accuracy"])
    assert set(checks) == set(seconds) and max(checks) == reached < 60  # no check after the target was reached
    assert checks[reached] >= 0.6 and full[reached] >= 0.6  # the check, confirmed on all 1024 test examples
    assert all(checks[s] < 0.6 or full.get(s, 0) < 0.6 for s in checks if s < reached)
    assert result["time_to_accuracy_seconds"] == pytest.approx(seconds[reached])
    assert 0 < result["time_to_accuracy_seconds"] < result["train_seconds"]  # evaluation time is not counted
    assert result["eval_seconds"] > 0
    row = runs(store, "smoke").set_index("run_id").loc[result["run_id"]]
    assert row["tags.target.reached"] == "true" and row["metrics.target_accuracy"] == 0.6


def test_a_target_never_reached_is_recorded_as_such(tf_devices, store):
    result = _smoke(store)  # the MLP's own target, 0.98: far off after 60 smoke steps
    assert result["target_accuracy"] == 0.98 and "time_to_accuracy_seconds" not in result
    row = runs(store, "smoke").set_index("run_id").loc[result["run_id"]]
    assert row["tags.target.reached"] == "false"
    off = _smoke(store, "train.target_accuracy=null")
    assert "target_accuracy" not in off
    # A model's own target is an MNIST accuracy: on other data there is none unless one is set.
    assert validate(compose("debug=smoke", "data=synthetic")).train.target_accuracy is None
    assert validate(compose("debug=smoke", "data=synthetic", "train.target_accuracy=0.5")).train.target_accuracy == 0.5


def test_the_floor_is_the_steps_own_work_and_the_run_reports_its_ratio(tf_devices, store):
    """runner/measure/floor.py: the towers' forward and backward passes at the run's batch, then the update of the
    first layer's weights (the one no strategy can overlap) at the device set's bandwidth."""
    from runner.models.cnn import CNN
    from runner.models.mlp import MLP
    from runner.measure import floor

    model = MLP(variant="default").build()
    assert floor.first_layer_weights(model) == 784 * 512 + 512  # the first Dense; the other two overlap backward
    assert floor.first_layer_weights(CNN(variant="default").build()) == 3 * 3 * 32 + 32  # the first convolution
    one, two = (floor.bandwidth_bytes_per_second([f"/device:CPU:{i}" for i in range(n)], 16) for n in (1, 2))
    assert two > 0.5 * one  # two devices copying at once move at least about what one moves alone
    small, large = (floor.towers_seconds([model], b, ["/device:CPU:0"]) for b in (16, 512))
    assert 0 < small < large  # the work grows with the batch
    parts = floor.floor_step_ms([model], 128, "adam", ["/device:CPU:0"])
    assert parts["floor_step_ms"] == pytest.approx(parts["floor_compute_ms"] + parts["floor_update_ms"])
    assert parts["floor_update_ms"] > floor.floor_step_ms([model], 128, "sgd", ["/device:CPU:0"])["floor_update_ms"] / 3
    result = _smoke(store, "train.probe_floor=true", "train.steps=100")
    assert result["step_time_over_floor"] == pytest.approx(result["step_time_ms"] / result["floor_step_ms"])
    assert result["step_time_over_floor"] > 0.5  # a step can hardly beat its own work by much


def test_a_floor_that_cannot_be_measured_leaves_the_trained_run_finished(tf_devices, store, monkeypatch):
    """The floor is measured after training: its failure is a warning and the run's `floor` tag, the run FINISHED
    with its results (was: the run FAILED after it had trained)."""
    import mlflow

    from runner.measure import floor

    def out_of_memory(*args, **kwargs):
        raise MemoryError("cannot allocate the second set of tower models")

    monkeypatch.setattr(floor, "floor_step_ms", out_of_memory)
    result = _smoke(store, "train.probe_floor=true")
    assert result["test_accuracy"] > 0.5 and "floor_step_ms" not in result
    run_ = mlflow.MlflowClient(store).get_run(result["run_id"])
    assert run_.info.status == "FINISHED"
    assert run_.data.tags["floor"] == "failed: cannot allocate the second set of tower models"


def test_no_floor_is_claimed_on_simulated_devices(tf_devices, store, monkeypatch):
    """There the towers' passes timed alone do not bound the step (runner/measure/floor.py): the run says why it
    logs no floor instead of logging one its step beats."""
    import mlflow

    from runner.measure import floor

    assert floor.not_a_bound(True, "CPU", 4, cores=2) and floor.not_a_bound(True, "CPU", 2, cores=8)
    assert floor.not_a_bound(True, "GPU", 4, cores=2) is None and floor.not_a_bound(False, "CPU", 1, cores=1) is None
    monkeypatch.setattr(floor.os, "cpu_count", lambda: 1)  # 2 simulated devices on a 1-core host
    result = _smoke(store, "train.probe_floor=true", "strategy=mirrored", "gpus=2")
    assert "floor_step_ms" not in result and "step_time_over_floor" not in result
    tag = mlflow.MlflowClient(store).get_run(result["run_id"]).data.tags["floor"]
    assert tag.startswith("not measured: on 2 simulated CPU devices sharing 1 core the towers' passes timed alone")


def test_a_run_logs_its_predicted_rate_and_terms(tf_devices, store, tmp_path, monkeypatch):
    """train.predict=true: the cost model's prediction for the run's own combination, calibrated in its process."""
    from runner.paths import read_cache
    from runner.predict import calibrate
    from runner.predict.costs import TERMS

    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "cache"))
    result = _smoke(store, "train.predict=true")
    terms = [result[f"predicted_{t}_ms"] for t in TERMS]
    assert all(t >= 0 for t in terms) and result["predicted_towers_ms"] > 0
    assert result["predicted_step_ms"] == pytest.approx(sum(terms))
    assert result["predicted_images_per_sec"] == pytest.approx(64 / result["predicted_step_ms"] * 1e3)
    row = runs(store, "smoke").set_index("run_id").loc[result["run_id"]]
    assert row["tags.predicted.dominant"].split()[0] in TERMS
    cached = read_cache(calibrate.cache_path(tmp_path / "cache"))
    assert not cached or sum(k.endswith("|machine") for k in cached) == 1  # cached unless others used the CPUs
    assert "predicted_images_per_sec" not in _smoke(store)  # the smoke preset leaves it out
