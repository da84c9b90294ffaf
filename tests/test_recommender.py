"""Recommenders: named features in the task contract (data_pipelines.Spec), synthetic click logs in Criteo's layout,
DLRM, and its embedding tables' sparse gradients under every data-parallel strategy (at the strategy level, as
tests/test_text.py does the GPT)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from conftest import compose, runs

from runner.config import ConfigError, validate
from runner.data_pipelines import clicks

# Four tables of unusual sizes: an op of a table's shape in a step's graph is that table (or a copy of it).
TABLES = (97, 101, 103, 107)
CLICKS = ["model=dlrm", "data=clicks", "model.variant=tiny", f"data.vocabulary_sizes=[{','.join(map(str, TABLES))}]",
          "data.train_limit=4096", "data.test_limit=1000"]
DATA_PARALLEL = ["mirrored", "replicated", "parameter_server", "sharded_update", "hybrid"]


def test_click_logs_have_criteos_layout_power_law_ids_and_a_learnable_label():
    data = clicks.Clicks(tables="default", train_limit=20000, test_limit=20000).load(seed=0)
    x, y = data.x_train, data.y_train
    assert x["dense"].shape == (20000, 13) and x["dense"].dtype == np.float32 and (x["dense"] >= 0).all()
    ids, vocabularies = x["categorical"], np.array(clicks.vocabularies("default"))
    assert ids.shape == (20000, 26) and ids.dtype == np.int32 and (ids >= 0).all() and (ids < vocabularies).all()
    assert set(np.unique(y)) == {0, 1} and 0.15 < y.mean() < 0.35  # near Criteo's click rate
    _, counts = np.unique(ids[:, 0], return_counts=True)  # the 250,000-row table: a few ids take much of the traffic
    assert np.sort(counts)[::-1][:10].sum() > 0.1 * len(ids) and len(counts) > 2000
    assert clicks.bayes_auc("default", 20000) > 0.8  # what a model could learn
    again = clicks.Clicks(tables="default", train_limit=20000, test_limit=20000).load(seed=0)
    assert (again.x_train["categorical"] == ids).all() and data.digest("train") == again.digest("train")
    assert data.digest("train") != clicks.Clicks(tables="default", train_limit=20000).load(seed=1).digest("train")


def test_drawn_click_logs_are_kept_read_back_whole_and_drawn_again_when_the_file_is_bad(tmp_path, monkeypatch):
    """The cache of drawn logs (clicks.drawn): the second load reads the first's draw, the same arrays; a file cut
    short is drawn again and replaced; an unwritable cache only keeps nothing."""
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "cache"))
    first = clicks.Clicks(tables="tiny", train_limit=3000, test_limit=500).load(seed=4)
    files = sorted((tmp_path / "cache").glob("*.npz"))
    assert len(files) == 2  # the training and the test split, no partial file left

    def refuse(*args):
        raise AssertionError("drew again what the cache holds")

    monkeypatch.setattr(clicks.Hidden, "draw", refuse)
    again = clicks.Clicks(tables="tiny", train_limit=3000, test_limit=500).load(seed=4)
    assert again.digest("train") == first.digest("train") and again.digest("test") == first.digest("test")
    monkeypatch.undo()
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "cache"))
    files[0].write_bytes(files[0].read_bytes()[:1000])  # cut short, as by a full disk or a kill
    redrawn = clicks.Clicks(tables="tiny", train_limit=3000, test_limit=500).load(seed=4)
    assert redrawn.digest("train") == first.digest("train") and files[0].stat().st_size > 1000
    (tmp_path / "ro").mkdir(mode=0o500)
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "ro" / "cache"))
    if os.access(tmp_path / "ro", os.W_OK):  # root writes anywhere: a file where the folder would go
        (tmp_path / "ro").chmod(0o700)
        (tmp_path / "ro" / "cache").write_text("not a folder")
    kept_nothing = clicks.Clicks(tables="tiny", train_limit=3000, test_limit=500).load(seed=4)
    assert kept_nothing.digest("train") == first.digest("train")


def test_the_spec_says_named_features_a_binary_label_and_examples_per_second():
    spec = validate(compose(*CLICKS)).spec
    assert [f.name for f in spec.features] == ["dense", "categorical"] and spec.features[1].vocabularies == TABLES
    assert spec.target == "binary" and spec.outputs_shape == (1,) and spec.labels_shape == ()
    assert spec.unit == "examples" and spec.rate_key == "examples_per_sec" and spec.input_bytes == 4 * (13 + 4)


def test_auc_is_the_share_of_positive_negative_pairs_ordered_right():
    from runner.tasks import auc

    rng = np.random.default_rng(0)
    labels, scores = rng.integers(0, 2, 300), rng.normal(size=300).round(1)  # rounded: ties count half
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert auc(labels, scores) == pytest.approx(pairs, abs=1e-12)
    assert auc(labels, labels) == 1.0 and np.isnan(auc(np.ones(3), np.arange(3)))


def test_adagrad_updates_the_rows_looked_up_as_the_dense_gradient_would(tf_devices):
    """A sparse gradient with a row looked up twice, applied to its rows only, gives the weights and accumulator
    the dense gradient gives (the repeated row's parts summed first)."""
    import tensorflow as tf

    from runner.optimizers import SparseAdagrad

    values = tf.constant([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]])
    sparse = tf.IndexedSlices(values, tf.constant([4, 1, 4]), tf.constant([6, 2]))
    dense = tf.convert_to_tensor(sparse)
    out = []
    for grad in (sparse, dense):
        table = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
        optimizer = SparseAdagrad(0.1)
        optimizer.build([table])
        for _ in range(3):
            optimizer.apply_gradients([(grad, table)])
        out.append((table.numpy(), optimizer.variables[-1].numpy()))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-6)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-6)
    assert (out[0][0][[0, 2, 3, 5]] == np.arange(12, dtype=np.float32).reshape(6, 2)[[0, 2, 3, 5]]).all()


def _loop(*overrides: str):
    """A compiled training loop of dlrm/tiny on unshuffled click logs, and its built strategy."""
    from runner.experiment import build
    from runner.tracking import NoRun

    plan = validate(compose("debug=smoke", *CLICKS, "pipeline.shuffle_buffer=0", "train.global_batch_size=64",
                            "train.learning_rate=0.5", *overrides))  # a rate at which the tables move the loss
    built = build(plan, NoRun())
    return built.strategy.train_loop(built.strategy.batches(plan.pipeline, built.examples, plan.train.seed)), \
        built.strategy


def _run(loop, steps: int = 10) -> np.ndarray:
    """`steps` calls of one step each of a compiled loop: its losses."""
    import tensorflow as tf

    return np.array([float(loop(tf.constant(1))[0]) for _ in range(steps)])


def _loss_history(*overrides: str, steps: int = 10):
    loop, strategy = _loop(*overrides)
    return _run(loop, steps), strategy


@pytest.fixture(scope="module")
def single_losses(tf_devices):
    return _loss_history("strategy=single")[0]


@pytest.mark.parametrize("strategy,pipeline,gpus", [
    *[(s, "split", 2) for s in DATA_PARALLEL],
    ("mirrored", "per_tower", 2), ("mirrored", "sharded", 2), ("sharded_update", "sharded", 2),
    ("sharded_update", "split", 4), ("hybrid", "split", 4), ("hybrid", "sharded", 2),
])
def test_dlrm_learns_the_same_under_every_strategy(tf_devices, single_losses, strategy, pipeline, gpus):
    """Unshuffled, the same seed: the towers' shares are the single device's batch and the tables' rows are
    updated from the same looked-up rows, so only float summation order differs (1e-4 relative). A strategy that
    left the tables untrained or a copy stale differs by 1e-3 (tried: sharded_update without writing the updated
    rows back into the copies). And no op of the step makes a table's gradient dense (`_dense_tables`)."""
    loop, strategy_built = _loop(f"strategy={strategy}", f"pipeline={pipeline}", f"gpus={gpus}")
    assert _dense_tables(loop) == []
    losses = _run(loop)
    np.testing.assert_allclose(losses, single_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    copies = getattr(strategy_built, "models", [getattr(strategy_built, "model", None)])
    for table in range(len(TABLES)):  # every copy of every table holds the same (trained) rows
        first = copies[0].get_layer(f"table{table}").embeddings.numpy()
        for other in copies[1:]:
            np.testing.assert_array_equal(other.get_layer(f"table{table}").embeddings.numpy(), first)


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])  # writes back the rows looked up | every owner's part
def test_sharded_update_holds_tables_of_two_widths_as_two_variables_a_device_and_learns_singles_losses(
        tf_devices, optimizer):
    """A device holds its rows of the tables of one width as one variable (`sharded_update.groups`): a model with
    tables 4 and 8 wide has two a device, and trains single's losses."""
    mine = ("model.name=mine", "+model._target_=user_models.two_widths_recommender", f"train.optimizer={optimizer}")
    losses, built = _loss_history("strategy=sharded_update", "gpus=4", *mine)
    assert built.groups == [[0, 2], [1, 3]]
    assert built.training.tables_rows_only == (optimizer == "adagrad")  # config.ROWS_ONLY: only the rows looked up
    rows = [-(-v // 4) for v in TABLES]  # R: each device's rows of a table
    assert [tuple(v.shape) for v in built.table_shards[3]] == [(rows[0] + rows[2], 4), (rows[1] + rows[3], 8)]
    np.testing.assert_allclose(losses, _loss_history("strategy=single", *mine)[0], rtol=1e-4)


@pytest.mark.parametrize("strategy", ["sharded_update", "hybrid"])
def test_mixed_float16_keeps_a_tables_gradient_sparse_and_learns_replicateds_losses(tf_devices, strategy):
    """Under loss scaling the unscaled gradient of a table stays its rows (tf.IndexedSlices): divided as a dense
    tensor it became the whole table (sharded_update's owners, which read the rows they changed, failed to trace)."""
    float16 = ("train.precision=mixed_float16", "train.optimizer=adagrad", "gpus=2")
    losses = _loss_history(f"strategy={strategy}", *float16)[0]
    np.testing.assert_allclose(losses, _loss_history("strategy=replicated", *float16)[0], rtol=1e-3)


def test_sharded_update_restores_its_tables_grouped_rows_and_their_slots_from_a_checkpoint(tf_devices, tmp_path):
    from runner.checkpoints import Checkpointer

    adagrad = ("strategy=sharded_update", "gpus=2", "train.optimizer=adagrad")
    loop, first = _loop(*adagrad)
    _run(loop, 3)
    Checkpointer(tmp_path, 1000, first.checkpoint_objects(), "r").save(3)
    second = _loop(*adagrad)[1]
    fresh = [v.numpy() for part in second.table_shards for v in part]  # the grouped rows before any step
    assert Checkpointer(tmp_path, 1000, second.checkpoint_objects(), "r").restore() == (3, "r")
    saved, restored = ([*(v for part in s.table_shards for v in part), *(v for o in s.optimizers for v in o.variables),
                        *s.models[1].variables] for s in (first, second))
    assert len(saved) == len(restored)
    for a, b in zip(saved, restored):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert any((a != b.numpy()).any() for a, b in zip(fresh, restored))  # 3 steps moved them: restored, not rebuilt


def test_sharded_update_keeps_every_copy_of_a_table_whole_under_an_optimizer_that_moves_every_row(tf_devices):
    """Adam's slots move rows no batch looked up: each copy gets its owners' whole parts, not only the rows looked up
    (writing those alone left the copies stale: tried, 5.6e-4 relative apart from one device within 10 steps)."""
    single = _loss_history("strategy=single", "train.optimizer=adam", "train.learning_rate=0.01")[0]
    losses, built = _loss_history("strategy=sharded_update", "gpus=2", "train.optimizer=adam",
                                  "train.learning_rate=0.01")
    np.testing.assert_allclose(losses, single, rtol=1e-4)
    # Table 0's rows, owner by owner: the first R rows of each owner's variable for its group (the last part padded).
    owners = np.concatenate([part[0].numpy()[:built.rows[0]] for part in built.table_shards])
    for copy in built.models:
        table = copy.get_layer("table0").embeddings.numpy()
        np.testing.assert_array_equal(table, owners[:len(table)])


def test_parameter_server_can_spread_the_tables_over_the_devices(tf_devices, single_losses):
    """strategy.tables=spread: each table on one training device (dealt by size, as hybrid), its optimizer state
    beside it, every tower reading the one copy; the same losses as one device."""
    from runner.strategies.common import optimizer_state_bytes

    losses, built = _loss_history("strategy=parameter_server", "strategy.tables=spread", "gpus=2")
    np.testing.assert_allclose(losses, single_losses, rtol=1e-4)
    homes = {built.models[0].get_layer(f"table{t}").embeddings.value.device[-5:] for t in range(len(TABLES))}
    assert homes == {"CPU:0", "CPU:1"} and "embedding tables on CPU:0, CPU:1" in built.describe()["placement"]
    assert len(optimizer_state_bytes(built)) == 2  # the tables' slots beside them, on both devices


def _table_shaped_ops(strategy: str, optimizer: str, gpus: int = 2) -> list[str]:
    """The ops of a compiled training step (its loop and every function inside) whose output has the shape of an
    embedding table, other than reading the table itself: a table made dense."""
    from runner.experiment import build
    from runner.tracking import NoRun

    plan = validate(compose("debug=smoke", *CLICKS, f"strategy={strategy}", f"train.optimizer={optimizer}",
                            *([f"gpus={gpus}"] if strategy != "single" else [])))
    built = build(plan, NoRun())
    return _dense_tables(built.strategy.train_loop(built.strategy.batches(plan.pipeline, built.examples,
                                                                          plan.train.seed)))


def _dense_tables(loop) -> list[str]:
    """The ops of `loop`'s compiled step whose output has a table's shape (see `_table_shaped_ops`)."""
    import tensorflow as tf

    graph = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def(add_shapes=True)
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    shapes = {(v, 8) for v in TABLES}
    return [n.op for n in nodes if any(
        tuple(d.size for d in s.dim) in shapes for s in n.attr["_output_shapes"].list.shape)]


# An optimizer per part, as TF Model Garden's ranking models train DLRM: Adam for the MLPs, SGD for the tables.
PER_PART = ("train.optimizer=adam", "train.learning_rate=0.01", "train.table_optimizer=sgd",
            "train.table_learning_rate=0.5")
ADAMW = ("train.optimizer=adamw", "train.learning_rate=0.05", "train.weight_decay=0.5")


@pytest.fixture(scope="module")
def single_by_optimizer(tf_devices):
    """Single's losses under each optimizer setting below (made once each)."""
    made = {}
    return lambda settings: made.setdefault(settings, _loss_history("strategy=single", *settings)[0])


@pytest.mark.parametrize("strategy,settings", [
    *[(s, PER_PART) for s in DATA_PARALLEL],
    ("sharded_update", ADAMW),  # its own decay of the flat shard beside Keras' of the table rows it owns
    ("sharded_update", (*ADAMW, "train.table_optimizer=adagrad")),
])
def test_an_optimizer_per_part_trains_the_same_under_every_strategy(tf_devices, single_by_optimizer, strategy,
                                                                      settings):
    """Adam updates the MLPs and SGD the tables (train.table_optimizer, `optimizers.PerPart`): every strategy trains
    single's losses (1e-4 relative), and no op of the step has a table's shape, which Adam's update of a table would
    (test_no_strategy_makes_a_tables_gradient_dense): the tables went to SGD. With AdamW each weight is decayed once
    (tried: sharded_update decayed its tables' rows itself and in Keras' AdamW, 1e-2 apart within 10 steps)."""
    loop, built = _loop(f"strategy={strategy}", "gpus=2", *settings)
    if "train.table_optimizer=sgd" in settings:
        assert _dense_tables(loop) == []
    losses = _run(loop)
    np.testing.assert_allclose(losses, single_by_optimizer(settings), rtol=1e-4)
    assert losses[-1] < losses[0]


def test_an_optimizer_per_part_keeps_each_parts_state_and_restores_it(tf_devices, tmp_path):
    """Adam's two slots for the MLP, none for the tables (SGD): the state a checkpoint saves and restores."""
    import keras
    import tensorflow as tf

    from runner import optimizers
    from runner.strategies.common import build_optimizer, tables

    train = validate(compose(*CLICKS, *PER_PART)).train
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(97, 8),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    optimizer = build_optimizer(train, model.trainable_variables, tables(model))
    adam, sgd = optimizer.parts
    assert isinstance(optimizer, optimizers.PerPart) and type(sgd) is keras.optimizers.SGD
    slots = [[v for v in part.variables if v.shape.rank] for part in (adam, sgd)]  # not counters, not rates
    assert isinstance(adam, keras.optimizers.Adam) and len(slots[0]) == 2 * 2  # m and v of the kernel and bias
    assert slots[1] == []  # none for the table
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.constant([[1, 2, 3]])))
    grads = tape.gradient(loss, model.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    saved = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / "ckpt"))
    moments = [v.numpy() for v in adam.variables]
    fresh = build_optimizer(train, model.trainable_variables, tables(model))
    tf.train.Checkpoint(optimizer=fresh).restore(saved).assert_consumed()
    for before, after in zip(moments, fresh.parts[0].variables):
        np.testing.assert_array_equal(after.numpy(), before)
    assert int(fresh.parts[1].iterations) == 1


def test_an_optimizer_for_tables_on_a_model_without_tables_fails_the_run_in_one_line(tf_devices, store):
    from runner.experiment import run

    with pytest.raises(ConfigError, match=r"^train.table_optimizer=sgd updates a model's embedding tables .* has "
                                          r"none; set train.table_optimizer=null$"):
        run(compose("debug=smoke", f"mlflow.tracking_uri={store}", "train.table_optimizer=sgd"))
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FAILED" and "train.table_optimizer=sgd" in row["tags.error"]


def test_no_strategy_makes_a_tables_gradient_dense(tf_devices):
    """With adagrad (dlrm's default) every strategy reads, moves and applies the rows looked up: no op of the step
    has a table's shape, not even a read of the table (Keras' own lookup reads the whole table, which TensorFlow
    copies every step once a sparse update has touched it: `common.read_rows_only`). One device here; every
    data-parallel strategy in test_dlrm_learns_the_same_under_every_strategy. Adam's update is dense over the table
    in Keras (its moments decay every row every step): the same probe sees it, so it would see a strategy that
    densified."""
    assert _table_shaped_ops("single", "adagrad") == []
    assert {"Sub", "Mul", "Sqrt"} <= set(_table_shaped_ops("replicated", "adam"))


@pytest.mark.parametrize("overrides,words", [
    (["strategy=model_parallel", "gpus=2"], ["strategy=model_parallel splits a model of one input", "named features"]),
    (["model=mlp"], ["model=mlp takes images", "model=dlrm"]),
    (["data=mnist"], ["model=dlrm takes a dense float32 feature", "28x28x1 uint8 images"]),  # CLICKS' data keys not
    (["train.target_accuracy=0.9", "train.target_auc=0.8"], ["are two targets"]),
    (["data.vocabulary_sizes=[20000000,20000000]", "model.variant=default", "strategy=replicated", "gpus=4"],
     ["embedding tables are 9.5 GiB (10,240,000,000 bytes)", "adagrad keeps 1 slot",
      "use strategy=hybrid or parameter_server"]),
    (["data.vocabulary_sizes=null", "data.tables=criteo", "model.variant=criteo"], ["89.5 GiB", "use smaller tables"]),
    (["data.vocabulary_sizes=[20000000,20000000]", "model.variant=default", "strategy=replicated", "gpus=4",
      "train.optimizer=sgd", "train.table_optimizer=adam"],  # the tables' own optimizer's slots count
     ["train.table_optimizer=adam keeps 2 slot", "needs 114.4 GiB", "hybrid 28.6"]),
    (["train.table_learning_rate=0.1"], ["train.table_learning_rate=0.1 is the rate of train.table_optimizer"]),
])
def test_what_a_recommender_cannot_do_is_one_line(overrides, words):
    base = CLICKS[:3] if "data=mnist" in overrides else CLICKS
    with pytest.raises(ConfigError) as e:
        validate(compose(*base, *overrides))
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value), str(e.value)


def test_a_click_model_run_prints_its_auc_and_examples_per_second_and_is_timed_to_an_auc(tf_devices, store, tmp_path,
                                                                                          capsys, monkeypatch):
    """Its last line (the one `python -m runner` prints, tests/test_cli.py) leads with the AUC; the run is timed to
    an AUC, priced by the cost model, and reported by its AUC."""
    from runner.cli.main import result_line
    from runner.experiment import run

    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "cache"))  # the cost model's calibration
    last = result_line(run(compose("debug=smoke", *CLICKS, "strategy=mirrored", "gpus=2", "train.steps=60",
                                   "train.target_auc=0.55", "train.check_every=10", "train.check_examples=500",
                                   "train.predict=true", f"mlflow.tracking_uri={store}")))
    assert last.startswith("test AUC ") and " test log loss " in last and "examples/s" in last, last
    assert "target AUC 0.55 reached in " in last
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["metrics.examples_per_sec"] > 0 and row["metrics.test_auc"] > 0.55
    assert row["tags.target.reached"] == "true" and 0 < row["metrics.time_to_auc_seconds"]
    # the cost model prices its tables' rows: predicted examples/s beside the measured ones
    assert row["metrics.predicted_examples_per_sec"] > 0 and row["metrics.predicted_update_ms"] > 0
    assert row["tags.predicted.dominant"].split()[0] in ("towers", "update", "reduce", "ops", "input")
    from conftest import markdown_rows

    from runner.cli.report import main as report

    assert report(["--tracking-uri", store, "--experiment", "smoke", "--out", str(tmp_path / "report")]) == 0
    (table,) = [r for r in markdown_rows(capsys.readouterr().out) if "test AUC" in r]  # the AUC, not an accuracy
    assert float(table["test AUC"]) == pytest.approx(row["metrics.test_auc"], abs=1e-4)
    assert float(table["time to AUC (s)"]) == pytest.approx(row["metrics.time_to_auc_seconds"], abs=0.05)


def test_hybrid_keeps_each_table_once_on_one_device_and_looks_rows_up_there(tf_devices):
    """DLRM's scheme: a table lives on one device (the tables dealt so each device holds about the same bytes), every
    tower's lookup in it runs there (ids in, rows out), and the dense weights have a copy per device."""
    import tensorflow as tf

    from runner.strategies.common import deal

    assert deal([100, 10, 60, 50], 2) == [0, 0, 1, 1] and deal([5, 5, 5], 3) == [0, 1, 2]
    loop, built = _loop("strategy=hybrid", "gpus=2")
    placed = [t.value.device[-5:] for t in built.shared]
    assert len(placed) == len(TABLES) and placed == [f"CPU:{j}" for j in built.owners] and set(built.owners) == {0, 1}
    for copy in built.models:  # every copy's table is the one shared variable
        assert [layer.embeddings for layer in copy.layers if "table" in layer.name] == built.shared
    dense = {k: d for k, d in built.variable_devices().items() if "bottom0/kernel" in k}
    assert sorted(d[-5:] for d in dense.values()) == ["CPU:0", "CPU:1"]
    graph = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def()
    lookups = {}  # table -> the devices its lookups (a gather in layer table<t> of either tower's copy) run on
    for n in (n for f in graph.library.function for n in f.node_def if n.op in ("GatherV2", "ResourceGather")):
        layer = re.search(r"/table(\d+)(_\d+)?/\w+$", n.name)
        if layer:
            lookups.setdefault(int(layer.group(1)), []).append(n.device[-5:])
    assert lookups == {t: [f"CPU:{j}"] * 2 for t, j in enumerate(built.owners)}  # two towers, each on the owner


def test_lookups_read_rows_and_compute_what_keras_computes(tf_devices):
    """build_model's Embedding layers read their rows in place (ResourceGather) and give Keras' own lookup's outputs
    and gradient rows."""
    import keras
    import tensorflow as tf

    from runner.models.dlrm import DLRM
    from runner.strategies.common import build_model

    spec = validate(compose(*CLICKS)).spec
    ours = build_model(DLRM(variant="tiny"), spec, 0)
    keras.utils.set_random_seed(0)
    theirs = DLRM(variant="tiny").build(spec)
    rng = np.random.default_rng(0)
    x = {"dense": rng.random((16, 13), np.float32),
         "categorical": np.stack([rng.integers(0, v, 16) for v in TABLES], 1).astype(np.int32)}
    grads = []
    for model in (ours, theirs):
        with tf.GradientTape() as tape:
            out = model(x)
        grads.append(tape.gradient(out, model.get_layer("table2").embeddings.value))
    np.testing.assert_array_equal(ours(x).numpy(), theirs(x).numpy())
    np.testing.assert_array_equal(tf.convert_to_tensor(grads[0]).numpy(), tf.convert_to_tensor(grads[1]).numpy())
    assert isinstance(grads[0], tf.IndexedSlices)


def test_your_own_click_logs_in_criteos_layout_train_a_recommender(tf_devices, tmp_path, store):
    """train.tsv and test.tsv (label, 13 dense counts, categorical ids below data.vocabulary_sizes; an empty field 0),
    the click decided by the first id (below 25 or not) with 10% of labels flipped: dlrm/default learns it under hybrid
    x2 (dlrm/tiny, 8 wide, learns nothing of it in 300 steps)."""
    from runner.experiment import run

    rng, folder = np.random.default_rng(0), tmp_path / "logs"
    folder.mkdir()
    for split, n in (("train", 4096), ("test", 1000)):
        ids = np.stack([rng.integers(0, v, n) for v in (50, 20, 30)], 1)
        y = (ids[:, 0] < 25) ^ (rng.random(n) < 0.1)
        counts = rng.integers(0, 100, (n, 13)).astype(str)
        counts[:, 4] = ""  # a missing count
        lines = ["\t".join([str(int(a)), *c, *map(str, i)]) for a, c, i in zip(y, counts, ids)]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    args = ["model=dlrm", "data=files", f"data.path={folder}", "data.vocabulary_sizes=[50,20,30]"]
    spec = validate(compose(*args)).spec
    assert spec.features[1].vocabularies == (50, 20, 30) and spec.target == "binary"
    result = run(compose("debug=smoke", *args, "model.variant=default", "strategy=hybrid", "gpus=2", "train.steps=200",
                         "train.target_auc=null",
                         f"mlflow.tracking_uri={store}"))
    assert result["unit"] == "examples" and result["test_auc"] > 0.8  # the flips cap it at 0.9


def _click_records(tf, folder, label=None, bad_id=None, nan_at=None) -> None:
    """TFRecord shards of click logs (dense, categorical ids below (50, 20, 30), label): train in two files, test in
    one, the click decided by the first id (below 25 or not), 10% of labels flipped; `label`, `bad_id` (column 0) or
    a NaN dense value (at position `nan_at`) written into the 100th training record."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    files = (("train-00000-of-00002", 2048), ("train-00001-of-00002", 2048), ("validation-00000-of-00001", 1000))
    for name, n in files:
        ids = np.stack([rng.integers(0, v, n) for v in (50, 20, 30)], 1)
        y = ((ids[:, 0] < 25) ^ (rng.random(n) < 0.1)).astype(np.int64)
        if name.startswith("train-00000"):
            y[99] = y[99] if label is None else label
            ids[99, 0] = ids[99, 0] if bad_id is None else bad_id
        with tf.io.TFRecordWriter(str(folder / name)) as writer:
            counts = np.log1p(rng.integers(0, 100, (n, 13))).astype(np.float32)  # the TSV test's log(1 + count)
            if name.startswith("train-00000") and nan_at is not None:
                counts[99, nan_at] = np.nan
            for dense, cats, click in zip(counts, ids, y):
                feature = {"dense": tf.train.Feature(float_list=tf.train.FloatList(value=dense)),
                           "categorical": tf.train.Feature(int64_list=tf.train.Int64List(value=cats)),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[click]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_your_own_click_logs_in_tfrecord_train_a_recommender_file_by_file(tf_devices, tmp_path, store):
    """TFRecord shards of tf.train.Examples with the declared features (dense, categorical, label): dlrm/default learns
    the click under hybrid x2, the sharded pipeline giving each tower its own file."""
    from runner.experiment import run

    _click_records(tf_devices, tmp_path / "logs")
    args = ["model=dlrm", "data=files", f"data.path={tmp_path / 'logs'}", "data.vocabulary_sizes=[50,20,30]"]
    spec = validate(compose(*args)).spec
    assert spec.features[1].vocabularies == (50, 20, 30) and spec.target == "binary"
    result = run(compose("debug=smoke", *args, "model.variant=default", "strategy=hybrid", "gpus=2",
                         "pipeline=sharded", "train.steps=200", "train.target_auc=null",
                         f"mlflow.tracking_uri={store}"))
    assert result["unit"] == "examples" and result["test_auc"] > 0.8  # the flips cap it at 0.9


@pytest.mark.parametrize("bad, wanted", [
    ({"label": 2}, r"has label 2, not 0 or 1 \(a click model's label\)"),
    ({"bad_id": 60}, r"has id 60 in categorical column 1, outside its table \(data.vocabulary_sizes\[0\]\)"),
    ({"nan_at": 4}, r"has nan in dense feature 5, not a finite number"),  # trained on to AUC 0.49 without a word
    ({}, r"cannot be read: .*categorical"),  # 4 tables declared, 3 ids per record
])
def test_a_click_record_the_model_cannot_use_stops_training_in_one_line(tf_devices, tmp_path, store, bad, wanted):
    from runner.data_pipelines import DataError
    from runner.experiment import run

    _click_records(tf_devices, tmp_path / "logs", **bad)
    tables = "[50,20,30]" if bad else "[50,20,30,40]"
    with pytest.raises(DataError, match=wanted):
        run(compose("debug=smoke", "model=dlrm", "data=files", f"data.path={tmp_path / 'logs'}",
                    f"data.vocabulary_sizes={tables}", "pipeline.shuffle_buffer=0", f"mlflow.tracking_uri={store}"))
    assert runs(store, "smoke").iloc[0]["status"] == "FAILED"


def test_the_floor_counts_each_tables_update_at_the_rows_a_batch_looks_up(tf_devices, monkeypatch):
    """runner/measure/floor.py: an embedding table is the first layer of its own lookups, so its update is on the
    step's critical path like the first layer's: the rows a batch looks up (distinct ones) for an optimizer that
    updates only those, the whole table for one that updates every row; the first layer's weights are the first
    layer that is not a table."""
    import tensorflow as tf

    from runner.config import TOUCHED
    from runner.measure import floor
    from runner.models.dlrm import DLRM
    from runner.strategies.common import build_model, tables

    spec = validate(compose(*CLICKS)).spec
    model = build_model(DLRM(variant="tiny"), spec, 0)
    found = tables(model)
    rng = np.random.default_rng(0)
    x = {"dense": rng.random((64, 13), np.float32),
         "categorical": np.stack([rng.integers(0, v, 64) for v in TABLES], 1).astype(np.int32)}
    rows = floor.looked_up(found, model, x)
    for t, r in enumerate(rows):
        assert sorted(r.numpy()) == sorted(set(x["categorical"][:, t]))
    assert floor.first_layer_weights(model, skip={id(t) for t in found}) == 13 * 16 + 16  # bottom0, not a table
    device, bandwidth = ["/device:CPU:0"], 1e9
    dense = floor.tables_update_seconds([model], [found], [(x, None)], "adam", device, bandwidth)
    assert dense == pytest.approx(TOUCHED["adam"] * 4 * 8 * sum(TABLES) / bandwidth)  # every row of every table
    assert floor.rows_seconds([found], [rows], device) > 0
    seen = []
    monkeypatch.setattr(floor, "rows_seconds", lambda on, ids, devices: seen.append(ids) or 1e-3)
    sparse = floor.tables_update_seconds([model], [found], [(x, None)], "adagrad", device, bandwidth)
    assert sparse == pytest.approx(TOUCHED["adagrad"] / 2 * 1e-3)  # at least TOUCHED / 2 gathers of those rows
    assert [[sorted(r.numpy()) for r in ids] for ids in seen[0]] == [[sorted(r.numpy()) for r in rows]]
    monkeypatch.undo()
    assert floor.tables_update_seconds([model], [[]], None, "adagrad", device, bandwidth) == 0.0
    y = rng.integers(0, 2, (64, 1)).astype(np.float32)
    parts = floor.floor_step_ms([model], 64, "adagrad", device, task=spec.task, batches=[(x, y)], tables=[found])
    assert parts["floor_step_ms"] == pytest.approx(parts["floor_compute_ms"] + parts["floor_update_ms"])
    assert isinstance(rows[0], tf.Tensor)
