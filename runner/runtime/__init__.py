"""The process a run lives in: its devices, the multi-worker cluster, signals, the bounded wait for peers, and
TensorFlow's start-up lines filtered."""
