"""The cluster of a multi-worker run, read from TF_CONFIG or from the config keys that produce it (no TensorFlow).

TensorFlow's MultiWorkerMirroredStrategy reads the environment variable TF_CONFIG:

    {"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}

`strategy.workers` (the host:port list) with `strategy.task_index` writes it for you; with `strategy.workers`
empty the runner uses TF_CONFIG as the launcher set it (a cluster scheduler, or a hand-written export). Worker 0
is the chief (unless the cluster names a separate `chief` task): only the chief logs to MLflow.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from runner.errors import ConfigError

ENV = "TF_CONFIG"
TASK_TYPES = ("chief", "worker")
# A task's address: a host name or IPv4 address (letters, digits, '.', '-', '_'), or an IPv6 address in brackets
# ([::1]), then ':' and the port.
ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+(%[\w.-]+)?\]):(?P<port>[0-9]+)")
ADDRESS_FORM = ("host:port (a host name or IP address without spaces or ':', or an IPv6 address in brackets as "
                "[::1]:2222; a port from 1 to 65535)")


@dataclass(frozen=True)
class Cluster:
    """Every task's address and this process's place among them."""

    tasks: dict[str, list[str]]  # task type -> addresses, e.g. {"worker": ["127.0.0.1:2222", ...]}
    task_type: str
    task_index: int

    @property
    def count(self) -> int:
        """Processes training together (chief included)."""
        return sum(len(self.tasks.get(t, [])) for t in TASK_TYPES)

    @property
    def is_chief(self) -> bool:
        """The one task that logs and writes the final artifacts: `chief` if there is one, else worker 0."""
        if "chief" in self.tasks:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def name(self) -> str:
        return f"{self.task_type}{self.task_index}"

    @property
    def hosts(self) -> int:
        """Machines its training tasks are on (their addresses' host parts): each with its own processors."""
        return len({address.rsplit(":", 1)[0] for t in TASK_TYPES for address in self.tasks.get(t, [])})

    def tf_config(self) -> str:
        return json.dumps({"cluster": self.tasks, "task": {"type": self.task_type, "index": self.task_index}})


def parse(text: str, source: str = ENV) -> Cluster:
    """A TF_CONFIG JSON string as a Cluster, or a ConfigError naming what is wrong with it."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source} is not valid JSON ({e.msg} at character {e.pos}): {text[:80]!r}") from None
    if not (isinstance(spec, dict) and isinstance(spec.get("cluster"), dict) and isinstance(spec.get("task"), dict)):
        raise ConfigError(f'{source} needs "cluster" and "task" objects, got: {text[:80]!r}')
    tasks = {t: v for t, v in spec["cluster"].items() if t in TASK_TYPES}
    if not tasks.get("worker") and not tasks.get("chief"):
        raise ConfigError(f'{source}: "cluster" must list "worker" addresses (host:port), got: {text[:80]!r}')
    for addresses in tasks.values():
        if not isinstance(addresses, list) or not all(isinstance(a, str) and ":" in a for a in addresses):
            raise ConfigError(f"{source}: cluster addresses must be a list of host:port strings, got {addresses!r}")
    _check_addresses([a for addresses in tasks.values() for a in addresses], source)
    task_type, index = spec["task"].get("type"), spec["task"].get("index")
    if task_type not in tasks:
        raise ConfigError(f"{source}: task type {task_type!r} is not in the cluster; choose one of: "
                          f"{', '.join(tasks)}")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ConfigError(f"{source}: task index {json.dumps(index)} is not an integer; give the task's place in "
                          f"the {task_type} list as a number from 0 to {len(tasks[task_type]) - 1}")
    if not 0 <= index < len(tasks[task_type]):
        raise ConfigError(f"{source}: task index {index!r} is out of range; {task_type} has "
                          f"{len(tasks[task_type])} tasks")
    return Cluster(tasks, task_type, index)


def _check_addresses(addresses: list[str], source: str) -> None:
    """Each task's own server: host:port with a host (ADDRESS) and a port from 1 to 65535, no address twice (the
    second server could never start, and the first would wait for it until strategy.peer_timeout; so would every
    task for a peer at an address gRPC cannot resolve, such as ':2222' or 'a b:2222')."""
    for address in addresses:
        port = address.rsplit(":", 1)[1]
        if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"{source}: {address!r} has no port from 1 to 65535; give every task as host:port")
        if not ADDRESS.fullmatch(address):
            raise ConfigError(f"{source}: {address!r} is not an address; give every task as {ADDRESS_FORM}")
    twice = sorted({a for a in addresses if addresses.count(a) > 1})
    if twice:
        raise ConfigError(f"{source}: {', '.join(twice)} is listed more than once; every task needs its own "
                          "host:port (on one machine, a port each)")


def check_own_port(spec: Cluster) -> None:
    """A ConfigError when this task's port is taken on this machine: its TensorFlow server would fail to start (an
    `UnknownError: Could not start gRPC server` traceback that names no port). The server binds the port on every
    interface whatever host the cluster names (see multi_worker.exposure), so the port is tried the way gRPC binds
    it: the wildcard address (IPv6's, which takes IPv4's too, where the machine has IPv6), SO_REUSEADDR (a port
    whose last connections linger in TIME_WAIT is free), no SO_REUSEPORT (TensorFlow turns it off); closed at once."""
    address = spec.tasks[spec.task_type][spec.task_index]
    port = int(address.rsplit(":", 1)[1])
    try:
        probe, wildcard = socket.socket(socket.AF_INET6, socket.SOCK_STREAM), "::"
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    except OSError:  # no IPv6 on this machine
        probe, wildcard = socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((wildcard, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:  # anything else (a port below 1024 without root): TensorFlow's to say
                return
            raise ConfigError(f"{spec.name}'s address {address}: port {port} of this machine is in use by another "
                              "process (TensorFlow's server binds it on every interface); stop that process, or give "
                              f"{spec.name} a free port") from None


def from_options(workers: list[str], task_index: int, strategy: str) -> Cluster:
    """The cluster of `strategy.workers` / `strategy.task_index`, else of TF_CONFIG when `workers` is empty; a
    ConfigError when they are missing or malformed."""
    if workers:
        text = json.dumps({"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": task_index}})
        return parse(text, "strategy.workers/strategy.task_index")
    if not os.environ.get(ENV):
        raise ConfigError(
            f"strategy={strategy} needs the cluster: set strategy.workers=[host:port,...] and strategy.task_index, "
            f"or the {ENV} environment variable"
        )
    return parse(os.environ[ENV])


def worker_suffix(_root_: Any) -> str:
    """`-worker1` etc. for a multi-worker task, '' otherwise: the `${worker_suffix:}` in hydra.run.dir, so each
    worker started on the same machine in the same second still gets its own output folder and log."""
    strategy = _root_.get("strategy") or {}
    if "workers" not in strategy:  # a strategy of one process
        return ""
    try:
        spec = from_options(list(strategy.get("workers") or []), int(strategy.get("task_index") or 0),
                            str(strategy.get("name")))
    except (ConfigError, ValueError, TypeError):  # a malformed cluster: validation reports it once the job starts
        return ""
    return f"-{spec.name}"


def register_resolver() -> None:
    """Make `${worker_suffix:}` available to the configs (before Hydra composes them)."""
    if not OmegaConf.has_resolver("worker_suffix"):
        OmegaConf.register_new_resolver("worker_suffix", worker_suffix)
