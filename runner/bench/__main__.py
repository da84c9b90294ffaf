"""The benchmarks' command line: `python -m runner.bench COMMAND` (the commands: `--help`)."""

from __future__ import annotations

import argparse
import sys
import typing

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

import runner.bench
from runner.data_pipelines import DATASETS, PIPELINES
from runner.bench.fit import held_out_command
from runner.bench.floors import built_in, floor_settings, floors, multi_jobs
from runner.bench.grid import DATA_PARALLEL, GRID_MODELS, grid, settings
from runner.bench.jobs import Setting, out_problem, too_few_timed
from runner.bench.peers import peers
from runner.bench.pipelines import pipelines
from runner.bench.predicted import predicted
from runner.bench.published import cells, published
from runner.bench.settings import SPEED_SETTINGS, settings_steps, speed_settings
from runner.cli.arguments import Parser, positive
from runner.cli.overrides import check_group_overrides, explain
from runner.config import OptimizerName, compose, validate
from runner.errors import ConfigError, UserError
from runner.runtime import signals
from runner.strategies import baseline, doing, name_of


def _ints(text: str) -> list[int]:
    """Counts separated by commas (`1,2,4`); anything else refused in argparse's one line, naming the value."""
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a list of counts separated by commas (e.g. 1,2,4)") from None


def _names(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def _setting_options(parser: argparse.ArgumentParser, models: list[str], test_limit: int | None) -> None:
    """The options of `grid`, `strategies` and `floors` that make each model's jobs.Setting (jobs.setting_for)."""
    parser.add_argument("--models", "--model", dest="models", type=_names, default=models,
                        help=f"models (default: {','.join(models)})")
    parser.add_argument("--steps", type=positive, default=None, help="steps per job (default: per model/variant)")
    parser.add_argument("--steps-per-call", type=positive, default=None,
                        help="steps per compiled call (default: per model)")
    parser.add_argument("--test-limit", type=positive, default=test_limit,
                        help="evaluate runner jobs on the first N test images")
    parser.add_argument("--optimizer", default=None, choices=typing.get_args(OptimizerName),
                        help="for runner jobs and Keras fit alike (default: each model's own, as `runner` trains it)")


def _grid_parser(sub: argparse._SubParsersAction, name: str, full: bool) -> argparse.ArgumentParser:
    """`grid` (the whole issue grid by default) and `strategies` (one model, 2 and 4 devices) share the options."""
    helps = {"grid": "every model/variant x strategy x pipeline x N vs single device and Keras fit, with targets",
             "strategies": "data-parallel strategies x pipelines vs single device and Keras fit, one model"}
    g = sub.add_parser(name, help=helps[name])
    _setting_options(g, list(GRID_MODELS) if full else ["mlp"], None)
    variants, gpus = ["tiny", "default"] if full else ["default"], [1, 2, 4, 8] if full else [2, 4]
    strategies = [*DATA_PARALLEL, baseline()] if full else list(DATA_PARALLEL)
    g.add_argument("--variants", "--variant", dest="variants", type=_names, default=variants,
                   help=f"each model's variants to run, where it has them (default: {','.join(variants)})")
    g.add_argument("--gpus", type=_ints, default=gpus,
                   help=f"device counts (simulated where the machine has fewer; default: {','.join(map(str, gpus))})")
    g.add_argument("--strategies", type=_names, default=strategies,
                   help=f"strategies ({baseline()} on 1 device only; default: {','.join(strategies)})")
    g.add_argument("--repeats", type=positive, default=1,
                   help="run every job this many times, in rounds; rows show the median and the range")
    g.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every job, runner and Keras fit alike (repeatable): your model "
                        "(+model._target_=pkg.fn, hydra.searchpath=[file://DIR]) or your data (data.shape=[32,32,3])")
    return g


def _check_grid(parser: argparse.ArgumentParser, args: argparse.Namespace, first: Setting) -> None:
    """Each device count's first job (of setting `first`) validated as the runner will (e.g. a global batch the
    towers cannot split), so a bad grid is one `error:` line before any job instead of a failed job per combination."""
    strategies = [job.strategy for job in multi_jobs([2])] if args.command == "floors" else args.strategies
    for n in args.gpus:
        strategy = baseline() if n == 1 else next((s for s in strategies if s != baseline()), None)
        if strategy is None:
            continue
        try:
            validate(compose([*first.overrides(), f"gpus={n}", f"strategy={strategy}"]))
        except ConfigError as e:
            parser.error(f"--gpus {n}: {e}")


def main(argv: list[str] | None = None) -> int:
    """Command line of the benchmarks."""
    parser = Parser(prog="python -m runner.bench", description=runner.bench.__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pipelines", help="input pipeline alone vs training step, per pipeline x strategy x N")
    p.add_argument("--gpus", type=_ints, default=[1, 2, 4], help="device counts (default: 1,2,4)")
    # tf_cnn_benchmarks' replicated mode both ways: each variable summed on one device, and all-reduced
    replicated = [name_of(doing(f"--variable_update=replicated{n}")) for n in ("", " --all_reduce_spec=nccl")]
    p.add_argument("--strategies", type=_names, default=replicated,
                   help=f"strategies (default: {','.join(replicated)})")
    p.add_argument("--model", default="mlp", help="the model (default: %(default)s)")
    p.add_argument("--variant", default="default", help="its variant (default: %(default)s)")
    p.add_argument("--steps", type=positive, default=400, help="steps per job (default: %(default)s)")
    p.add_argument("--steps-per-call", type=positive, default=50,
                   help="steps per compiled call (default: %(default)s)")
    grids = (p, _grid_parser(sub, "grid", True), _grid_parser(sub, "strategies", False))
    for parsed in grids:
        parsed.add_argument("--pipelines", type=_names, default=PIPELINES.names(),
                            help=f"pipelines (default: {','.join(PIPELINES.names())})")
    fl = sub.add_parser("floors", help="each built-in model's step vs its floor at 1, 2, 4 devices, MFU and Keras fit, "
                                       "in rounds")
    _setting_options(fl, built_in(), 1000)
    fl.add_argument("--rounds", type=positive, default=3, help="rounds over every model's runner and Keras jobs")
    fl.add_argument("--gpus", type=_ints, default=[1, 2, 4],
                    help="device counts (above 1: the data-parallel extremes, all-reduced and on the host, on "
                         "simulated devices)")
    for parsed in (*grids, fl):
        parsed.add_argument("--batch", type=positive, default=128, help="global batch (default: %(default)s)")
        parsed.add_argument("--data", default="mnist", choices=DATASETS.names(), help="the data (default: %(default)s)")
    pr = sub.add_parser("predicted", help="the cost model's predictions beside an experiment's measured runs")
    pr.add_argument("--experiment", default="bench_strategies", help="whose finished runner runs to predict")
    pr.add_argument("--recalibrate", action="store_true", help="measure this machine's calibrations again")
    about = "spec-sheet predictions against published tables (runner/bench/published/)"
    pu = sub.add_parser("published", help=about, description=f"{about}: each cell predicted from conf/hardware/'s "
                        "spec sheet beside TensorFlow's 2017 measurement, per system and model")
    pu.add_argument("--hardware", type=_names, default=[],
                    help=f"only these systems, separated by commas: {', '.join(_systems())} (default: all)")
    pu.add_argument("--held-out", action="store_true",
                    help="fit the constants again leaving out each model, system and multi-machine cells in turn, and "
                         "score the left-out cells (runner/bench/fit.py; about two minutes)")
    pe = sub.add_parser("peers", help="a user's ResNet-20 against tf_cnn_benchmarks' resnet20, or (--gpt) the GPT "
                                      "against nanoGPT, in rounds")
    pe.add_argument("--peer", default=None, help="a checkout of github.com/tensorflow/benchmarks (without --gpt)")
    pe.add_argument("--towers", type=_ints, default=[1, 2])
    pe.add_argument("--rounds", type=positive, default=None, help="default 3; with --gpt 2")
    pe.add_argument("--batch", type=positive, default=64, help="images per tower")
    pe.add_argument("--steps", type=positive, default=200,
                    help="steps of each job (the peer times them all after its warm-up; the runner, all but its "
                         "first call)")
    pe.add_argument("--gpt", action="store_true", help="the runner's GPT against nanoGPT on the runner's text")
    pe.add_argument("--nanogpt", default=None, help="with --gpt: a checkout of github.com/karpathy/nanoGPT")
    pe.add_argument("--python", default=None, help="with --gpt: the Python of a venv with torch and numpy")
    pe.add_argument("--iters", type=int, default=2000,
                    help="with --gpt: optimizer steps of every job (nanoGPT's --max_iters; default its recipe's)")
    pe.add_argument("--compile", type=_names, default=["false", "true"],
                    help="with --gpt: nanoGPT's --compile settings, each a peer of its own (default false,true)")
    pe.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="with --gpt: a config override of the runner's jobs; nanoGPT follows the recipe's keys")
    st = sub.add_parser("settings", help="each speed setting's values side by side, as ratios to the default")
    st.add_argument("--groups", type=_names, default=list(SPEED_SETTINGS), help=f"of {','.join(SPEED_SETTINGS)}")
    st.add_argument("--steps", type=positive, default=None, help="steps per job (default: the group's)")
    st.add_argument("--test-limit", type=positive, default=1000, help="evaluate on the first N test images")
    for parsed in (*grids, fl, pr, pe, st):
        parsed.add_argument("--tracking-uri", default=None,
                            help="the MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    for parsed in (*grids[1:], fl, pr, pu, pe, st):
        parsed.add_argument("--out", default=None, help="also write the markdown to this file")
    args = parser.parse_args(argv)
    signals.install()  # SIGTERM as `Terminated`: the running job is stopped and the sweep's parent closed KILLED
    try:
        return _run(parser, args)
    except (UserError, HydraException, OmegaConfBaseException) as e:  # a model, variant or override refused
        parser.error(explain(e))  # in the runner's own words (`python -m runner model.nosuch=1`)
    except (KeyboardInterrupt, signals.Terminated) as e:
        print(f"python -m runner.bench: stopped ({e or 'Ctrl-C'})", file=sys.stderr)
        return signals.exit_code(e)


def _systems() -> list[str]:
    """The systems of the published tables (runner/bench/published/*.csv)."""
    return sorted({c.hardware for c in cells()})


def _check_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The names options list, checked before any job or prediction, in one line naming the value and the choices:
    strategies and pipelines as the runner checks its group choices (the config folders of --override included),
    settings groups and published systems by their lists. (An unknown strategy was Hydra's traceback, an unknown
    pipeline a table of failed jobs, an unknown system an empty comparison's traceback.)"""
    for option, group in (("strategies", "strategy"), ("pipelines", "pipeline")):
        chosen = [f"{group}={name}" for name in getattr(args, option, None) or []]
        if chosen and (error := check_group_overrides([*getattr(args, "override", []), *chosen])):
            parser.error(f"--{option}: {error}")
    for option, allowed in (("groups", list(SPEED_SETTINGS)), ("hardware", _systems())):
        for name in getattr(args, option, None) or []:
            if name not in allowed:
                parser.error(f"--{option} {name} is not one of {', '.join(allowed)}")


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The chosen benchmark, after its checks."""
    _check_names(parser, args)
    if getattr(args, "out", None) and (problem := out_problem(args.out)):  # before, not after, the jobs
        parser.error(f"--out {args.out} cannot hold the tables: {problem}; choose a writable file")
    if args.command in ("predicted", "peers", "published"):  # no jobs of a setting to check first
        if args.command == "published" and args.held_out:
            return held_out_command(args)
        return {"predicted": predicted, "peers": peers, "published": published}[args.command](args)
    if args.command == "settings":
        todo = settings_steps(args)
    elif args.command == "pipelines":
        todo = [(args.model, args.steps, args.steps_per_call)]
    else:
        setups = (floor_settings if args.command == "floors" else settings)(args)
        todo = [(s.name, s.steps, s.steps_per_call) for s in setups]
    # at least 20 timed steps in at least two timed calls (a standard error needs two), or exit 2
    for name, steps, per_call in todo:
        if problem := too_few_timed(name, steps, per_call):
            parser.error(problem)
    if args.command in ("grid", "strategies", "floors"):
        _check_grid(parser, args, setups[0])
    return {"floors": floors, "pipelines": pipelines, "settings": speed_settings}.get(args.command, grid)(args)


if __name__ == "__main__":
    sys.exit(main())
