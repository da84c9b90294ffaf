"""What a run is tagged with: the config as params, the model and combination, the command, the source commit, the
process that writes it, and its place in a sweep."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import runner
from runner.tracking.redact import redact
from runner.tracking.stale import started

_MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
ENV_PARENT = "RUNNER_PARENT_RUN_ID"  # set for a sweep's job processes: the sweep's parent run


def parent_run_id() -> str | None:
    """The sweep's parent run, inside a sweep job."""
    return os.environ.get(ENV_PARENT) or None


def command_line() -> str:
    """This process's command line as typed (`python -m runner ...`, or `runner ...` for the console script, which
    its interpreter runs by path), for tags."""
    argv = sys.orig_argv
    if len(argv) > 1 and Path(argv[1]).name == "runner":
        argv = argv[1:]
    return " ".join(shlex.quote(a) for a in [Path(argv[0]).name, *argv[1:]])


def flatten(cfg: DictConfig) -> dict[str, str]:
    """The resolved config as flat `a.b.c -> value` params."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = redact(str(node)[:_MAX_PARAM_LEN])

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


def _git_commit() -> str | None:
    """The commit of the checkout the runner is installed from in editable mode (`pip install -e`, found in the
    install's own record, PEP 610 direct_url.json), if there is one and git can read it; None for a regular install,
    whose version says what ran."""
    try:
        direct = json.loads(metadata.distribution(runner.DISTRIBUTION).read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    url = direct.get("url", "")
    if not direct.get("dir_info", {}).get("editable", False) or not url.startswith("file://"):
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(url.removeprefix("file://")), capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def base_tags(cfg: DictConfig) -> dict[str, str]:
    """Tags every run carries, so the UI and search_runs can filter by them."""
    tags = {
        "model": cfg.model.name,
        "model.variant": str(cfg.model.get("variant", "")),
        "pipeline": cfg.pipeline.name,
        "strategy": cfg.strategy.name,
        "data": cfg.data.name,
        "data.synthetic": str(cfg.data.name == "synthetic").lower(),
        "mlflow.runName": f"{cfg.model.name}-{cfg.pipeline.name}-{cfg.strategy.name}-{cfg.gpus}dev",
        "runner.version": runner.__version__,
        # The UI's Source column: the command that made the run.
        "mlflow.source.name": redact(command_line()),
        "mlflow.source.type": "LOCAL",
    }
    if cfg.sweep.repeats > 1:  # which run of its combination this is (sweep.repeats)
        tags["sweep.round"] = f"{cfg.sweep.round + 1} of {cfg.sweep.repeats}"
    commit = _git_commit()
    return {**tags, **({"mlflow.source.git.commit": commit} if commit else {})}


def process_tags() -> dict[str, str]:
    """Which process writes the run (its host, pid and start): how a later start of the same config, and the
    checkpoint folder's claim, tell a dead run from a live one (stale.process_alive)."""
    pid = os.getpid()
    return {"runner.host": socket.gethostname(), "runner.pid": str(pid),
            **({"runner.started": since} if (since := started(pid)) else {})}


def sweep_tags(digest: str) -> dict[str, str]:
    """The config hash (what resume matches on) and, inside a sweep, the parent run."""
    parent = parent_run_id()
    return {"config_hash": digest, **({"mlflow.parentRunId": parent} if parent else {})}


