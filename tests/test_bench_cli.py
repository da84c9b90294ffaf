"""The benchmark commands' defaults, plans and refusals, without running a job: what each command would run (its
planning functions on the parsed defaults) against what docs/benchmarks.md says, and bad input as one `error:` line
before any job."""

from __future__ import annotations

import re

import pytest

from conftest import REPO

DOCS = (REPO / "docs" / "benchmarks.md").read_text()


def _parsed(monkeypatch, *argv: str):
    """The command line's arguments as the bench parses them, its command not run."""
    from runner.bench import __main__ as bench

    seen = []
    monkeypatch.setattr(bench, "_run", lambda parser, args: seen.append(args) or 0)
    assert bench.main(list(argv)) == 0
    return seen[0]


def test_the_default_grid_is_the_documented_one(monkeypatch):
    """`grid` planned 1,190 jobs of every registered model (alexnet, gpt, dlrm ...) where the docs name mlp, cnn,
    nin and a fraction of that."""
    from runner.bench import grid

    args = _parsed(monkeypatch, "grid")
    assert args.models == ["mlp", "cnn", "nin"] and f"(`--models {','.join(args.models)}`)" in DOCS
    assert f"(`--variants {','.join(args.variants)}`)" in DOCS and f"(`--gpus {','.join(map(str, args.gpus))}`)" in DOCS
    assert f"(`--strategies {','.join(args.strategies)}`;" in DOCS
    per_table, tables = len(grid.plan(args.strategies, args.pipelines, args.gpus)), len(grid.settings(args))
    assert f"is {per_table * tables} jobs, {per_table} per model/variant" in DOCS
    assert re.search(rf"runner.bench grid +# .*\({per_table * tables} jobs", DOCS)


def test_a_variant_none_of_the_models_has_is_one_error_line(monkeypatch, capsys):
    """`grid --variants huge` ran the models without variants (all of them, then) and said nothing."""
    from runner.bench import __main__ as bench

    monkeypatch.setattr(bench, "grid", lambda args: pytest.fail("the grid ran"))

    for argv, said in [(["grid", "--variants", "huge"],
                        "error: --variants huge: not a variant of mlp, cnn, nin; choose from tiny, default, chainer, "
                        "paper"),
                       (["strategies", "--models", "mlp,conv2d", "--variants", "default,paper"],
                        "error: --variants paper: not a variant of mlp, conv2d; choose from tiny, default, chainer")]:
        with pytest.raises(SystemExit) as exit_:
            bench.main(argv)
        assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [said]


def test_an_override_hydra_refuses_is_the_runners_one_error_line(monkeypatch, capsys):
    """`--override foo` ended in Hydra's OverrideParseException, `--override model.nosuch=1` in a 26-frame
    ConfigCompositionException; the runner's own command line says each in one line, and so does the bench."""
    from runner.bench import __main__ as bench

    monkeypatch.setattr(bench, "grid", lambda args: pytest.fail("the grid ran"))
    for override, said in [("foo", "error: Error parsing override 'foo' missing EQUAL at '<EOF>'"),
                           ("model.nosuch=1", "error: model.nosuch is not an option of any model; "),
                           ("gpus=abc", "error: Error merging override gpus=abc: Value 'abc' ")]:
        with pytest.raises(SystemExit) as exit_:
            bench.main(["strategies", f"--override={override}"])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and line.startswith(said)


def test_an_out_file_the_kernel_refuses_is_one_error_line_before_the_work(monkeypatch, capsys, tmp_path):
    """`published --out /proc/nope/x.md` as root (where the permission bits pass) printed the tables, then a
    FileNotFoundError's traceback: now the file is opened before the work; a write that fails after it is one line."""
    from runner.bench import __main__ as bench
    from runner.bench.jobs import save
    from runner.errors import UserError

    monkeypatch.setattr(bench, "published", lambda args: pytest.fail("the work ran"))
    with pytest.raises(SystemExit) as exit_:
        bench.main(["published", "--out", "/proc/nope/x.md"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and line.startswith("error: --out /proc/nope/x.md cannot hold the tables: ")
    with pytest.raises(UserError, match="^--out /proc/nope/x.md cannot hold the tables: "):
        save(["| a |"], "/proc/nope/x.md")
    monkeypatch.setattr(bench, "published", lambda args: 0)
    assert bench.main(["published", "--out", str(tmp_path / "new" / "x.md")]) == 0
    assert not (tmp_path / "new" / "x.md").exists()  # tried, not left behind empty


def test_the_settings_groups_and_jobs_are_the_documented_ones(monkeypatch):
    """The docs listed 16 groups and '47 jobs' where `--help` lists 21 and the default runs 76."""
    from runner.bench.settings import SPEED_SETTINGS

    groups = _parsed(monkeypatch, "settings").groups
    assert groups == list(SPEED_SETTINGS) and f"(`--groups {','.join(groups)}`;" in DOCS
    jobs = sum(len(SPEED_SETTINGS[g][3]) + 1 for g in groups)  # each value, then the default again (settings._group)
    assert f"All {len(groups)} groups are {jobs} jobs" in DOCS


def test_the_commands_say_what_they_ran_in_plain_words(monkeypatch, capsys):
    """`--gpus two` said argparse's 'invalid _ints value'; pipelines/grid/strategies options had no help; the
    pipelines header left out the variant; floors printed '1 rounds' and judged 'MFU <= 100% in every run' on the
    one-device runs alone."""
    import contextlib

    from runner.bench import __main__ as bench
    from runner.bench import floors, pipelines

    with pytest.raises(SystemExit) as exit_:
        bench.main(["strategies", "--gpus", "two"])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        "error: argument --gpus: two is not a list of counts separated by commas (e.g. 1,2,4)"]
    seen = []
    monkeypatch.setattr(bench, "_run", lambda parser, args: seen.append(parser) or 0)
    bench.main(["grid"])
    commands = seen[0]._subparsers._group_actions[0].choices
    for name in ("pipelines", "grid", "strategies"):
        assert [a.dest for a in commands[name]._actions if not a.help] == [], name
    never = contextlib.nullcontext  # no store, no jobs: what the command prints around them
    monkeypatch.setattr(pipelines, "sweep", lambda uri, experiment: never())
    monkeypatch.setattr(pipelines, "run_job", lambda overrides, bench: {"error": "not run"})
    args = _parsed(monkeypatch, "pipelines", "--variant", "tiny", "--gpus", "1", "--strategies", "single")
    pipelines.pipelines(args)
    assert capsys.readouterr().out.startswith("# pipeline benchmark: model=mlp variant=tiny steps=400 ")
    monkeypatch.setattr(floors, "sweep", lambda uri, experiment: never())
    monkeypatch.setattr(floors, "run_one", lambda setting, job, bench, progress, r: {"rate": 1.0, "mfu": 0.5})
    floors.floors(_parsed(monkeypatch, "floors", "--models", "mlp", "--rounds", "1", "--gpus", "1,2"))
    out = capsys.readouterr().out
    assert "## Each model's step against its floor: 1 round, " in out
    assert "- PASS MFU <= 100% in every one-device runner run: 1 of 1 hold" in out


def test_published_help_says_what_it_does_and_names_its_systems(capsys):
    """`published --help` had no description and '--hardware: only these systems' named none of them."""
    from runner.bench import __main__ as bench

    with pytest.raises(SystemExit):
        bench.main(["published", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "spec-sheet predictions against published tables" in text, text
    assert "only these systems, separated by commas: dgx1_p100, ec2_p2_8xlarge, gce_k80x8 (default: all)" in text
