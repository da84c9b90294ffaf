"""The fused optimizers apply Keras' own update rule, on one device and on every mirrored copy."""

from __future__ import annotations

import numpy as np
import pytest

from runner import optimizers


def _train(tf, name: str, fused: bool, steps: int = 20, strategy=None, **options):
    """20 updates of a small two-variable model from fixed weights and fixed gradients; the final weights."""
    import keras

    scope = strategy.scope() if strategy else keras.name_scope("plain")
    with scope:  # the optimizer too: Keras ties it to the strategy it is created under
        optimizer = optimizers.make(name, 0.01, fused)
        for key, value in options.items():  # e.g. a large epsilon, so where it sits in the formula shows
            setattr(optimizer, key, value)
        kernel = keras.Variable(np.linspace(-1, 1, 12).reshape(3, 4).astype("float32"), name="kernel")
        bias = keras.Variable(np.zeros(4, "float32"), name="bias")
        optimizer.build([kernel, bias])
    rng = np.random.default_rng(0)
    grads = [[tf.constant(rng.normal(size=s).astype("float32")) for s in [(3, 4), (4,)]] for _ in range(steps)]

    @tf.function
    def apply(g):
        g = [tf.identity(x) for x in g]  # made on the replica's device, as a real step's gradients are
        optimizer.apply_gradients(zip(g, [kernel, bias]))

    for g in grads:
        if strategy:
            strategy.run(apply, args=(g,))
        else:
            apply(g)
    return kernel, bias


@pytest.mark.parametrize("name,options", [("adam", {}), ("adam", {"epsilon": 0.1}), ("momentum", {}),
                                          ("momentum", {"nesterov": True}), ("adamw", {"weight_decay": 0.1})])
def test_fused_update_matches_keras_update(tf_devices, name, options):
    fused = _train(tf_devices, name, True, **options)
    keras_own = _train(tf_devices, name, False, **options)
    for a, b in zip(fused, keras_own):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(fused[0].numpy(), np.linspace(-1, 1, 12).reshape(3, 4))  # it did update


@pytest.mark.parametrize("keras_class", ["Adam", "RMSprop", "SGD", "Adagrad"])
def test_the_direct_update_matches_keras_own_and_traces_fewer_ops(tf_devices, keras_class):
    """Outside tf.distribute the runner's optimizers update each variable directly (`optimizers.direct`, with
    train.fused_optimizer), without Keras' all-reduce and update over the default strategy's one replica: the same
    weights, fewer ops."""
    import keras

    tf = tf_devices
    make = optimizers.SparseAdagrad if keras_class == "Adagrad" else getattr(keras.optimizers, keras_class)
    out = []
    for optimizer in (optimizers.direct(make(0.01)), make(0.01)):
        kernel = keras.Variable(np.linspace(-1, 1, 12).reshape(3, 4).astype("float32"), name="kernel")
        optimizer.build([kernel])

        @tf.function
        def apply(g):
            optimizer.apply_gradients([(g, kernel)])

        for step in range(5):
            apply(tf.constant(np.full((3, 4), 0.1 * (step + 1), "float32")))
        out.append((kernel.numpy(), len(apply.get_concrete_function(tf.zeros((3, 4))).graph.get_operations())))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    assert not np.allclose(out[0][0], np.linspace(-1, 1, 12).reshape(3, 4))  # it did update
    assert out[0][1] < out[1][1]  # the default strategy's identities and update contexts are gone
    assert "_backend_update_step" in vars(optimizers.make("sgd", 0.01, fused=True))  # the runner's default
    assert "_backend_update_step" not in vars(optimizers.make("sgd", 0.01, fused=False))  # Keras' own, as asked


def test_fused_classes_are_used_only_when_asked():
    assert type(optimizers.make("adam", 1e-3, fused=True)) is optimizers.FusedAdam
    assert type(optimizers.make("momentum", 1e-3, fused=True)) is optimizers.FusedMomentum
    assert type(optimizers.make("adam", 1e-3, fused=False)).__name__ == "Adam"
    assert type(optimizers.make("rmsprop", 1e-3, fused=True)).__name__ == "RMSprop"


def test_fused_adam_updates_every_mirrored_copy_like_one_device(tf_devices):
    # Under MirroredStrategy Keras calls update_step once per device with that device's copy; the fused kernel
    # must write each copy (a wrong handle would update one copy twice and leave the other untouched).
    tf = tf_devices
    one_device_sum = tf.distribute.ReductionToOneDevice()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=one_device_sum)
    kernel, _ = _train(tf, "adam", True, strategy=strategy)
    # Each replica sees the same gradient and the optimizer sums them: the same as one device with twice the gradient.
    alone, _ = _train(tf, "adam", True)
    copies = [c.numpy() for c in kernel.value.values]
    assert [c.device.split("device:")[1] for c in kernel.value.values] == ["CPU:0", "CPU:1"]
    np.testing.assert_array_equal(copies[0], copies[1])
    np.testing.assert_allclose(copies[0], alone.numpy(), rtol=1e-4, atol=1e-6)  # Adam is scale-invariant in g


def _decayed(tf, optimizer_class, strategy):
    """Five AdamW steps (decay 0.1, a warmed-up cosine) of a two-variable model on two mirrored devices, from fixed
    weights and gradients: the final kernel and how often the traced step read the schedule."""
    import keras

    class Counted(keras.optimizers.schedules.LearningRateSchedule):
        reads = 0

        def __call__(self, step):
            Counted.reads += 1  # once per read while tracing
            return optimizers.cosine(0.01, warmup_steps=2, total_steps=10, min_rate=0.001)(step)

    with strategy.scope():
        optimizer = optimizer_class(Counted(), weight_decay=0.1)
        kernel = keras.Variable(np.linspace(-1, 1, 12).reshape(3, 4).astype("float32"), name="kernel")
        bias = keras.Variable(np.ones(4, "float32"), name="bias")
        optimizer.build([kernel, bias])
    rng = np.random.default_rng(0)
    grads = [[tf.constant(rng.normal(size=s).astype("float32")) for s in [(3, 4), (4,)]] for _ in range(5)]

    @tf.function
    def step(g):
        strategy.run(lambda *g: optimizer.apply_gradients(zip([tf.identity(x) for x in g], [kernel, bias])), args=g)

    for g in grads:
        step(g)
    return kernel.value.values[0].numpy(), Counted.reads


def test_adamw_decays_as_keras_does_reading_the_schedule_once_a_step(tf_devices):
    import keras

    tf = tf_devices
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    ours, ours_reads = _decayed(tf, optimizers.AdamW, strategy)
    keras_own, keras_reads = _decayed(tf, keras.optimizers.AdamW, strategy)
    np.testing.assert_array_equal(ours, keras_own)
    assert type(optimizers.make("adamw", 1e-3, fused=False, weight_decay=0.1)) is optimizers.AdamW
    assert type(optimizers.make("adamw", 1e-3, fused=True, weight_decay=0.1)) is optimizers.FusedAdamW
    # each replica's update reads it once (2); the decay: ours once a replica (2), Keras' once per variable and
    # device (2 x 2): with the tiny GPT's 28 decayed variables, 2 reads against 56 on two devices
    assert (ours_reads, keras_reads) == (2 + 2, 2 + 2 * 2)
