"""analysis.decode: the study page's decode section from hand-built moe.decode reports."""

from __future__ import annotations

import json

import pytest

from analysis import decode
from analysis.runs import AnalysisError
from analysis_fixtures import made_from
from moe.rundir import sweep_root


def _policy(name, measured, modelled, misses=0.5, recall=None, tok_s=100.0):
    return {"policy": name, "measured_stall_per_token_s": measured, "modelled_stall_per_token_s": modelled,
            "ratio": modelled / measured if measured > 0 else None, "measured_tokens_per_s": tok_s,
            "modelled_tokens_per_s": 110.0, "misses_per_token": misses,
            "measured_timely_required_byte_recall": recall}


def _report(arm, policies, same_order=True):
    return {"arm": arm, "tokens": 128, "batch": 1, "mode": "sample", "tier": "disk", "page_cache_bypass": "O_DIRECT",
            "filesystem": "ext4", "capacity": 2, "num_experts": 8, "cache": "LRU", "budget_bytes_per_step": 1.5e6,
            "rounds": 3, "policies": policies,
            "order": {"tie_fraction": 0.01, "same_order": same_order,
                      "discordant_pairs": [] if same_order else [["highest_prob", "oracle"]]}}


def test_rows_lines_and_table_follow_the_reports(tmp_path):
    a = _report("A", [_policy("none", 4e-3, 3e-3, misses=0.8), _policy("highest_prob", 2e-3, 2.4e-3, recall=0.5,
                                                                                     tok_s=95.0)])
    b = _report("B", [_policy("none", 3e-3, 3e-3, misses=0.6), _policy("oracle", 0.0, 0.0)], same_order=False)
    (tmp_path / sweep_root.DECODE_DIR).mkdir(parents=True)
    for run, doc in (("a-s1", a), ("b-lam0.1-s1", b)):
        (tmp_path / sweep_root.DECODE_DIR / f"{run}.json").write_text(json.dumps(made_from(tmp_path / run, doc)))
    docs = decode.load_decode(tmp_path)
    rows = decode.decode_rows(docs)
    assert [(r["run"], r["policy"]) for r in rows] == [("a-s1", "none"), ("a-s1", "highest_prob"),
                                                       ("b-lam0.1-s1", "none"), ("b-lam0.1-s1", "oracle")]
    lines = decode.decode_lines(docs, rows)
    assert lines[0].startswith("Each run decoded 128 tokens × 1 stream(s) (sample) with every expert in the slow "
                               "tier, disk (O_DIRECT on ext4), and 2 of 8 experts per layer resident (LRU); each "
                               "admission policy at 1.50 MB per step, medians over 3 round(s).")
    # ratios 0.75 (3/4) and 1.20 (2.4/2); B's oracle never stalled, so it has no ratio.
    assert lines[2] == ("* a-s1 (arm A): demand-only S 4.000 ms per token measured (100.0 tokens/s), 3.000 ms "
                        "modelled (110.0 tokens/s), 0.800 misses per token; modelled / measured S from 0.75 to 1.20 "
                        "over 2 policies; the model orders the policies as measured (ties within 1% aside). "
                        "Prefetch lowers S but also measured throughput: highest_prob 2.000 ms at 95.0 tokens/s, "
                        "against demand-only's 4.000 ms at 100.0 tokens/s.")
    assert "Prefetch lowers S" not in lines[3]  # B's oracle stalls less at the same throughput
    assert lines[3].endswith("from 1.00 to 1.00 over 1 policies; the model reverses highest_prob/oracle.")
    assert lines[4] == ("* Demand-only measured S of b-lam0.1-s1 is 25.0% below a-s1's; its misses per token 0.600 "
                        "against 0.800 (one decode each: no interval).")
    table = decode.decode_table_md(rows)
    assert "| a-s1 | highest_prob | 2.000 | 2.400 | 1.20 | 95.0 | 110.0 | 0.500 | 50.0% |" in table
    assert "| b-lam0.1-s1 | oracle | 0.000 | 0.000 | — | 100.0 | 110.0 | 0.500 | — |" in table
    assert decode.decode_lines({}, []) == ["* No decode step ran in this study: the offloaded decode is not "
                                           "measured here."]


def test_the_sweep_writes_where_the_page_reads_and_a_broken_file_is_one_line(tmp_path):
    assert decode.load_decode(tmp_path) == {}
    (tmp_path / sweep_root.DECODE_DIR).mkdir(parents=True)
    (tmp_path / sweep_root.DECODE_DIR / "a-s1.json").write_text("{")
    with pytest.raises(AnalysisError, match=r"a-s1.json: not JSON .*; delete it and rerun the sweep"):
        decode.load_decode(tmp_path)
