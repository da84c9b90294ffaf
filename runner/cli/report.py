"""`runner report` / `python -m runner.cli.report`: compare runs from MLflow in a table, a verdict per model and
three plots (what they show: runner/report/table.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from runner.cli.arguments import Parser, tolerance
from runner.report import verdict
from runner.report.table import ReportError, report, select


def parser() -> Parser:
    p = Parser(prog="runner report", description="Compare runs from MLflow: a table, one verdict "
                                "line per model, and plots. With no arguments: the newest sweep in the store.")
    p.add_argument("--experiment", default=None, help="the experiment to report (default: the one of the newest "
                   "sweep, else the newest experiment)")
    p.add_argument("--parent", default=None, help="a sweep's parent run id, or a unique prefix of it (the 8 "
                   "characters logs show): report its children")
    p.add_argument("--latest-sweep", action="store_true", help="report the newest sweep of --experiment (an error "
                   "if it has none)")
    p.add_argument("--filter", default="", help="an MLflow search filter, e.g. \"tags.model = 'mlp'\"")
    p.add_argument("--tracking-uri", default=None, help="the store (default: $MLFLOW_TRACKING_URI, else "
                   "sqlite:///mlflow.db in this folder)")
    p.add_argument("--out", default="report", help="folder for report.md and the PNG plots (default: report)")
    p.add_argument("--accuracy-tolerance", type=tolerance, default=verdict.Tolerance.accuracy,
                   help="'learns the same': the largest |Δ test accuracy| to the 1-device run (default: %(default)s)")
    p.add_argument("--loss-tolerance", type=tolerance, default=verdict.Tolerance.loss,
                   help="'learns the same': the largest relative |Δ test loss| (default: %(default)s)")
    return p


def _missing(uri: str) -> bool:
    """Whether `uri` names a store on this host that is not there: a sqlite file or a folder (MLflow's file store,
    `file:///...` or a plain path) that does not exist."""
    if uri.startswith("sqlite:///"):
        return not Path(uri.removeprefix("sqlite:///")).is_file()
    parsed = urlparse(uri)
    return parsed.scheme in ("", "file") and not Path(parsed.path).exists()


def main(argv: list[str] | None = None) -> int:
    """Command line of the report; one `error:` line and status 2 when there is nothing to report."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from runner.errors import one_line
    from runner.paths import unwritable
    from runner.tracking import resolve_uri
    from runner.tracking.redact import redact

    args = parser().parse_args(argv)
    if problem := unwritable(Path(args.out)):  # said before the store is read, not as a traceback after it
        print(f"error: --out {args.out} cannot hold the report: {problem}; choose a writable folder", file=sys.stderr)
        return 2
    # the given store (not "a folder (MLflow's file store)": there is nothing there), else the default MLflow would make
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or resolve_uri(None)
    if _missing(uri):
        print(f"error: no store at {redact(uri)}: nothing to report; give the store your runs wrote (--tracking-uri, "
              "or run from their folder)", file=sys.stderr)
        return 2
    uri = resolve_uri(uri)
    client = MlflowClient(uri)
    try:
        selection = select(client, args.experiment, args.parent, args.latest_sweep)
        made = report(client, selection, args.filter, Path(args.out),
                      verdict.Tolerance(args.accuracy_tolerance, args.loss_tolerance))
    except ReportError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)  # it names the store
        return 2
    except MlflowException as e:  # a server that does not answer, a database that refuses
        print(f"error: the store {redact(uri)} cannot be read: {redact(one_line(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # the folder, made or written (e.g. under /proc, a full disk)
        print(f"error: --out {args.out} cannot hold the report: {e.strerror or e}; choose a writable folder",
              file=sys.stderr)
        return 2
    print(selection.said)
    print(made.text)
    print("\n".join(["", *made.lines]))
    plotted = ", ".join(str(p) for p in made.paths) or "none (no run measured a rate or a test score)"
    print(f"\nplots: {plotted}{made.logged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
