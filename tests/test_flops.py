"""FLOP counts (analytic against TensorFlow's profiler), the cached matmul peak probe, and MFU arithmetic."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import cli_env, run_cli, runs

from runner.data_pipelines import MNIST


@pytest.fixture
def flops(tf_devices):
    """runner.measure.flops, imported after the test devices are configured (as the run imports it)."""
    from runner.measure import flops

    return flops


@pytest.fixture
def graph_flops(tf_devices):
    """runner.measure.graph_flops: TensorFlow's own count, the cross-check."""
    from runner.measure import graph_flops

    return graph_flops


@pytest.fixture
def peak(tf_devices):
    """runner.measure.peak: the measured matmul peak."""
    from runner.measure import peak

    return peak


def _mlp_formula(h: int) -> float:
    """784-h-h-10 by hand: 2 FLOPs per multiply-add, 3x forward, minus the first layer's input gradient."""
    forward = 2 * (784 * h + h * h + h * 10)
    return 3 * forward - 2 * 784 * h


def test_mlp_default_is_about_3_2_mflop_per_example(flops):
    from runner.models.mlp import MLP

    count = flops.training_flops_per_example(MLP(variant="default").build())
    assert 3.0e6 <= count <= 3.4e6
    assert count == _mlp_formula(512) == 3_209_216


def test_mlp_count_follows_the_hidden_units_across_variants(flops):
    """Per hidden unit the cost is affine in h (6h + 3196): the h x h layer makes the total quadratic, not linear."""
    from runner.models.mlp import HIDDEN_UNITS, MLP

    counts = {h: flops.training_flops_per_example(MLP(variant=v).build()) for v, h in HIDDEN_UNITS.items()}
    assert counts == {h: _mlp_formula(h) for h in counts}
    per_unit = {h: c / h for h, c in counts.items()}
    slope, intercept = np.polyfit(list(per_unit), list(per_unit.values()), 1)
    assert slope == pytest.approx(6) and intercept == pytest.approx(3196)
    assert counts[1000] / counts[64] > 1000 / 64  # more than linear in h


@pytest.mark.parametrize("name,variant", [("mlp", "default"), ("nin", "tiny")])
def test_analytic_matches_profiler_within_5_percent(flops, graph_flops, name, variant):
    """MLP and NIN (SAME-padded, stride-1 convs): the profiler's formulas and ours count the same work."""
    from runner.models import MODELS

    model = MODELS.get(name)(variant=variant).build()
    analytic, profiled = flops.training_flops_per_example(model), graph_flops.profiler_flops_per_example(model)
    assert profiled == pytest.approx(analytic, rel=0.05)
    assert profiled >= analytic  # the profiler adds bias, pooling and loss ops, never fewer multiply-adds


def _profiler_convention(model) -> float:
    """The analytic count with conv backward ops charged on the conv's input area, as TF's profiler does."""
    import keras

    total, first = 0.0, True
    for layer in model.layers:
        if not layer.trainable_weights:
            continue
        forward = 2.0 * math.prod(layer.kernel.shape) * math.prod(layer.output.shape[1:-1])
        ratio = 1.0
        if isinstance(layer, keras.layers.Conv2D):
            ratio = math.prod(layer.input.shape[1:3]) / math.prod(layer.output.shape[1:3])
        total += forward + forward * ratio * (1 if first else 2)  # weight gradient, then input gradient
        first = False
    return total


def test_cnn_counts_agree_once_the_profilers_valid_padding_convention_is_applied(flops, graph_flops):
    """cnn (VALID convs): the forward passes agree; in training the profiler charges backprop on the input area."""
    from runner.models.cnn import CNN

    model = CNN(variant="tiny").build()
    forward = graph_flops.profiler_flops_per_example(model, training=False)
    assert forward == pytest.approx(flops.forward_flops_per_example(model), rel=0.05)
    analytic, profiled = flops.training_flops_per_example(model), graph_flops.profiler_flops_per_example(model)
    assert profiled == pytest.approx(_profiler_convention(model), rel=0.05)
    assert profiled > 1.05 * analytic  # the gap is the padding convention, not a missing layer


def test_unknown_weighted_layer_is_refused(flops):
    import keras

    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.BatchNormalization(), keras.layers.Flatten()])
    with pytest.raises(ValueError, match="no FLOP formula"):
        flops.training_flops_per_example(model)


def _resnet(batch_norm: bool):
    """A small ResNet (the shape of a user's model): conv, two residual blocks with batch norm, pooling, dense."""
    import keras
    from keras import layers

    x = inputs = keras.Input((28, 28, 1))
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    for _ in range(2):
        y = layers.Conv2D(8, 3, padding="same")(x)
        y = layers.ReLU()(layers.BatchNormalization()(y) if batch_norm else y)
        y = layers.Conv2D(8, 3, padding="same")(y)
        y = layers.BatchNormalization()(y) if batch_norm else y
        x = layers.ReLU()(layers.Add()([x, y]))
    return keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)))


def test_a_layer_without_a_formula_is_counted_by_tensorflow(flops):
    """Batch norm has weights but no formula: TensorFlow's count of the traced step takes over, and agrees with
    the formulas on the same network without batch norm to within what batch norm, biases and ReLU add."""
    counted = flops.count_training_flops(_resnet(batch_norm=True))
    assert counted.source == "TensorFlow's graph statistics"
    plain = flops.count_training_flops(_resnet(batch_norm=False))
    assert plain.source == "layer formulas"
    assert 1.0 < counted.flops_per_example / plain.flops_per_example < 1.1


def test_a_model_nothing_can_count_is_a_warning_and_no_figure(flops, monkeypatch, caplog):
    from runner.measure import graph_flops

    def untraceable(*args, **kwargs):
        raise ValueError("the traced step has tensors without static shapes, e.g. ['ragged']")

    monkeypatch.setattr(graph_flops, "profiler_flops_per_example", untraceable)
    assert flops.count_training_flops(_resnet(batch_norm=True)) is None
    (record,) = [r for r in caplog.records if "FLOPs not counted" in r.getMessage()]
    assert "batch_normalization" in record.getMessage() and "MFU are left out" in record.getMessage()


@pytest.mark.alone  # a probe beside another test is disturbed, and not trusted
def test_probe_peak_measures_once_then_reads_the_cache(peak, tmp_path, monkeypatch):
    start = time.perf_counter()
    first = peak.probe_peak(sizes=(512,), seconds=0.3, cache_dir=tmp_path)
    uncached_s = time.perf_counter() - start
    assert first is not None and first.gflops > 0 and not first.cached and first.dtype == "float32"
    assert json.loads((tmp_path / "peak.json").read_text())[first.key]["gflops"] == first.gflops

    monkeypatch.setattr(peak, "_benchmark", lambda *a: pytest.fail("the cached peak was measured again"))
    start = time.perf_counter()
    second = peak.probe_peak(sizes=(512,), seconds=0.3, cache_dir=tmp_path)
    assert time.perf_counter() - start < 0.1 < uncached_s
    assert second.cached and second.gflops == first.gflops and second.key == first.key


@pytest.mark.alone  # a probe beside another test is disturbed, and not trusted
def test_probe_peak_survives_a_corrupt_cache_and_skips_unsupported_dtypes(peak, tmp_path, monkeypatch):
    (tmp_path / "peak.json").write_text("{not json")
    probed = peak.probe_peak(sizes=(256,), seconds=0.05, cache_dir=tmp_path)
    assert probed is not None and not probed.cached
    assert probed.key in json.loads((tmp_path / "peak.json").read_text())

    monkeypatch.setattr(peak, "cpuinfo", lambda: {"model name": "Test CPU", "flags": "sse2 avx2"})
    assert peak.probe_peak(dtype="float16", cache_dir=tmp_path) is None  # no native fp16: not probed
    assert peak.probe_peak(dtype="bfloat16", cache_dir=tmp_path) is None
    with pytest.raises(ValueError, match="dtype"):
        peak.probe_peak(dtype="int8", cache_dir=tmp_path)


def test_mfu_arithmetic():
    from runner.measure.flops import mfu

    assert mfu(25_000, 3.2e6, 400.0) == pytest.approx(0.2)  # 80 GFLOP/s of 400
    assert mfu(25_000, 3.2e6, 400.0, physical_processors=2) == pytest.approx(0.1)
    assert mfu(0, 3.2e6, 400.0) == 0
    assert mfu(25_000, 3.2e6, 40.0) == pytest.approx(2.0)  # > 1: a peak 10x too low, inconsistent inputs
    for bad in [dict(peak_gflops=0), dict(physical_processors=0), dict(images_per_sec=-1)]:
        with pytest.raises(ValueError):
            mfu(**{"images_per_sec": 1.0, "flops_per_example": 1.0, "peak_gflops": 1.0, **bad})


def _best_mlp_rate(tf, batch: int = 128, steps: int = 20, calls: int = 4) -> float:
    """Best images/s of compiled Adam steps of the MLP on in-memory data (best of `calls`, as the probe)."""
    import keras

    from runner.models.mlp import MLP

    model, opt = MLP(variant="default").build(), keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    x = tf.random.uniform((batch, 28, 28, 1), seed=0)
    y = tf.random.uniform((batch,), maxval=10, dtype=tf.int32, seed=0)

    @tf.function
    def run(n):
        for _ in tf.range(n):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    float(run(tf.constant(1)))  # warm-up: tracing
    best = math.inf
    for _ in range(calls):
        start = time.perf_counter()
        float(run(tf.constant(steps)))
        best = min(best, time.perf_counter() - start)
    return steps * batch / best


@pytest.mark.alone  # a probe beside another test is disturbed, and not trusted
def test_measured_mlp_mfu_is_a_fraction(flops, peak, tf_devices, tmp_path):
    """The MLP's real training rate times its analytic FLOPs stays under the matmul peak: 0 < MFU < 1."""
    from runner.models.mlp import MLP

    rate = _best_mlp_rate(tf_devices)
    probed = peak.probe_peak(sizes=(1024,), seconds=0.5, cache_dir=tmp_path)
    value = flops.mfu(rate, flops.training_flops_per_example(MLP(variant="default").build()), probed.gflops)
    assert 0 < value < 1, f"{rate:.0f} images/s against {probed.gflops:.0f} GFLOP/s gives MFU {value:.2f}"


def test_probe_notices_other_processes_using_the_cpus(peak):
    """A probe disturbed by a busy process is flagged: one spinning core of the usable ones is a large share."""
    import subprocess
    import sys

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.1)
        _, share = peak.timed_with_others_share(lambda: time.sleep(0.5))
    finally:
        spinner.kill()
        spinner.wait()
    assert share >= 0.8 / len(peak._cpus())


@pytest.mark.alone  # a probe beside another test is disturbed, and not trusted
def test_refresh_keeps_the_higher_figure(peak, tmp_path):
    """Other processes only ever slow a probe down, so a re-probe never lowers the cached peak."""
    low = peak.probe_peak(sizes=(256,), seconds=0.05, cache_dir=tmp_path)
    cache = tmp_path / "peak.json"
    cache.write_text(json.dumps({low.key: {"gflops": 1e-3}}))
    raised = peak.probe_peak(sizes=(256,), seconds=0.05, cache_dir=tmp_path, refresh=True)
    assert raised.gflops > 1e-3 and json.loads(cache.read_text())[low.key]["gflops"] == raised.gflops
    cache.write_text(json.dumps({low.key: {"gflops": 1e9}}))
    kept = peak.probe_peak(sizes=(256,), seconds=0.05, cache_dir=tmp_path, refresh=True)
    assert kept.gflops == 1e9 and not kept.cached


def test_a_probe_taken_under_load_is_tried_again_and_never_cached(peak, tmp_path, monkeypatch, caplog):
    """Other processes' share above BUSY twice: no peak (MFU left out), nothing cached; once: the retry counts."""
    monkeypatch.setattr(peak, "RETRY_AFTER", 0.0)
    shares = iter([0.6, 0.6, 0.6, 0.6, 0.6, 0.6])
    monkeypatch.setattr(peak, "_measure", lambda device, dtype, size, seconds: (100.0 + size, next(shares)))
    assert peak.probe_peak(sizes=(1, 2, 3), cache_dir=tmp_path) is None
    assert not (tmp_path / "peak.json").exists() and "peak not measured" in caplog.text
    shares = iter([0.6, 0.6, 0.6, 0.0, 0.1, 0.0])  # the second sweep ran on an idle machine
    probed = peak.probe_peak(sizes=(1, 2, 3), cache_dir=tmp_path)
    assert (probed.gflops, probed.size, probed.others) == (103.0, 3, 0.1)  # the best size of the sweep
    assert json.loads((tmp_path / "peak.json").read_text())[probed.key]["size"] == 3


def test_a_runs_probe_that_found_the_machine_busy_says_so(peak, monkeypatch, caplog):
    """The probe runs in a process of its own, whose 'peak not measured' warning was never shown: on a busy machine
    every run probed again (~15 s each) without a word."""
    import subprocess

    said = ("[2026-11-29 08:59:01,000][runner.measure.peak][WARNING] - peak not measured: other processes used 61% of "
            "the CPUs during two probes (90 GFLOP/s at best); MFU is left out. Re-probe on an idle machine: runner "
            "check --reprobe")
    monkeypatch.setattr(peak, "cached_cpu_peak", lambda dtype="float32", cache_dir=None: None)
    monkeypatch.setattr(peak.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", said + "\n"))
    assert peak.cpu_peak("float32") is None
    assert ("peak not measured: other processes used 61% of the CPUs during two probes (90 GFLOP/s at best); MFU is "
            "left out. Re-probe on an idle machine: runner check --reprobe; until a probe is cached, every run probes "
            "again") in caplog.text


@pytest.mark.alone  # a probe beside another test is disturbed, and not trusted
def test_hosts_under_one_model_name_get_their_own_peak(peak, tmp_path, monkeypatch):
    """A peak cached on a host without AVX-512 is not read on one with it, though /proc/cpuinfo names both alike."""
    monkeypatch.setattr(peak, "_measure", lambda device, dtype, size, seconds: (50.0, 0.0))
    monkeypatch.setattr(peak, "cpuinfo", lambda: {"model name": "AMD EPYC", "flags": "fpu avx2"})
    zen3 = peak.probe_peak(sizes=(8,), cache_dir=tmp_path)
    monkeypatch.setattr(peak, "cpuinfo", lambda: {"model name": "AMD EPYC", "flags": "fpu avx2 avx512f"})
    monkeypatch.setattr(peak, "_measure", lambda device, dtype, size, seconds: (90.0, 0.0))
    zen4 = peak.probe_peak(sizes=(8,), cache_dir=tmp_path)
    assert zen3.key != zen4.key and (zen3.gflops, zen4.gflops) == (50.0, 90.0) and not zen4.cached


def test_a_run_that_beats_the_peak_has_it_probed_again(monkeypatch):
    """MFU is a measured ratio, never clamped: above 1 the peak is re-probed; still above, MFU is left out with a
    tag saying why."""
    from runner import experiment
    from runner.measure import peak as peak_module
    from runner.runtime.devices import Devices

    devices, tags = Devices(("/device:CPU:0",), "CPU", False, "1 CPU (2 cores)"), {}
    recorder = type("R", (), {"tags": lambda self, t: tags.update(t)})()
    result = {"images_per_sec": 10_000.0}  # x 10 MFLOP = 100 GFLOP/s achieved
    probes = []

    def fresh(gflops):  # the host CPU's peak, probed again (in a fresh process)
        return lambda dtype, refresh: probes.append((dtype, refresh)) or gflops

    monkeypatch.setattr(peak_module, "cpu_peak", fresh(200.0))
    hardware = {"flops_per_example": 1e7, "peak_gflops": 50.0}  # a stale, low peak
    out = experiment._utilisation(result, hardware, devices, "float32", recorder, MNIST)
    assert out["mfu"] == pytest.approx(0.5) and hardware["peak_gflops"] == 200.0 and not tags
    assert probes == [("float32", True)]
    monkeypatch.setattr(peak_module, "cpu_peak", fresh(80.0))  # re-probed, still beaten
    hardware = {"flops_per_example": 1e7, "peak_gflops": 50.0}
    out = experiment._utilisation(result, hardware, devices, "float32", recorder, MNIST)
    assert "mfu" not in out and hardware["peak_gflops"] == 80.0 and "Winograd" in tags["mfu.missing"]


def test_a_clusters_mfu_is_against_the_peaks_of_all_its_machines():
    """A 2-worker job on two machines: the global rate over one machine's peak read an MFU twice too high; workers on
    one host (localhost) share its peak."""
    from runner import experiment
    from runner.runtime.cluster import Cluster
    from runner.runtime.devices import Devices

    devices = Devices(("/device:GPU:0", "/device:GPU:1"), "GPU", False, "2 GPU")
    recorder = type("R", (), {"tags": lambda self, t: None})()
    result, hardware = {"images_per_sec": 10_000.0}, {"flops_per_example": 1e7, "peak_gflops": 100.0}  # 100 GFLOP/s
    apart = Cluster({"worker": ["n7:2222", "n8:2222"]}, "worker", 0)
    together = Cluster({"worker": ["localhost:2222", "localhost:2223"]}, "worker", 0)
    assert (apart.hosts, together.hosts) == (2, 1)
    out = experiment._utilisation(result, dict(hardware), devices, "float32", recorder, MNIST, apart.hosts)
    assert out["mfu"] == pytest.approx(0.25)  # of 2 machines x 2 GPUs x 100 GFLOP/s
    out = experiment._utilisation(result, dict(hardware), devices, "float32", recorder, MNIST, together.hosts)
    assert out["mfu"] == pytest.approx(0.5)


def test_a_mixed_precision_runs_peak_is_its_compute_dtypes_where_native(monkeypatch):
    """MFU of a bfloat16 run against the bfloat16 peak where the CPU has it natively, else against float32's."""
    from runner import experiment
    from runner.measure import peak as peak_module
    from runner.runtime.devices import Devices

    devices = Devices(("/device:CPU:0",), "CPU", False, "1 CPU (2 cores)")
    monkeypatch.setattr(peak_module, "cpu_peak", lambda dtype, refresh: {"float32": 200.0, "bfloat16": 400.0}[dtype])
    monkeypatch.setattr(peak_module, "cpuinfo", lambda: {"model name": "CPU", "flags": "avx2 avx512_bf16"})
    assert experiment._peak(devices, "mixed_bfloat16") == 400.0 and experiment._peak(devices, "float32") == 200.0
    assert "bfloat16 peak" in experiment._mfu_basis(devices, "mixed_bfloat16")
    monkeypatch.setattr(peak_module, "cpuinfo", lambda: {"model name": "CPU", "flags": "avx2"})
    assert experiment._peak(devices, "mixed_bfloat16") == 200.0


def test_a_sweep_probes_the_peak_once_before_its_jobs_and_not_again(peak, tmp_path, monkeypatch):
    """Jobs side by side would see each other as load; the sweep probes first, in a fresh process, unless cached."""
    import subprocess

    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: calls.append(args) or subprocess.CompletedProcess(
        args, 0, "", ""))
    peak.probe_before_jobs()
    assert len(calls) == 1 and "probe_peak(dtype='float32'" in calls[0][-1]
    key = peak.cache_key(peak._cpu_description())
    (tmp_path / "peak.json").write_text(json.dumps({key: {"gflops": 123.0}}))
    assert peak.cached_cpu_peak() == 123.0
    peak.probe_before_jobs()
    assert len(calls) == 1  # cached: no second probe


@pytest.mark.slow  # a run on 2 devices and a probe, ~30 s
@pytest.mark.alone  # a probe beside another test is disturbed, and not trusted
def test_a_run_on_simulated_devices_takes_the_whole_cpus_peak(tmp_path):
    """On 2 simulated devices the run gives each op 1 of the 2 cores; the peak it logs and caches is still the whole
    CPU's, probed in a fresh process (probed in the run's own, it came out about half, and MFU twice too high)."""
    env = {"RUNNER_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli("debug=smoke", "strategy=mirrored", "gpus=2", "train.probe_peak=true", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (entry,) = json.loads((tmp_path / "cache" / "peak.json").read_text()).values()
    assert runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]["metrics.peak_gflops"] == entry["gflops"]
    code = "from runner.measure.peak import probe_peak; print(probe_peak(refresh=True).gflops)"
    whole = subprocess.run([sys.executable, "-c", code], env=cli_env({"RUNNER_CACHE_DIR": str(tmp_path / "again")}),
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert entry["gflops"] > 0.75 * float(whole.stdout.split()[-1]), (entry, whole.stdout)


def test_the_floors_timings_run_with_the_garbage_collector_on_as_training_does():
    """median_seconds times with timeit, which turns the collector off unless told: the floor would then be timed
    under conditions the training step it is compared with never has."""
    import gc

    from runner.measure.floor import median_seconds

    seen: list[bool] = []
    assert median_seconds(lambda: seen.append(gc.isenabled()), repeats=3) >= 0
    assert seen == [True] * 5 and gc.isenabled()  # two warm-up calls, three timed
