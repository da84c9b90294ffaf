"""Checkpoints and resume: a job SIGKILLed mid-training and started again continues from its last checkpoint."""

from __future__ import annotations

import json
import re
import signal
import time

import mlflow
import numpy as np
import pytest
from conftest import compose, run_cli, runs, start_cli

# Tiny MLP, 2000 steps (~2 s of training): the first checkpoint (step 100) comes early, the end much later.
KILL_ARGS = ["debug=smoke", "train.steps=2000", "train.checkpoint_every=100", "train.measure_input=false"]


def _kill_after_first_checkpoint(cwd) -> int:
    """Start the job, SIGKILL it once a checkpoint is complete; the step it was saved at."""
    proc = start_cli(*KILL_ARGS, cwd=cwd)
    deadline = time.time() + 120
    while not list(cwd.glob("checkpoints/*/run.json")):  # written after the checkpoint itself is complete
        assert proc.poll() is None and time.time() < deadline, "the job ended before its first checkpoint"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    (saved,) = cwd.glob("checkpoints/*/run.json")
    return json.loads(saved.read_text())["step"]


def _digest(stdout_and_err: str) -> str:
    return re.search(r"final weights sha256 ([0-9a-f]{16})", stdout_and_err).group(1)


@pytest.mark.slow  # a killed run, its resume and an uninterrupted twin: ~18 s
def test_sigkilled_job_resumes_from_its_checkpoint_and_ends_like_an_uninterrupted_run(tmp_path):
    killed_dir, clean_dir = tmp_path / "killed", tmp_path / "clean"
    killed_dir.mkdir(), clean_dir.mkdir()
    clean = start_cli(*KILL_ARGS, cwd=clean_dir)  # the uninterrupted twin, alongside (a separate process either way)
    saved_step = _kill_after_first_checkpoint(killed_dir)
    assert 100 <= saved_step < 2000
    dead = runs(f"sqlite:///{killed_dir / 'mlflow.db'}", "smoke")
    assert list(dead["status"]) == ["RUNNING"]  # SIGKILL: nothing could end it

    resumed = run_cli(*KILL_ARGS, cwd=killed_dir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = resumed.stdout + resumed.stderr
    assert f"at step {saved_step}" in log and f"fast-forwarded past {saved_step} finished steps" in log
    uri = f"sqlite:///{killed_dir / 'mlflow.db'}"
    df = runs(uri, "smoke").set_index("run_id")
    (old_id,) = dead["run_id"]
    new = df.drop(index=old_id).iloc[0]
    assert df.loc[old_id, "status"] == "KILLED" and "died" in df.loc[old_id, "tags.error"]
    assert new["status"] == "FINISHED" and new["tags.resumed_from"] == old_id
    assert new["tags.resumed_from_step"] == str(saved_step)
    history = mlflow.MlflowClient(uri).get_metric_history(new.name, "train_loss")
    steps = sorted(m.step for m in history)
    # The killed run's points up to the checkpoint, then its own; each process's first call is one step.
    assert steps == [1, *range(10, saved_step + 1, 10), saved_step + 1, *range(saved_step + 10, 2001, 10)]
    assert not list(killed_dir.glob("checkpoints/*/ckpt-*"))  # finished: the checkpoints are gone

    clean_out, clean_err = clean.communicate(timeout=300)
    assert clean.returncode == 0, clean_err[-2000:]
    # Same seed, same batches in the same order from the same step: the weights come out bit-identical
    # (tolerance 0); the final test loss, printed to 4 decimals, therefore too.
    assert _digest(log) == _digest(clean_out + clean_err)
    loss = re.compile(r"test loss (\d+\.\d+)")
    assert loss.search(resumed.stdout).group(1) == loss.search(clean_out).group(1)


def test_non_finite_loss_keeps_the_last_good_checkpoint(tf_devices, store, tmp_path):
    import tensorflow as tf

    from runner.experiment import run
    from runner.train import NonFiniteLoss

    folder = tmp_path / "ckpt"
    cfg = compose("debug=smoke", f"mlflow.tracking_uri={store}", "train.optimizer=sgd", "train.learning_rate=1e30",
                  "train.steps_per_call=1", "train.checkpoint_every=1", f"train.checkpoint_dir={folder}")
    with pytest.raises(NonFiniteLoss, match=r"not finite at step (\d+)") as error:
        run(cfg)
    bad_step = int(re.search(r"step (\d+)", str(error.value)).group(1))
    assert runs(store, "smoke").iloc[0]["status"] == "FAILED"
    (ckpt_dir,) = folder.iterdir()
    latest = tf.train.latest_checkpoint(str(ckpt_dir))
    assert latest is not None and latest.endswith(f"ckpt-{bad_step - 1}")  # the last step that was finite
    reader = tf.train.load_checkpoint(latest)
    weights = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("model/")]
    assert weights and all(np.isfinite(w).all() for w in weights)


def test_checkpoint_settings_do_not_change_the_config_hash():
    from runner.config import validate

    def config_hash(cfg):
        return validate(cfg).config_hash

    base = compose("debug=smoke")
    assert config_hash(base) == config_hash(compose("debug=smoke", "train.checkpoint_every=7"))
    assert config_hash(base) != config_hash(compose("debug=smoke", "train.seed=1"))
    # a multi-worker job's workers, and the job requeued on other nodes: one config, one checkpoint folder (worker 1
    # looked for the chief's checkpoints in a folder of its own, and the job never resumed)
    workers = [compose("debug=smoke", "strategy=multi_worker", f"strategy.workers=[{a}:2222,{b}:2223]",
                       f"strategy.task_index={i}") for a, b in (("localhost", "localhost"), ("n7", "n8")) for i in (0, 1)]
    assert len({config_hash(cfg) for cfg in workers}) == 1


FLOAT16_OVERFLOWING = ("train.precision=mixed_float16", "train.loss_scale=1e9", "train.loss_scale_period=3")


@pytest.mark.parametrize(
    "strategy,pipeline,model,precision",
    [
        ("single", "split", "cnn", ()),  # cnn: dropout, so the seed generators' states must be restored too
        # mlp like every other in-process MirroredStrategy test: TensorFlow's collective instance keys are
        # per-process, so a later strategy over the same devices with other gradient shapes would clash.
        ("mirrored", "sharded", "mlp", ()),
        ("replicated", "per_tower", "mlp", ()),
        ("parameter_server", "split", "mlp", ()),
        ("model_parallel", "split", "cnn", ()),
        # float16 with a scale that overflows, then doubles every 3 steps into overflow again: the steps after the
        # restore skip or apply as before only if the loss scale and its counters were restored too.
        ("sharded_update", "split", "mlp", FLOAT16_OVERFLOWING),
    ],
)
def test_restored_state_and_fast_forwarded_feed_continue_exactly(tf_devices, tmp_path, strategy, pipeline, model,
                                                                 precision):
    """Train 10 steps, checkpoint, train 10 more; a fresh strategy restored from the checkpoint, with its feed
    fast-forwarded 10 steps, must produce the same 10 losses."""
    import keras
    import tensorflow as tf
    from conftest import build_strategy

    from runner.data_pipelines import common
    from runner.checkpoints import Checkpointer
    from runner.config import validate
    from runner.runtime.devices import Devices
    from runner.train import fast_forward

    gpus = 1 if strategy == "single" else 2
    plan = validate(compose("debug=smoke", f"strategy={strategy}", f"pipeline={pipeline}", f"model={model}",
                            f"gpus={gpus}", *precision))
    keras.mixed_precision.set_dtype_policy(plan.train.precision)  # as a run does before building the model
    x = np.random.default_rng(0).integers(0, 255, (512, 28, 28), dtype=np.uint8)
    y = np.random.default_rng(1).integers(0, 10, 512).astype(np.int32)
    devices = Devices(tuple(f"/device:CPU:{i}" for i in range(gpus)), "CPU", gpus > 1, "test")

    def fresh():
        s = build_strategy(plan, devices)
        ckpt = Checkpointer(tmp_path, 1000, s.checkpoint_objects(), "r1")
        return s, s.batches(plan.pipeline, common.examples(x, y), 0), ckpt

    def losses(s, batches, n):
        loop = s.train_loop(batches)
        return [float(loop(tf.constant(1))[0]) for _ in range(n)]

    first, batches, ckpt = fresh()
    losses(first, batches, 10)
    ckpt.save(10)
    expected = losses(first, batches, 10)
    second, batches, ckpt = fresh()
    assert ckpt.restore() == (10, "r1")
    fast_forward(second, batches, 10)
    np.testing.assert_allclose(losses(second, batches, 10), expected, rtol=1e-6)
    if precision:
        skipped = [int(s.loss_scale.skipped.numpy()) for s in (first, second)]
        assert skipped[0] == skipped[1] > 0, skipped
    keras.mixed_precision.set_dtype_policy("float32")


def test_a_json_file_beside_the_checkpoints_is_never_seen_half_written(tmp_path):
    """run.json and writer.json are polled by other processes (a second start, `runner report`, tests) while the
    run rewrites them: a reader sees the old file or the new one, never an empty or partial one."""
    import threading

    from runner.paths import write_json

    path, seen, done = tmp_path / "run.json", [], threading.Event()
    write_json(path, {"step": 0})

    def read() -> None:
        while not done.is_set():
            seen.append(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for step in range(1, 3000):
        write_json(path, {"run_id": "r" * 200, "step": step})
    done.set()
    reader.join()
    assert len(seen) > 100 and all(json.loads(text)["step"] >= 0 for text in seen)
    assert json.loads(path.read_text())["step"] == 2999 and [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_checkpoints_of_other_training_data_are_refused_and_of_an_older_runner_resumed(tmp_path):
    import tensorflow as tf

    from runner.checkpoints import RUN_FILE, CheckpointError, Checkpointer

    weights = tf.Variable(1.0)
    Checkpointer(tmp_path, 10, {"w": weights}, "r1", data="aaaa").save(10)
    with pytest.raises(CheckpointError, match="other data .its digest aaaa, this data's bbbb"):
        Checkpointer(tmp_path, 10, {"w": weights}, "r2", data="bbbb").restore()
    assert Checkpointer(tmp_path, 10, {"w": weights}, "r2", data="aaaa").restore() == (10, "r1")
    (tmp_path / RUN_FILE).write_text('{"run_id": "r1", "step": 10}')  # an older runner's: the data unknown
    assert Checkpointer(tmp_path, 10, {"w": weights}, "r2", data="bbbb").restore() == (10, "r1")


def test_checkpoints_a_finished_run_cannot_delete_are_named_in_a_warning(tmp_path, monkeypatch, caplog):
    """On a disk remounted read-only the finished run's checkpoints stayed without a word, and a start of the same
    config "resumed" the finished run: a second FINISHED run, a false repeat."""
    import tensorflow as tf

    from runner import checkpoints

    saver = checkpoints.Checkpointer(tmp_path / "abc", 10, {"w": tf.Variable(1.0)}, "r1")
    saver.save(10)
    monkeypatch.setattr(checkpoints.shutil, "rmtree", lambda path, ignore_errors: None)  # as a read-only disk does
    saver.finished()
    assert f"checkpoints in {tmp_path / 'abc'} could not be deleted" in caplog.text
    monkeypatch.undo()
    caplog.clear()
    saver.finished()
    assert not (tmp_path / "abc").exists() and "could not be deleted" not in caplog.text
