"""`python -m runner.cli.docs`: write docs/configuration.md from the config schema, and README.md's "config at a
glance" from the registries, so that neither can drift.

Every key comes from the dataclasses themselves (runner/config.py's top level, each registered component's options),
with its type, default, what is allowed (`Literal` choices, `RULES`) and the comment beside the field; the README's
table lists every option of every group, the default marked, and the built-in models by the task they take.
tests/test_docs.py checks that the committed pages are what this writes.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from runner.config import COMPONENTS, PRESETS, Config, group_options, refuses
from runner.registry import fields, literal_values, spelled

PAGE = Path("docs/configuration.md")
README = Path("README.md")
GLANCE = ("<!-- the config at a glance: written by `python -m runner.cli.docs` from the registries -->",
          "<!-- end of the config at a glance -->")  # the README's lines around the table
WHAT = {  # what each group chooses (its options come from the registries and conf/)
    "model": "the network, built for the data's examples (input shape and classes, vocabulary or tables); "
             "`keras_app`: any `keras.applications` constructor (`model.app`), untrained",
    "pipeline": "how each step's batches reach the towers",
    "strategy": "how the model and its update are placed on the devices (`hybrid`: a recommender's tables, one per "
                "device; [which when](docs/pipelines-and-strategies.md))",
    "data": "the examples: images (real, verified MNIST; random ones for throughput), token ids (Shakespeare's "
            "text), click logs (synthetic, in Criteo's layout), or your own `.npy` arrays, TFRecord shards or TFDS "
            "dataset",
    "hardware": "what `runner predict` prices: this machine (calibrated), or a spec sheet's GPUs and nodes "
                "(conf/hardware/, or your own YAML)",
}
INTRO = """# Configuration: every key

What each key does, its default and what it allows, for the top level and for every component. This page is
written by `python -m runner.cli.docs` from the schema (the dataclasses in `runner/config.py` and in each component's
module), and a test checks that it matches. Set a key on the command line (`train.steps=600`, `strategy.input=
distribute`) or in a YAML of `conf/`; `python -m runner --cfg job` prints the composed config of a command.

The config is validated before TensorFlow is imported: a wrong type, an unknown key, an unknown option or an
out-of-range value fails within about a second with one `error:` line naming the key, the value and what is
allowed, and exit status 2 (`RUNNER_TRACEBACK=1` shows the traceback instead). The groups (choose with
`group=option`) are `model`, `pipeline`, `strategy`, `data` and `hardware`, one YAML per component in
`conf/<group>/`, and the presets `experiment` and `debug`. The hardware YAMLs besides `this` are spec sheets for
`runner predict` (`runner.hardware.SpecSheet`; their fields: docs/cost-model.md). The defaults below are the
schema's: `model=gpt` and `model=dlrm` bring their own `train.*` recipe (conf/model/gpt.yaml, dlrm.yaml), which
`python -m runner --cfg job model=gpt data=shakespeare` shows.
"""


def _comments(cls: type) -> dict[str, str]:
    """The comment written beside (or just above) each field in the class's source."""
    out, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        match = re.match(r"\s+(\w+): [^=]+?(?:= .*?)?(?:\s+#\s*(.*))?$", line)
        if match and match.group(1) in {f.name for f in dataclasses.fields(cls)}:
            out[match.group(1)] = " ".join([*above, match.group(2) or ""]).strip()
        above = []
    return out


def _type(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return "choice"
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        return f"{_type(args[0])} or null"
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def rows(cls: type, prefix: str) -> list[str]:
    """Markdown rows `| key | type | default | allowed | what |` for the fields of an options dataclass."""
    comments, out = _comments(cls), []
    for field in dataclasses.fields(cls):
        annotation = fields(cls)[field.name]
        key = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(annotation):
            out += rows(annotation, f"{key}.")
            continue
        if field.name in ("name", *COMPONENTS) and cls is Config or field.name == "name":
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        shown = spelled(default)
        what = comments.get(field.name, "").replace("|", "/")
        rule = getattr(cls, "RULES", {}).get(field.name)
        choices = [spelled(c) for c in literal_values(annotation) or () if c is not None]
        allowed = ", ".join(f"`{c}`" for c in choices) if choices else rule[1] if rule else ""
        out.append(f"| `{key}` | {_type(annotation)} | `{shown}` | {allowed} | {what} |")
    return out


def page() -> str:
    """The whole page."""
    head = "| key | type | default | allowed | what |\n|---|---|---|---|---|"
    parts = [INTRO, "## Top level: devices, training, tracking, sweeps", "", head, *rows(Config, ""), ""]
    for kind, registry in COMPONENTS.items():
        parts += [f"## {kind}: {', '.join(f'`{n}`' for n in registry.names())}", ""]
        for name in registry.names():
            cls = registry.get(name)
            doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
            table = rows(cls, f"{kind}.")
            parts += [f"### `{kind}={name}`", "", doc, ""]
            parts += [head, *table, ""] if table else ["No options of its own.", ""]
    return "\n".join(parts).rstrip() + "\n"


def _names(names: list[str], default: str | None = None) -> str:
    """`b` (default), `a`, `c`, ...: the default first."""
    first = [f"`{default}` (default)"] if default in names else []
    return ", ".join([*first, *(f"`{n}`" for n in names if n != default)])


def _models(default: str) -> str:
    """The built-in models by the task they take (the model's own check, without TensorFlow, takes data of it:
    images, MNIST's or ImageNet's size for the networks that need larger ones; Shakespeare's token ids; the synthetic
    clicks' logs), and the variants they have."""
    from runner.data_pipelines import Spec

    models, data = COMPONENTS["model"], COMPONENTS["data"]
    tasks = {"images": [data.get("mnist")().spec(), Spec((224, 224, 3), 1000)],
             "text (token ids)": [data.get("shakespeare")().spec()], "click logs": [data.get("clicks")().spec()]}
    takes = {task: [n for n in models.names() if not all(refuses(models.get(n)().check, s) for s in specs)]
             for task, specs in tasks.items()}
    by_task = [f"{task}: {_names(names, default)}" for task, names in takes.items()]
    variants = dict.fromkeys(v for n in models.names() for v in typing.get_args(fields(models.get(n)).get("variant")))
    return (f"{'; '.join(by_task)}; your own (`model._target_`). `model.variant`: {_names(list(variants))}, where "
            "the model has them")


def glance() -> str:
    """README.md's table of every group's options, between the GLANCE lines."""
    from runner.config import compose

    cfg = compose([])
    rows = ["| group | options | what it chooses |", "|---|---|---|"]
    for group in COMPONENTS:
        options = _models(cfg.model.name) if group == "model" else _names(group_options(group), cfg[group].name)
        rows.append(f"| `{group}` | {options} | {WHAT[group]} |")
    presets = "; ".join(_names(group_options(group)) for group in PRESETS)
    rows.append(f"| {', '.join(f'`{group}`' for group in PRESETS)} | {presets} | presets; each file opens with its "
                "command |")
    return "\n".join([GLANCE[0], *rows, GLANCE[1]])


def readme(text: str) -> str:
    """README.md's text with its table replaced by `glance()`."""
    start, end = text.index(GLANCE[0]), text.index(GLANCE[1]) + len(GLANCE[1])
    return text[:start] + glance() + text[end:]


def main() -> int:
    PAGE.write_text(page())
    README.write_text(readme(README.read_text()))
    print(f"wrote {PAGE} and the config at a glance in {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
