"""`train.reuse_freed_memory`: after tf.distribute's generator-based input iterators (mirrored with
`strategy.input=distribute`) have set glibc's mmap threshold to 128 KiB, the runner sets it back so freed tensors
are reused instead of mapped and faulted in again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cli_env

from runner.measure import malloc

# In a fresh process (malloc settings are process-wide): a mirrored run on 2 devices fed through tf.distribute's
# input API (its per-device iterators are generator datasets) with the option off, then
# with it on; after each, page faults per 1 MiB tensor that TensorFlow's threads make and free (256 pages when it
# is mapped fresh). Main-thread numpy arrays would not show it: the main heap keeps free chunks that fit.
SCRIPT = """
import json, resource, sys
import tensorflow as tf
from conftest import compose
from runner.experiment import run

@tf.function
def churn():
    total = tf.constant(0.0)
    for _ in tf.range(50):
        total += tf.reduce_sum(tf.random.uniform([1 << 18]))  # (262144,) float32: 1 MiB made and freed
    return total

def faults_per_mib():
    # The steady state: the fewest over 5 churns. A churn may run on a pool thread whose malloc arena has not
    # grown yet and fault a few tensors' pages in once (seen: whole MiBs, 5-33 faults per MiB averaged over a churn,
    # in about one churn of ten; the others 0). With the option off every churn maps all 50 fresh.
    churn()  # traced, and its first allocations
    counts = []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        churn()
        counts.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
    return min(counts)

out = {}
for reuse in ("false", "true"):
    # measure_input off: only the training calls' own reuse() can undo it
    run(compose("debug=smoke", "strategy=mirrored", "gpus=2", "strategy.input=distribute",
                f"train.reuse_freed_memory={reuse}", "train.measure_input=false",
                f"mlflow.tracking_uri=sqlite:///{sys.argv[1]}/mlflow.db"))
    out[reuse] = faults_per_mib()
print(json.dumps(out))
"""


def test_reuse_sets_glibcs_thresholds_here():
    assert malloc.reuse() is True  # Linux with glibc: what CI and these machines run


@pytest.mark.slow  # 2 mirrored jobs, ~11 s
def test_mirrored_run_leaves_freed_tensors_reusable_only_with_the_option_on(tmp_path):
    # With oneDNN off, TensorFlow's CPU tensors come from glibc's malloc, where the trap is. TensorFlow turns
    # oneDNN on by itself on CPUs with AVX512_VNNI/AVX512_BF16/AMX, and its allocator then pools large tensors, so
    # nothing is mapped per step (measured: 0.08 faults per MiB with the 128 KiB threshold set, 76 with
    # oneDNN off); the test pins the case where the option matters, whatever CPU it runs on.
    env = cli_env({"TF_CPP_MIN_LOG_LEVEL": "0", "PYTHONPATH": f"{REPO / 'tests'}:{REPO}",
                   "TF_ENABLE_ONEDNN_OPTS": "0"})
    script = tmp_path / "churn.py"  # a file, not -c: AutoGraph reads the loop's source
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The cause, in TensorFlow's own words: its generator dataset set the trim threshold.
    assert "Memory patch applied: M_TRIM_THRESHOLD=128 kb was set" in proc.stderr
    faults = json.loads(proc.stdout.strip().splitlines()[-1])
    assert faults["false"] > 200, faults  # every 1 MiB tensor mapped fresh, in every churn: 256 pages faulted in
    assert faults["true"] < 20, faults  # served from the heap: its pages are already there


def test_a_runs_peak_memory_is_its_own_not_the_process_that_started_it():
    """A child's ru_maxrss on Linux keeps the peak of the parent's pages it shared before exec: a run started by a
    test worker holding 1.9 GB reported 1.9 GB. `peak_rss_mb` is the run's own (VmHWM)."""
    from runner.measure.hooks import peak_rss_mb

    held = bytearray(1536 * 2**20)
    held[::4096] = b"\1" * len(held[::4096])  # every page touched: resident
    code = "from runner.measure.hooks import peak_rss_mb; print(peak_rss_mb())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO,
                           check=True)
    assert peak_rss_mb() >= 1536 > 2 * float(child.stdout), child.stdout
    del held
