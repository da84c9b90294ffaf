"""`runner report` / `python -m runner.report`: compare runs from MLflow in a table and two plots.

    runner report [--experiment NAME] [--parent RUN_ID | --latest-sweep] [--filter "tags.model = 'mlp'"]
                  [--tracking-uri URI] [--out DIR]

The table has one row per run: model, pipeline, strategy, device count and kind, batch scaling mode (strong: the
global batch fixed as devices grow; weak: the per-device batch fixed), images/s ± standard error, speedup and
efficiency against the 1-device run of the same model, pipeline, strategy and scaling mode (else of the same model
under `single`), test accuracy, wall time and status. The plots are throughput against device count per strategy
with the ideal linear line, and test accuracy per combination. With a sweep's parent run, table and plots are also
logged as artifacts of that parent, so they show in the MLflow UI.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One run, as the report shows it."""

    run_id: str
    model: str
    pipeline: str
    strategy: str
    devices: int
    kind: str
    simulated: bool
    images_per_sec: float
    stderr: float
    accuracy: float
    wall_seconds: float
    status: str
    scaling: str = "strong"
    host_only: bool = False  # gpus=0: the host CPU alone, the baseline beside the device runs
    achieved_gflops: float = math.nan
    mfu: float = math.nan
    speedup: float = math.nan
    efficiency: float = math.nan

    @property
    def device_label(self) -> str:
        if self.host_only:
            return "host CPU (gpus=0)"
        return f"{self.devices} {self.kind}{' (sim)' if self.simulated else ''}"


def _row(run: Any) -> Row:
    tags, m = run.data.tags, run.data.metrics
    return Row(
        run.info.run_id, tags.get("model", "?"), tags.get("pipeline", "?"), tags.get("strategy", "?"),
        int(tags.get("devices.count", 0)), tags.get("devices.kind", "?"), tags.get("devices.simulated") == "true",
        m.get("images_per_sec", math.nan), m.get("images_per_sec_stderr", math.nan), m.get("test_accuracy", math.nan),
        m.get("wall_seconds", math.nan), run.info.status, tags.get("batch_scaling", "strong"),
        tags.get("devices.requested") == "0", m.get("achieved_gflops", math.nan), m.get("mfu", math.nan),
    )


def fetch(uri: str, experiment: str, parent: str | None, filter_string: str) -> list[Row]:
    """The runs to report (a sweep parent's children, or all non-parent runs of the experiment)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"error: no experiment {experiment!r} in {uri}")
    clauses = [filter_string] if filter_string else []
    if parent:
        clauses.append(f"tags.mlflow.parentRunId = '{parent}'")
    runs = client.search_runs([exp.experiment_id], " and ".join(clauses), max_results=5000)
    return add_speedups([_row(r) for r in runs if r.data.tags.get("sweep") != "parent"])


def latest_sweep(uri: str, experiment: str) -> str | None:
    """The newest sweep parent run of the experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    found = client.search_runs(
        [exp.experiment_id], "tags.sweep = 'parent'", order_by=["start_time DESC"], max_results=1
    )
    return found[0].info.run_id if found else None


def _baseline(row: Row, finished: list[Row]) -> Row | None:
    key = (row.model, row.pipeline, row.strategy, row.scaling, 1)
    same = [r for r in finished if (r.model, r.pipeline, r.strategy, r.scaling, r.devices) == key]
    single_key = (row.model, "single", row.scaling, 1)
    single = [r for r in finished if (r.model, r.strategy, r.scaling, r.devices) == single_key]
    return (same or single or [None])[0]


def add_speedups(rows: list[Row]) -> list[Row]:
    """Speedup = images/s over the baseline's; efficiency = speedup / devices."""
    finished = [r for r in rows if r.status == "FINISHED" and not math.isnan(r.images_per_sec)]
    for row in rows:
        base = _baseline(row, finished)
        if base is not None and row.status == "FINISHED" and row.devices:
            row.speedup = row.images_per_sec / base.images_per_sec
            row.efficiency = row.speedup / row.devices
    return sorted(rows, key=lambda r: (r.model, r.pipeline, r.strategy, r.scaling, r.devices))


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def table(rows: list[Row]) -> str:
    """The comparison as a Markdown table."""
    head = ("| model | pipeline | strategy | devices | scaling | images/s | ± stderr | speedup | efficiency "
            "| GFLOP/s | MFU | test acc | wall s | status |\n" + "|---" * 14 + "|")
    lines = [
        f"| {r.model} | {r.pipeline} | {r.strategy} | {r.device_label} | {r.scaling} "
        f"| {_fmt(r.images_per_sec, ',.0f')} "
        f"| {_fmt(r.stderr, ',.0f')} | {_fmt(r.speedup, '.2f')} | {_fmt(r.efficiency, '.2f')} "
        f"| {_fmt(r.achieved_gflops, '.1f')} | {_fmt(r.mfu, '.1%')} "
        f"| {_fmt(r.accuracy, '.4f')} | {_fmt(r.wall_seconds, '.1f')} | {r.status} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def plot_throughput(rows: list[Row], path: Path) -> None:
    """Images/s against device count, one line per model/pipeline/strategy, with the ideal linear line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.status == "FINISHED" and not math.isnan(r.images_per_sec):
            groups.setdefault((r.model, r.pipeline, r.strategy), []).append(r)
    for (model, pipeline, strategy), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r.devices)
        xs, ys = [r.devices for r in rs], [r.images_per_sec for r in rs]
        (line,) = ax.plot(xs, ys, "o-", label=f"{model}/{pipeline}/{strategy}")
        base = [r for r in rs if r.devices == 1]
        if base and len(rs) > 1:
            ax.plot(xs, [base[0].images_per_sec * x for x in xs], ":", color=line.get_color(), alpha=0.6)
    ax.set(xlabel="devices", ylabel="images/s", title="Throughput vs devices (dotted: ideal linear scaling)")
    ax.set_xticks(sorted({r.devices for rs in groups.values() for r in rs}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_accuracy(rows: list[Row], path: Path) -> None:
    """Test accuracy per combination, as horizontal bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.status == "FINISHED" and not math.isnan(r.accuracy)]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.3 * len(done) + 1)))
    labels = [f"{r.model}/{r.pipeline}/{r.strategy}/{r.device_label}" for r in done]
    ax.barh(labels, [r.accuracy for r in done], color="tab:blue")
    ax.set(xlabel="test accuracy", xlim=(0, 1), title="Test accuracy per combination")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(uri: str, experiment: str, parent: str | None, filter_string: str, out: Path) -> tuple[str, list[Path]]:
    """Build the table and plots; log them to the parent run if there is one. Returns (table, plot paths)."""
    rows = fetch(uri, experiment, parent, filter_string)
    out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    (out / "report.md").write_text(text + "\n")
    plots = [out / "throughput.png", out / "accuracy.png"]
    plot_throughput(rows, plots[0])
    plot_accuracy(rows, plots[1])
    if parent:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        for path in [out / "report.md", *plots]:
            client.log_artifact(parent, str(path), "report")
    return text, plots


def main(argv: list[str] | None = None) -> int:
    """Command line of the report."""
    from runner.tracking import resolve_uri

    parser = argparse.ArgumentParser(prog="runner report", description="Compare runs from MLflow.")
    parser.add_argument("--experiment", default="runner")
    parser.add_argument("--parent", default=None, help="a sweep's parent run id: report its children")
    parser.add_argument("--latest-sweep", action="store_true", help="report the newest sweep of the experiment")
    parser.add_argument("--filter", default="", help="an MLflow search filter, e.g. \"tags.model = 'mlp'\"")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--out", default="report", help="folder for report.md and the PNG plots")
    args = parser.parse_args(argv)
    uri = resolve_uri(args.tracking_uri)
    parent = args.parent or (latest_sweep(uri, args.experiment) if args.latest_sweep else None)
    text, plots = report(uri, args.experiment, parent, args.filter, Path(args.out))
    print(text)
    print(f"\nplots: {', '.join(str(p) for p in plots)}" + (f"; logged to parent run {parent}" if parent else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
