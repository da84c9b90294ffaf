"""A run's MLflow writes kept locally first, so a tracking store that goes away mid-run loses nothing.

Every write a run makes (params, tags, metric points, text artifacts, files, its final status) is appended to a
journal, a JSON-lines file in the run's output folder, before it is sent; once the store has taken it, an
acknowledgement line follows. While the store cannot be written, training goes on and the run sends the writes when
it answers again; if it is still gone at the end, `runner replay <journal>` sends the rest later. (MLflow's
asynchronous logging does not say which writes the store acknowledged, in order, to resume from there.)

    {"journal": 1, "uri": "http://...", "run_id": "...", "experiment": "..."}    the header
    {"seq": 3, "op": "metrics", "args": {"points": [["train_loss", 0.5, 1764000000000, 50]]}}
    {"ack": 3}
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)
NAME = "mlflow_journal.jsonl"


class Journal:
    """The writes of one run, in order, with the store's acknowledgements; in memory and, given a path, on disk (a
    file that cannot be written, its disk full too, is said once and the entries stay in memory)."""

    def __init__(self, path: Path | None, header: dict[str, Any],
                 on_error: Callable[[OSError], None] | None = None):
        self.path, self.header, self.on_error = path, header, on_error
        self.file = path  # kept when writing stops: a partial file is removed with the rest
        self.entries: list[dict[str, Any]] = []
        self.acked = 0  # every entry up to this seq is in the store
        self._write(header)

    @classmethod
    def load(cls, path: Path) -> Journal:
        """A journal file as written by a run (entries and acknowledgements)."""
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        journal = cls.__new__(cls)
        journal.path, journal.file, journal.header, journal.on_error = path, path, lines[0], None
        journal.entries = [e for e in lines[1:] if "seq" in e]
        journal.acked = max([e["ack"] for e in lines[1:] if "ack" in e], default=0)
        return journal

    def _write(self, line: dict[str, Any]) -> None:
        if self.path is None:
            return
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as e:
            if self.on_error is not None:
                self.on_error(e)
            else:
                log.warning("the MLflow journal %s cannot be written (%s); its writes are kept in memory only",
                            self.path, e)
            self.path = None

    def append(self, op: str, **args: Any) -> None:
        entry = {"seq": len(self.entries) + 1, "op": op, "args": args}
        self.entries.append(entry)
        self._write(entry)

    def ack(self, seq: int) -> None:
        self.acked = seq
        self._write({"ack": seq})

    def pending(self) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["seq"] > self.acked]

    def remove(self) -> None:
        """Delete the file once the store has everything (a file left incomplete by a full disk too)."""
        if self.file is not None:
            self.file.unlink(missing_ok=True)


def send(client: Any, run_id: str, entry: dict[str, Any]) -> None:
    """Write one journal entry to the store through `client` (an MlflowClient)."""
    from mlflow.entities import Metric, Param, RunTag

    op, args = entry["op"], entry["args"]
    if op == "params":
        client.log_batch(run_id, params=[Param(k, v) for k, v in args["params"].items()])
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in args["tags"].items()])
    elif op == "metrics":
        points = [Metric(k, v, t, s) for k, v, t, s in args["points"]]
        for i in range(0, len(points), 1000):  # MLflow takes at most 1000 metrics per batch
            client.log_batch(run_id, metrics=points[i : i + 1000])
    elif op == "text":
        client.log_text(run_id, args["text"], args["name"])
    elif op == "file":
        if Path(args["path"]).is_file():
            client.log_artifact(run_id, args["path"])
    elif op == "dataset":
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(args["name"], args["digest"], "local", json.dumps({"uri": args["source"]}),
                          profile=json.dumps(args["profile"]))
        client.log_inputs(run_id, datasets=[DatasetInput(dataset, [InputTag("mlflow.data.context", args["context"])])])
    elif op == "end":
        client.set_terminated(run_id, args["status"])
    else:
        raise ValueError(f"unknown journal entry {op!r}")


def replay(path: Path, uri: str | None = None) -> tuple[int, str]:
    """Send a journal's unacknowledged writes to its run's store (or `uri`); returns (how many, the run id)."""
    from mlflow.tracking import MlflowClient

    journal = Journal.load(path)
    if uri is None and "***" in journal.header["uri"]:
        raise ValueError(f"the journal's store {journal.header['uri']} had credentials, masked here: pass "
                         "--tracking-uri (and the credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD)")
    client, run_id = MlflowClient(uri or journal.header["uri"]), journal.header["run_id"]
    pending = journal.pending()
    for entry in pending:
        send(client, run_id, entry)
        journal.ack(entry["seq"])
    return len(pending), run_id
