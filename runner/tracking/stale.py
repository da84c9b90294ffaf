"""Runs left RUNNING by a process that died without ending them (SIGKILL, power loss), closed as KILLED."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def close_dead_runs(uri: str, experiment: str, digest: str) -> list[str]:
    """End as KILLED the RUNNING runs of this config whose process died on this host (SIGKILL, power loss).

    Runs of live processes, or of other hosts (whose processes cannot be checked from here), are left alone.

    Returns:
        The ids of the runs it closed.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    closed = []
    query = f"tags.config_hash = '{digest}' and attributes.status = 'RUNNING'"
    for found in client.search_runs([exp.experiment_id], query):
        tags = found.data.tags
        pid = tags.get("runner.pid", "")
        if tags.get("runner.host") != socket.gethostname() or not pid.isdigit() or _alive(int(pid)):
            continue
        client.set_tag(found.info.run_id, "error", f"the process (pid {pid}) died without ending the run")
        client.set_terminated(found.info.run_id, "KILLED")
        closed.append(found.info.run_id)
        log.warning("run %s of this config was left RUNNING by a dead process (pid %s): marked KILLED",
                    found.info.run_id, pid)
    return closed


