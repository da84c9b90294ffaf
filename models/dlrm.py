"""DLRM, the layout of TF Model Garden's ranking model (official/recommendation/ranking; Naumov et al. 2019).

The dense features go through a bottom MLP to one vector of the embedding dimension d; each categorical feature's
id looks up a row of its own table (d wide); the pairwise dot products of those F = 1 + tables vectors and the
bottom MLP's output go through a top MLP to one logit, the log-odds of a click. Most of its parameters are the
tables, whose gradients are sparse (the rows a batch looked up): what the strategies differ on.

Variants: `tiny` for tests; `default` for one machine; `criteo` as Model Garden's dlrm_criteo (with Criteo's
vocabularies, data.tables=criteo, a cluster's tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from runner.data_pipelines import Spec
from runner.errors import ConfigError
from runner.lazy import keras
from runner.models import MODELS, ModelOptions

Variant = Literal["tiny", "default", "criteo"]


@dataclass(frozen=True)
class Sizes:
    """A variant's embedding dimension (the bottom MLP's last width) and the MLPs' hidden widths."""

    embedding_dim: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]


SIZES: dict[Variant, Sizes] = {
    "tiny": Sizes(8, (16, 8), (32, 16)),
    "default": Sizes(64, (256, 128, 64), (512, 256)),
    "criteo": Sizes(128, (512, 256, 128), (1024, 1024, 512, 256)),  # Model Garden's dlrm_criteo
}


def dot_interaction(features: int) -> Any:
    """A layer taking (b, F, d) vectors to the (b, F (F - 1) / 2) dot products of every pair (DLRM's interaction,
    without self-interaction)."""
    rows, cols = np.tril_indices(features, -1)
    pairs = (rows * features + cols).astype("int32")  # the strictly lower triangle, flattened

    class DotInteraction(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            z = keras.ops.matmul(x, keras.ops.transpose(x, (0, 2, 1)))  # (b, F, F)
            return keras.ops.take(keras.ops.reshape(z, (-1, features * features)), pairs, axis=1)  # (b, P)

        def compute_output_spec(self, x: Any) -> Any:
            return keras.KerasTensor((x.shape[0], len(pairs)), dtype=x.dtype)

        def forward_flops_per_example(self) -> float:
            return 2.0 * features * features * self._d

        def build(self, input_shape: tuple) -> None:
            self._d = int(input_shape[-1])

    return DotInteraction(name="interaction")


@MODELS.register
@dataclass
class DLRM(ModelOptions):
    """DLRM for data of one dense and one categorical feature group (data=clicks), one table per categorical column."""

    name: str = "dlrm"
    variant: Variant = "default"

    def build(self, spec: Spec) -> Any:
        """An uncompiled keras.Model: {"dense" (b, D) float32, "categorical" (b, F - 1) int32} -> (b, 1) logits."""
        dense_feature, ids_feature = spec.features
        sizes = SIZES[self.variant]
        d = sizes.embedding_dim
        dense = keras.Input(dense_feature.shape, name=dense_feature.name)  # (b, D)
        ids = keras.Input(ids_feature.shape, dtype="int32", name=ids_feature.name)  # (b, tables)
        x = dense
        for i, units in enumerate((*sizes.bottom[:-1], d)):
            x = keras.layers.Dense(units, activation="relu", name=f"bottom{i}")(x)  # ends (b, d)
        rows = [keras.layers.Embedding(v, d, name=f"table{k}")(ids[:, k])  # (b, d) each
                for k, v in enumerate(ids_feature.vocabularies)]
        stacked = keras.ops.stack([x, *rows], axis=1)  # (b, F, d)
        h = keras.layers.Concatenate()([x, dot_interaction(1 + len(rows))(stacked)])  # (b, d + P)
        for i, units in enumerate(sizes.top):
            h = keras.layers.Dense(units, activation="relu", name=f"top{i}")(h)
        logit = keras.layers.Dense(1, name="logit")(h)  # (b, 1)
        return keras.Model({dense_feature.name: dense, ids_feature.name: ids}, logit, name=f"dlrm_{self.variant}")

    def check(self, spec: Spec) -> None:
        kinds = [(f.dtype, bool(f.vocabularies)) for f in spec.features]
        if spec.target != "binary" or kinds != [("float32", False), ("int32", True)]:
            from runner.data_pipelines.clicks import LAYOUTS

            raise ConfigError(f"model=dlrm takes a dense float32 feature and a categorical id feature with a binary "
                              f"label, the data gives {spec}: use data=clicks, or your own click logs in data=files, "
                              f"{LAYOUTS}")

    def table_bytes(self, spec: Spec) -> int:
        """Its tables' float32 weights: one row of the embedding dimension per id of every vocabulary."""
        return 4 * SIZES[self.variant].embedding_dim * sum(spec.features[1].vocabularies)

    def activations_per_example(self, spec: Spec) -> int:
        """The MLPs' widths, the looked-up rows and the interaction."""
        s, tables = SIZES[self.variant], len(spec.features[1].vocabularies)
        return sum(s.bottom) + sum(s.top) + 1 + (tables + 1) * (s.embedding_dim + tables + 1)
