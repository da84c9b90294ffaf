"""Command line: `python -m runner [overrides]` or `runner [overrides]`; a thin wrapper around `run(cfg)`.

Errors a user can fix (a bad config value, missing data, impossible devices) print one line, `error: ...`, and exit
with status 2; set RUNNER_TRACEBACK=1 (or HYDRA_FULL_ERROR=1) to see the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn

import hydra
from omegaconf import DictConfig

from runner.cli.overrides import explain, preflight
from runner.config import CONF_DIR
from runner.errors import UserError
from runner.tasks import LOSS, METRICS, TASKS

log = logging.getLogger("runner")
USER_ERROR_EXIT = 2


def _fail(message: str) -> NoReturn:
    from runner.tracking.redact import redact

    print(f"error: {redact(message)}", file=sys.stderr)
    sys.exit(USER_ERROR_EXIT)


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
    if result["run_id"]:
        from runner.tracking import ui

        print(ui.where_to_look(result["tracking_uri"], result["experiment_id"]))
    print(result_line(result))
    return result


def result_line(result: dict) -> str:
    """A finished run's last line: its held-out scores as its task says them (runner/tasks.py: accuracy, a language
    model's loss per token, a click model's AUC), its rate, its target and its MLflow run."""
    unit = result["unit"]
    rate = f"{result[f'{unit}_per_sec']:,.0f} {unit}/s" if f"{unit}_per_sec" in result else f"{unit}/s not measured"
    for metric in METRICS.values():
        seconds, steps, target = f"time_to_{metric.name}_seconds", f"steps_to_{metric.name}", f"target_{metric.name}"
        if {seconds, steps, target} & result.keys():  # steps without seconds: resumed without the earlier part's time
            said = "" if metric.name == "accuracy" else f"{metric.said} "
            rate += f"  target {said}{metric.level(result[target])} " + (
                f"reached in {result[seconds]:.1f} s ({result[steps]:.0f} steps)" if seconds in result else
                f"reached in {result[steps]:.0f} steps (time not known)" if steps in result else "not reached")
    task = TASKS[result.get("task", "class")]  # its test figures (`test_<metric>`) as its task says them
    said = task.headline or tuple((m.name, f"test {m.said} {{:.4f}}") for m in (task.score, LOSS))
    scores = "  ".join(form.format(result[f"test_{name}"]) for name, form in said if f"test_{name}" in result)
    where = f"mlflow run {result['run_id']}" if result["run_id"] else "not logged here (the chief worker logs)"
    return f"{scores}  {rate}  ({result['steps']:.0f} steps, {result['wall_seconds']:.1f} s wall)  {where}"


def _report(e: BaseException) -> NoReturn:
    """Report a user error in one line and exit 2, or re-raise it when a traceback was asked for."""
    if os.environ.get("RUNNER_TRACEBACK", "") not in ("", "0"):
        raise e
    message = explain(e)
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:  # Hydra's job log file too, not printed a second time
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
    _fail(message)


def _exit_now(code: int) -> None:
    """Exit once everything is recorded (logs and output flushed), skipping the interpreter's teardown when
    TensorFlow is loaded: destroying its input iterators can wait long on their threads, for nothing a user needs."""
    if "tensorflow" not in sys.modules:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


SUBCOMMANDS = ("report", "check", "predict", "replay")  # runner.cli.<name>.main(argv) -> exit status


def subcommand(name: str, argv: list[str]) -> int:
    """`runner NAME ARGS`: the subcommand's own exit status, or 130 on Ctrl-C; what it does not catch itself (a
    store's refusal, a config Hydra cannot compose) is one `error:` line and SystemExit(2)."""
    import importlib

    from hydra.errors import HydraException
    from mlflow.exceptions import MlflowException
    from omegaconf.errors import OmegaConfBaseException

    from runner.runtime import signals

    try:
        return importlib.import_module(f"runner.cli.{name}").main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return signals.exit_code(KeyboardInterrupt())
    except (UserError, HydraException, OmegaConfBaseException, MlflowException) as e:
        _report(e)


def cli() -> None:
    """Console-script entry: check group choices in one line, then hand over to Hydra (with HYDRA_FULL_ERROR set, so
    that it re-raises its errors instead of printing them over several lines, and the ones a user can fix are one)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    os.environ.setdefault("RUNNER_TRACEBACK", os.environ.get("HYDRA_FULL_ERROR", ""))
    sys.argv[0] = "runner"  # argparse's and Hydra's messages name the command, not __main__.py
    os.environ["HYDRA_FULL_ERROR"] = "1"
    from runner import sweep, tracking
    from runner.runtime import quiet, signals

    quiet.quiet_cpp_log()

    if sys.argv[1:2] in (["--version"], ["-V"]):
        import runner

        print(f"runner {runner.__version__} ({runner.DISTRIBUTION})")
        sys.exit(0)
    tracking.bound_http_retries()
    if sys.argv[1:2] and sys.argv[1] in SUBCOMMANDS:
        _exit_now(subcommand(sys.argv[1], sys.argv[2:]))
    if sys.argv[1:2] and "=" not in sys.argv[1] and not sys.argv[1].startswith(("-", "~", "+")):  # `runner predikt`
        _fail(f"{sys.argv[1]!r} is not a subcommand ({', '.join(SUBCOMMANDS)}) or a config override KEY=VALUE")
    sys.argv[1:], error = preflight(sys.argv[1:])
    if error:
        _fail(error)
    signals.install()
    try:
        main()
        _exit_now(1 if sweep.failures else 0)
    except sweep.SweepAborted as e:  # the sweep's own start or end
        sweep.close_open_parent("FAILED")
        _report(e.error)
    except (KeyboardInterrupt, signals.Terminated) as e:
        sweep.close_open_parent("KILLED")
        print("interrupted" if isinstance(e, KeyboardInterrupt) else f"terminated ({e})", file=sys.stderr)
        _exit_now(signals.exit_code(e))
    except Exception as e:
        sweep.close_open_parent("FAILED")
        if not isinstance(e, (UserError, HydraException, OmegaConfBaseException)):
            raise
        _report(e)


if __name__ == "__main__":
    cli()
