"""MLflow tracking: the store, one run's lifecycle and its journal, tags, system metrics, redaction and the UI view.

The loop records through the `Recorder` contract (`run.py`); nothing here reaches back into the loop. The names
below are the package's interface; each is defined once, in the module named beside it.
"""

from runner.runtime import ENV_CHILD, is_sweep_child
from runner.tracking.run import NoRun, Recorder, Run, WriterRun, record_invalid, tracked
from runner.tracking.stale import abandoned, close_dead, close_dead_sweep, process_alive
from runner.tracking.store import (
    StoreError, bound_http_retries, ensure_experiment, open_store, resolve_uri, schema_lock, whole_write,
)
from runner.tracking.tags import (
    ENV_PARENT, command_line, parent_run_id, process_tags,
)

__all__ = [
    "Recorder", "Run", "NoRun", "WriterRun", "tracked", "record_invalid",
    "abandoned", "close_dead", "close_dead_sweep", "process_alive",
    "StoreError", "bound_http_retries", "ensure_experiment", "open_store", "resolve_uri", "schema_lock", "whole_write",
    "ENV_CHILD", "ENV_PARENT", "command_line", "is_sweep_child", "parent_run_id", "process_tags",
]
