"""`python -m runner.cli.docs`: write docs/configuration.md from the config schema, so that the page cannot drift.

Every key comes from the dataclasses themselves: the top level (runner/config.py) and each registered component's
options (its module), with its type, default, what is allowed (the `Literal` choices and `RULES`) and the comment
written beside the field. tests/test_docs.py checks that the committed page is what this writes.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

from runner.config import COMPONENTS, Config
from runner.registry import fields

PAGE = Path("docs/configuration.md")
INTRO = """# Configuration: every key

What each key does, its default and what it allows, for the top level and for every component. This page is
written by `python -m runner.cli.docs` from the schema (the dataclasses in `runner/config.py` and in each component's
module), and a test checks that it matches. Set a key on the command line (`train.steps=600`, `strategy.input=
distribute`) or in a YAML of `conf/`; `python -m runner --cfg job` prints the composed config of a command.

The config is validated before TensorFlow is imported: a wrong type, an unknown key, an unknown option or an
out-of-range value fails within about a second with one `error:` line naming the key, the value and what is
allowed, and exit status 2 (`RUNNER_TRACEBACK=1` shows the traceback instead). The groups (choose with
`group=option`) are `model`, `pipeline`, `strategy` and `data`, one YAML per component in `conf/<group>/`, and the
presets `experiment` and `debug`.
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
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        return f"{_type(args[0])} or null"
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _allowed(cls: type, name: str, annotation: Any) -> str:
    rule = getattr(cls, "RULES", {}).get(name)
    choices = [a for a in typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal]
    if not choices:
        choices = [c for arg in typing.get_args(annotation) if typing.get_origin(arg) is typing.Literal
                   for c in typing.get_args(arg)]
    if choices:
        return ", ".join(f"`{str(c).lower() if isinstance(c, bool) else c}`" for c in choices)  # as typed
    return rule[1] if rule else ""


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
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
        what = comments.get(field.name, "").replace("|", "/")
        out.append(f"| `{key}` | {_type(annotation)} | `{shown}` | {_allowed(cls, field.name, annotation)} | {what} |")
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


def main() -> int:
    PAGE.write_text(page())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
