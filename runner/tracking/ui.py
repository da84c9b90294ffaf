"""What the MLflow UI shows of the runner's experiments, set up by the runner so that nobody has to configure it.

- The experiment gets a description (the tag `mlflow.note.content`, shown under its title) and the model-training
  kind (`mlflow.experimentKind`, which MLflow UIs before 3.17 read to choose the page).
- A saved runs-table view, `runner` (the experiment tag `mlflow.sharedViewState.runner`: a JSON envelope holding the
  view state, the format the UI's "share view" writes), shows images/s, test accuracy, time to accuracy, model,
  pipeline, strategy and devices as columns, sorted by start time so that sweep children nest under their parent.
- `view_url` opens that view on the runs table. MLflow 3.17 chooses between its GenAI overview and the runs table
  from a `workflowType` URL parameter (else the browser's last choice, by default GenAI), not from the experiment,
  so the URL names `workflowType=machine_learning`.
"""

from __future__ import annotations

import json
import time
from typing import Any

VIEW_KEY = "runner"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
COLUMNS = (
    "metrics.`images_per_sec`", "metrics.`test_accuracy`", "metrics.`time_to_accuracy_seconds`",
    "tags.`model`", "tags.`pipeline`", "tags.`strategy`", "tags.`devices.count`", "tags.`devices.kind`",
)
DESCRIPTION = (
    "Runs of the runner (python -m runner): one run per model x pipeline x strategy x devices; a sweep is a parent "
    "run with one child per job. Compare them in the view 'runner' (images/s, test accuracy, time to accuracy), with "
    "`runner report` (table, verdict, plots), or by the tags model, pipeline, strategy, devices.count."
)


def view_state() -> dict[str, Any]:
    """The runs-table view: the columns above, newest first (start time: sweep children nest under their parent)."""
    return {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False,
            "selectedColumns": list(COLUMNS), "groupBy": None}


def view_tag_value() -> str:
    """The tag's value: the envelope the UI reads ({name, createdAt, updatedAt, state}), the state as plain JSON."""
    now = int(time.time() * 1000)
    return json.dumps({"name": "runner: speed and accuracy", "createdAt": now, "updatedAt": now,
                       "state": json.dumps(view_state())})


def experiment_tags() -> dict[str, str]:
    """The tags an experiment the runner creates carries (besides its runs view)."""
    return {"mlflow.note.content": DESCRIPTION, "mlflow.experimentKind": "custom_model_development",
            VIEW_TAG: view_tag_value()}


def set_up(client: Any, experiment_id: str, existing: dict[str, str]) -> None:
    """Tag an experiment for the UI, leaving alone what it already has (a user may have edited its description)."""
    for key, value in experiment_tags().items():
        if key not in existing:
            client.set_experiment_tag(experiment_id, key, value)


def base_url(uri: str) -> str:
    """Where the UI of a store is: the server itself for an http(s) store, else a local `mlflow ui`."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"


def view_url(uri: str, experiment_id: str) -> str:
    """The runs table of the experiment in the runner's view."""
    return (f"{base_url(uri)}/#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}"
            "&workflowType=machine_learning")


def ui_command(uri: str) -> str | None:
    """The command that serves a local store's UI (bound to this machine only); None for a tracking server."""
    if uri.startswith(("http://", "https://")):
        return None
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def where_to_look(uri: str, experiment_id: str) -> str:
    """One line: the UI command (if the store is local) and the URL of the runs view (credentials masked)."""
    from runner.tracking.redact import redact

    uri = redact(uri)
    command = ui_command(uri)
    return f"MLflow UI: {command}, then open {view_url(uri, experiment_id)}" if command else \
        f"MLflow UI: {view_url(uri, experiment_id)}"
