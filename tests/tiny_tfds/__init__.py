"""A TensorFlow Datasets builder the tests prepare locally (TFDS needs a builder's module inside a package)."""
