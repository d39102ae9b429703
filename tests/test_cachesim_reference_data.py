"""Reproduction checks against the reference artifacts (skipped without them)."""

import pytest

from cachesim import metrics
from cachesim.policies import CacheSpec
from cachesim.trace import load_trace

# Published in the reference repository's runs/a-main-s1/metrics.json (prose),
# rounded there to 4 decimals: miss/token at capacity fractions of E = 16,
# static pinned over the whole trace (w = 1.0), request-order LRU.
PUBLISHED_PROSE = {
    "lru": {0.125: 11.9339, 0.25: 8.981, 0.5: 4.4116},
    "static": {0.125: 10.8099, 0.25: 7.8502, 0.5: 3.6388},
    "belady": {0.125: 10.349, 0.25: 6.0862, 0.5: 2.2586},
}


@pytest.mark.slow
def test_a_main_s1_prose_reproduces_published_cache_metrics(reference_dir):
    trace = load_trace(reference_dir / "runs" / "a-main-s1" / "trace_prose.npz")
    assert round(metrics.reuse(trace, 1), 4) == 0.2965
    grid = [(policy, fraction) for policy in PUBLISHED_PROSE for fraction in (0.125, 0.25, 0.5)]
    rows = metrics.cache_table([trace], [CacheSpec(p, fraction=f) for p, f in grid])[0]
    for (policy, fraction), row in zip(grid, rows):
        published = PUBLISHED_PROSE[policy][fraction]
        if policy == "belady":
            # The reference broke Belady ties by Python set order; we break them by
            # lowest id (as for every other policy), which moves the bound by < 0.02%.
            assert row["misses_per_token"] == pytest.approx(published, rel=2e-4)
            assert row["misses_per_token"] <= published + 1e-4
        else:
            assert round(row["misses_per_token"], 4) == published, (policy, fraction)


def test_every_reference_trace_loads_with_e_from_meta(reference_dir):
    paths = sorted((reference_dir / "runs").glob("*/trace_*.npz"))
    paths += sorted((reference_dir / "qwen3-30b-a3b").glob("*.npz"))
    assert len(paths) == 11 * 3 + 4
    for path in paths[::6]:  # a spread of runs; loading all takes ~1 s each on 2 cores
        trace = load_trace(path)
        assert trace.num_experts == trace.meta["num_experts"]
        assert trace.num_experts in (16, 128)
