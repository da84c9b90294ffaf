"""Whether the process that writes a run is still alive, and runs left RUNNING by one that died without ending them
(SIGKILL, power loss): closed as KILLED when the same config starts again, and by `runner report` and a sweep's end.
One check (`process_alive`) answers every such question.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)


def _stat(pid: int) -> list[str] | None:
    """Process `pid`'s /proc status fields from its state on (None: no such process, or no /proc, as on macOS)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def started(pid: int) -> str | None:
    """When process `pid` started (clock ticks after boot), None where unknown: with its pid, one process for ever."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def _alive(pid: int, since: str | None = None) -> bool:
    """Whether process `pid` exists and has not ended (and started at `since`, if given: a later process given the
    same pid is not it). A zombie has ended: a sweep killed with its jobs leaves their processes to an init that may
    never reap them, and the signal check alone would call them alive for ever."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    fields = _stat(pid)
    if fields is None:  # no /proc: the signal check alone
        return True
    return fields[0] not in ("Z", "X") and (since is None or fields[19:20] == [since])


def process_alive(tags: Mapping[str, str]) -> bool | None:
    """Whether the process named by a run's `runner.host`, `runner.pid` and `runner.started` tags (tags.process_tags)
    is alive; None when this host cannot know (a process of another host, or a run without the tags)."""
    pid = tags.get("runner.pid", "")
    if tags.get("runner.host") != socket.gethostname() or not pid.isdigit():
        return None
    return _alive(int(pid), tags.get("runner.started"))


def abandoned(run: Any) -> bool:
    """Whether an MLflow run is RUNNING although its process is gone from this host: no one will ever end it."""
    return run.info.status == "RUNNING" and process_alive(run.data.tags) is False


def close_dead(client: Any, run: Any, whose: str = "the process", what: str = "the run") -> bool:
    """End `run` KILLED, saying why in its `error` tag (`whose` process died without ending `what`), if it is
    `abandoned`; True if it did."""
    if not abandoned(run):
        return False
    client.set_tag(run.info.run_id, "error", f"{whose} (pid {run.data.tags['runner.pid']}) died without ending {what}")
    client.set_terminated(run.info.run_id, "KILLED")
    return True


def close_dead_runs(uri: str, digest: str) -> None:
    """End as KILLED the RUNNING runs of this config whose process died on this host (SIGKILL, power loss), in any
    experiment (a run resumed under another mlflow.experiment continues one of them). Runs of live processes, or of
    other hosts (which cannot be checked from here), are left alone."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    query = f"tags.config_hash = '{digest}' and attributes.status = 'RUNNING'"
    for found in client.search_runs(experiments, query) if experiments else []:
        if close_dead(client, found):
            log.warning("run %s of this config was left RUNNING by a dead process (pid %s): marked KILLED",
                        found.info.run_id, found.data.tags["runner.pid"])


def close_dead_sweep(client: Any, parent: str) -> str | None:
    """End KILLED a sweep's parent run that its sweep, gone from this host, left RUNNING, once none of its jobs runs
    any more (each abandoned job is closed first), and return that status; None when it left the parent as it was
    (ended already, its sweep alive or on another host, or a job still running)."""
    run = client.get_run(parent)
    if not abandoned(run):
        return None
    jobs = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'", max_results=5000)
    statuses = ["KILLED" if close_dead(client, job) else job.info.status for job in jobs]
    return "KILLED" if "RUNNING" not in statuses and close_dead(client, run, "the sweep's process", "its run") else None
