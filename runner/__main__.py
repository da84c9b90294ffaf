"""Command line: `python -m runner [overrides]` or `runner [overrides]`; a thin wrapper around `run(cfg)`.

Errors a user can fix (a bad config value, missing data, impossible devices) print one line, `error: ...`, and exit
with status 2; set RUNNER_TRACEBACK=1 (or HYDRA_FULL_ERROR=1) to see the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from runner.config import CONF_DIR, GROUPS, HYDRA_GROUPS, allowed, group_options
from runner.errors import UserError

log = logging.getLogger("runner")
USER_ERROR_EXIT = 2
# Hydra launcher settings that Hydra itself does not check before the sweep starts.
HYDRA_RULES = {
    "hydra.launcher.n_jobs": (lambda v: isinstance(v, int) and v != 0 and v >= -(os.cpu_count() or 1),
                              "a positive number of parallel jobs, or -1 for one per CPU"),
}


def _fail(message: str) -> None:
    from runner.redact import redact

    print(f"error: {redact(message)}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT)


def _show_traceback() -> bool:
    return os.environ.get("RUNNER_TRACEBACK", "") not in ("", "0")


def config_dirs(args: list[str]) -> tuple[Path, ...]:
    """The user's config directories on the command line: `--config-dir D` / `-cd D` and file:// entries of
    `hydra.searchpath=[...]` (where their own component YAMLs live)."""
    dirs = []
    for flag, value in zip(args, args[1:] + [""]):
        if flag in ("--config-dir", "-cd"):
            dirs.append(value)
        elif flag.startswith("--config-dir="):
            dirs.append(flag.split("=", 1)[1])
        elif flag.startswith("hydra.searchpath="):
            entries = flag.split("=", 1)[1].strip("[]").split(",")
            dirs += [e.strip().removeprefix("file://") for e in entries if not e.strip().startswith("pkg://")]
    return tuple(Path(d).expanduser() for d in dirs if d)


def check_launch_dir(args: list[str]) -> str | None:
    """Hydra writes each run's folder under the launch directory (outputs/, multirun/) unless hydra.run.dir /
    hydra.sweep.dir say otherwise, and fails with a traceback when it cannot: say so in one line first."""
    from runner.paths import unwritable

    if any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in args):
        return None
    problem = unwritable(Path.cwd())
    if problem:
        return (f"the launch directory cannot be written ({problem}): each run writes its folder (outputs/) and, by "
                "default, its store (mlflow.db) there; run from a writable folder, or set hydra.run.dir=/writable/dir "
                "and mlflow.tracking_uri")
    return None


def check_group_overrides(args: list[str]) -> str | None:
    """Find a command-line choice of a config group that does not exist (`model=foo`, `-m model=mlp,foo`).

    Hydra would report it as a multi-line search-path dump; this gives one line with the allowed options. Parsing
    uses Hydra's own override grammar; anything it cannot parse is left for Hydra to report.

    Returns:
        The error message, or None when every group choice exists.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, extra = OverridesParser.create(), config_dirs(args)
    for arg in args:
        if arg.startswith("-"):
            continue
        try:
            override = parser.parse_override(arg)
        except Exception:  # not an override (e.g. the value of --config-name): Hydra reports it if it matters
            continue
        group = override.key_or_group
        if group in HYDRA_RULES and not override.is_delete():
            ok, wanted = HYDRA_RULES[group]
            if not ok(override.value()):
                return f"{group}={override.value()} is not allowed; expected {wanted}"
        if group not in (*GROUPS, *HYDRA_GROUPS) or override.is_delete():
            continue
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        allowed = group_options(group, extra)
        for value in values:
            if value is not None and str(value) not in allowed:
                return f"{group}={value} is not an option of group '{group}'; choose one of: {', '.join(allowed)}"
    return None


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> Any:
    """Hydra entry: run one job and print its result (in a multirun: start it in a fresh process)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from runner import sweep, tracking
    from runner.experiment import run

    if HydraConfig.get().mode == RunMode.MULTIRUN and not tracking.is_sweep_child():
        return sweep.run_isolated(cfg)  # the job runs in a fresh process; the sweep goes on if it fails
    try:
        result = run(cfg)
    except UserError as e:
        # Exiting here, inside the job, keeps Hydra from adding its own "Error executing job" line.
        _report(e)
    rate = f"{result['images_per_sec']:,.0f} images/s" if "images_per_sec" in result else "images/s not measured"
    if "time_to_accuracy_seconds" in result:
        rate += (f"  target {result['target_accuracy']:.2f} reached in {result['time_to_accuracy_seconds']:.1f} s "
                 f"({result['steps_to_accuracy']:.0f} steps)")
    elif "target_accuracy" in result:
        rate += f"  target {result['target_accuracy']:.2f} not reached"
    if result["run_id"]:
        from runner import ui

        print(ui.where_to_look(result["tracking_uri"], result["experiment_id"]))
    print(
        f"test accuracy {result['test_accuracy']:.4f}  test loss {result['test_loss']:.4f}  "
        f"{rate}  ({result['steps']:.0f} steps, "
        f"{result['wall_seconds']:.1f} s)  "
        + (f"mlflow run {result['run_id']}" if result["run_id"] else "not logged here (the chief worker logs)")
    )
    return result


def one_line(e: BaseException) -> str:
    """An exception as one line: the first lines of its first paragraph (Hydra's messages run on for pages).

    Hydra wraps a value the schema refuses ("Error merging override gpus=abc") around OmegaConf's reason, which is
    added from the cause.
    """
    paragraph = str(e).strip().split("\n\n")[0].splitlines()[:2]
    text = " ".join(line.strip() for line in paragraph) or type(e).__name__
    if text.startswith("Could not override '"):
        return _unknown_key(text.split("'")[1]) or text
    cause = e.__cause__ or e.__context__
    if text.startswith("Error merging override") and cause is not None and str(cause).strip():
        text += f": {str(cause).strip().splitlines()[0]}"
        key = text.removeprefix("Error merging override ").split("=", 1)[0]
        if allowed(key):
            text += f"; {key} must be {allowed(key).removeprefix('expected ')}"
    return text


def _unknown_key(key: str) -> str | None:
    """For a key the chosen component does not have (`strategy.cross_device_ops` with strategy=single): which
    components of the group have it, instead of Hydra's hint to append it."""
    from runner.config import COMPONENTS
    from runner.registry import fields

    group, _, name = key.partition(".")
    if group not in COMPONENTS or not name or "." in name:
        return None
    registry = COMPONENTS[group]
    owners = [n for n in registry.names() if name in fields(registry.get(n))]
    if not owners:
        return f"{key} is not an option of any {group}; `python -m runner --cfg job` shows the chosen {group}'s options"
    return f"{key} is not an option of the chosen {group}; it belongs to {group}={', '.join(owners)} (choose one)"


def _log_to_files(message: str) -> None:
    """Put the error into Hydra's job log file too, without printing it a second time on the console."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _report(e: BaseException) -> None:
    """Report a user error in one line and exit 2, or re-raise it when a traceback was asked for."""
    if _show_traceback():
        raise e
    message = one_line(e)
    _log_to_files(message)
    _fail(message)


def _exit_now(code: int) -> None:
    """Exit once everything is recorded, skipping the interpreter's teardown when TensorFlow is loaded: destroying
    its objects took up to a minute after 8-device runs of the sharded pipeline (each input iterator's destructor
    waits on its background threads) and does nothing a user needs. Logs and output are flushed first."""
    if "tensorflow" not in sys.modules:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cli() -> None:
    """Console-script entry: check group choices in one line, then hand over to Hydra.

    Hydra normally prints errors itself, over several lines; with HYDRA_FULL_ERROR set it re-raises them
    instead, so that this function can report the ones a user can fix in one line.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    os.environ.setdefault("RUNNER_TRACEBACK", os.environ.get("HYDRA_FULL_ERROR", ""))
    sys.argv[0] = "runner"  # argparse's and Hydra's messages name the command, not __main__.py
    os.environ["HYDRA_FULL_ERROR"] = "1"
    from runner import signals, sweep, tracking

    if sys.argv[1:2] in (["--version"], ["-V"]):
        import runner

        print(f"runner {runner.__version__} ({runner.DISTRIBUTION})")
        sys.exit(0)
    if sys.argv[1:2] == ["report"]:
        from runner.report import main as report_main

        sys.exit(report_main(sys.argv[2:]))
    if sys.argv[1:2] == ["check"]:
        from runner.check import main as check_main

        sys.exit(check_main(sys.argv[2:]))
    if sys.argv[1:2] == ["replay"]:
        from runner.journal import main as replay_main

        sys.exit(replay_main(sys.argv[2:]))
    tracking.bound_http_retries()
    error = check_group_overrides(sys.argv[1:]) or check_launch_dir(sys.argv[1:])
    if error:
        _fail(error)
    signals.install()
    try:
        main()
        _exit_now(1 if sweep.failures else 0)
    except (KeyboardInterrupt, signals.Terminated) as e:
        sweep.close_open_parent("KILLED")
        print("interrupted" if isinstance(e, KeyboardInterrupt) else f"terminated ({e})", file=sys.stderr)
        _exit_now(130 if isinstance(e, KeyboardInterrupt) else 143)
    except (UserError, HydraException, OmegaConfBaseException) as e:
        sweep.close_open_parent("FAILED")
        _report(e)
    except Exception:
        sweep.close_open_parent("FAILED")
        raise


if __name__ == "__main__":
    cli()
