"""README.md is a short front door: the two commands first, a link to every guide, links that resolve,
and every figure it quotes found in the results file it cites."""

from __future__ import annotations

import pathlib
import re

from test_docs_commands import GUIDES

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250
# What a fresh machine runs first (set-up + smoke run; set-up + tests): verbatim, first, never moved.
FIRST_COMMANDS = [
    "bash scripts/setup.sh && .venv/bin/python main.py --config=configs/arm_b.py:smoke --workdir=runs/arm_b-smoke",
    "bash scripts/setup.sh && .venv/bin/python -m pytest -n auto",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")
RESULTS_FILE = re.compile(r"((?:docs|benchmarks)/results/[\w./-]+\.md)")
# A figure: a number with a decimal point or a thousands comma (1,983; 57.0; 2:00 is a wall time).
FIGURE = re.compile(r"(?<![\w.])[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])[-+]?\d+\.\d+|\b\d+:\d\d\b")


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    first_block = lines.index("```bash")
    assert lines[first_block + 1:first_block + 3] == FIRST_COMMANDS
    assert lines[first_block + 3] == "```"
    assert all(not ln.strip() or ln.startswith("#") for ln in lines[:first_block]), "nothing before the commands"


def test_readme_links_every_guide_the_spec_and_the_architecture():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(README.read_text("utf-8"))}
    wanted = {*GUIDES, ROOT / "docs" / "spec.md", ROOT / "docs" / "architecture.md"}
    assert not {p.resolve() for p in wanted} - linked, sorted(str(p) for p in wanted - linked)
    assert all(p.is_file() for p in GUIDES)


def broken_links(text: str, base: pathlib.Path) -> list[str]:
    """Relative link targets in a Markdown text (read from folder ``base``) that name no file or folder."""
    targets = (t for t in LINK.findall(text) if not re.match(r"^(https?:|mailto:|#)", t))
    return [t for t in targets if not (base / t.partition("#")[0]).exists()]


def test_relative_links_resolve():
    docs = [README, *sorted(ROOT.glob("docs/**/*.md")), *sorted(ROOT.glob("*/README.md")),
            *sorted(ROOT.glob("*/*/README.md"))]
    broken = [f"{d.relative_to(ROOT)}: {t}" for d in docs for t in broken_links(d.read_text("utf-8"), d.parent)]
    assert not broken, broken
    # It bites: a guide's link written from the repository root, not from docs/, is reported.
    assert broken_links("[spec](spec.md) [arms](docs/arms.md#top) [web](https://x.org)", ROOT / "docs") == [
        "docs/arms.md#top"]


def unsourced_figures(text: str) -> list[str]:
    """Figures in a paragraph that cites a results file but do not appear in any file it cites."""
    problems = []
    for paragraph in re.split(r"\n\s*\n", text):
        cited = set(RESULTS_FILE.findall(paragraph))
        if not cited:
            continue
        sources = "".join((ROOT / c).read_text(encoding="utf-8") for c in cited).replace("−", "-")
        for figure in FIGURE.findall(paragraph.replace("−", "-")):
            if figure.lstrip("+-") not in sources:
                problems.append(f"{figure} (cites {sorted(cited)})")
    return problems


def test_readme_figures_come_from_the_results_files_they_cite():
    text = README.read_text(encoding="utf-8")
    assert len(RESULTS_FILE.findall(text)) >= 2 and len(FIGURE.findall(text)) >= 6  # the check has work to do
    assert not unsourced_figures(text), unsourced_figures(text)
    # It bites: a figure the cited page does not hold is reported.
    assert unsourced_figures("cuts misses by 57.1% ([docs/results/cpu-study-2.md](docs/results/cpu-study-2.md))") \
        == ["57.1 (cites ['docs/results/cpu-study-2.md'])"]
