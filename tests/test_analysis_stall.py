"""analysis.stall_section: the study page's stall section from hand-built cachesim.stall documents."""

from __future__ import annotations

import json

import pytest

from analysis import stall_section
from analysis.runs import AnalysisError
from analysis_fixtures import made_from
from moe import rundir
from moe.rundir import sweep_root


def _result(policy, s, p99, recall, unused, budget=2e6):
    return {"policy": policy, "budget_bytes_per_step": "inf" if policy == "none" else budget,
            "stall_per_token_s": s, "step_stall_s": {"p50": s / 2, "p95": s, "p99": p99},
            "timely_required_byte_recall": recall, "unused_prefetched_bytes_per_token": unused}


def _doc(*domains):
    return {"runs": [{"trace": f"trace_{i}", "hardware": "hw", "model": "m", "capacity_per_layer": 4,
                      "results": results} for i, results in enumerate(domains)]}


def test_rows_average_each_policy_over_the_domains_and_lines_follow_them(tmp_path):
    a = _doc([_result("none", 4e-3, 8e-3, 0.0, 0.0), _result("highest_prob", 2e-3, 6e-3, 0.5, 1e6),
              _result("oracle", 1e-3, 2e-3, 0.9, 0.0)],
             [_result("none", 2e-3, 4e-3, 0.0, 0.0), _result("highest_prob", 1e-3, 2e-3, 0.3, 3e6),
              _result("oracle", 1e-3, 2e-3, 0.9, 0.0)])
    b = _doc([_result("none", 1e-3, 1e-3, 0.0, 0.0), _result("highest_prob", 1e-3, 1e-3, 0.0, 5e5)])
    (tmp_path / sweep_root.STALL_DIR).mkdir(parents=True)
    for run, doc in (("a-s1", a), ("b-s1", b)):
        (tmp_path / sweep_root.STALL_DIR / f"{run}.json").write_text(json.dumps(made_from(tmp_path / run, doc)))
    rows = stall_section.stall_rows(stall_section.load_stall(tmp_path))
    hp = next(r for r in rows if r["run"] == "a-s1" and r["policy"] == "highest_prob")
    assert (hp["stall_s"], hp["p99_s"], hp["recall"], hp["unused_bytes"], hp["domains"]) == pytest.approx(
        (1.5e-3, 4e-3, 0.4, 2e6, 2))
    lines = stall_section.stall_lines(rows)
    assert lines[0].startswith("Timed tier on each run's held-out traces: m expert bytes on `hw`, 4 experts resident "
                               "per layer, every admission policy at one prefetch budget of 2.00 MB per step")
    # 3 ms on demand only (mean of 4 and 2), 1.5 ms with highest_prob: 2.00x less; the oracle is a bound beside it.
    assert lines[2] == ("* a-s1: S 3.0000 ms per token on demand only; lowest with highest_prob, 1.5000 ms (2.00× "
                        "less), timely byte recall 40.0%, unused prefetch 2.00 MB per token; the oracle admission "
                        "(a bound) 1.0000 ms.")
    assert lines[3] == "* b-s1: no admission policy lowers S below demand-only's 1.0000 ms per token."
    table = stall_section.stall_table_md(rows)
    assert "| a-s1 | highest_prob | 1.5000 | 0.7500 / 1.5000 / 4.0000 | 40.0% | 2.00 |" in table
    assert stall_section.stall_lines([]) == ["* No stall step ran in this study: the timed tier's metrics are not "
                                     "measured here."]


def test_the_sweep_writes_where_the_page_reads_and_a_broken_file_is_one_line(tmp_path):
    assert stall_section.load_stall(tmp_path) == {}  # a study without the step: no section
    (tmp_path / sweep_root.STALL_DIR).mkdir(parents=True)
    (tmp_path / sweep_root.STALL_DIR / "a-s1.json").write_text("{")
    with pytest.raises(AnalysisError, match=r"a-s1.json: not JSON .*; delete it and rerun the sweep"):
        stall_section.load_stall(tmp_path)


def test_a_stale_or_orphan_stall_report_is_refused_in_one_line_naming_both_steps_and_the_fix(tmp_path):
    (tmp_path / sweep_root.STALL_DIR).mkdir(parents=True)
    path = tmp_path / sweep_root.STALL_DIR / "a-s1.json"
    doc = _doc([_result("none", 1e-3, 1e-3, 0.0, 0.0)])
    path.write_text(json.dumps(made_from(tmp_path / "a-s1", doc, step=32)))
    assert list(stall_section.load_stall(tmp_path)) == ["a-s1"]  # current
    (tmp_path / "a-s1" / rundir.CHECKPOINTS / "80").mkdir()  # the run trained on: the report is of step 32
    with pytest.raises(AnalysisError) as error:
        stall_section.load_stall(tmp_path)
    assert str(error.value).startswith(f"{path} was made from checkpoint step 32 (no evaluation yet), but "
                                       f"{tmp_path / 'a-s1'} is now at step 80 (no evaluation yet): stale; it is "
                                       f"not used; recompute it: rerun the sweep on {tmp_path} (python -m launch.sweep")
    path.write_text(json.dumps(doc))  # from before reports recorded their source: cannot be checked
    with pytest.raises(AnalysisError, match="a-s1.json records no source"):
        stall_section.load_stall(tmp_path)
    (tmp_path / sweep_root.STALL_DIR / "gone.json").write_text(json.dumps(doc))
    path.unlink()
    with pytest.raises(AnalysisError, match=f"gone.json: its run {tmp_path / 'gone'} is not there"):
        stall_section.load_stall(tmp_path)
