"""Configuration-driven experiment runner for multi-device TensorFlow training (Hydra + MLflow)."""

import time

# When this process first imported the runner: for `python -m runner` that is its start (after ~0.05 s of Python
# start-up), the origin of the `seconds_to_first_step` job-overhead figure.
STARTED_AT = time.time()

from runner import cluster as _cluster  # noqa: E402  (after STARTED_AT, which should be taken first)

_cluster.register_resolver()  # conf/config.yaml's hydra.run.dir uses ${worker_suffix:}
