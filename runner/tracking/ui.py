"""What the MLflow UI shows of the runner's experiments, set up by the runner so that nobody has to configure it.

- The experiment gets a description (the tag `mlflow.note.content`, shown under its title) and the model-training
  kind (`mlflow.experimentKind`, which MLflow UIs before 3.17 read to choose the page).
- A saved runs-table view, `runner` (the experiment tag `mlflow.sharedViewState.runner`, in the format the UI's
  "share view" writes), shows each kind of run's own figures (`figures`), the config keys a sweep varied besides its
  combinations' own (`params.train.precision`), then model, pipeline, strategy and devices, newest first so that sweep
  children nest under their parent; a run adds its kind's columns when it starts (`set_up`).
- `where_to_look` names the URL of that view, with `workflowType=machine_learning`: MLflow 3.17 chooses between its
  GenAI overview and the runs table from that URL parameter (else the browser's last choice), not the experiment.
"""

from __future__ import annotations

import json
import time
from typing import Any

from runner.tracking.redact import redact

VIEW_KEY = "runner"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
TAG_COLUMNS = ("tags.`model`", "tags.`pipeline`", "tags.`strategy`", "tags.`devices.count`", "tags.`devices.kind`")
DESCRIPTION = (
    "Runs of the runner (python -m runner): one run per model x pipeline x strategy x devices; a sweep is a parent "
    "run with one child per job. Compare them in the view 'runner' (each run's rate in its own unit, test score and "
    "time to its target), with `runner report` (table, verdict, plots), or by the tags model, pipeline, strategy, "
    "devices.count."
)


def figures(unit: str, task: Any, target: str | None) -> tuple[str, ...]:
    """The view's columns for a run's own figures: its rate (`<unit>_per_sec`: images, tokens or examples), its
    task's score (`accuracy`, a click model's `auc`) and the test figure its last line leads with (`Task.headline`:
    a language model's validation loss), the test figure it is timed to where that is another, and its time to
    that target (none without a target)."""
    led = [task.headline[0][0]] if task.headline else []
    tests = [task.score.name, *led, *([target] if target else [])]
    keys = [f"{unit}_per_sec", *dict.fromkeys(f"test_{name}" for name in tests)]
    return tuple(f"metrics.`{key}`" for key in [*keys, *([f"time_to_{target}_seconds"] if target else [])])


def view_tag_value(columns: tuple[str, ...] = ()) -> str:
    """The tag's value: the envelope the UI reads ({name, createdAt, updatedAt, state}), its state (as plain JSON)
    the runs-table view: the figures' and swept keys' `columns`, then the tags (the UI shows them grouped: metrics,
    parameters, tags), newest first (sweep children under their parent)."""
    now = int(time.time() * 1000)
    state = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False,
             "selectedColumns": list(dict.fromkeys([*columns, *TAG_COLUMNS])), "groupBy": None}
    return json.dumps({"name": "runner: speed and accuracy", "createdAt": now, "updatedAt": now,
                       "state": json.dumps(state)})


def shown(value: str | None) -> tuple[str, ...]:
    """The figures' columns a view tag's value selects (none from a missing or unreadable value)."""
    try:
        columns = json.loads(json.loads(value or "")["state"])["selectedColumns"]
    except (ValueError, KeyError, TypeError):
        return ()
    return tuple(c for c in columns if isinstance(c, str) and c not in TAG_COLUMNS)


def set_up(client: Any, experiment_id: str, existing: dict[str, str], columns: tuple[str, ...] = ()) -> None:
    """Tag an experiment for the UI, leaving alone what it already has (a user may have edited its description),
    and add the figures' `columns` (`figures`: the run about to start's) to its view where they are missing. Runs
    of two kinds starting at once on a tracking server may each write the view without the other's columns; the
    next run of that kind adds them again."""
    tags = {"mlflow.note.content": DESCRIPTION, "mlflow.experimentKind": "custom_model_development"}
    for key, value in tags.items():
        if key not in existing:
            client.set_experiment_tag(experiment_id, key, value)
    had = shown(existing.get(VIEW_TAG))
    if VIEW_TAG not in existing or not set(columns) <= set(had):
        client.set_experiment_tag(experiment_id, VIEW_TAG, view_tag_value((*had, *columns)))


def where_to_look(uri: str, experiment_id: str) -> str:
    """One line: for a local store the command that serves its UI (bound to this machine only), then the URL of
    the experiment's runs table in the runner's view (a tracking server's own; credentials masked)."""
    uri = redact(uri)
    server = uri.startswith(("http://", "https://"))
    url = (f"{uri.rstrip('/') if server else 'http://127.0.0.1:5000'}/#/experiments/{experiment_id}/runs"
           f"?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning")
    if server:
        return f"MLflow UI: {url}"
    return f"MLflow UI: mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000, then open {url}"
