"""Renders tables (columns + row dicts) as Markdown, LaTeX or CSV; pure string functions.

Human formats (Markdown, LaTeX) round through each column's formatter; CSV
keeps full precision (it is for machines, like the JSON output).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Callable, Sequence
from typing import Any

EMPTY = "—"


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: row key, header text, human formatter, LaTeX header, alignment."""

    key: str
    header: str
    fmt: Callable[[Any], str] = str
    latex: str | None = None  # Defaults to the escaped header.
    align: str = "r"


@dataclasses.dataclass(frozen=True)
class Table:
    """A titled table; ``name`` is the file stem under --out, notes print below it."""

    name: str
    title: str
    columns: tuple[Column, ...]
    rows: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()


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


def general(v: Any) -> str:
    """Compact number (0.05 -> '0.05', 1.0 -> '1'), text unchanged."""
    if _missing(v):
        return EMPTY
    return f"{v:g}" if isinstance(v, float) else str(v)


# -- renderers --------------------------------------------------------------------------------
def render_markdown(table: Table) -> str:
    """GitHub-flavoured Markdown: a heading, the table, then notes in italics."""
    align = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = [f"### {table.title}", ""]
    lines.append("| " + " | ".join(c.header for c in table.columns) + " |")
    lines.append("|" + "|".join(align[c.align] for c in table.columns) + "|")
    for row in table.rows:
        cells = [c.fmt(row.get(c.key)).replace("|", "\\|") for c in table.columns]
        lines.append("| " + " | ".join(cells) + " |")
    if not table.rows:
        lines.append("| " + " | ".join(["(no rows)"] + [""] * (len(table.columns) - 1)) + " |")
    lines += [""] + [f"_{n}_" for n in table.notes] + ([""] if table.notes else [])
    return "\n".join(lines).rstrip() + "\n"


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                  "λ": r"$\lambda$", "μ": r"$\mu$", "Δ": r"$\Delta$", "—": "---", "≥": r"$\geq$", "≤": r"$\leq$",
                  "τ": r"$\tau$", "γ": r"$\gamma$", "×": r"$\times$"}


def latex_escape(text: str) -> str:
    """Escapes LaTeX specials and maps the Greek letters used in headers to math."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def render_latex(table: Table) -> str:
    """A booktabs ``table`` environment (needs \\usepackage{booktabs})."""
    spec = "".join(c.align for c in table.columns)
    head = " & ".join(c.latex if c.latex is not None else latex_escape(c.header) for c in table.columns)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             head + r" \\", r"\midrule"]
    for row in table.rows:
        lines.append(" & ".join(latex_escape(c.fmt(row.get(c.key))) for c in table.columns) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{latex_escape(table.title)}}}",
              rf"\label{{tab:{table.name.replace('_', '-')}}}", r"\end{table}"]
    lines += [f"% {n}" for n in table.notes]
    return "\n".join(lines) + "\n"


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    return repr(value) if isinstance(value, float) else value


def render_csv(table: Table) -> str:
    """CSV with the column keys as header and unrounded values."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c.key for c in table.columns])
    for row in table.rows:
        writer.writerow([_csv_cell(row.get(c.key)) for c in table.columns])
    return buf.getvalue()


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
