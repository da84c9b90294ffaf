"""`runner predict [-m] OVERRIDES [--recalibrate]`: each combination's predicted images/s, its dominant term and the
predicted fastest, from the cost model (runner/predict/), without training.

    runner predict -m model=cnn strategy=replicated,sharded_update pipeline=split,sharded gpus=2,4

takes the same overrides as a sweep; the first prediction on a device set calibrates it (seconds, in a fresh
process; cached), later ones read the cache. Exit status 2 for a bad override (one `error:` line), 1 when no
combination could be predicted.
"""

from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="runner predict", description=__doc__.splitlines()[0])
    p.add_argument("--recalibrate", action="store_true", help="measure this machine's calibrations again")
    p.add_argument("overrides", nargs="*", help="config overrides, with sweeps (`strategy=a,b`) as after -m")
    return p


def main(argv: list[str] | None = None) -> int:
    """Print the predictions of every combination of the overrides."""
    from runner.cli.overrides import check_group_overrides
    from runner.predict.grid import expand, predict_all, table

    args, rest = parser().parse_known_args(argv)
    overrides = [o for o in [*args.overrides, *rest] if o not in ("-m", "--multirun")]
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        print(f"error: {unknown[0]} is not an option of runner predict; see runner predict --help", file=sys.stderr)
        return 2
    error = check_group_overrides(overrides)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    outcomes = predict_all(expand(overrides), args.recalibrate)  # a bad override raises: runner's dispatcher says it
    print("\n".join(table(outcomes)))
    return 0 if any(o.prediction for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
