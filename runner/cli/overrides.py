"""What the command line checks before Hydra starts, and how Hydra's errors become one line: a group choice that
does not exist, a launcher setting Hydra does not check, an unwritable launch folder, a key the chosen component
lacks."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Any

from runner.config import GROUPS, HYDRA_GROUPS, allowed, group_options
from runner.errors import one_line

# Hydra launcher settings that Hydra itself does not check before the sweep starts.
HYDRA_RULES = {
    "hydra.launcher.n_jobs": (lambda v: isinstance(v, int) and v != 0 and v >= -(os.cpu_count() or 1),
                              "a positive number of parallel jobs, or -1 for one per CPU"),
}
MULTIRUN_FLAGS = ("-m", "--multirun")


def expand_repeats(args: list[str]) -> tuple[list[str], str | None]:
    """`sweep.repeats=R` (R > 1) in a multirun: a sweep over `sweep.round=range(R)` put first, which Hydra varies
    slowest, so every combination runs once per round (a slow spell of the host hits all combinations alike).
    Returns the arguments and an error line (None if fine)."""
    repeats = [a.split("=", 1)[1] for a in args if a.startswith("sweep.repeats=")]
    if repeats and not (repeats[-1].isdigit() and int(repeats[-1]) > 0):  # refused before any job starts
        return args, f"sweep.repeats={repeats[-1]} is not allowed; expected {allowed('sweep.repeats')}"
    if not repeats or int(repeats[-1]) < 2:
        return args, None
    multirun, rounds = any(a in MULTIRUN_FLAGS for a in args), any(a.startswith("sweep.round=") for a in args)
    if not multirun:  # with sweep.round: one job of a sweep, started by it
        return args, None if rounds else (f"sweep.repeats={repeats[-1]} runs each combination of a sweep "
                                          f"{repeats[-1]} times: add -m (a single run has nothing to repeat against)")
    if rounds:
        return args, "sweep.round is set by the sweep from sweep.repeats; give sweep.repeats alone"
    first = next(i for i, a in enumerate(args) if "=" in a and not a.startswith("-"))  # flags stay before it
    return [*args[:first], f"sweep.round=range({int(repeats[-1])})", *args[first:]], None


def preflight(argv: list[str]) -> tuple[list[str], str | None]:
    """The arguments for Hydra and the error line (None if fine) of what the command line checks before Hydra starts:
    `sweep.repeats` expanded, group choices, the launcher settings Hydra does not check, the launch folder. `-m`
    goes first: Hydra's argparse takes one run of overrides (`a=1 -m b=2` was its usage and "unrecognized
    arguments: b=2")."""
    switch = [a for a in argv if a in MULTIRUN_FLAGS]
    shown = [a for a in argv if a.split("=")[0] in ("--cfg", "-c", "--info", "-i")]
    if switch and shown:  # Hydra's ValueError traceback: "Only one of --run, --multirun, --cfg, --info ..."
        return argv, (f"{switch[0]} runs a sweep and {shown[0]} shows a config without running anything: give one "
                      "(to see a sweep job's config, drop -m and give that job's values)")
    args, error = expand_repeats([*switch[:1], *(a for a in argv if a not in MULTIRUN_FLAGS)])
    return args, error or check_group_overrides(args) or check_launch_dir(args)


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


def searchpath(dirs: tuple[Path, ...]) -> list[str]:
    """Config folders as the one override that adds them, `hydra.searchpath=[file://D,...]`, as `compose()` takes
    them (no folders: no override)."""
    return [f"hydra.searchpath=[{','.join(f'file://{d}' for d in dirs)}]"] if dirs else []


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
    """The error line for a command-line choice of a config group that does not exist (`model=foo`, `-m
    model=mlp,foo`), with the allowed options (Hydra would dump its search path), or None. Parsing uses Hydra's own
    override grammar; anything it cannot parse is left for Hydra to report."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, extra = OverridesParser.create(), config_dirs(args)
    missing = [d for d in extra if not d.is_dir()]  # Hydra skips a folder it cannot find, without a word
    if missing:
        return (f"config folder {missing[0]} does not exist (--config-dir or hydra.searchpath); give the folder that "
                "holds your <group>/<option>.yaml files")
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
            if value is not None and (shadowed := _shadowed(group, str(value), extra)):
                return shadowed
    return None


def _shadowed(group: str, option: str, dirs: tuple[Path, ...]) -> str:
    """Why a user's `group/option.yaml` of the same name as a shipped one is not read (Hydra finds the shipped one
    first, and the user's figures were silently ignored), or ''. A choice made by a preset (an experiment's
    `override /model: cnn`) is not seen here."""
    from runner.config import CONF_DIR

    shipped = CONF_DIR / group / f"{option}.yaml"
    yours = [p for d in dirs if (p := d / group / f"{option}.yaml").is_file() and p.resolve() != shipped.resolve()]
    if not yours or not shipped.is_file():
        return ""
    return (f"{group}={option}: {yours[0]} is not read, the runner's own conf/{group}/{option}.yaml is (Hydra finds it "
            "first); give yours another name")


def explain(e: BaseException) -> str:
    """An exception as one line (`one_line`); a value the schema refuses ("Error merging override gpus=abc") with
    OmegaConf's reason, from the cause Hydra wraps, and what the key allows."""
    text = one_line(e)
    if text.startswith("Could not override '"):
        return _unknown_key(text.split("'")[1]) or text
    if preset := re.match(r"In '(\w+)/(\w+)': ConfigKeyError raised while composing config: Key '(\w+)' not in '(\w+)'",
                          text):
        return _preset_key(*preset.groups()) or text
    if comma := re.match(r"Ambiguous value for argument '([^=]+)=(.*)'", text):  # Hydra's two choices, cut at "1."
        key, value = comma.groups()
        as_list = f"a list is written {key}=[{value}]"
        one = f"a sweep of its values is `-m {key}={value}`, one value holding a comma quoted: '{key}=\"{value}\"'"
        takes = _takes_list(key)
        return f"{key}={value}: an unquoted comma is ambiguous; " + (
            as_list if takes else one if takes is False else f"{as_list}; {one}")
    cause = e.__cause__ or e.__context__
    if text.startswith("Error merging override") and cause is not None and str(cause).strip():
        text += f": {str(cause).strip().splitlines()[0].rstrip('.')}"
        key = text.removeprefix("Error merging override ").split("=", 1)[0]
        if allowed(key):
            text += f"; {key} must be {allowed(key).removeprefix('expected ')}"
        elif "is not a ListConfig" in text:
            text += f"; {key} takes a list: {key}=[a,b]"
    return text


def _takes_list(key: str) -> bool | None:
    """Whether `key` (data.vocabulary_sizes, data.path, train.seed) takes a list in every component or section that
    has it, or None where they differ or none has it."""
    from runner.config import COMPONENTS, Config
    from runner.registry import fields

    group, _, name = key.partition(".")
    owners = [COMPONENTS[group].get(n) for n in COMPONENTS[group].names()] if group in COMPONENTS else \
        [fields(Config).get(group)]
    kinds = {any(typing.get_origin(t) in (list, tuple) for t in (typing.get_args(f[name]) or ()) + (f[name],))
             for f in (fields(o) for o in owners if dataclasses.is_dataclass(o)) if name in f}
    return kinds.pop() if len(kinds) == 1 else None


def _unknown_key(key: str) -> str | None:
    """For a key the chosen component does not have (`strategy.cross_device_ops` with strategy=single): which
    components of the group have it, instead of Hydra's hint to append it."""
    from runner.config import COMPONENTS
    from runner.registry import fields

    group, _, name = key.partition(".")
    if "." in name and group in COMPONENTS:  # hardware.accelerator.peak_flop: Hydra's "+" hint fails validation
        return _unknown_nested(group, name)
    if not name or "." in name:
        return None
    if group not in COMPONENTS:  # train.step: a key of the top-level schema's sections
        return _unknown_top_level(group, name)
    registry = COMPONENTS[group]
    owners = [n for n in registry.names() if name in fields(registry.get(n))]
    if any(typing.get_origin(fields(registry.get(n))[name]) is dict for n in owners):
        return f"{key} is a mapping of {group}={', '.join(owners)}: add entries with +{key}.NAME=VALUE"
    if not owners:  # a YAML option may carry keys no registered class has (a spec sheet's hardware.nodes)
        owners = [o for o, yaml in _shipped(group).items() if name in yaml]
    if not owners:
        return f"{key} is not an option of any {group}; `python -m runner --cfg job` shows the chosen {group}'s options"
    return f"{key} is not an option of the chosen {group}; it belongs to {group}={', '.join(owners)} (choose one)"


def _shipped(group: str) -> dict[str, Any]:
    """The runner's own options of `group` (conf/<group>/*.yaml), each as its YAML's keys and values."""
    from omegaconf import OmegaConf

    from runner.config import CONF_DIR

    return {o: OmegaConf.load(CONF_DIR / group / f"{o}.yaml") or {} for o in group_options(group)}


def _unknown_nested(group: str, name: str) -> str | None:
    """For `group.name` a dotted key no option of the group has (hardware.accelerator.peak_flop): the keys spelled
    like its first misspelt part, in the group's classes (registered, or named by a shipped option's `_target_`)."""
    from runner.config import COMPONENTS
    from runner.registry import fields, locate, near, unknown

    targets = {yaml.get("_target_") for yaml in _shipped(group).values()}
    classes = [*map(COMPONENTS[group].get, COMPONENTS[group].names()), *(locate(t, group) for t in targets if t)]
    first = name.split(".")[0]
    owners = [cls for cls in classes if first in fields(cls)]
    if not owners:  # the first part is misspelt in all of them: the keys of every option of the group
        keys, whose = sorted({f for cls in classes for f in fields(cls)}), f"the {group} options' keys"
        return f"{group}.{name} is not a key of any {group}; {near(first, keys, group, 99, whose)}"
    hint = next((h for cls in owners if (h := unknown(cls, name, group))), "")
    return f"{group}.{name} is not a key of the chosen {group}{hint}" if hint else None


def _unknown_top_level(section: str, name: str) -> str | None:
    """For a key `section.name` the top-level schema's section (train, mlflow, sweep) lacks: the keys it has that are
    spelled alike, instead of Hydra's hint to append it (which then fails validation)."""
    from runner.config import Config
    from runner.registry import fields, near

    kind = fields(Config).get(section)
    if section not in fields(Config):
        return (f"{section}.{name}: the config has no {section!r}; its sections: {', '.join(fields(Config))} "
                "(python -m runner --cfg job shows them)")
    if not dataclasses.is_dataclass(kind):
        return None
    return f"{section}.{name} is not a key of {section}; {near(name, list(fields(kind)), section, 99)} " \
        "(docs/configuration.md)"


def _preset_key(group: str, option: str, key: str, cls: str) -> str | None:
    """A preset (`debug=smoke`) setting a key the chosen component lacks (`model.variant` of model=conv2d): which
    component and which key, instead of Hydra's "Key 'variant' not in 'Conv2D'"."""
    from runner.config import COMPONENTS

    for kind, registry in COMPONENTS.items():
        names = [n for n in registry.names() if registry.get(n).__name__ == cls]
        if names:
            return (f"{group}={option} sets {kind}.{key}, which {kind}={names[0]} does not have; leave {group}="
                    f"{option} out and set what it would (conf/{group}/{option}.yaml) yourself, or choose a {kind} "
                    f"with {key}")
    return None
