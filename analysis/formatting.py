"""Tables as pandas DataFrames, rendered as Markdown, LaTeX or CSV by pandas' writers.

A :class:`Table` is rows (dicts of unrounded values) plus, per column, a
header and a cell formatter. Markdown and LaTeX are human formats: each cell
goes through its column's formatter (the rounding lives there), then
``DataFrame.to_markdown`` (tabulate) writes a GitHub table or a booktabs
tabular. CSV is for machines: ``DataFrame.to_csv`` of the unrounded values.
(``DataFrame.to_latex`` would need Jinja2, which the project does not
depend on; tabulate's ``latex_booktabs`` escapes the same specials.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tabulate import LATEX_ESCAPE_RULES

if TYPE_CHECKING:
    import pandas as pd

EMPTY = "—"
_ALIGN = {"l": "left", "r": "right", "c": "center"}
# Characters of headers and cells that pdflatex cannot typeset as text; mapped after tabulate's escaping.
_LATEX_SYMBOLS = {"λ": r"$\lambda$", "μ": r"$\mu$", "Δ": r"$\Delta$", "—": "---", "–": "--", "≥": r"$\geq$",
                  "≤": r"$\leq$", "τ": r"$\tau$", "γ": r"$\gamma$", "×": r"$\times$", "±": r"$\pm$",
                  "Σ": r"$\Sigma$", "²": r"$^2$", "ε": r"$\varepsilon$"}


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: row key, header text, human formatter, alignment (l, r or c)."""

    key: str
    header: str
    fmt: Callable[[Any], str] = str
    align: str = "r"


@dataclasses.dataclass(frozen=True)
class Table:
    """A titled table; ``name`` is the file stem under --out, notes print below it."""

    name: str
    title: str
    columns: tuple[Column, ...]
    rows: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()

    def frame(self, cell: Callable[[Any], Any] = lambda v: v) -> pd.DataFrame:
        """The unrounded values (through ``cell``), one column per column key.

        Object dtype: ints stay ints and None stays None (a float column would
        print a seed 1 as 1.0 and lose the difference between 0 and missing).
        """
        import pandas as pd  # here, not at the top: the table commands' --help need not wait for it

        keys = [c.key for c in self.columns]
        return pd.DataFrame([[cell(row.get(k)) for k in keys] for row in self.rows], columns=keys, dtype=object)

    def formatted(self) -> pd.DataFrame:
        """The cells as the human formats show them, headed by the column headers."""
        import pandas as pd

        frame = self.frame()
        cells = {c.header: [c.fmt(v) for v in frame[c.key]] for c in self.columns}
        return pd.DataFrame(cells, columns=[c.header for c in self.columns], dtype=object)


# -- cell formatters --------------------------------------------------------------------------
def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fixed(digits: int) -> Callable[[Any], str]:
    """Fixed-point with ``digits`` decimals; None/NaN as an em dash."""
    return lambda v: EMPTY if _missing(v) else f"{v:.{digits}f}"


def percent(digits: int = 1) -> Callable[[Any], str]:
    """A fraction shown as a percentage (0.4387 -> '43.9%')."""
    return lambda v: EMPTY if _missing(v) else f"{100 * v:.{digits}f}%"


def signed_percent(digits: int = 2) -> Callable[[Any], str]:
    """A relative change shown with its sign (0.0213 -> '+2.13%')."""
    return lambda v: EMPTY if _missing(v) else f"{100 * v:+.{digits}f}%"


def percent_interval(digits: int = 2, signed: bool = True) -> Callable[[Any], str]:
    """A (low, high) pair of fractions as '[+1.80, +2.02]%'; None (no interval) as an em dash."""
    spec = f"+.{digits}f" if signed else f".{digits}f"

    def fmt(v: Any) -> str:
        if v is None or any(_missing(x) for x in v):
            return EMPTY
        low, high = v
        return f"[{100 * low:{spec}}, {100 * high:{spec}}]%"

    return fmt


def percent_spread(digits: int = 2, signed: bool = True) -> Callable[[Any], str]:
    """A spread across seeds ({n, mean, sd, ...} of fractions) as '+1.91% ± 0.05 (2 seeds)'; None as an em dash."""
    spec = f"+.{digits}f" if signed else f".{digits}f"

    def fmt(v: Any) -> str:
        if v is None:
            return EMPTY
        return f"{100 * v['mean']:{spec}}% ± {100 * v['sd']:.{digits}f} ({v['n']} seeds)"

    return fmt


def general(v: Any) -> str:
    """Compact number (0.05 -> '0.05', 1.0 -> '1'), text unchanged."""
    if _missing(v):
        return EMPTY
    return f"{v:g}" if isinstance(v, float) else str(v)


# -- renderers --------------------------------------------------------------------------------
def _human_frame(table: Table) -> pd.DataFrame:
    """The formatted cells; an empty table gets one '(no rows)' row (a bare header would read as a table)."""
    frame = table.formatted()
    if frame.empty:
        frame.loc[0] = ["(no rows)"] + [""] * (len(table.columns) - 1)
    return frame


def _tabulate(table: Table, frame: pd.DataFrame, **kwargs: Any) -> str:
    # disable_numparse keeps every cell as its formatter wrote it ('0.100' stays '0.100').
    return frame.to_markdown(index=False, colalign=[_ALIGN[c.align] for c in table.columns],
                             disable_numparse=True, **kwargs)


def render_markdown(table: Table) -> str:
    """GitHub-flavoured Markdown: a heading, the table, then notes in italics."""
    frame = _human_frame(table).map(lambda cell: cell.replace("|", "\\|"))
    frame.columns = [h.replace("|", "\\|") for h in frame.columns]
    lines = [f"### {table.title}", "", _tabulate(table, frame), ""]
    lines += [f"_{n}_" for n in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def latex_symbols(text: str) -> str:
    """Maps the Greek letters and symbols of headers and cells to LaTeX (after escaping)."""
    return "".join(_LATEX_SYMBOLS.get(ch, ch) for ch in text)


def render_latex(table: Table) -> str:
    """A booktabs ``table`` environment (needs \\usepackage{booktabs}); notes as comments."""
    tabular = latex_symbols(_tabulate(table, _human_frame(table), tablefmt="latex_booktabs"))
    caption = latex_symbols("".join(LATEX_ESCAPE_RULES.get(ch, ch) for ch in table.title))  # tabulate's rules
    lines = [r"\begin{table}[t]", r"\centering", r"\small", tabular, rf"\caption{{{caption}}}",
             rf"\label{{tab:{table.name.replace('_', '-')}}}", r"\end{table}"]
    lines += [f"% {n}" for n in table.notes]
    return "\n".join(lines) + "\n"


def _csv_cell(value: Any) -> Any:
    """A list as 'a;b' (a CI: 'low;high'), a mapping as 'key=value;...' (a seed spread: 'n=2;mean=...')."""
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    if isinstance(value, dict):
        return ";".join(f"{k}={v}" for k, v in value.items())
    return value


def render_csv(table: Table) -> str:
    """CSV with the column keys as header and unrounded values (None as an empty cell)."""
    return table.frame(_csv_cell).to_csv(index=False, lineterminator="\n")


RENDERERS: dict[str, Callable[[Table], str]] = {"markdown": render_markdown, "latex": render_latex,
                                                "csv": render_csv}
EXTENSIONS = {"markdown": "md", "latex": "tex", "csv": "csv", "json": "json"}


def render(table: Table, fmt: str) -> str:
    """Dispatches to the renderer of ``fmt`` (markdown, latex or csv)."""
    try:
        return RENDERERS[fmt](table)
    except KeyError:
        raise ValueError(f"unknown table format {fmt!r}; use one of {', '.join(RENDERERS)}") from None


def render_all(tables: Sequence[Table], fmt: str) -> str:
    """Several tables in one stream (CSV sections are introduced by '# <name>' lines)."""
    if fmt == "csv":
        return "\n".join(f"# {t.name}\n{render_csv(t)}" for t in tables)
    return "\n".join(render(t, fmt) for t in tables)
