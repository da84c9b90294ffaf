"""The process a run lives in: its devices, the multi-worker cluster, signals, the bounded wait for peers, and
TensorFlow's start-up lines filtered; whether a sweep started it (`is_sweep_child`)."""

import os

ENV_CHILD = "RUNNER_SWEEP_CHILD"  # "1" in the fresh process a sweep job starts


def is_sweep_child() -> bool:
    """True in the fresh process a sweep job starts."""
    return os.environ.get(ENV_CHILD) == "1"
