"""A study's evidence, kept (analysis.evidence), and its page regenerated from that folder alone.

``tests/data/tiny-study`` is a committed study (configs/study_tiny.py: tiny runs of arms A, B and M with
M's control, a frontier and the stall step), kept with analysis.evidence and its page made by
analysis.report from the kept folder; every figure the issue asks of a study page is checked on it.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
from analysis_fixtures import check_vs_lines
from launch_fixtures import write_complete_run

from analysis import evidence, report, run_args
from helpers import REPO
from moe import rundir

DATA = REPO / "tests" / "data"
PAGE = DATA / "tiny-study.md"
RUNS = DATA / "tiny-study" / "runs"


def test_the_committed_page_regenerates_from_its_evidence_alone_and_meets_the_issue_s_figures(tmp_path,
                                                                                              monkeypatch):
    # The committed page's own command, from a copy of the repository's tests/data elsewhere (another machine).
    shutil.copytree(RUNS, tmp_path / RUNS.relative_to(REPO))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(run_args.ENV_CACHE_DIR, str(tmp_path / "cache"))
    assert report.main([str(RUNS.relative_to(REPO)), "--name=tiny-study", "--out=tests/data"]) == 0
    page = (tmp_path / "tests" / "data" / "tiny-study.md").read_text()
    committed = PAGE.read_text()
    assert report.TIMINGS_HEADING in committed
    # Byte for byte apart from Timings. A change to what the page says shows here: review the page's diff, then
    # python -m analysis.report tests/data/tiny-study/runs --name=tiny-study --out=tests/data
    assert report.strip_timings(page) == report.strip_timings(committed), "the committed page differs"
    _meets_the_issue_s_figures(page)


def test_the_committed_evidence_is_small_and_holds_no_training_state():
    files = [p for p in RUNS.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 2 * 2**20
    assert not [p for p in files if "checkpoints" in p.parts or p.name.endswith(".tmp")]
    assert (RUNS / "status.json").is_file() and (RUNS / "preregistration.json").is_file()


def _meets_the_issue_s_figures(page):
    # No interval runs outside its scale: hit rates in [0, 100]%, reductions of misses below 100%.
    for low, high in re.findall(r"95% CI \[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]", page):
        assert float(low) <= float(high)
    for line in page.splitlines():
        for m in re.finditer(r"([\d.]+)% reduction[^;]*?95% CI \[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]", line):
            assert float(m.group(3)) < 100.0, line
        for m in re.finditer(r"static hit@50%[^;]*?95% CI \[([+-]?[\d.]+)%, ([+-]?[\d.]+)%\]", line):
            assert 0.0 <= float(m.group(1)) <= float(m.group(2)) <= 100.0, line
    assert check_vs_lines(page) >= 10  # every "X vs Y = Z" recomputes from its X and Y
    for aspect in ("seed pairing (confidence verdict)", "interval rule (confidence verdict)",
                   "collapse reading (diagnostic)", "arm M's control"):
        assert f"| {aspect} |" in page
    # The registered RQ1 estimand: its interval, its half-width against the target, and the seeds to decide it.
    (joint,) = [line for line in page.splitlines() if line.startswith("RQ1 joint question") and "branched" not in line]
    assert re.search(r"\(95% CI \[[+-][\d.]+%, [+-][\d.]+%\], jackknife", joint)
    assert re.search(r"half-width ±[\d.]+ points against the registered ±0\.5-point target", joint)
    assert re.search(r"(seeds would decide it|needs \d+ seeds|more than \d+ seeds)", joint)
    # Arm M under MELINOE's own question against its control, never in RQ1's overall word.
    assert "* m-s1 against its control m-control-s1" in page
    overall = [line for line in page.splitlines() if line.startswith(("RQ1 overall", "RQ2 overall"))]
    assert len(overall) == 5 and not [line for line in overall if "M λ" in line]
    # The page opens with exactly those words, and the registered rule's word follows the joint line's state.
    assert [line[2:] for line in page.splitlines() if line.startswith(("* RQ1 overall", "* RQ2 overall"))] == overall
    assert overall[-1].startswith("RQ1 overall, the study's registered decision rule")
    assert overall[-1].split("): ", 1)[1].startswith("NOT RESOLVED") and joint.endswith("-> NOT RESOLVED")
    # No arm C here, and arm A is below the static-hit gate at this size: RQ2 is not tested (not "not
    # testable": that needs arm A at or above the gate, tests/test_analysis_verdict.py).
    assert "RQ2 overall, confidence verdict: NOT TESTED (no counted configuration with a baseline)" in page
    assert "below the gate, so a confinement loss has room to show an effect" in page


def test_keep_copies_what_the_page_reads_and_nothing_of_training_state(tmp_path):
    root = tmp_path / "sweep"
    run = root / "a-s1"
    write_complete_run(run, steps=4)
    (run / "config.json").write_text("{}")
    (run / "checkpoints" / "4").mkdir(parents=True)
    (run / "checkpoints" / "4" / "state").write_bytes(b"x" * 100)
    (run / "frontier.json").write_text("{}")
    rundir.write_json(root / "status.json", {"command": "python -m launch.sweep", "machine": "here"})
    (root / "analysis" / "stall").mkdir(parents=True)
    (root / "analysis" / "stall" / "a-s1.json").write_text("{}")
    (root / "analysis" / "results" / "x").mkdir(parents=True)
    (root / "analysis" / "results" / "x.md").write_text("page")
    out = tmp_path / "docs" / "x" / "runs"
    size = evidence.keep(root, out)
    kept = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"status.json", "a-s1/frontier.json", "a-s1/config.json", "analysis/stall/a-s1.json"} <= kept
    assert not [k for k in kept if k.startswith(("a-s1/checkpoints", "analysis/results"))]
    assert 0 < size == evidence.compressed_size(out)
    with pytest.raises(ValueError, match="exists; remove it or give a new folder"):
        evidence.keep(root, out)
    with pytest.raises(ValueError, match=r"compresses to 0\.0 MiB, over the 0 MiB a study may commit"):
        evidence.keep(root, tmp_path / "small", limit=1)
    assert not (tmp_path / "small").exists()
    with pytest.raises(ValueError, match="no status.json; give a sweep root"):
        evidence.keep(run, tmp_path / "other")
    assert json.loads((out / "status.json").read_text())["machine"] == "here" and math.isfinite(size)
