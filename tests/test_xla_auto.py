"""train.jit_compile=auto decided by measurement (issue #64): the step timed with XLA and without, once per machine,
model and batch (cached), the faster kept, the run told which and why."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import compose, runs

from runner.experiment import run
from runner.measure import xla


def sleeper(per_step: float, calls: list):
    """A step that takes `per_step` seconds (a real wait, timed by the probe like a compiled loop), counting calls."""

    def timed(steps: int) -> float:
        calls.append(steps)
        start = time.perf_counter()
        time.sleep(per_step * steps)
        return time.perf_counter() - start

    return timed


@pytest.mark.parametrize("plain, compiled, on", [(0.004, 0.002, True), (0.002, 0.004, False),
                                                 (0.0040, 0.0039, False)])  # within TIE: no compile for 2.5%
def test_the_faster_side_is_kept_and_cached_with_both_figures(tmp_path, plain, compiled, on):
    calls = {False: [], True: []}
    make = lambda jit: sleeper(compiled if jit else plain, calls[jit])  # noqa: E731
    decision = xla.decide("k", "model=m at 8 examples", make, folder=tmp_path)
    assert decision.on is on and decision.reason.startswith(f"{'on' if on else 'off'}: measured ")
    assert "model=m at 8 examples" in decision.reason and "(cached)" not in decision.reason
    entry = json.loads((tmp_path / xla.CACHE_FILE).read_text())["k"]
    assert entry["plain_ms"] == pytest.approx(plain * 1e3, rel=0.5) and entry["xla_ms"] > 0
    assert len(calls[True]) == len(calls[False]) == 2 + xla.ROUNDS  # compile, estimate, then alternating rounds
    again = xla.decide("k", "model=m at 8 examples", lambda jit: pytest.fail("measured twice"), folder=tmp_path)
    assert again.on is on and again.reason.endswith("(cached)")
    assert xla.cached("other", tmp_path) is None


def test_an_auto_run_tags_its_measured_decision_and_a_second_reads_it_cached(tf_devices, store):
    """In-process tests set train.jit_compile=false (conftest.UNMEASURED); a later auto wins. The first run measures
    (or finds this machine's cached figure), the second reads the cache; both tag the same reason."""
    overrides = ["debug=smoke", "train.steps=4", "train.steps_per_call=2", "train.checkpoint_every=0",
                 "mlflow.system_metrics_interval=0", "train.jit_compile=auto"]
    for _ in range(2):
        run(compose(*overrides, f"mlflow.tracking_uri={store}"))
    table = runs(store, "smoke").sort_values("start_time")
    first, second = table["tags.jit_compile_reason"]
    assert first.startswith(("on: measured", "off: measured")) and "model=mlp at 64 examples" in first
    assert second.endswith("(cached)") and second.split(" (cached)")[0] == first.split(" (cached)")[0]
    assert set(table["tags.xla"]) == {first.split(":")[0]}


def test_a_strategy_that_cannot_compile_its_step_is_off_unmeasured(tf_devices, store):
    run(compose("debug=smoke", "train.steps=2", "train.steps_per_call=1", "train.checkpoint_every=0",
                "mlflow.system_metrics_interval=0", "strategy=model_parallel", "gpus=2", "train.jit_compile=auto",
                f"mlflow.tracking_uri={store}"))
    row = runs(store, "smoke").iloc[0]
    assert row["tags.xla"] == "off" and row["tags.jit_compile_reason"].startswith("off: ")
    assert "an XLA cluster runs on one device" in row["tags.jit_compile_reason"]


def test_the_cost_model_prices_the_passes_as_the_run_compiles_them(tmp_path, monkeypatch):
    """calibrate.compiled reads the same decision a run takes (xla.setting): a fixed setting, a refusal, or the
    cached measurement; the towers' calibration key says which, so an XLA run is never priced from plain passes."""
    from runner.config import validate
    from runner.predict import calibrate

    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path))
    auto = validate(compose("model=mlp", "train.jit_compile=auto"))
    assert not calibrate.compiled(auto)  # nothing measured yet: priced plain
    plain_key = calibrate.towers_key(auto)
    xla.write_cache(tmp_path / xla.CACHE_FILE, {xla.key(auto, "/device:CPU:0"):
                    {"plain_ms": 2.0, "xla_ms": 1.0, "label": "model=mlp", "measured": "now"}})
    assert calibrate.compiled(auto) and calibrate.towers_key(auto) != plain_key
    assert calibrate.compiled(validate(compose("model=mlp", "train.jit_compile=true")))
    assert not calibrate.compiled(validate(compose("model=mlp", "strategy=model_parallel", "gpus=2",
                                                   "train.jit_compile=auto")))


def test_the_floor_counts_the_faster_of_plain_and_compiled_passes(tf_devices):
    """With train.jit_compile possible the floor's passes are timed compiled too (a step compiled by XLA must not
    beat its floor); a model XLA cannot compile keeps the plain figure instead of losing its floor."""
    import keras
    import user_models

    from runner.measure import floor

    devices = ["/device:CPU:0", "/device:CPU:1"]
    towers = []
    for device in devices:  # each tower's variables on its device: its XLA cluster must run there (cannot read across)
        with tf_devices.device(device):
            towers.append(keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]))
    assert floor.towers_seconds(towers, 32, devices, calls=3, repeats=2, jit=True) > 0
    python_step = user_models.with_python_step()
    figures = floor.floor_step_ms([python_step], 32, "sgd", ["/device:CPU:0"], xla=True)
    assert figures["floor_compute_ms"] > 0 and figures["floor_step_ms"] >= figures["floor_compute_ms"]


def test_a_step_xla_cannot_compile_is_off_with_its_reason_and_cached(tmp_path):
    """DLRM's sparse Adagrad update has no XLA kernel: the probe's compiled side fails as it compiles; the decision
    is off, names why, and is cached like a measured one (the run goes on plain: it was a traceback)."""
    plain = sleeper(0.002, [])

    def refused(steps: int) -> float:
        raise ValueError("Detected unsupported operations when trying to compile graph: ResourceSparseApplyAdagradV2")

    decision = xla.decide("sparse", "model=dlrm at 512 examples", lambda jit: refused if jit else plain,
                          folder=tmp_path)
    assert not decision.on and decision.reason.startswith("off: XLA cannot compile the step of model=dlrm")
    assert "ResourceSparseApplyAdagradV2" in decision.reason
    assert xla.cached("sparse", tmp_path).reason.endswith("(cached)")


def test_the_decision_is_kept_per_optimizer():
    """The optimizer's update is part of the compiled step (Keras' AdamW is ~10 ops a variable XLA fuses; the fused
    kernel one): a decision measured with one optimizer is not read for another."""
    from runner.config import validate

    plans = [validate(compose("model=mlp", *extra)) for extra in ([], ["train.optimizer=momentum"],
                                                                   ["train.fused_optimizer=false"])]
    keys = {xla.key(plan, "/device:CPU:0") for plan in plans}
    assert len(keys) == 3
    assert xla.key(plans[0], "/device:CPU:0") == xla.key(validate(compose("model=mlp")), "/device:CPU:0")


def test_a_decision_cached_by_other_code_is_measured_again(monkeypatch):
    """A cached decision belongs to the TensorFlow and the step code that measured it: a new version of either (e.g.
    an optimizer update XLA can now compile) is not answered from the cache."""
    from runner.config import validate

    plan = validate(compose("model=mlp"))
    before = xla.key(plan, "/device:CPU:0")
    version = xla.step_code(plan)
    monkeypatch.setattr(xla, "step_code", lambda _: (version[0], "another step"))
    assert xla.key(plan, "/device:CPU:0") != before
    monkeypatch.setattr(xla, "step_code", lambda _: ("2.99.0", version[1]))
    assert xla.key(plan, "/device:CPU:0") != before
    import sys

    import tensorflow as tf

    assert version[0] == tf.__version__
    monkeypatch.delitem(sys.modules, "tensorflow")  # as the cost model reads it: the installed distribution's
    assert xla._tensorflow_version.__wrapped__() == tf.__version__
    monkeypatch.undo()
    assert xla.step_code(validate(compose("model=gpt", "data=shakespeare")))[1] != version[1]  # another model's code
    import hashlib

    import user_models

    from runner import optimizers
    from runner.strategies import common

    user = validate(compose("+model._target_=user_models.resnet", "model.name=resnet"))
    read = sorted({user_models.__file__, common.__file__, optimizers.__file__})  # a user's builder: its own module
    assert xla.step_code(user)[1] == hashlib.sha256(b"".join(Path(f).read_bytes() for f in read)).hexdigest()[:16]
