"""Models: one module each, with a VARIANTS table and `build(variant) -> keras.Model` returning logits.

Modules import Keras inside `build`, not at top level, so that config validation can read VARIANTS without
loading TensorFlow. Adding a model is one module here plus one YAML in conf/model/.
"""

INPUT_SHAPE = (28, 28, 1)  # every model takes MNIST-shaped images, float32 in [0, 1]
NUM_CLASSES = 10
