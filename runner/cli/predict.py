"""`runner predict [-m] OVERRIDES [--recalibrate] [--config-dir D]`: each combination's predicted rate (images/s,
tokens/s or examples/s: one table per unit), its dominant term and the predicted fastest, without training.

    runner predict -m model=cnn strategy=replicated,sharded_update pipeline=split,sharded gpus=2,4
    runner predict -m hardware=dgx1_p100 experiment=tf_cnn_resnet50 strategy=parameter_server,mirrored gpus=1,8

takes the same overrides as a sweep. On this machine (`hardware=this`, the default) the first prediction on a device
set calibrates it (seconds, in a fresh process; cached), later ones read the cache; on a named hardware
(conf/hardware/, or yours in `--config-dir`) it prices the model's layers from the spec sheet and runs nothing.
`predict.format=json` prints one JSON object per combination instead of the tables. Exit status 2 for a bad override
(one `error:` line; so is a lone combination the runner refuses or no cost model covers, where a sweep's are rows),
1 when no combination could be predicted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runner.cli.arguments import Parser

FORMAT = "predict.format"  # this command's own key: table (default) or json, one object per combination


def parser() -> Parser:
    p = Parser(prog="runner predict", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--recalibrate", action="store_true", help="measure this machine's calibrations again")
    p.add_argument("--config-dir", "-cd", action="append", default=[],
                   help="a folder of your own component YAMLs (model, data, hardware, ...)")
    p.add_argument("overrides", nargs="*", help="config overrides, with sweeps (`strategy=a,b`) as after -m")
    return p


def main(argv: list[str] | None = None) -> int:
    """Print the predictions of every combination of the overrides."""
    from runner.cli.overrides import MULTIRUN_FLAGS, check_group_overrides, searchpath
    from runner.predict.grid import expand, predict_all, records, table

    args, rest = parser().parse_known_args(argv)
    overrides = [o for o in [*args.overrides, *rest] if o not in MULTIRUN_FLAGS]
    unknown = [o for o in overrides if o.startswith("-")]
    output = [o for o in overrides if o.startswith(f"{FORMAT}=")]
    overrides = [o for o in overrides if not o.startswith(f"{FORMAT}=")]
    shape = output[-1].split("=", 1)[1] if output else "table"
    dirs = tuple(Path(d).expanduser().resolve() for d in args.config_dir)
    error = (f"{unknown[0]} is not an option of runner predict; see runner predict --help" if unknown
             else f"{FORMAT}={shape!r} is not allowed; choose one of: table, json" if shape not in ("table", "json")
             else check_group_overrides([*overrides, *(f"--config-dir={d}" for d in dirs)]))
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    combos = [[*searchpath(dirs), *c] for c in expand(overrides)]
    # a bad override raises (runner's dispatcher says it), and so does a lone combination's refusal or missing cost
    # model, as a run's refusal would
    outcomes = predict_all(combos, args.recalibrate, refusals_raise=len(combos) == 1)
    if shape == "json":
        print("\n".join(json.dumps(r) for r in records(outcomes)))
    else:
        print("\n".join(table(outcomes)))
    return 0 if any(o.prediction for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
