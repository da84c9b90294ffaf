"""Configuration-driven experiment runner for multi-device TensorFlow training (Hydra + MLflow)."""

import time
from importlib import metadata

# When this process first imported the runner: for `python -m runner` that is its start (after ~0.05 s of Python
# start-up), the origin of the `seconds_to_first_step` job-overhead figure.
STARTED_AT = time.time()

DISTRIBUTION = "tf-runner"
try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

from runner.runtime import cluster as _cluster  # noqa: E402  (after STARTED_AT, which should be taken first)

_cluster.register_resolver()  # conf/config.yaml's hydra.run.dir uses ${worker_suffix:}
