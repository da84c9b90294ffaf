"""Shared fixtures. TensorFlow-using tests share one process-wide device layout (4 logical CPU devices), set up
before TensorFlow initialises; tests that need another layout run the CLI in a subprocess."""

from __future__ import annotations

import fcntl
import functools
import gc
import importlib.abc
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
TEST_DEVICES = 4


def _test_devices(tf) -> None:
    """Split the CPU into TEST_DEVICES logical devices, unless TensorFlow is initialised already."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * TEST_DEVICES)
    except RuntimeError:  # already initialised: by an earlier fixture use in this process
        pass


class _DevicesOnImport(importlib.abc.MetaPathFinder):
    """Sets the layout as TensorFlow is imported, whichever test imports it first: a test building a Keras model
    without `tf_devices` (a spec-sheet prediction) would otherwise initialise TensorFlow with one CPU device, and
    every `tf_devices` test after it in that process fail (seen where a few files run on their own)."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _test_devices(module)

        spec.loader.exec_module = exec_module
        return spec


if "tensorflow" not in sys.modules:
    sys.meta_path.insert(0, _DevicesOnImport())


@pytest.fixture(scope="session")
def tf_devices():
    """TensorFlow with TEST_DEVICES logical CPU devices (once per test process)."""
    import tensorflow as tf

    _test_devices(tf)
    assert len(tf.config.list_logical_devices("CPU")) == TEST_DEVICES
    return tf


# Held while a store is copied into a folder: tests that start children from two threads (test_float16, test_slow)
# would otherwise both find the folder without a store, and the second copy would land on the first child's store.
_STORE_LOCK = threading.Lock()


@functools.cache
def _migrated_store() -> Path:
    """An empty sqlite MLflow store with every schema migration applied, made once per test process (under
    _STORE_LOCK)."""
    from mlflow import MlflowClient

    path = Path(tempfile.mkdtemp(prefix="migrated-store-")) / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()  # creates the tables and runs the migrations
    return path


def new_store(folder: Path) -> str:
    """A fresh, empty sqlite store in `folder` (its mlflow.db), as its tracking URI: a copy of one migrated store,
    as MLflow would create it (creating a store runs ~100 schema migrations: a second each time)."""
    with _STORE_LOCK:
        shutil.copyfile(_migrated_store(), folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


@pytest.fixture
def store(tmp_path) -> str:
    """A fresh sqlite tracking URI in the test's own folder."""
    return new_store(tmp_path)


# What a run measures beyond its training (the input pipeline alone after training, the host's matmul peak, XLA's
# step against the plain one for train.jit_compile=auto) is off in in-process tests: seconds a run, read by none of
# them. The tests about these measurements switch them on again (a later override wins).
UNMEASURED = ("train.measure_input=false", "train.probe_peak=false", "train.jit_compile=false")


@functools.cache
def _checkpoints() -> Path:
    """This test process's checkpoint folder: the launch folder's `checkpoints/` would be every worker's, and a run is
    refused beside a live run of its config that writes there (two workers' smoke runs at once)."""
    return Path(tempfile.mkdtemp(prefix="checkpoints-"))


def compose(*overrides: str):
    """Compose the project's config through Hydra's compose API, as @hydra.main would (with UNMEASURED and this
    process's checkpoint folder first: a test's own overrides win)."""
    from runner.config import compose as compose_config

    return compose_config([*UNMEASURED, f"train.checkpoint_dir={_checkpoints()}", *overrides])


def build_strategy(plan, devices):
    """Build the plan's strategy over `devices`, as a run does."""
    from runner.experiment import training_for

    return plan.strategy.build(devices, training_for(plan))


def cli_env(env: dict | None = None) -> dict:
    """The environment of a `python -m runner` child: this one, without the tracking URI that in-process tests
    leave behind (mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI), so the child uses its own default store.
    `env` adds variables; one given as None is removed (TF_CPP_MIN_LOG_LEVEL=None: TensorFlow's log as a user has it)."""
    full_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    return {k: v for k, v in full_env.items() if v is not None}


def _default_store(cwd: Path, store: bool) -> None:
    """With `store`, a copy of the migrated store as the launch folder's default store (mlflow.db) unless it has one:
    as a user's second run finds it; the child skips the migrations (about 1 s of its start). Tests about creating
    the store, or whose folder is a small or read-only disk, pass store=False."""
    with _STORE_LOCK:
        if store and not (cwd / "mlflow.db").exists():
            shutil.copyfile(_migrated_store(), cwd / "mlflow.db")


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300, merged: bool = False,
            store: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m runner ARGS` in a fresh process, as a user would, and wait for it. `merged`: stderr into
    stdout, in the order a terminal shows them; `store`: see `_default_store`."""
    _default_store(cwd, store)
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], cwd=cwd, env=cli_env(env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True, timeout=timeout,
    )


def called(capsys, main, *argv: str) -> tuple[int, str, str]:
    """A command's entry point, `main(argv) -> exit status`, in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def subcommand(capsys, name: str, *argv: str) -> tuple[int, str, str]:
    """`runner NAME ARGV` in this process, through the command's edge (runner.cli.main.subcommand, where a store's
    refusal or a bad override becomes one `error:` line): (exit status, stdout, stderr). For the cases a process adds
    nothing to; tests/test_bad_input.py and tests/test_hostile_input.py keep the ones that start one."""
    from runner.cli.main import subcommand as edge

    return called(capsys, functools.partial(edge, name), *argv)


def start_cli(*args: str, cwd: Path, env: dict | None = None, store: bool = True, **popen) -> subprocess.Popen:
    """Start `python -m runner ARGS` in a fresh process, as a user would, without waiting (to signal it, or to run
    others beside it); its output is piped. `store`: see `_default_store`; `popen`: more of Popen's arguments
    (start_new_session=True)."""
    _default_store(cwd, store)
    return subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=cwd, env=cli_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def markdown_rows(text: str) -> list[dict[str, str]]:
    """Every row of every Markdown table in `text`, as {column header: cell}: tests read cells by name, so a column
    added to a table moves no assertion."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not all(set(c) <= set("-:") for c in cells):
            rows.append(dict(zip(header, cells)))
    return rows


def read_idx(path: Path):
    """An uncompressed IDX file's array, parsed as data=mnist parses its files (DataError where it is inconsistent)."""
    from runner.data_pipelines.idx import _parse_idx, _read_bytes

    return _parse_idx(_read_bytes(path), str(path))


def write_idx(path: Path, array) -> None:
    """Write `array` as an uncompressed IDX file, as data=mnist writes one; ValueError for a dtype IDX cannot store."""
    from runner.data_pipelines.idx import _encode_idx

    path.write_bytes(_encode_idx(array))


def runs(uri: str, experiment: str):
    """All runs of `experiment` in the store at `uri`, as a DataFrame."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=[experiment])


def pytest_configure(config):
    """Before any test, in pytest's own process (xdist's workers not started yet): the host CPU's float32 matmul
    peak, probed once if this machine has none cached. Every `python -m runner` a test starts reads it for MFU; probed
    beside another test's work a peak is disturbed, not cached, and probed again by every run after it (~20 s each)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        from runner.measure.peak import cached_cpu_peak, cpu_peak

        if cached_cpu_peak() is None:
            cpu_peak("float32")


def pytest_itemcollected(item):
    """The tests marked `alone` form one xdist_group: one worker runs them one after the other, and holds the machine
    once for all of them (`_Machine`)."""
    if item.get_closest_marker("alone"):
        item.add_marker(pytest.mark.xdist_group("alone"))


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests that share a module's or a class's fixture
def pytest_collection_modifyitems(items):
    """The tests marked `long` first, the rest in their order: pytest-xdist hands tests to its workers in this order,
    and a long test handed out last keeps one worker busy after the other has run out of tests."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


class _Machine:
    """This worker's hold on the machine, through a lock file of this run of pytest-xdist's workers: shared by any
    test, exclusive for one marked `alone`, which waits until no other test runs while no other starts. An exclusive
    hold is kept from one `alone` test to the next (they run in a row: one group), so the worker waits for the other
    to finish its test once, not once per test. Without workers one test runs at a time anyway: no lock."""

    def __init__(self) -> None:
        self.file = None
        self.mode = None

    def hold(self, mode: int) -> None:
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if run is None or mode == self.mode:
            return
        self.release()
        self.file = open(Path(tempfile.gettempdir()) / f"runner-tests-{run}.lock", "a")
        fcntl.flock(self.file, mode)
        self.mode = mode

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the file drops the lock
        self.file = self.mode = None


_machine = _Machine()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The suite runs on two pytest-xdist workers; a test marked `alone` probes or times the machine itself (its
    matmul peak), which another test running beside it would disturb: it holds the machine alone (`_Machine`).

    What a test leaves is frozen (`gc.freeze`), never collected: freed by a later collection, an earlier test's
    tf.data iterator stalls an unrelated test for up to 60 s (docs/testing.md, "Nothing collected between tests")."""
    alone = item.get_closest_marker("alone") is not None
    _machine.hold(fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    yield
    if not (alone and nextitem is not None and nextitem.get_closest_marker("alone")):
        _machine.release()
    gc.freeze()


_exit_status = 0


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Skip the interpreter's teardown once pytest is done: with TensorFlow loaded it takes minutes here (garbage
    collection of graphs and strategies) and checks nothing. The results and exit status are already final."""
    if "tensorflow" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
