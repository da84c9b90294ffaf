"""strategy=multi_worker: MultiWorkerMirroredStrategy across real processes on 127.0.0.1, the runner's own loop."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from conftest import compose, runs, start_cli

from runner.config import ConfigError, validate


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> str | None:
    """Where a TCP port of this machine listens: "loopback", "every interface", another address, or None."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                if set(address) == {"0"}:
                    return "every interface"
                return "loopback" if address in ("0100007F", "00000000000000000000000001000000") else address
    return None


def _wait_for_listeners(ports: list[int], timeout: float = 120) -> dict[int, str]:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {port: _listening(port) for port in ports}
        if all(found.values()):
            return found
        time.sleep(0.2)
    raise AssertionError(f"the workers never listened on {ports}")


# float16 with a start that overflows: both workers must skip the same steps (one decision over every replica's
# gradients) to end bit-identical.
FLOAT16 = ["train.precision=mixed_float16", f"train.loss_scale={2.0**40}", "train.loss_scale_period=1000"]


def _two_workers(folder, *extra: str, env: dict | None = None) -> tuple[list[tuple[str, str]], dict[int, str]]:
    """Start `python -m runner debug=smoke strategy=multi_worker EXTRA` as workers 1 and 0 of one job on 127.0.0.1;
    both must exit 0. Returns their (stdout, stderr) and where their TensorFlow servers listened."""
    workers = f"strategy.workers=[127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}]"
    procs = [
        start_cli("debug=smoke", "strategy=multi_worker", workers, f"strategy.task_index={i}", *extra, cwd=folder,
                  env=env)
        for i in (1, 0)
    ]
    listening = _wait_for_listeners([int(w.split(":")[1]) for w in workers.strip("]").split("[")[1].split(",")])
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-2000:]
    return outputs, listening


@pytest.mark.parametrize("extra", [[], pytest.param(FLOAT16, marks=pytest.mark.slow)], ids=["float32", "float16"])
def test_two_workers_train_one_model_and_only_the_chief_logs(tmp_path, extra):
    outputs, listening = _two_workers(tmp_path, *extra)
    # TensorFlow's servers listen on every interface, though the spec names 127.0.0.1: each worker says so.
    assert set(listening.values()) == {"every interface"}, listening
    for out, err in outputs:
        assert "listens on port" in out + err and "trusted network or behind a firewall" in out + err
    digests = {re.search(r"final weights sha256 ([0-9a-f]{16})", out + err).group(1) for out, err in outputs}
    assert len(digests) == 1  # the two workers end with bit-identical weights

    df = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke")
    assert len(df) == 1  # the chief's run only
    row = df.iloc[0]
    assert row["status"] == "FINISHED" and row["tags.devices.workers"] == "2"
    assert row["tags.weights.sha256"] in digests and row["metrics.test_accuracy"] > 0.5
    assert row["params.train.per_device_batch_size"] == "32"  # global 64 over 2 workers x 1 device
    if extra:
        skipped = row["metrics.skipped_steps"]
        assert skipped > 0 and row["metrics.loss_scale"] == 2.0**40 / 2**skipped
    # Each worker keeps its own log, in its own output folder, even when started in the same second.
    logs = {p.parent.name.rsplit("-", 1)[1]: p.read_text() for p in tmp_path.glob("outputs/*/*/runner.log")}
    assert sorted(logs) == ["worker0", "worker1"]
    assert all("final weights sha256" in text for text in logs.values())
    # Outside a sweep the wait is the log's, at INFO: whom it waits for, how long, that each must be started.
    assert "INFO] - joining 2 workers as worker1: waiting up to 300 s (strategy.peer_timeout) for 127.0.0.1:" in logs[
        "worker1"] and "must be started\n" in logs["worker1"] and "a sweep job" not in logs["worker1"]


@pytest.mark.slow  # two fresh workers training a ResNet, ~40 s
def test_two_workers_keep_one_set_of_batch_norm_statistics(tmp_path):
    """A user's ResNet with batch normalization on 32x32x3 data across two workers: per-replica batch statistics,
    moving statistics all-reduced every step, so both workers end bit-identical, moving statistics included."""
    from conftest import REPO

    outputs, _ = _two_workers(tmp_path, "+model._target_=user_models.resnet", "model.name=resnet",
                              "+model.filters=4", "data=synthetic", "data.shape=[32,32,3]", "data.train_limit=512",
                              "data.test_limit=128", "train.steps=10", env={"PYTHONPATH": str(REPO / "tests")})
    digests = {re.search(r"final weights sha256 ([0-9a-f]{16})", out + err).group(1) for out, err in outputs}
    assert len(digests) == 1
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.model"] == "resnet"
    assert row["tags.batch_norm.copies_equal"] == "true" and "all-reduced" in row["tags.batch_norm"]


@pytest.mark.slow  # two fresh workers training the GPT, ~40 s
def test_two_workers_train_the_gpt_with_its_recipe_to_the_same_weights(tmp_path):
    """nanoGPT's recipe across two workers: AdamW, the cosine schedule and clipping of the summed gradients (the
    runner's own all-reduce); both workers end bit-identical and the chief logs tokens/s and the validation loss."""
    import math

    outputs, _ = _two_workers(tmp_path, "model=gpt", "data=shakespeare", "data.sequence_length=32",
                              "data.test_limit=64", "train.steps=20", "train.lr_warmup_steps=2")
    digests = {re.search(r"final weights sha256 ([0-9a-f]{16})", out + err).group(1) for out, err in outputs}
    assert len(digests) == 1
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.model"] == "gpt" and row["params.train.clip_norm"] == "1.0"
    assert row["metrics.tokens_per_sec"] > 0 and row["metrics.test_loss"] < math.log(84)


def test_a_worker_killed_while_training_ends_the_chief_in_one_line_and_its_run_failed(tmp_path):
    """SIGKILL to worker 1 alone: the chief ended FAILED after a 44-frame `UnavailableError: Graph execution error`
    traceback, its `error` tag just "UnavailableError: Graph execution error:"."""
    import os
    import signal
    import time

    ports = [_free_port(), _free_port()]
    workers = f"strategy.workers=[127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}]"
    worker, chief = (start_cli("debug=smoke", "strategy=multi_worker", workers, f"strategy.task_index={i}",
                               "train.steps=1000000", cwd=tmp_path) for i in (1, 0))
    try:
        deadline = time.monotonic() + 120
        while not any("step 1/" in log.read_text() for log in tmp_path.glob("outputs/*/*-worker0/runner.log")):
            assert time.monotonic() < deadline and chief.poll() is None, "the chief never trained"
            time.sleep(0.2)
        os.kill(worker.pid, signal.SIGKILL)
        out, err = chief.communicate(timeout=120)
    finally:
        for proc in (worker, chief):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err[-3000:]
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: worker0 lost worker1 (127.0.0.1:{ports[1]}) of the cluster while training "
                           "(TensorFlow"), line
    assert line.endswith("start every worker of the job again, and it resumes from its last checkpoint")
    assert chief.returncode == 2
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]
    assert row["status"] == "FAILED" and row["tags.error"] == f"PeerLost: {line.removeprefix('error: ')}"


def test_workers_given_different_configs_are_refused_in_one_line_before_training(tmp_path):
    """Worker 1 given train.steps=400: both failed 16-26 s in, TensorFlow's 'Shape mismatch in the collective
    instance' traceback and FAILED runs. Each worker now checks, with its peers, that all were given one config."""
    ports = [_free_port(), _free_port()]
    workers = f"strategy.workers=[127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}]"
    procs = [start_cli("debug=smoke", "strategy=multi_worker", workers, f"strategy.task_index={i}", *extra,
                       cwd=tmp_path) for i, extra in ((1, ["train.steps=400"]), (0, []))]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
        (line,) = [line for line in err.splitlines() if line.startswith("error:")]
        assert "the workers were started with different configs" in line and "only strategy.task_index" in line
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]
    assert row["status"] == "FAILED" and "different configs" in row["tags.error"]
    assert "metrics.train_loss" not in row or row.isna()["metrics.train_loss"]  # refused before training


@pytest.mark.parametrize("kind,message,lost", [
    ("UnavailableError", "Collective ops is aborted by: The following tasks are unhealthy (stopped sending heartbeats):"
     "\n/job:worker/replica:0/task:1\nThe tasks have crashed.", "worker1 (h1:2) of the cluster while training "
     "(TensorFlow reports it unhealthy: it stopped sending heartbeats)"),
    ("UnavailableError", "Graph execution error:\n\nCollective ops is aborted by: recvmsg:Connection reset by peer\n"
     "Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling RecvBuf:\n"
     "\t [[{{node while/CollectiveReduceV2_1}}]] [Op:__inference_loop_863]", "worker2 (h2:3) of the cluster while "
     "training (TensorFlow's UnavailableError: Collective ops is aborted by: recvmsg:Connection reset by peer)"),
    ("AbortedError", "on /job:worker/replica:0/task:0/device:CPU:0: peer gone", "a peer of the cluster while training "
     "(TensorFlow's AbortedError: on /job:worker/replica:0/task:0/device:CPU:0: peer gone)"),
    ("InvalidArgumentError", "Incompatible shapes: [32] vs. [64]", None),
])
def test_tensorflows_lost_peer_errors_name_the_task_and_what_to_do(kind, message, lost):
    """The chief (worker0) of three workers: its own devices are not a lost peer; an error of another kind passes."""
    import tensorflow as tf

    from runner.runtime.cluster import Cluster
    from runner.strategies.multi_worker import lost_peer

    error = lost_peer(getattr(tf.errors, kind)(None, None, message), Cluster({"worker": ["h0:1", "h1:2", "h2:3"]},
                                                                             "worker", 0))
    assert (str(error) if error else None) == (lost and f"worker0 lost {lost}; a worker stopped, crashed or cannot be "
                                               "reached: start every worker of the job again, and it resumes from "
                                               "its last checkpoint")


def test_a_sweep_job_waiting_for_its_peers_says_the_sweep_starts_none(tmp_path):
    """`-m strategy=multi_worker ...`: each job waited out strategy.peer_timeout for workers nobody starts, told only to
    start every worker; its wait line said neither how long nor for whom."""
    from conftest import run_cli

    ports = [_free_port(), _free_port()]
    done = run_cli("-m", "debug=smoke", "strategy=multi_worker", "strategy.peer_timeout=3",
                   f"strategy.workers=[127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}]", cwd=tmp_path)
    assert done.returncode == 1 and "1 failed" in done.stderr, done.stderr[-3000:]
    log = next(tmp_path.glob("multirun/*/*/0/runner.log")).read_text()
    assert (f"WARNING] - joining 2 workers as worker0: waiting up to 3 s (strategy.peer_timeout) for 127.0.0.1:"
            f"{ports[1]}; every worker of strategy.workers must be started; a sweep job is one worker and the sweep "
            "starts no other") in log
    job = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").dropna(subset=["tags.error"]).iloc[0]
    assert job["status"] == "FAILED" and job["tags.error"] == (
        f"worker0 waited 3 s for 127.0.0.1:{ports[1]} and gave up: start every worker of strategy.workers (or "
        "TF_CONFIG), or raise strategy.peer_timeout; a sweep job is one worker and the sweep starts no other: start "
        "the other workers of each job yourself (the same overrides, each its own strategy.task_index), or run "
        "this strategy outside a sweep")


@pytest.mark.parametrize(
    "tf_config,message",
    [
        ('{"cluster": {"worker": ["a:1"]}', "TF_CONFIG is not valid JSON"),
        ('{"task": {"type": "worker", "index": 0}}', 'needs "cluster" and "task"'),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}', "task index 2 is out of range"),
        ('{"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}', "host:port"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "task type 'ps' is not in the cluster"),
        ('{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}', "a:1 is listed more than"),
        ('{"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "a:1 is listed"),
        ('{"cluster": {"worker": ["a:x", "b:2"]}, "task": {"type": "worker", "index": 0}}', "'a:x' has no port from 1"),
        ('{"cluster": {"worker": ["a:1", "b:70000"]}, "task": {"type": "worker", "index": 0}}', "'b:70000' has no port"),
        # an index that is not a number was "out of range" ("1"), or taken as worker 1 (true)
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": "1"}}',
         'task index "1" is not an integer; give the task\'s place in the worker list as a number from 0 to 1'),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": true}}',
         "task index true is not an integer"),
        ('{"cluster": {"worker": ["a:1", "b c:2"]}, "task": {"type": "worker", "index": 0}}',
         "'b c:2' is not an address; give every task as host:port (a host name or IP address without spaces"),
        ('{"cluster": {"worker": ["[::1]:1", "[::1:2"]}, "task": {"type": "worker", "index": 0}}',
         "'[::1:2' is not an address"),
    ],
)
def test_malformed_tf_config_is_a_one_line_config_error(monkeypatch, tf_config, message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        validate(compose("strategy=multi_worker", "debug=smoke"))
    assert "\n" not in str(error.value)


def test_one_address_for_two_workers_is_refused_before_the_wait(monkeypatch):
    """strategy.workers=[localhost:1,localhost:1] waited strategy.peer_timeout (300 s) for a server that could never
    start."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=re.escape("strategy.workers/strategy.task_index: localhost:1 is listed")):
        validate(compose("strategy=multi_worker", "debug=smoke", "strategy.workers=[localhost:1,localhost:1]"))


@pytest.mark.parametrize("address", [":2222", "host with space:2222", "localhost:2222:3333"])
def test_an_address_without_a_usable_host_is_refused_before_the_wait(monkeypatch, address):
    """Each was accepted, and every worker then waited strategy.peer_timeout (300 s) for a peer gRPC cannot reach."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError) as error:
        validate(compose("strategy=multi_worker", "debug=smoke", f"strategy.workers=[{address},localhost:2223]"))
    assert str(error.value) == (
        f"strategy.workers/strategy.task_index: {address!r} is not an address; give every task as host:port (a host "
        "name or IP address without spaces or ':', or an IPv6 address in brackets as [::1]:2222; a port from 1 to "
        "65535)")


@pytest.mark.parametrize("workers", ['["[::1]:2222", "[::1]:2223"]', '["node-0.job_a.svc:2222", "10.0.0.2:2222"]'])
def test_ipv6_and_host_names_are_accepted(monkeypatch, workers):
    monkeypatch.setenv("TF_CONFIG", f'{{"cluster": {{"worker": {workers}}}, "task": {{"type": "worker", "index": 1}}}}')
    spec = validate(compose("strategy=multi_worker", "debug=smoke")).cluster
    assert (spec.count, spec.name, spec.hosts) == (2, "worker1", 1 if "::1" in workers else 2)


def test_this_workers_port_taken_on_this_machine_is_one_line_before_tensorflow(tmp_path, monkeypatch):
    """Another process listening on this worker's own port: TensorFlow's server failed after the devices started, in a
    44-frame traceback (`UnknownError: Could not start gRPC server`) naming no port. A peer's port is not checked
    (it is another process's, maybe on this machine)."""
    from conftest import run_cli

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port, other = taken.getsockname()[1], _free_port()
        workers = f"strategy.workers=[localhost:{port},127.0.0.1:{other}]"
        message = (f"worker0's address localhost:{port}: port {port} of this machine is in use by another process "
                   "(TensorFlow's server binds it on every interface); stop that process, or give worker0 a free port")
        with pytest.raises(ConfigError) as error:
            validate(compose("strategy=multi_worker", "debug=smoke", workers))
        assert str(error.value) == message
        assert validate(compose("strategy=multi_worker", "debug=smoke", workers, "strategy.task_index=1")).cluster
        done = run_cli("debug=smoke", "strategy=multi_worker", workers, cwd=tmp_path, env={"TF_CONFIG": ""})
    assert done.returncode == 2 and done.stderr.strip() == f"error: {message}", done.stderr[-2000:]
    assert not list(tmp_path.glob("mlflow.db")) or runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").empty


def test_multi_worker_without_a_cluster_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"strategy.workers=\[host:port,...\].*TF_CONFIG"):
        validate(compose("strategy=multi_worker", "debug=smoke"))


def test_cluster_keys_produce_tf_config_and_the_global_batch_spans_all_workers(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    cfg = validate(compose("strategy=multi_worker", "debug=smoke", "strategy.workers=[h0:1,h1:1,h2:1,h3:1]",
                           "strategy.task_index=2"))
    spec = cfg.cluster
    assert (spec.count, spec.name, spec.is_chief) == (4, "worker2", False)
    assert cfg.train.per_device_batch_size == 16  # smoke's global 64 over 4 workers
    assert '"index": 2' in spec.tf_config()


@pytest.mark.slow  # two fresh workers and a single-device run of dlrm/tiny, ~45 s
def test_two_workers_train_the_recommender_to_the_single_devices_losses(tmp_path):
    """dlrm/tiny on unshuffled click logs: two workers (MultiWorkerMirroredStrategy's collectives carry the tables'
    rows) log the loss of every step a single device logs for the same global batch (1e-4 relative)."""
    import numpy as np

    clicks = ["model=dlrm", "data=clicks", "data.tables=tiny", "data.train_limit=4096", "data.test_limit=1000",
              "pipeline.shuffle_buffer=0", "train.global_batch_size=64", "train.learning_rate=0.5", "train.steps=20",
              "train.steps_per_call=1", "train.target_auc=null"]
    two, one, rows = _two_workers_and_one_device(tmp_path, *clicks)
    assert all(row["metrics.examples_per_sec"] > 0 and row["metrics.test_auc"] > 0.5 for row in rows)
    assert len(two) == len(one) >= 15
    np.testing.assert_allclose(two, one, rtol=1e-4)


@pytest.mark.slow  # two fresh workers and a single-device run, ~40 s
def test_two_workers_with_xla_train_the_single_devices_losses(tmp_path):
    """train.jit_compile=true across two workers (each replica's forward and backward one XLA cluster, the
    all-reduce outside it): unshuffled, the loss of every step a single device logs without XLA (1e-4 relative)."""
    import numpy as np

    mlp = ["pipeline.shuffle_buffer=0", "data.train_limit=1024", "train.steps=20", "train.steps_per_call=1"]
    two, one, rows = _two_workers_and_one_device(tmp_path, *mlp, xla=True)
    assert rows[0]["tags.xla"] == "on" and rows[1]["tags.xla"] == "off"
    assert rows[1]["tags.jit_compile_reason"] == "train.jit_compile=false"
    assert len(two) == len(one) >= 15
    np.testing.assert_allclose(two, one, rtol=1e-4)


def _two_workers_and_one_device(tmp_path, *overrides: str, xla: bool = False) -> tuple[Any, Any, list]:
    """The same job by two workers (in tmp_path/two; train.jit_compile=true with `xla`, else false) and by one device
    without XLA (tmp_path/one): each run's training loss per step and its MLflow row (two's first)."""
    import numpy as np
    from mlflow import MlflowClient

    from conftest import run_cli

    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
    _two_workers(tmp_path / "two", *overrides, f"train.jit_compile={str(xla).lower()}")
    single = run_cli("debug=smoke", *overrides, "strategy=single", "train.jit_compile=false", cwd=tmp_path / "one")
    assert single.returncode == 0, single.stderr[-2000:]
    out = []
    for folder in ("two", "one"):
        row = runs(f"sqlite:///{tmp_path / folder / 'mlflow.db'}", "smoke").iloc[0]
        assert row["status"] == "FINISHED"
        history = MlflowClient(f"sqlite:///{tmp_path / folder / 'mlflow.db'}").get_metric_history(row["run_id"],
                                                                                                  "train_loss")
        out.append((np.array([m.value for m in sorted(history, key=lambda m: m.step)]), row))
    return out[0][0], out[1][0], [out[0][1], out[1][1]]
