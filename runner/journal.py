"""A run's MLflow writes kept locally first, so a tracking store that goes away mid-run loses nothing.

Every write a run makes (params, tags, metric points, text artifacts, files, its final status) is appended to a
journal, a JSON-lines file in the run's output folder, before it is sent; once the store has taken it, an
acknowledgement line follows. While the store cannot be written (a tracking server down, a full disk), training
goes on and the writes pile up in the journal; the run sends them when the store answers again, at the latest when
it ends. If the store is still gone then, `runner replay <journal>` sends the rest later, and the run ends in the
store with its real status and every metric.

MLflow's asynchronous logging is not used for this: the run must know which writes the store acknowledged, in
order, to resume from there after a failure or in another process.

    {"journal": 1, "uri": "http://...", "run_id": "...", "experiment": "..."}    the header
    {"seq": 3, "op": "metrics", "args": {"points": [["train_loss", 0.5, 1764000000000, 50]]}}
    {"ack": 3}
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
NAME = "mlflow_journal.jsonl"


class Journal:
    """The writes of one run, in order, with the store's acknowledgements; in memory and, given a path, on disk.

    A journal that cannot be written (its disk full too) keeps its entries in memory and says so once.
    """

    def __init__(self, path: Path | None, header: dict[str, Any]):
        self.path, self.header = path, header
        self.entries: list[dict[str, Any]] = []
        self.acked = 0  # every entry up to this seq is in the store
        self._write(header)

    @classmethod
    def load(cls, path: Path) -> Journal:
        """A journal file as written by a run (entries and acknowledgements)."""
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        journal = cls.__new__(cls)
        journal.path, journal.header = path, lines[0]
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
            log.warning("the MLflow journal %s cannot be written (%s); its writes are kept in memory only", self.path, e)
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
        """Delete the file once the store has everything."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


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


def main(argv: list[str]) -> int:
    """`runner replay JOURNAL [--tracking-uri URI]`: send what a run could not write to its store."""
    import argparse

    parser = argparse.ArgumentParser(prog="runner replay", description=main.__doc__)
    parser.add_argument("journal", type=Path, help=f"a run's {NAME} (in its output folder)")
    parser.add_argument("--tracking-uri", default=None, help="the store to send to (default: the run's own)")
    args = parser.parse_args(argv)
    try:
        count, run_id = replay(args.journal, args.tracking_uri)
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"error: {args.journal} is not a readable run journal ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the store's failure, whatever it is, is the one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"error: the store refused the replay ({type(e).__name__}: {first}); nothing acknowledged is sent twice, "
              "run the same command again once it works", file=sys.stderr)
        return 2
    print(f"replayed {count} writes of run {run_id}")
    return 0
