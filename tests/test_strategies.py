"""Every data-parallel strategy x pipeline learns exactly what `single` learns, and puts variables and ops where it
says. All in one process on the 4 logical CPU devices of the `tf_devices` fixture, at the strategy level: the run's
own objects (`runner.experiment.build`) and its compiled loop, without MLflow (tests/test_train.py checks what a run
logs)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_strategy, compose

from runner.data_pipelines import PIPELINES as _PIPELINES
from runner.bench.grid import DATA_PARALLEL  # every data-parallel strategy of one process, from the registry
from runner.config import validate
from runner.runtime.devices import Devices
from runner.strategies import STRATEGIES
from runner.experiment import build
from runner.tracking import NoRun

PIPELINES = _PIPELINES.names()
EXACT = ["pipeline.shuffle_buffer=0", "data.train_limit=1024"]
STEPS = 20


def _loop(*overrides):
    """The strategy's compiled loop, fed by the plan's pipeline from the plan's data as a run feeds it."""
    plan = validate(compose("debug=smoke", *EXACT, *overrides))
    built = build(plan, NoRun())
    return built.strategy.train_loop(built.strategy.batches(plan.pipeline, built.examples, plan.train.seed))


def _loss_history(tf, *overrides) -> np.ndarray:
    """The training loss of each of the first STEPS steps, one step per call of the strategy's compiled loop."""
    loop = _loop(*overrides)
    return np.array([float(loop(tf.constant(1))[0]) for _ in range(STEPS)])


@pytest.fixture(scope="module")
def single_losses(tf_devices):
    return _loss_history(tf_devices, "strategy=single")


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("strategy", [*DATA_PARALLEL, "mirrored strategy.input=distribute"])
def test_two_devices_reproduce_the_single_device_loss_sequence(tf_devices, single_losses, strategy, pipeline):
    # Unshuffled, the two towers' halves of a step are exactly the single device's batch (sharded: examples
    # 0, 2, 4... and 1, 3, 5... of it), so only float summation order differs: tolerance 1e-4 relative. Mirrored
    # twice: fed by the pipeline's own towers (its default) and through tf.distribute's input API.
    losses = _loss_history(tf_devices, *f"strategy={strategy}".split(), f"pipeline={pipeline}", "gpus=2")
    np.testing.assert_allclose(losses, single_losses, rtol=1e-4)
    assert losses[-1] < losses[0]


def _strategy(tf, name, n, *overrides):
    plan = validate(compose("debug=smoke", f"strategy={name}", f"gpus={n}", *overrides))
    names = tuple(f"/device:CPU:{i}" for i in range(n))
    return build_strategy(plan, Devices(names, "CPU", n > 1, "test")), plan


def _feed(tf, strategy, plan):
    from runner.data_pipelines import common

    x = np.random.default_rng(0).integers(0, 255, (512, 28, 28), dtype=np.uint8)
    y = np.random.default_rng(1).integers(0, 10, 512).astype(np.int32)
    return strategy.batches(plan.pipeline, common.examples(x, y), 0)


def test_replicated_copies_stay_identical_after_every_step(tf_devices):
    strategy, plan = _strategy(tf_devices, "replicated", 4)
    loop = strategy.train_loop(_feed(tf_devices, strategy, plan))
    before = [v.numpy() for v in strategy.models[0].trainable_variables]
    for _ in range(3):
        loop(tf_devices.constant(1))
        first = [v.numpy() for v in strategy.models[0].trainable_variables]
        for copy in strategy.models[1:]:
            for a, b in zip(first, (v.numpy() for v in copy.trainable_variables)):
                np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(before, first))  # they did train


def _graph_nodes(tf, loop):
    graph = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def()
    return list(graph.node) + [n for f in graph.library.function for n in f.node_def]


def _matmul_devices(tf, loop) -> tuple[dict, dict]:
    """Count forward and backward MatMul nodes per requested device in the traced training loop, each function's
    body once per call (the towers' one traced forward and backward, `common.stateless_passes`): a node without a
    device of its own runs on its caller's, as TensorFlow places a function called under tf.device."""
    graph = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def()
    bodies = {f.signature.name: f.node_def for f in graph.library.function}
    forward, backward = {}, {}

    def walk(nodes, caller: str) -> None:
        for node in nodes:
            device = node.device or caller
            for value in node.attr.values():  # a call, a loop's body: the functions the node runs
                if value.HasField("func") and value.func.name in bodies:
                    walk(bodies[value.func.name], device)
            if node.op == "MatMul":
                side = backward if "gradient_tape" in node.name else forward
                side[device] = side.get(device, 0) + 1

    walk(graph.node, "")
    return forward, backward


@pytest.mark.parametrize("n", [2, 4])
def test_replicated_places_a_copy_and_a_tower_per_device(tf_devices, n):
    strategy, plan = _strategy(tf_devices, "replicated", n)
    homes = {path.split("/")[0]: dev for path, dev in strategy.variable_devices().items()}
    assert homes == {str(i): f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(n)}
    forward, backward = _matmul_devices(tf_devices, strategy.train_loop(_feed(tf_devices, strategy, plan)))
    devices = {f"/device:CPU:{i}" for i in range(n)}
    assert set(forward) == devices and set(backward) == devices  # every tower's forward and backward on its device
    assert len(set(forward.values())) == 1 and len(set(backward.values())) == 1  # the same work on each


def test_later_copies_start_from_the_first_copys_values_on_their_own_devices(tf_devices):
    import keras

    from runner.strategies.common import placed_copies

    draws = []

    def drawn(shape, dtype=None):  # an initializer that counts its calls: only the first copy's variables draw
        draws.append(shape)
        return keras.random.normal(shape, dtype=dtype, seed=len(draws))

    def model_fn(seed):
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(5, kernel_initializer=drawn, bias_initializer=drawn)(inputs)
        return keras.Model(inputs, keras.layers.BatchNormalization()(hidden))

    devices = [f"/device:CPU:{i}" for i in range(3)]
    copies = placed_copies(model_fn, 0, devices)
    assert draws == [(3, 5), (5,)]
    for i, copy in enumerate(copies):
        assert len(copy.variables) == len(copies[0].variables) == 6
        for mine, first in zip(copy.variables, copies[0].variables):
            assert mine.value.device.endswith(f"CPU:{i}")
            np.testing.assert_array_equal(mine.numpy(), first.numpy())

@pytest.mark.parametrize("ps_device,home", [("cpu", "CPU:0"), ("first_device", "CPU:0")])
def test_parameter_server_keeps_one_copy_on_its_device_and_towers_on_all(tf_devices, ps_device, home):
    strategy, plan = _strategy(tf_devices, "parameter_server", 4, f"strategy.ps_device={ps_device}")
    devices = set(strategy.variable_devices().values())
    assert len(strategy.models) == 1 and {d.split("device:")[1] for d in devices} == {home}
    forward, backward = _matmul_devices(tf_devices, strategy.train_loop(_feed(tf_devices, strategy, plan)))
    assert set(forward) == set(backward) == {f"/device:CPU:{i}" for i in range(4)}


@pytest.mark.parametrize("n", [2, 4])
def test_mirrored_mirrors_every_variable_on_every_device(tf_devices, n):
    strategy, _ = _strategy(tf_devices, "mirrored", n)
    by_replica = {}
    for path, device in strategy.variable_devices().items():
        by_replica.setdefault(device.split("device:")[1], []).append(path.split("/", 1)[1])
    assert sorted(by_replica) == [f"CPU:{i}" for i in range(n)]
    assert all(paths == by_replica["CPU:0"] for paths in by_replica.values())


@pytest.mark.parametrize("n", [2, 4])
def test_mirrored_feeds_replica_i_from_the_pipeline_on_device_i(tf_devices, n):
    # sharded: tower i's iterator stages its batches on device i; replica i must train there, on that batch.
    strategy, plan = _strategy(tf_devices, "mirrored", n, "pipeline=sharded")
    loop = strategy.train_loop(_feed(tf_devices, strategy, plan))
    forward, backward = _matmul_devices(tf_devices, loop)
    devices = {f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(n)}
    assert set(forward) == devices and set(backward) == devices
    fetches = {node.device for node in _graph_nodes(tf_devices, loop) if node.op == "IteratorGetNext"}
    assert fetches == devices  # one get_next() per device


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("feed", ["towers", "distribute"])
def test_mirrored_split_feed_is_the_pipelines_own_or_tf_distributes(tf_devices, n, feed):
    # towers (the default): the pipeline's one get_next() of the global batch and its tf.split (images, labels)
    # inside the loop; distribute: tf.distribute's per-replica iterators, one get_next() per device, no split.
    strategy, plan = _strategy(tf_devices, "mirrored", n, "pipeline=split", f"strategy.input={feed}")
    nodes = _graph_nodes(tf_devices, strategy.train_loop(_feed(tf_devices, strategy, plan)))
    gets, splits = (sum(node.op == op for node in nodes) for op in ("IteratorGetNext", "Split"))
    assert (gets, splits) == ((1, 2) if feed == "towers" else (n, 0))


def test_single_puts_everything_on_its_device(tf_devices):
    strategy, plan = _strategy(tf_devices, "single", 1)
    assert {d.split("device:")[1] for d in strategy.variable_devices().values()} == {"CPU:0"}
    forward, backward = _matmul_devices(tf_devices, strategy.train_loop(_feed(tf_devices, strategy, plan)))
    assert set(forward) == set(backward) == {"/device:CPU:0"}


def test_unknown_strategy_name_raises():
    from runner.strategies import STRATEGIES

    with pytest.raises(ValueError, match="'ring'.*choose one of:.*mirrored"):
        STRATEGIES.get("ring")


def test_mirrored_auto_sums_on_one_device_on_cpus(tf_devices):
    # TensorFlow's own choice for CPU devices is a collective ring, 1.3x slower on devices sharing cores.
    strategy, _ = _strategy(tf_devices, "mirrored", 2)
    ops = strategy.strategy.extended._cross_device_ops
    assert isinstance(ops, tf_devices.distribute.ReductionToOneDevice)
    strategy, _ = _strategy(tf_devices, "mirrored", 2, "strategy.cross_device_ops=hierarchical_copy")
    assert isinstance(strategy.strategy.extended._cross_device_ops, tf_devices.distribute.HierarchicalCopyAllReduce)
    strategy, _ = _strategy(tf_devices, "mirrored", 2, "strategy.cross_device_ops=tensorflow")  # TensorFlow's own
    assert type(strategy.strategy.extended._cross_device_ops).__name__ == "CollectiveAllReduce"


@pytest.mark.parametrize("strategy", [s for s in DATA_PARALLEL if not STRATEGIES.get(s).no_jit])
def test_xla_compiled_towers_reproduce_the_single_device_loss_sequence(tf_devices, single_losses, strategy):
    """train.jit_compile=true: each tower's forward and backward one XLA cluster on its device (common.tower_step),
    fed unshuffled as above; XLA fuses and reorders the float sums, so the tolerance is the test's above."""
    loop = _loop(f"strategy={strategy}", "gpus=2", "train.jit_compile=true")
    losses = np.array([float(loop(tf_devices.constant(1))[0]) for _ in range(STEPS)])
    np.testing.assert_allclose(losses, single_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    compiled = [n for n in _graph_nodes(tf_devices, loop) if n.attr["_XlaMustCompile"].b]
    assert sorted(n.device[-5:] for n in compiled) == ["CPU:0", "CPU:1"]  # one cluster per tower, on its device
