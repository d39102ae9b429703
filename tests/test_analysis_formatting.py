"""Markdown / LaTeX / CSV rendering of tables through pandas' writers, checked cell by cell."""

import csv
import io

import pytest
from analysis_fixtures import squash

from analysis import formatting
from analysis.formatting import Column, Table

TABLE = Table(
    name="demo_table",
    title="Demo & test_1",
    columns=(Column("run", "run", align="l"), Column("lam", "λ", formatting.general),
             Column("hit", "hit", formatting.percent()), Column("cost", "ΔPPL", formatting.signed_percent()),
             Column("x", "x", formatting.fixed(3)), Column("ci", "95% CI", formatting.percent_interval(1)),
             Column("seed", "seed", formatting.general), Column("spread", "over seeds", formatting.percent_spread(1))),
    rows=({"run": "a_1", "lam": 0.05, "hit": 0.43871, "cost": 0.021349, "x": 1 / 3, "ci": (0.581, 0.6062),
           "seed": 1, "spread": {"n": 2, "mean": 0.5, "sd": 0.0125}},
          {"run": "b|2", "lam": 0.0, "hit": None, "cost": -0.004, "x": float("nan"), "ci": None, "seed": None},
          {"run": "c", "lam": 1.0, "hit": 0.1, "cost": 0.0, "x": 0.1, "ci": [-0.01, 0.02], "seed": 2}),
    notes=("a note",),
)


def _markdown_cells(text: str) -> list[list[str]]:
    """The body rows of the (one) Markdown table in ``text``, as stripped cells."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in rows[2:]]


def test_markdown_rounds_through_each_columns_formatter():
    text = formatting.render_markdown(TABLE)
    assert text.startswith("### Demo & test_1\n\n| run ")
    assert text.endswith("\n\n_a note_\n")
    assert _markdown_cells(text) == [["a_1", "0.05", "43.9%", "+2.13%", "0.333", "[+58.1, +60.6]%", "1",
                                      "+50.0% ± 1.2 (2 seeds)"],
                                     ["b\\|2", "0", "—", "-0.40%", "—", "—", "—", "—"],
                                     ["c", "1", "10.0%", "+0.00%", "0.100", "[-1.0, +2.0]%", "2", "—"]]
    # Alignment row: left for run, right for the numbers ('0.100' is kept: no number re-parsing).
    assert squash(text.splitlines()[3]).startswith("|:-") and text.splitlines()[3].endswith("-:|")


def test_latex_is_a_booktabs_table_with_escapes_and_symbols():
    tex = formatting.render_latex(TABLE)
    assert tex.startswith("\\begin{table}[t]\n\\centering\n\\small\n\\begin{tabular}{lrrrrrrr}\n\\toprule\n")
    assert squash(r" run & $\lambda$ & hit & $\Delta$PPL & x & 95\% CI & seed & over seeds \\") in squash(tex)
    assert squash(r" a\_1 & 0.05 & 43.9\% & +2.13\% & 0.333 & [+58.1, +60.6]\% & 1 & +50.0\% $\pm$ 1.2 (2 seeds) \\") in squash(tex)
    assert squash(r" b|2 & 0 & --- & -0.40\% & --- & --- & --- & --- \\") in squash(tex)
    assert r"\caption{Demo \& test\_1}" in tex and r"\label{tab:demo-table}" in tex
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == 1 and tex.rstrip().endswith("% a note")


def test_csv_keeps_full_precision_and_types():
    rows = list(csv.reader(io.StringIO(formatting.render_csv(TABLE))))
    assert rows[0] == ["run", "lam", "hit", "cost", "x", "ci", "seed", "spread"]
    assert rows[1] == ["a_1", "0.05", "0.43871", "0.021349", repr(1 / 3), "0.581;0.6062", "1", "n=2;mean=0.5;sd=0.0125"]
    assert rows[2][2] == "" and rows[2][6] == ""  # None is an empty cell
    assert rows[3][1] == "1.0" and rows[3][6] == "2"  # a float stays a float, an int an int


def test_render_all_csv_sections_and_unknown_format():
    text = formatting.render_all([TABLE, TABLE], "csv")
    assert text.count("# demo_table\n") == 2
    with pytest.raises(ValueError, match="unknown table format 'html'"):
        formatting.render(TABLE, "html")


def test_empty_table_says_so():
    empty = Table("e", "Empty", (Column("a", "a"), Column("b", "b")), ())
    assert squash("| (no rows) | |") in squash(formatting.render_markdown(empty))
    assert "(no rows)" in formatting.render_latex(empty)
    assert formatting.render_csv(empty) == "a,b\n"


def test_spread_formatter():
    spread = {"n": 2, "mean": 0.0191, "sd": 0.0005, "low": 0.0187, "high": 0.0194}
    assert formatting.percent_spread(2)(spread) == "+1.91% ± 0.05 (2 seeds)"
    assert formatting.percent_spread(1, signed=False)(spread) == "1.9% ± 0.1 (2 seeds)"
    assert formatting.percent_spread()(None) == "—"
