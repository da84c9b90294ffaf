"""Models as a user would write them, outside the package, for the tests: plain functions taking keras.applications'
`input_shape` and `classes`; and components that give the runner their written contract (a Protocol) alone."""

from __future__ import annotations

from dataclasses import dataclass

from runner.data_pipelines import DatasetOptions


def resnet(input_shape=(28, 28, 1), classes: int = 10, filters: int = 8):
    """A small ResNet: a stem convolution, one residual block (two 3x3 convolutions with batch normalization, added to
    its input), global average pooling, a dense classifier."""
    import keras
    from keras import layers

    x = inputs = keras.Input(input_shape)
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)  # (b, H, W, filters)
    y = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same")(x)))
    y = layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same")(y))
    x = layers.GlobalAveragePooling2D()(layers.ReLU()(layers.Add()([x, y])))  # (b, filters)
    return keras.Model(inputs, layers.Dense(classes)(x), name="resnet")  # (b, classes) logits


def dropout_mlp(input_shape=(28, 28, 1), classes: int = 10):
    """An MLP with dropout: each tower draws its own masks, so no strategy's losses equal one device's."""
    import keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(32, "relu"),
                             keras.layers.Dropout(0.5), keras.layers.Dense(classes)])


def odd_arguments(shape, num_classes):
    """A model function whose parameters the runner does not fill (it passes input_shape and classes)."""
    raise AssertionError("never called: validation refuses its signature")


def text_classifier(vocabulary_size: int, sequence_length: int, classes: int, channels: int = 16):
    """A user's text classifier as keras_hub names its arguments: token ids (b, length) -> (b, classes) logits,
    through an embedding, mean pooling over the positions and a Dense layer."""
    import keras

    ids = keras.Input((sequence_length,), dtype="int32")
    x = keras.layers.Embedding(vocabulary_size, channels)(ids)  # (b, t, c)
    x = keras.layers.GlobalAveragePooling1D()(x)  # (b, c)
    return keras.Model(ids, keras.layers.Dense(classes)(x), name="text_classifier")


def fixed_vocabulary_classifier(sequence_length: int, classes: int):
    """A user's text classifier with a vocabulary of its own (30 ids), whatever the data's: ids past it cannot be
    looked up."""
    import keras

    ids = keras.Input((sequence_length,), dtype="int32")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 8, name="words")(ids))
    return keras.Model(ids, keras.layers.Dense(classes)(x), name="fixed_vocabulary")


def with_python_step(input_shape=(28, 28, 1), classes: int = 10):
    """A classifier with a layer XLA cannot compile: it passes its input through a Python function
    (tf.numpy_function, TensorFlow's PyFunc op), as a user's preprocessing step might."""
    import keras
    import numpy as np
    import tensorflow as tf

    class PythonStep(keras.layers.Layer):
        def call(self, x):
            y = tf.numpy_function(np.negative, [x], x.dtype)  # (b, ...) computed in Python
            return tf.ensure_shape(y, x.shape)

    x = inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(PythonStep()(inputs))  # (b, H*W*C)
    return keras.Model(inputs, keras.layers.Dense(classes)(x), name="python_step")  # (b, classes) logits


def recommender(vocabulary_sizes: list[int], num_dense_features: int, embedding_dim: int = 8):
    """A user's recommender, sized by the data's tables as the runner passes them: the dense features normalized
    (batch normalization, which no FLOP formula covers) into a Dense layer, one table per categorical column, all
    concatenated into one logit (b, 1)."""
    import keras

    dense = keras.Input((num_dense_features,), name="dense")
    ids = keras.Input((len(vocabulary_sizes),), dtype="int32", name="categorical")
    rows = [keras.layers.Embedding(v, embedding_dim, name=f"table{k}")(ids[:, k])  # (b, d) each
            for k, v in enumerate(vocabulary_sizes)]
    x = keras.layers.Dense(16, activation="relu", name="bottom")(keras.layers.BatchNormalization(name="norm")(dense))
    joined = keras.layers.Concatenate(name="joined")([x, *rows])  # (b, 16 + tables * d)
    return keras.Model({"dense": dense, "categorical": ids}, keras.layers.Dense(1, name="logit")(joined),
                       name="recommender")


def fixed_tables_recommender(tables: int = 3, rows: int = 100):
    """A user's recommender with tables of its own size (`rows` each), whatever the data's: ids past them cannot be
    looked up."""
    import keras

    dense = keras.Input((13,), name="dense")
    ids = keras.Input((tables,), dtype="int32", name="categorical")
    looked_up = [keras.layers.Embedding(rows, 4, name=f"table{k}")(ids[:, k]) for k in range(tables)]
    joined = keras.layers.Concatenate(name="joined")([dense, *looked_up])
    return keras.Model({"dense": dense, "categorical": ids}, keras.layers.Dense(1, name="logit")(joined),
                       name="fixed_tables")


def subclassed_recommender():
    """A user's recommender as a keras.Model subclass: no keras.Input until it is called."""
    import keras

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.table, self.logit = keras.layers.Embedding(100, 4), keras.layers.Dense(1)

        def call(self, x):
            rows = keras.ops.sum(self.table(x["categorical"]), axis=1)  # (b, 4)
            return self.logit(keras.ops.concatenate([x["dense"], rows], axis=1))

    return Subclassed()


def two_widths_recommender(vocabulary_sizes: list[int], num_dense_features: int):
    """A user's recommender whose tables are 4 and 8 wide in turn (sharded_update holds them as two groups)."""
    import keras

    dense = keras.Input((num_dense_features,), name="dense")
    ids = keras.Input((len(vocabulary_sizes),), dtype="int32", name="categorical")
    rows = [keras.layers.Embedding(v, 4 + 4 * (k % 2), name=f"table{k}")(ids[:, k])
            for k, v in enumerate(vocabulary_sizes)]
    joined = keras.layers.Concatenate(name="joined")([dense, *rows])  # (b, 13 + 4 + 8 + ...)
    return keras.Model({"dense": dense, "categorical": ids}, keras.layers.Dense(1, name="logit")(joined),
                       name="two_widths")



@dataclass
class NpzData(DatasetOptions):
    """A user's dataset: MNIST-shaped images and labels in one .npz file (x_train, y_train, x_test, y_test)."""

    name: str = "npz"
    path: str = "data.npz"

    def spec(self):
        from runner.data_pipelines import MNIST

        return MNIST

    def load(self, seed: int):
        import numpy as np

        from runner.data_pipelines.common import Arrays

        d = np.load(self.path)
        return Arrays(d["x_train"], d["y_train"], d["x_test"], d["y_test"], synthetic=False)


@dataclass
class KerasStyleData(NpzData):
    """A user's dataset whose load returns keras.datasets' ((x_train, y_train), (x_test, y_test)), not a Data."""

    name: str = "keras_style"

    def load(self, seed: int):
        import numpy as np

        x, y = np.zeros((8, 28, 28), "uint8"), np.zeros(8, "int64")
        return (x, y), (x, y)


@dataclass
class OwnArrays(DatasetOptions):
    """A user's dataset of 8 float features and 3 classes whose load builds `Arrays` of `width` features and labels
    up to `top_label` (the defaults match its spec)."""

    name: str = "own_arrays"
    width: int = 8
    top_label: int = 2

    def spec(self):
        from runner.data_pipelines import Spec

        return Spec((8,), 3, "float32")

    def load(self, seed: int):
        import numpy as np

        from runner.data_pipelines.common import Arrays

        x, y = np.zeros((64, self.width), "float32"), np.arange(64) % (self.top_label + 1)
        return Arrays(x, y, x, y, synthetic=False, spec=self.spec())


@dataclass
class TupleSpecData(NpzData):
    """A user's dataset whose spec() returns a (shape, classes) tuple, not a Spec."""

    name: str = "tuple_spec"

    def spec(self):
        return (28, 28, 1), 10


def _members(contract: type) -> set[str]:
    """What a typing.Protocol declares: its attributes and its methods."""
    return {n for n in vars(contract) if not n.startswith("_")} | set(getattr(contract, "__annotations__", {}))


class _ContractOnly:
    """A user's component that gives the runner its contract and nothing else: `WRAPS` = (module, Protocol, registry,
    built-in, options); each of the Protocol's members is that built-in's, reading any other raises AttributeError.
    Its one option is `name`."""

    def __post_init__(self) -> None:
        import importlib

        module, contract, registry, built_in, options = self.WRAPS
        module = importlib.import_module(module)
        inner = getattr(module, registry).get(built_in)(**options)
        object.__setattr__(self, "_given", (_members(getattr(module, contract)), inner, contract))

    def __getattr__(self, attr: str):
        members, inner, contract = self.__dict__.get("_given", (set(), None, "component's"))
        if attr not in members:
            raise AttributeError(f"{attr!r} is not in the {contract} contract")
        return getattr(inner, attr)


@dataclass
class ContractModel(_ContractOnly):
    name: str = "contract_model"
    WRAPS = ("runner.models", "Model", "MODELS", "mlp", {"variant": "tiny"})


@dataclass
class ContractData(_ContractOnly):
    name: str = "contract_data"
    WRAPS = ("runner.data_pipelines", "Dataset", "DATASETS", "mnist", {"train_limit": 4096, "test_limit": 1024})


@dataclass
class ContractPipeline(_ContractOnly):
    name: str = "contract_pipeline"
    WRAPS = ("runner.data_pipelines", "Pipeline", "PIPELINES", "split", {})


@dataclass
class ContractStrategy(_ContractOnly):
    name: str = "contract_strategy"
    WRAPS = ("runner.strategies", "StrategyOptions", "STRATEGIES", "replicated", {})


def misspelt(input_shape=(28, 28, 1), classes: int = 10):
    """A user's bug: a layer's name misspelt (AttributeError when it is called)."""
    import keras

    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dens(classes)(keras.layers.Flatten()(inputs)))
