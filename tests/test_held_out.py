"""The held-out check of the spec sheet's constants (runner/bench/fit.py): a fold's predictions never read the
cells they are scored against, the fit finds constants that made the figures, and the command prints its table."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from runner.bench import fit, published
from runner.predict.spec_sheet import FIT

slow = pytest.mark.slow  # models built for the published cells, and least-squares fits over them


def _cell(mode: str, rate: float) -> published.Cell:
    """A made-up published cell of one setting (8 GPUs of one system, model and batch) in `mode`."""
    return published.Cell("sys", "net", 32, mode, 8, 1, rate, ())


def test_a_fastest_mode_is_scored_only_where_the_published_modes_differ_beyond_a_tie():
    """Every setting a table measured in several modes had them within 10%: the old count called any prediction
    right there (it could not fail). A setting counts only when its published modes differ beyond the tie, and a
    predicted tie is no answer."""
    a, b = _cell("ps", 1000.0), _cell("replicated", 800.0)
    assert fit.Fold("f", [a, b], {a: 900.0, b: 700.0}).fastest() == (1, 1)  # a predicted fastest, a published
    assert fit.Fold("f", [a, b], {a: 700.0, b: 900.0}).fastest() == (0, 1)  # the wrong one
    assert fit.Fold("f", [a, b], {a: 900.0, b: 880.0}).fastest() == (0, 1)  # a predicted tie: no answer
    close = _cell("replicated", 950.0)
    assert fit.Fold("f", [a, close], {a: 2000.0, close: 100.0}).fastest() == (0, 0)  # published within 10%: none


@pytest.fixture(scope="module")
def every():
    """Every published cell, ready to price again."""
    return fit.samples(published.cells())


@pytest.fixture(scope="module")
def k80(every):
    """The two K80 systems' cells (81 of them: one machine and several)."""
    return [s for s in every if s.cell.hardware in ("gce_k80x8", "ec2_p2_8xlarge")]


@slow
def test_the_shipped_constants_are_the_fit_to_every_published_cell(every):
    """FIT is what runner/bench/fit.py finds on all 117 cells (to the 3 figures shipped), not a hand-set value."""
    found = fit.fit(every)
    for name in ("memory", "link", "overlap", "sync"):  # kernel_cycles is START's, never fitted
        assert getattr(FIT, name) == pytest.approx(getattr(found, name), rel=5e-3), name
    assert FIT.algorithms == pytest.approx(found.algorithms, rel=5e-3)
    assert FIT.architecture == pytest.approx(found.architecture, rel=5e-3)


def _published(found, change):
    """`found` with each cell's published rate as `change(cell)` says."""
    return [dataclasses.replace(s, cell=dataclasses.replace(s.cell, published=change(s.cell))) for s in found]


@slow
@pytest.mark.parametrize("by", ["machines", "system"])
def test_a_folds_predictions_do_not_read_the_cells_left_out_and_do_read_the_others(k80, by):
    group = fit.FOLDS[by]
    folds = fit.held_out(k80, by)
    assert folds and all(fold.held for fold in folds)
    for fold in folds:
        name = fold.name.split("=", 1)[1]
        tripled = next(f for f in fit.held_out(_published(k80, lambda c: c.published * (3 if group(c) == name else 1)),
                                               by) if f.name == fold.name)
        assert [tripled.rates[c] for c in tripled.held] == pytest.approx([fold.rates[c] for c in fold.held], rel=1e-9)
        moved = next(f for f in fit.held_out(_published(k80, lambda c: c.published * (1 if group(c) == name else
                                                                                      1 + c.gpus / 10)), by)
                     if f.name == fold.name)
        assert [moved.rates[c] for c in moved.held] != pytest.approx([fold.rates[c] for c in fold.held], rel=1e-3)


@slow
def test_the_fit_finds_constants_that_made_the_published_figures(k80):
    """Figures priced with made-up constants are fitted back to within 1% (from a start that knows none of them)."""
    made_up = dataclasses.replace(FIT, memory=0.4, link=0.5, sync=0.05, overlap=0.3)
    found = _published(k80, lambda c: next(s.rate(made_up) for s in k80 if s.cell == c))
    errors = [abs(math.expm1(e)) for e in fit.errors(found, fit.fit(found))]
    assert max(errors) < 0.01, max(errors)
    assert max(abs(math.expm1(e)) for e in fit.errors(found, fit.START)) > 0.2  # the start alone is far off


@slow
def test_held_out_prints_in_sample_and_left_out_rows_with_their_figures():
    out = subprocess.run([sys.executable, "-m", "runner.bench", "published", "--held-out", "--hardware",
                          "gce_k80x8,ec2_p2_8xlarge"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split(" | ")[0].strip("| *"): line for line in out.stdout.splitlines() if line.startswith("| ")}
    assert "| all (in-sample) | 81 |" in rows["all (shipped constants)"]
    assert {"system=gce_k80x8", "each system left out", "model=alexnet", "each model left out",
            "machines=several machines"} <= rows.keys(), list(rows)
    assert "| the others | 81 |" in rows["each model left out"]
