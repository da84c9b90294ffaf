"""What a result records about the machine it ran on."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, cli_env

from runner.runtime.devices import Devices, describe_cpuinfo, precision_warning

# The first lines of /proc/cpuinfo on two EPYC hosts that both call themselves "AMD EPYC" (abridged flags).
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx fma avx2 sha_ni

processor\t: 1
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx fma avx2 sha_ni
"""
ZEN4 = ZEN3.replace("model\t\t: 1", "model\t\t: 17").replace("avx2 sha_ni", "avx2 avx512f avx512_bf16 sha_ni")


def test_cpu_record_tells_apart_hosts_with_the_same_name():
    assert describe_cpuinfo(ZEN3) == "AMD EPYC (family 25 model 1), avx2"
    assert describe_cpuinfo(ZEN4) == "AMD EPYC (family 25 model 17), avx2, avx512f, avx512_bf16"


def test_cpu_record_says_so_when_fields_are_missing():
    assert describe_cpuinfo("processor\t: 0\nflags\t: fpu sse4_2\n") == "? (family ? model ?), no avx2"


CPU1 = Devices(("/device:CPU:0",), "CPU", False, "1 CPU (2 cores)")
GPU1 = Devices(("/device:GPU:0",), "GPU", False, "1 GPU")


def test_bfloat16_warns_only_on_a_cpu_without_bfloat16_instructions():
    zen3, zen4 = describe_cpuinfo(ZEN3), describe_cpuinfo(ZEN4)
    warning = precision_warning("mixed_bfloat16", CPU1, zen3)
    assert warning.startswith("train.precision=mixed_bfloat16 on a CPU without bfloat16 instructions")
    assert zen3 in warning and "train.precision=float32" in warning
    assert precision_warning("mixed_bfloat16", CPU1, zen4) is None  # avx512_bf16: bf16 is fast there
    assert precision_warning("mixed_bfloat16", GPU1, zen3) is None  # the GPU computes, not the host
    assert precision_warning("float32", CPU1, zen3) is None
    for cpu in (zen3, zen4):  # float16 is for GPUs on any CPU, with or without bfloat16 instructions
        assert precision_warning("mixed_float16", CPU1, cpu).startswith("train.precision=mixed_float16 on CPU devices")
    assert precision_warning("mixed_float16", GPU1, zen3) is None


def test_tensorflow_imports_without_the_packages_keras_would_load_for_unused_features():
    # A fresh process: in this one TensorFlow may already be imported. sklearn and matplotlib are installed
    # (MLflow depends on both), IPython where a user has it, so without the block Keras would import them.
    code = (
        "import sys\n"
        "from runner.runtime.devices import import_tensorflow\n"
        "tf = import_tensorflow()\n"
        "assert 'keras' in sys.modules and tf.constant(1.0).numpy() == 1.0\n"
        "assert not {'sklearn', 'matplotlib', 'IPython'} & set(sys.modules), 'imported during TensorFlow'\n"
        "import sklearn.base, matplotlib.pyplot\n"  # the block is lifted: both still import when asked for
        "assert 'IPython' not in sys.modules\n"  # no None entry left to refuse it (IPython is not a dependency)
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_more_threads_per_op_than_cores_is_said(tf_devices, caplog):
    """train.intra_op_threads=99 on 2 cores ran mlp/tiny at a quarter of its rate, and nothing said why."""
    import os

    from runner.runtime import devices

    devices.setup(1, intra=(os.cpu_count() or 1) + 1)
    assert f"train.intra_op_threads={(os.cpu_count() or 1) + 1} is more threads per op than" in caplog.text
    caplog.clear()
    devices.setup(1, intra=os.cpu_count() or 1)
    assert "more threads per op" not in caplog.text
