"""Markdown / LaTeX / CSV rendering of tables (pure string functions)."""

import csv
import io

import pytest

from analysis import formatting
from analysis.formatting import Column, Table

TABLE = Table(
    name="demo_table",
    title="Demo & test",
    columns=(Column("run", "run", align="l"), Column("lam", "λ", formatting.general),
             Column("hit", "hit", formatting.percent()), Column("cost", "ΔPPL", formatting.signed_percent()),
             Column("x", "x", formatting.fixed(3))),
    rows=({"run": "a_1", "lam": 0.05, "hit": 0.43871, "cost": 0.021349, "x": 1 / 3},
          {"run": "b|2", "lam": 0.0, "hit": None, "cost": -0.004, "x": float("nan")}),
    notes=("a note",),
)


def test_markdown_exact():
    assert formatting.render_markdown(TABLE) == (
        "### Demo & test\n\n"
        "| run | λ | hit | ΔPPL | x |\n"
        "|:--|--:|--:|--:|--:|\n"
        "| a_1 | 0.05 | 43.9% | +2.13% | 0.333 |\n"
        "| b\\|2 | 0 | — | -0.40% | — |\n\n"
        "_a note_\n")


def test_latex_escapes_and_uses_booktabs():
    tex = formatting.render_latex(TABLE)
    assert r"run & $\lambda$ & hit & $\Delta$PPL & x \\" in tex
    assert r"a\_1 & 0.05 & 43.9\% & +2.13\% & 0.333 \\" in tex
    assert r"b|2 & 0 & --- & -0.40\% & --- \\" in tex
    assert r"\caption{Demo \& test}" in tex and r"\label{tab:demo-table}" in tex
    assert tex.count(r"\toprule") == 1 and r"\begin{tabular}{lrrrr}" in tex


def test_csv_keeps_full_precision():
    rows = list(csv.reader(io.StringIO(formatting.render_csv(TABLE))))
    assert rows[0] == ["run", "lam", "hit", "cost", "x"]
    assert rows[1] == ["a_1", "0.05", "0.43871", "0.021349", repr(1 / 3)]
    assert rows[2][2] == ""  # None


def test_render_all_csv_sections_and_unknown_format():
    text = formatting.render_all([TABLE, TABLE], "csv")
    assert text.count("# demo_table\n") == 2
    with pytest.raises(ValueError, match="unknown table format 'html'"):
        formatting.render(TABLE, "html")


def test_empty_table_says_so():
    empty = Table("e", "Empty", (Column("a", "a"), Column("b", "b")), ())
    assert "| (no rows) |  |" in formatting.render_markdown(empty)
