"""The docs stay true: every `python -m runner` / `runner` command in README.md and docs/ composes and validates (or
fails the way the page says it does), docs/configuration.md is what the schema writes, and the entry pages stay
short."""

from __future__ import annotations

import itertools
import re
import shlex

import pytest
from conftest import REPO, compose

from runner.config import ConfigError, validate

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUNS = ("check", "report", "replay", "--version", "--help", "--info")  # subcommands and flags that are not a run
FLAGS_WITH_VALUE = ("--cfg", "--package", "-p", "-sc", "--config-name", "-cn")


def _candidates(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, text) of what a page shows as code: fenced or indented lines, and inline `code` spans."""
    out, fenced = [], False
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            out.append((i, line.strip().removeprefix("$ ").split("  #")[0].strip()))
        else:
            out += [(i, span) for span in re.findall(r"`([^`]+)`", line)]
    return out


def commands() -> list[tuple[str, str, bool, bool]]:
    """(page, command, expected to be refused, a prediction) for every runner run and prediction the pages show."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, text in _candidates(lines):
            match = re.fullmatch(r"(?:python -m runner|runner) (.+)", text)
            if not match or "<" in text or "--config-dir" in text or text.endswith("\\"):
                continue
            args = shlex.split(match.group(1))
            priced = args[:1] == ["predict"]
            if priced:  # runner predict takes a sweep's overrides: they must compose too
                args = [a for a in args[1:] if a != "--recalibrate" and not a.startswith("predict.format=")]
            command = shlex.join(args)
            if not args or args[0] in NOT_RUNS or args[0].startswith("."):
                continue
            refused = i + 1 < len(lines) and lines[i + 1].strip().startswith("error:")
            found.append((page.name, command, refused, priced))
    return found


def overrides(command: str) -> list[list[str]]:
    """The configs a command composes: its overrides, one list per combination of a sweep (Hydra's syntax)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, fixed, swept = OverridesParser.create(), [], []
    args, skip = shlex.split(command), False
    for arg in args:
        if skip or arg in ("-m", "--multirun"):
            skip = False
            continue
        if arg in FLAGS_WITH_VALUE:
            skip = True
            continue
        override = parser.parse_override(arg)
        if override.key_or_group.startswith("hydra"):
            continue
        if override.is_sweep_override():
            swept.append([f"{override.key_or_group}={v}" for v in override.sweep_string_iterator()])
        else:
            fixed.append(arg)
    return [[*fixed, *combo] for combo in itertools.islice(itertools.product(*swept), 64)]


COMMANDS = commands()


def test_the_pages_show_commands():
    assert len(COMMANDS) >= 12 and {page for page, *_ in COMMANDS} >= {"README.md", "devices-and-clusters.md"}


@pytest.mark.parametrize("page,command,refused,priced", COMMANDS, ids=[f"{p}: {c}" for p, c, *_ in COMMANDS])
def test_every_command_in_the_docs_composes_and_validates(page, command, refused, priced):
    for config in overrides(command):
        if refused:
            with pytest.raises(ConfigError):
                validate(compose(*config), priced)
        else:
            validate(compose(*config), priced)


def test_the_configuration_page_is_what_the_schema_writes():
    from runner.cli.docs import page

    assert (REPO / "docs" / "configuration.md").read_text() == page(), "run `python -m runner.cli.docs`"


def test_the_readmes_config_at_a_glance_is_what_the_registries_write():
    """#61 item 5: the table listed no gpt, dlrm, shakespeare, clicks or hybrid. Every option of every group is in
    it now, the built-in models under the task they take, and the committed README is what the registries write."""
    from runner.cli.docs import glance, readme
    from runner.config import GROUPS, group_options

    table = glance()
    assert all(f"`{option}`" in table for group in GROUPS for option in group_options(group))
    assert "; text (token ids): `gpt`; click logs: `dlrm`;" in table and "`mnist` (default)" in table
    text = (REPO / "README.md").read_text()
    assert readme(text) == text, "run `python -m runner.cli.docs`"


def test_every_key_in_the_schema_is_on_the_configuration_page_and_the_other_way_round():
    from runner.config import COMPONENTS, Config
    from runner.registry import fields

    def keys(cls: type, prefix: str) -> set[str]:
        out = set()
        for name, annotation in fields(cls).items():
            if hasattr(annotation, "__dataclass_fields__"):
                out |= keys(annotation, f"{prefix}{name}.")
            elif name != "name" and name not in COMPONENTS:
                out.add(f"{prefix}{name}")
        return out

    schema = keys(Config, "")
    for kind, registry in COMPONENTS.items():
        for option in registry.names():
            schema |= keys(registry.get(option), f"{kind}.")
    documented = set(re.findall(r"^\| `([\w.]+)` \|", (REPO / "docs" / "configuration.md").read_text(), re.M))
    assert documented == schema


def test_the_entry_pages_are_short_and_tell_no_history():
    readme, benchmarks = (REPO / "README.md").read_text(), (REPO / "BENCHMARKS.md").read_text()
    assert len(readme.splitlines()) <= 250 and len(benchmarks.splitlines()) <= 200
    for text in (readme, benchmarks.split("\n", 3)[3]):  # BENCHMARKS.md names its commit in its header only
        assert not re.search(r"\b[0-9a-f]{40}\b|\bcommit [0-9a-f]{7,}", text)
        assert not re.search(r"\b(Zen 3|session \d+|was \d[\d,.]* (?:images/s|s|x))", text)
