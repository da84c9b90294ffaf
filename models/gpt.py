"""A decoder-only Transformer as nanoGPT's (karpathy/nanoGPT model.py): a character-level language model.

Token and learned position embeddings, `layers` pre-norm blocks of causal self-attention and a GELU MLP (4x wide),
a final LayerNorm, and the output layer tied to the token embedding (logits = h @ embedding^T). No biases in the
attention and MLP projections (nanoGPT's train.py default `bias=False`); weights drawn from N(0, 0.02), the
projections into the residual stream from N(0, 0.02 / sqrt(2 * layers)), as nanoGPT initialises them.

Variants are nanoGPT's Shakespeare recipes: `default` its CPU one (README), `baby` its GPU one
(config/train_shakespeare_char.py), and `tiny` for tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from runner.data_pipelines import Spec
from runner.errors import ConfigError
from runner.lazy import keras
from runner.models import MODELS, ModelOptions

Variant = Literal["tiny", "default", "baby"]
# variant -> (layers, heads, channels, dropout); the context (sequence length) and batch are the data's and train's
SIZES: dict[Variant, tuple[int, int, int, float]] = {
    "tiny": (2, 2, 32, 0.0),
    "default": (4, 4, 128, 0.0),
    "baby": (6, 6, 384, 0.2),
}


def reversible_embedding(vocabulary: int, channels: int, init: Any, positions: int) -> Any:
    """A token embedding whose call with reverse=True maps (b, t, channels) states to (b, t, vocabulary) logits
    with the same table (the tied output layer)."""
    class ReversibleEmbedding(keras.layers.Embedding):
        def call(self, inputs: Any, reverse: bool = False) -> Any:
            if not reverse:
                return super().call(inputs)  # (b, t) ids -> (b, t, channels)
            table = keras.ops.cast(self.embeddings, inputs.dtype)  # (vocabulary, channels)
            return keras.ops.matmul(inputs, keras.ops.transpose(table))  # (b, t, channels) -> (b, t, vocabulary)

        def forward_flops_per_example(self) -> float:
            """The output layer's matmul (positions, channels) x (channels, vocabulary); the lookup is free."""
            return 2.0 * positions * self.output_dim * self.input_dim

        def compute_output_spec(self, inputs: Any, reverse: bool = False) -> Any:
            if not reverse:
                return super().compute_output_spec(inputs)
            return keras.KerasTensor((*inputs.shape[:-1], self.input_dim), dtype=inputs.dtype)

    return ReversibleEmbedding(vocabulary, channels, embeddings_initializer=init, name="token_embedding")


def position_embedding(context: int, channels: int, init: Any) -> Any:
    """A layer adding a learned (context, channels) table to its input; a layer of its own so that the table is a
    trainable weight (an Embedding called on `arange` while building a functional model leaves a constant)."""
    class PositionEmbedding(keras.layers.Layer):
        def build(self, input_shape: tuple) -> None:
            self.embeddings = self.add_weight(shape=(context, channels), initializer=init, name="embeddings")

        def call(self, x: Any) -> Any:
            return x + keras.ops.cast(self.embeddings, x.dtype)  # (b, t, c) + (t, c)

        def forward_flops_per_example(self) -> float:
            return 0.0  # an element-wise add, left out of FLOP counts as bias adds are

    return PositionEmbedding(name="position_embedding")


def block(x: Any, heads: int, channels: int, dropout: float, init: Any, residual_init: Any, i: int) -> Any:
    """One pre-norm block: x + attention(norm(x)), then x + mlp(norm(x)); (b, t, channels) in and out."""
    h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_norm1")(x)
    h = keras.layers.MultiHeadAttention(heads, channels // heads, dropout=dropout, use_bias=False,
                                        kernel_initializer=init, name=f"block{i}_attention")(
        h, h, use_causal_mask=True)  # each position attends to itself and the ones before it
    x = x + keras.layers.Dropout(dropout)(h)
    h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{i}_norm2")(x)
    h = keras.layers.Dense(4 * channels, use_bias=False, kernel_initializer=init, name=f"block{i}_fc")(h)
    h = keras.layers.Activation("gelu")(h)  # (b, t, 4 channels)
    h = keras.layers.Dense(channels, use_bias=False, kernel_initializer=residual_init, name=f"block{i}_proj")(h)
    return x + keras.layers.Dropout(dropout)(h)


@MODELS.register
@dataclass
class GPT(ModelOptions):
    """nanoGPT's decoder-only Transformer, built for the data's vocabulary and sequence length (its context)."""

    name: str = "gpt"
    variant: Variant = "default"

    def build(self, spec: Spec) -> Any:
        """An uncompiled keras.Model: (b, context) int32 token ids -> (b, context, vocabulary) logits of the next token
        at every position (the context: the data's sequence length)."""
        vocabulary, context = spec.classes, spec.shape[0]
        layers, heads, channels, dropout = SIZES[self.variant]
        init = keras.initializers.RandomNormal(stddev=0.02)
        residual_init = keras.initializers.RandomNormal(stddev=0.02 / math.sqrt(2 * layers))
        ids = keras.Input((context,), dtype="int32", name="tokens")  # (b, t)
        embedding = reversible_embedding(vocabulary, channels, init, context)
        x = position_embedding(context, channels, init)(embedding(ids))  # (b, t, c)
        x = keras.layers.Dropout(dropout)(x)
        for i in range(layers):
            x = block(x, heads, channels, dropout, init, residual_init, i)
        x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
        logits = embedding(x, reverse=True)  # (b, t, vocabulary), tied to the token embedding
        return keras.Model(ids, logits, name=f"gpt_{self.variant}")

    def check(self, spec: Spec) -> None:
        if spec.target != "next_token":
            raise ConfigError("model=gpt is a language model: it takes token ids labelled with the next token at every "
                              f"position (data=shakespeare, or token files without labels); the data gives {spec}")

    def activations_per_example(self, spec: Spec) -> int:
        """Per block: the norms, q, k, v, the attention output and projection (7 t c), the MLP (9 t c: 4c, GELU,
        back to c) and the heads' (t, t) scores and weights; then the logits (t, vocabulary)."""
        layers, heads, channels, _ = SIZES[self.variant]
        t = spec.shape[0]
        return layers * (16 * t * channels + 2 * heads * t * t) + t * spec.classes
