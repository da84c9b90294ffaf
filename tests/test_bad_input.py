"""Bad input, table-driven: each row is a command line (`python -m runner debug=smoke ...`) a user could type, and
what they must see: exactly one `error:` line naming the bad value (and what is allowed), and what MLflow keeps.

Every row runs in this process, through what the command does up to its error line (the checks before Hydra, then
composition and the run, the error explained as `cli()` explains it): one line with the row's words, no run left
RUNNING. Errors found before the run opens leave no run at all; errors found after it opened (the data) leave exactly
one run, FAILED with the error; errors found before TensorFlow starts never set up its devices. A few rows, one per
way a command fails (before Hydra, in Hydra's composition, in validation, after the run opened, in the store, in a
sweep), also run as a real process: exit status 2, one `error:` line on stderr, no traceback. The last row asks for
the traceback, which only a process shows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from conftest import REPO, new_store, run_cli, write_idx

from runner.data_pipelines.mnist_files import FILES
from runner.config import MAX_DEVICES, group_options

EXPERIMENT = "smoke"  # the smoke preset's MLflow experiment


def _choices(group: str) -> str:
    return ", ".join(group_options(group))


def _idx_dir(tmp: Path, name: str) -> Path:
    """A data.path folder with the four files, each a well-formed IDX file of the right shape but wrong content."""
    folder = tmp / name
    folder.mkdir()
    write_idx(folder / FILES["train_images"][0], np.zeros((10, 28, 28), np.uint8))
    write_idx(folder / FILES["train_labels"][0], np.zeros(10, np.uint8))
    write_idx(folder / FILES["test_images"][0], np.zeros((10, 28, 28), np.uint8))
    write_idx(folder / FILES["test_labels"][0], np.zeros(10, np.uint8))
    return folder


def _truncated_dir(tmp: Path, name: str) -> Path:
    """As _idx_dir, but the training images' header promises 60,000 images and the file ends after one (800 bytes)."""
    folder = _idx_dir(tmp, name)
    header = bytes([0, 0, 0x08, 3]) + np.array([60000, 28, 28], ">u4").tobytes()
    (folder / FILES["train_images"][0]).write_bytes(header + bytes(28 * 28))
    return folder


def _clicks_dir(tmp: Path, damage: str = "") -> None:
    """A data.path folder `clicks` of click logs in Criteo's layout (label, 13 dense counts, 3 categorical ids below
    50, 20 and 30), line 3 of train.tsv replaced by `damage` where given."""
    folder = tmp / "clicks"
    folder.mkdir()
    good = "\t".join(["1", *["7"] * 13, "4", "5", "6"])
    for name in ("train", "test"):
        lines = [good] * 8
        if damage and name == "train":
            lines[2] = damage
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n")


CLICKS = ["model=dlrm", "data=files", "data.path={tmp}/clicks", "data.vocabulary_sizes=[50,20,30]"]
COUNTS = "\t".join(["7"] * 13)


def _deleted_experiment(folder: Path, name: str) -> None:
    from mlflow import MlflowClient

    folder.mkdir()
    client = MlflowClient(new_store(folder))
    client.delete_experiment(client.create_experiment(name))


def _user_data_configs(tmp: Path) -> None:
    """conf/data/ YAMLs of the users' datasets in tests/user_models.py."""
    (tmp / "conf" / "data").mkdir(parents=True)
    (tmp / "conf" / "data" / "npz.yaml").write_text("_target_: user_models.NpzData\npath: data.npz\n")
    (tmp / "conf" / "data" / "keras_style.yaml").write_text("_target_: user_models.KerasStyleData\n")
    (tmp / "conf" / "data" / "tuple_spec.yaml").write_text("_target_: user_models.TupleSpecData\n")
    (tmp / "conf" / "data" / "own_arrays.yaml").write_text("_target_: user_models.OwnArrays\nwidth: 8\ntop_label: 2\n")


def _file_as_dir(tmp: Path) -> None:
    (tmp / "afile").write_text("a regular file, so nothing can be created under it\n")


@dataclass
class Bad:
    args: list[str]  # "{tmp}" is replaced by the test's folder
    words: list[str]  # each must be in the error line ("{tmp}" replaced too)
    setup: Callable[[Path], object] | None = None
    run_opened: bool = False  # the error comes after the MLflow run opened: one run, FAILED
    env: dict[str, str] = field(default_factory=dict)
    traceback: bool = False  # RUNNER_TRACEBACK=1: a traceback instead of the one line
    before_tensorflow: bool = False  # found before TensorFlow starts (its devices are never set up)


ROWS = {
    # a user's click logs (data=files, Criteo's layout): found as they are read, before TensorFlow starts
    "clicks-label": Bad(CLICKS, ["{tmp}/clicks/train.tsv line 3", "label 2 is not 0 or 1"],
                        lambda t: _clicks_dir(t, f"2\t{COUNTS}\t4\t5\t6"), run_opened=True, before_tensorflow=True),
    "clicks-id-outside-its-table": Bad(CLICKS, ["train.tsv line 3", "categorical column 2 has id 20",
                                                "table of 20 rows", "data.vocabulary_sizes[1]"],
                                       lambda t: _clicks_dir(t, f"0\t{COUNTS}\t4\t20\t6"), run_opened=True,
                                       before_tensorflow=True),
    "clicks-not-the-declared-spec": Bad([*CLICKS[:3], "data.vocabulary_sizes=[50,20]"],
                                        ["has 3 categorical columns", "data.vocabulary_sizes gives 2 sizes"],
                                        _clicks_dir),
    "clicks-short-line": Bad(CLICKS, ["train.tsv line 3 has 15 tab-separated fields", "the declared spec 17"],
                             lambda t: _clicks_dir(t, f"0\t{COUNTS}\t4"), run_opened=True, before_tensorflow=True),
    "clicks-raw-hex-id": Bad(CLICKS, ["train.tsv line 3", "'68fd1e64', not an integer", "hash raw values"],
                             lambda t: _clicks_dir(t, f"0\t{COUNTS}\t4\t68fd1e64\t6"), run_opened=True,
                             before_tensorflow=True),
    # an unknown option in each config group, found before Hydra composes anything
    "group-model": Bad(["model=resnet"], ["model=resnet", _choices("model")]),
    "group-pipeline": Bad(["pipeline=fast"], ["pipeline=fast", _choices("pipeline")]),
    "group-strategy": Bad(["strategy=horovod"], ["strategy=horovod", _choices("strategy")]),
    "group-data": Bad(["data=imagenet"], ["data=imagenet", _choices("data")]),
    "group-experiment": Bad(["experiment=nope"], ["experiment=nope", _choices("experiment")]),
    "group-debug": Bad(["debug=verbose"], ["debug=verbose", _choices("debug")]),
    "group-in-sweep": Bad(["-m", "model=mlp,resnet"], ["model=resnet", _choices("model")]),
    # Hydra's ValueError traceback ("Only one of --run, --multirun, --cfg, --info ...")
    "sweep-and-cfg": Bad(["-m", "gpus=1,2", "--cfg", "job"], ["-m runs a sweep and --cfg shows a config", "give one"]),
    # wrong types, unknown keys and choices
    "gpus-not-int": Bad(["gpus=abc"], ["gpus", "'abc'", "Integer"]),
    "list-not-list": Bad(["strategy=multi_worker", "strategy.workers=h0:1"],
                         ["strategy.workers=h0:1", "takes a list: strategy.workers=[a,b]"]),
    # Hydra's "Ambiguous value ..." with its two choices ("1. ... 2. ...") cut to the first by one_line
    # and the one spelling the key takes (a list for data.path then failed: "Cannot convert 'list' to string")
    "comma-in-value": Bad(["data=files", "data.path=/data/a,b"],
                          ["data.path=/data/a,b: an unquoted comma is ambiguous; a sweep of its values is `-m "
                           "data.path=/data/a,b`, one value holding a comma quoted: 'data.path=\"/data/a,b\"'"]),
    "comma-in-list": Bad(["model=dlrm", "data=clicks", "data.vocabulary_sizes=3,4"],
                         ["data.vocabulary_sizes=3,4: an unquoted comma is ambiguous; a list is written "
                          "data.vocabulary_sizes=[3,4]"]),
    "epochs-not-number": Bad(["train.epochs=many"], ["train.epochs", "'many'", "Float"]),
    # an unknown key: were Hydra's "To append to your config use +train.step=100", which then failed validation
    "unknown-key": Bad(["train.foo=1"], ["train.foo is not a key of train; its keys: ", "train.steps"]),
    "preset-key-the-model-lacks": Bad(["model=conv2d"], [  # debug=smoke's model.variant; was Hydra's words alone
        "debug=smoke sets model.variant, which model=conv2d does not have", "conf/debug/smoke.yaml"]),
    "misspelled-key": Bad(["train.step=100"], ["train.step is not a key of train; did you mean train.steps?"]),
    "unknown-section": Bad(["foo.bar=1"], ["foo.bar: the config has no 'foo'; its sections: ", "train, mlflow"]),
    "unknown-optimizer": Bad(["train.optimizer=lion"], ["train.optimizer='lion'", "adam, adamw, sgd, momentum, rmsprop"]),
    # zero or negative sizes
    "batch-zero": Bad(["train.global_batch_size=0"], ["train.global_batch_size=0", "a positive integer"]),
    "gpus-negative": Bad(["gpus=-2"], ["gpus=-2", f"from 0 to {MAX_DEVICES}"]),
    "steps-per-call-zero": Bad(["train.steps_per_call=0"], ["train.steps_per_call=0", "a positive integer"]),
    # devices and strategies
    "batch-not-divisible": Bad(
        ["strategy=mirrored", "gpus=3"], ["train.global_batch_size=64", "3 towers", "a multiple of 3"]
    ),
    "gpus-over-max": Bad(
        ["strategy=mirrored", f"gpus={MAX_DEVICES + 1}"], [f"gpus={MAX_DEVICES + 1}", f"from 0 to {MAX_DEVICES}"]
    ),
    "single-on-2": Bad(["strategy=single", "gpus=2"], ["strategy=single", "gpus=2", "from 0 to 1", "mirrored"]),
    "model-parallel-on-1": Bad(
        ["strategy=model_parallel", "gpus=1"], ["strategy=model_parallel", "gpus=1", "needs gpus 2 or more", "single"]
    ),
    # data: found after the run opened, so the run must end FAILED
    "data-path-missing": Bad(["data.path=/does/not/exist"], ["/does/not/exist", "not a directory"], run_opened=True,
                             before_tensorflow=True),
    "data-sha256-mismatch": Bad(
        ["data.path={tmp}/wrong"],
        [f"{{tmp}}/wrong/{FILES['train_images'][0]}", "sha256 mismatch", f"expected {FILES['train_images'][1]}"],
        setup=lambda tmp: _idx_dir(tmp, "wrong"),
        run_opened=True,
        before_tensorflow=True,
    ),
    "data-truncated": Bad(
        ["data.path={tmp}/short"],
        [f"{{tmp}}/short/{FILES['train_images'][0]}", "sha256 mismatch", "800 bytes", "replace it"],
        setup=lambda tmp: _truncated_dir(tmp, "short"),
        run_opened=True,
        before_tensorflow=True,
    ),
    # a user's dataset (tests/user_models.py) whose file cannot be read: its OSError said in one line
    "user-data-file-missing": Bad(["hydra.searchpath=[file://{tmp}/conf]", "data=npz", "data.path={tmp}/missing.npz"],
                                  ["data=npz cannot load its examples", "No such file", "{tmp}/missing.npz"],
                                  setup=_user_data_configs, run_opened=True, before_tensorflow=True),
    "user-data-not-data": Bad(["hydra.searchpath=[file://{tmp}/conf]", "data=keras_style"],
                              ["data=keras_style: load returned a tuple", "common.Arrays(x_train, y_train"],
                              setup=_user_data_configs, run_opened=True, before_tensorflow=True),
    "user-spec-not-a-spec": Bad(["hydra.searchpath=[file://{tmp}/conf]", "data=tuple_spec"],
                                ["data=tuple_spec: spec() returned a tuple", "not a runner.data_pipelines.Spec"],
                                setup=_user_data_configs, before_tensorflow=True),
    "user-arrays-not-the-spec": Bad(["hydra.searchpath=[file://{tmp}/conf]", "data=own_arrays", "data.width=10"],
                                    ["Arrays: x_train (64, 10) holds examples of shape (10,)", "takes (8,)"],
                                    setup=_user_data_configs, run_opened=True, before_tensorflow=True),
    "user-arrays-to-a-convnet": Bad(["hydra.searchpath=[file://{tmp}/conf]", "data=own_arrays", "model=cnn"],
                                    ["model=cnn takes images", "8 float32 values an example", "model=mlp"],
                                    setup=_user_data_configs, before_tensorflow=True),
    "user-arrays-label-out-of-range": Bad(["hydra.searchpath=[file://{tmp}/conf]", "data=own_arrays",
                                           "data.top_label=6"], ["y_train has labels 0 to 6", "take 0 to 2"],
                                          setup=_user_data_configs, run_opened=True, before_tensorflow=True),
    # the tracking store cannot be written
    "store-under-a-file": Bad(
        ["mlflow.tracking_uri=sqlite:///{tmp}/afile/mlflow.db"],
        ["sqlite:///{tmp}/afile/mlflow.db", "{tmp}/afile is a file, not a directory", "set mlflow.tracking_uri"],
        setup=_file_as_dir,
    ),
    # a multi-worker job's cluster description is malformed
    "tf-config-malformed": Bad(
        ["strategy=multi_worker"], ["TF_CONFIG is not valid JSON", "{\"cluster\": [oops"],
        env={"TF_CONFIG": '{"cluster": [oops'},
    ),
    # values that pass the types but could not run (each used to crash or hang after validation)
    "batch-too-big": Bad(["train.global_batch_size=1000000000"],
                         ["train.global_batch_size=1000000000", "GiB", "this machine has", "smaller batch"]),
    "seed-negative": Bad(["train.seed=-1"], ["train.seed=-1", "0 to 4294967295"]),
    "seed-too-big": Bad(["train.seed=4294967296"], ["train.seed=4294967296", "0 to 4294967295"]),
    "epochs-infinite": Bad(["train.epochs=inf"], ["train.epochs=inf", "finite"]),
    "xla-not-a-choice": Bad(["train.jit_compile=maybe"], ["train.jit_compile='maybe'", "auto, true, false"]),
    "xla-model-parallel": Bad(["strategy=model_parallel", "gpus=2", "train.jit_compile=true"],
                              ["train.jit_compile=true", "strategy=model_parallel", "an XLA cluster runs on one device",
                               "train.jit_compile=false"]),
    "xla-sync-batch-norm": Bad(["strategy=mirrored", "gpus=2", "strategy.sync_batch_norm=true",
                                "train.jit_compile=true"], ["strategy.sync_batch_norm=true", "XLA cluster"]),
    "nccl-without-gpus": Bad(["strategy=mirrored", "gpus=2", "strategy.cross_device_ops=nccl"],
                             ["cross_device_ops=nccl", "NVIDIA GPUs", "reduce_to_one_device"]),
    "sharded-fewer-examples-than-shards": Bad(
        ["strategy=replicated", "pipeline=sharded", "gpus=8", "data.train_limit=5"],
        ["pipeline=sharded", "5 training examples", "8 shards", "data.train_limit"]),
    "per-device-batch-under-strong-scaling": Bad(
        ["train.per_device_batch_size=3"], ["train.per_device_batch_size=3", "strong scaling", "batch_scaling=weak"]),
    "key-of-another-strategy": Bad(["strategy.cross_device_ops=nccl"],
                                   ["strategy.cross_device_ops", "not an option of the chosen strategy",
                                    "strategy=mirrored"]),
    # a spec sheet's key with hardware=this, the default (was "hardware.nodes is not an option of any hardware")
    "key-of-a-spec-sheet": Bad(["hardware.nodes=8"], ["hardware.nodes", "not an option of the chosen hardware",
                                                      "hardware=dgx1_p100"]),
    "experiment-empty": Bad(["mlflow.experiment="], ["mlflow.experiment=''", "non-empty name"]),
    "gpus-null": Bad(["gpus=null"], ["gpus=null", f"from 0 to {MAX_DEVICES}"]),
    "launcher-unknown": Bad(["hydra/launcher=nonsense"], ["hydra/launcher=nonsense", "joblib", "slurm"]),
    "launcher-no-jobs": Bad(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"],
                            ["hydra.launcher.n_jobs=0", "a positive number of parallel jobs"]),
    "checkpoint-dir-is-a-file": Bad(["train.checkpoint_dir={tmp}/afile"],
                                    ["train.checkpoint_dir={tmp}/afile", "is a file, not a directory"],
                                    setup=_file_as_dir),
    "experiment-deleted": Bad(["mlflow.tracking_uri=sqlite:///{tmp}/deleted/mlflow.db"],
                              ["experiment 'smoke' was deleted", "mlflow experiments restore"],
                              setup=lambda tmp: _deleted_experiment(tmp / "deleted", "smoke")),
    # asked for: the traceback instead of the line
    "traceback-asked": Bad(
        ["gpus=-2"], ["runner.errors.ConfigError: gpus=-2", f"from 0 to {MAX_DEVICES}"],
        env={"RUNNER_TRACEBACK": "1"}, traceback=True,
    ),
}


# One row per way a command fails, run as a real process: before Hydra (a group choice), in Hydra's composition (a
# value the schema refuses), in validation inside the job, after the run opened (the data), in the store, in a sweep's
# launcher settings; and the traceback a user can ask for.
AS_A_PROCESS = ("group-model", "gpus-not-int", "batch-not-divisible", "data-sha256-mismatch", "store-under-a-file",
                "launcher-no-jobs", "traceback-asked", "sweep-and-cfg")


def _statuses(tmp: Path) -> list[tuple[str, str]]:
    """(status, error tag) of every run in the default store in `tmp`; [] if there is no store."""
    if not (tmp / "mlflow.db").exists():
        return []
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    return [(r.info.status, r.data.tags.get("error", "")) for r in client.search_runs(ids)] if ids else []


def _arguments(row: Bad, tmp_path: Path) -> tuple[list[str], list[str]]:
    """The row's command-line arguments and expected words, "{tmp}" replaced by the test's folder (set up first)."""
    if row.setup:
        row.setup(tmp_path)
    return [a.replace("{tmp}", str(tmp_path)) for a in row.args], [w.replace("{tmp}", str(tmp_path)) for w in row.words]


def _check_store(tmp_path: Path, row: Bad, words: list[str]) -> None:
    """No run left RUNNING; one FAILED run naming the error if the run had opened, else none at all."""
    runs = _statuses(tmp_path)
    assert "RUNNING" not in [status for status, _ in runs]
    if row.run_opened:
        assert len(runs) == 1 and runs[0][0] == "FAILED", runs
        assert words[0] in runs[0][1], f"the FAILED run's error tag does not name {words[0]!r}: {runs[0][1]!r}"
    else:
        assert runs == [], f"an error found before the run opened left runs behind: {runs}"
    if row.setup is _file_as_dir:
        assert (tmp_path / "afile").is_file()


def _error_line(args: list[str]) -> str | None:
    """What `python -m runner ARGS` prints after `error:`, taken in this process: the command line's checks before
    Hydra, then the composed config's run, its error explained as `cli()` explains it (None: no error)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from runner.cli.overrides import explain, preflight
    from runner.config import compose
    from runner.errors import UserError
    from runner.experiment import run

    args, error = preflight(args)
    if error:
        return error
    try:
        run(compose([a for a in args if not a.startswith("-")]))  # the flags (-m) only choose how Hydra launches
    except (UserError, HydraException, OmegaConfBaseException) as e:
        return explain(e)
    return None


@pytest.mark.parametrize("name", [name for name, row in ROWS.items() if not row.traceback])
def test_bad_input_is_one_line_and_leaves_no_run_running(tmp_path, monkeypatch, name):
    row = ROWS[name]
    args, words = _arguments(row, tmp_path)
    monkeypatch.chdir(tmp_path)  # the default store and the launch folder, as for a user in their own folder
    new_store(tmp_path)  # as a user's second run finds it (and run_cli gives a child): no migrations each row
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # left behind by other in-process tests
    for key, value in row.env.items():
        monkeypatch.setenv(key, value)
    if row.before_tensorflow:
        from runner.runtime import devices

        def started(*_, **__):
            raise AssertionError("the error came after TensorFlow's devices were set up")

        monkeypatch.setattr(devices, "setup", started)

    error = _error_line(["debug=smoke", *args])

    assert error is not None and "\n" not in error, error
    assert all(w in error for w in words), f"{words} not all in {error!r}"
    _check_store(tmp_path, row, words)


@pytest.mark.parametrize("name", AS_A_PROCESS)
def test_bad_input_as_a_command_exits_2_with_one_error_line(tmp_path, name):
    row = ROWS[name]
    args, words = _arguments(row, tmp_path)
    # This checkout's code, whatever `pip install -e` pointed at.
    env = {**row.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    proc = run_cli("debug=smoke", *args, cwd=tmp_path, env=env, timeout=120)

    stderr = proc.stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    if row.traceback:
        assert proc.returncode != 0, stderr[-2000:]
        assert "Traceback (most recent call last)" in stderr
        assert errors == [], "the traceback replaces the one-line error"
        last = stderr.strip().splitlines()[-1]
        assert all(w in last for w in words), f"{words} not all in {last!r}"
    else:
        assert proc.returncode == 2, stderr[-2000:]
        assert len(errors) == 1, stderr[-2000:]
        assert all(w in errors[0] for w in words), f"{words} not all in {errors[0]!r}"
        assert "Traceback" not in stderr, stderr[-2000:]
    assert "test accuracy" not in proc.stdout
    if row.before_tensorflow:
        # Hydra's log lines go to stdout; the devices module logs as soon as TensorFlow's devices are set up.
        assert "[runner.runtime.devices]" not in proc.stdout + stderr, "the error came after TensorFlow started"
    _check_store(tmp_path, row, words)
