"""libCacheSim as a second engine: exact LRU parity, hand-built answers per policy, conventions.

Every expected flag string below (m = miss, h = hit) is derived in its
comment from the policy's rule; the binding must reproduce it. Tests that
run libCacheSim skip where the optional extra is absent.
"""

import numpy as np
import pytest

from cachesim import reference as ref, simulate as sim
from cachesim.lcs import engine
from cachesim.policies import external
from cachesim.policies import CacheSpec, CacheSpecError
from cachesim.trace import load_trace, make_trace
from cachesim_fixtures import random_trace

needs_lcs = pytest.mark.skipif(not engine.available(), reason="libCacheSim is not installed "
                               "(pip install 'cacheable-moe[cache-policies]')")


def _scan(hot, rounds, scan):
    """`hot` keys requested `rounds` times, then `scan` keys once each, then the hot keys."""
    return list(range(hot)) * rounds + list(range(100, 100 + scan)) + list(range(hot))


HAND_BUILT = [
    # LRU: a hit refreshes 0, so 2 evicts 1 and 0 hits again.
    ("lcs-lru", 2, [0, 1, 0, 2, 0], "mmhmh"),
    # FIFO: a hit changes nothing, so 2 evicts 0, the first in.
    ("fifo", 2, [0, 1, 0, 2, 0], "mmhmm"),
    # CLOCK: 0's hit sets its bit; at 2 the hand clears it and evicts 1.
    ("clock", 2, [0, 0, 1, 2, 0], "mhmmh"),
    # SIEVE: 0 is visited; the hand passes it (clearing the bit) and evicts 1.
    ("sieve", 2, [0, 0, 1, 2, 0], "mhmmh"),
    # ARC: 0's hit moves it to T2; REPLACE evicts T1's LRU, 1.
    ("arc", 2, [0, 0, 1, 2, 0], "mhmmh"),
    # LRU-2: 1 has one access (infinite backward 2-distance) and goes first.
    ("lruk", 2, [0, 0, 1, 2, 0], "mhmmh"),
    # libCacheSim's LFU: 0 counts 2, 1 counts 1: 1 goes.
    ("lcs-lfu", 2, [0, 0, 1, 2, 0], "mhmmh"),
    # libCacheSim's LFUDA adds the cache age L (0 until the first eviction) to
    # a hit's count, not 1: 0 and 1 tie at 1, the first to get there (0) goes.
    ("lfuda", 2, [0, 0, 1, 2, 0], "mhmmm"),
    # LeCaR picks LRU's or LFU's victim at random; here both are 1 (older and
    # rarer than 0), so whatever the weights, 0 hits.
    ("lecar", 2, [0, 1, 0, 2, 0], "mmhmh"),
    # Belady (per request, always admitting): 2 evicts 1 (next at 4, not 0's 3),
    # 1 evicts 0 (6 vs 2's 5), 0 evicts 2 (8 vs 1's 7); the last 2 misses.
    ("lcs-belady", 2, [0, 1, 2, 0, 1, 2, 0, 1, 2], "mmmhmhmhm"),
    # SLRU (4 segments of 1): hits lift 0 to the top segment; one-time keys
    # churn through the bottom one, so 0 survives the scan.
    ("slru", 4, [0, 0, 0, 0] + list(range(100, 108)) + [0], "mhhh" + "m" * 8 + "h"),
]
# Two hot keys (3 rounds) then a scan of 3c one-time keys: the scan-resistant
# policies keep the hot keys; LRU, FIFO and CLOCK (whose sweep clears the hot
# bits and reaches them) lose them.
SCANS = [
    ("lcs-lru", 4, 2, "mm"), ("fifo", 4, 2, "mm"), ("clock", 4, 2, "mm"),
    # SIEVE: the hand stops after the hot keys (bits cleared once) and then
    # evicts each scan key right behind the newest: it never returns to them.
    ("sieve", 4, 2, "hh"),
    ("arc", 4, 2, "hh"),        # the hot keys live in T2, the scan in T1
    ("lirs", 12, 4, "hhhh"),    # hot keys are LIR; one-time keys only cycle the HIR slots
    ("cacheus", 4, 2, "hh"),    # SR-LRU keeps re-used keys out of the scan's way
    ("s3fifo", 20, 4, "hhhh"),  # hot keys move to the main FIFO; the scan leaves via the small one
    # 2Q promotes to Am only on a re-reference *after* eviction from A1in: the
    # hot keys were never evicted before the scan, so it flushes them.
    ("twoq", 4, 2, "mm"),
]
# Working sets that fit: nothing is evicted, only first requests miss
# (W-TinyLFU admits freely until the cache is full). Not Cacheus: at most sizes
# libCacheSim's halves (SR-LRU, CR-LFU) hold fewer keys than the capacity.
FITTING = [("tinylfu", 100), ("s3fifo", 20), ("twoq", 8), ("slru", 8), ("lirs", 12),
           ("arc", 5), ("sieve", 5), ("lecar", 5), ("lfuda", 5)]
_FIT_KEYS = {policy: np.random.default_rng(c).integers(0, c, 6 * c).tolist() for policy, c in FITTING}
# The convention traces of the LFU and Belady tests below.
LFU_KEYS = [0, 0, 1, 1, 2, 0, 2, 0]
BELADY_TOKENS = [[0, 1], [2, 0], [1, 2]]


@pytest.fixture(scope="module")
def flags():
    """Every case above in one libCacheSim worker: {(policy, capacity, keys): 'mh...'}."""
    cases = [(keys, policy, c) for policy, c, keys, _ in HAND_BUILT]
    cases += [(_scan(hot, 3, 3 * c), policy, c) for policy, c, hot, _ in SCANS]
    cases += [(_FIT_KEYS[policy], policy, c) for policy, c in FITTING]
    cases += [(LFU_KEYS, "lcs-lfu", 2), ([k for t in BELADY_TOKENS for k in t], "lcs-belady", 2),
              ([0, 1, 0], "lcs-belady", 1)]
    got = engine.miss_flags(cases)
    return {(policy, c, tuple(keys)): "".join("m" if f else "h" for f in result)
            for (keys, policy, c), result in zip(cases, got)}


@needs_lcs
def test_our_lru_is_libcachesim_lru_exactly():
    """Request-recency LRU, per layer and global, at every capacity: identical
    misses on random traces of several shapes and skews."""
    rng = np.random.default_rng(11)
    traces = [random_trace(int(rng.integers(2**31)), 2, int(rng.integers(40, 120)), k, e, skew)
              for k, e, skew in ((1, 5, 0.0), (2, 9, 0.6), (3, 9, 2.0), (2, 16, 0.3))]
    specs = [CacheSpec(policy, capacity=c, scope=scope) for scope in ("layer", "global")
             for c in (1, 2, 4, 7, 9, 18) for policy in ("lru", "lcs-lru")]
    for got in sim.simulate(traces, specs):
        np.testing.assert_array_equal(got[:, 0::2], got[:, 1::2])


@needs_lcs
def test_lru_parity_on_reference_traces(reference_dir):
    """The a-main-s1 code trace (E = 16, k = 2) and Qwen3-30B code (E = 128, k = 8), prefixes."""
    run = load_trace(reference_dir / "runs" / "a-main-s1" / "trace_code.npz")
    qwen = load_trace(reference_dir / "qwen3-30b-a3b" / "code.npz")
    traces = [make_trace(run.experts[:, :20_000], 16), make_trace(qwen.experts[:4, :2_000], 128)]
    specs = [CacheSpec(policy, fraction=f) for f in (0.125, 0.25, 0.5) for policy in ("lru", "lcs-lru")]
    for got in sim.simulate(traces, specs):
        np.testing.assert_array_equal(got[:, 0::2], got[:, 1::2])
        assert got.min() > 0


@needs_lcs
@pytest.mark.parametrize("policy, capacity, keys, want", HAND_BUILT)
def test_each_policy_on_a_hand_built_trace(flags, policy, capacity, keys, want):
    assert flags[policy, capacity, tuple(keys)] == want


@needs_lcs
@pytest.mark.parametrize("policy, capacity, hot, final", SCANS)
def test_scan_resistance_where_the_policy_promises_it(flags, policy, capacity, hot, final):
    got = flags[policy, capacity, tuple(_scan(hot, 3, 3 * capacity))]
    assert got[-hot:] == final
    assert got[:hot] == "m" * hot and got[hot:3 * hot] == "h" * 2 * hot  # compulsory, then hits


@needs_lcs
def test_a_working_set_that_fits_misses_only_once_per_key(flags):
    for policy, capacity in FITTING:
        keys = _FIT_KEYS[policy]
        assert flags[policy, capacity, tuple(keys)].count("m") == len(set(keys)), policy


@needs_lcs
def test_lfu_conventions_differ(flags):
    """Ours counts every request since the start of the trace and never resets
    a count, ties to the lowest id; libCacheSim counts requests since the key
    entered the cache (1 on every load), ties to the first to reach the count.
    Capacity 2, one request per token:

      keys      0 0 1 1 2 0 2 0
      ours      m h m h m m m h   2: counts 0:2, 1:2 tie -> 0 goes (lowest id);
                                  0: {1:2, 2:1} -> 2 goes, 0's count is now 3;
                                  2: {1:2, 0:3} -> 1 goes; the last 0 hits.
      libCacheSim m h m h m m m m  2: 0 reached 2 first -> 0 goes; 0 re-enters
                                  at count 1 and evicts 2 (1); 2: {1:2, 0:1}
                                  -> 0 goes again; the last 0 misses.
    """
    keys = LFU_KEYS
    ours = "".join("m" if token[0] else "h" for token in ref.replay_lfu([[k] for k in keys], 2))
    assert ours == "mhmhmmmh"
    assert flags["lcs-lfu", 2, tuple(keys)] == "mhmhmmmm"
    trace = make_trace(np.array(keys, np.int16)[None, :, None], 3)
    (got,) = sim.simulate([trace], [CacheSpec("lfu", capacity=2), CacheSpec("lcs-lfu", capacity=2)])
    assert got[0].tolist() == [5, 6]


@needs_lcs
def test_belady_conventions_differ(flags):
    """Ours ranks residents by their next request strictly after the current
    *token* (a token's later experts do not protect themselves from its
    earlier ones) and breaks ties by the lowest id; libCacheSim ranks by the
    next *request*. Capacity 2, k = 2, tokens [0, 1], [2, 0], [1, 2]:

      ours         m m | m m | m h   token 1: 2 evicts 0 (never needed after
                                     token 1) over 1 (token 2); then 0 misses
                                     and evicts 1 (tie at token 2, lowest id);
                                     token 2: 1 evicts 0 (tie: never), 2 hits.
      libCacheSim  m m | m h | m h   2 keeps 0 (next request, index 3, is
                                     sooner than 1's at 4): 0 hits.

    Neither bypasses: libCacheSim 0.3.5's Belady always admits the missed key.
    """
    tokens = BELADY_TOKENS
    ours = "".join("m" if f else "h" for token in ref.replay_belady(tokens, 2) for f in token)
    assert ours == "mmmmmh"
    assert flags["lcs-belady", 2, tuple(k for token in tokens for k in token)] == "mmmhmh"
    trace = make_trace(np.array([tokens], np.int16), 3)
    (got,) = sim.simulate([trace], [CacheSpec("belady", capacity=2),
                                    CacheSpec("lcs-belady", capacity=2)])
    assert got[0].tolist() == [5, 4]
    # Always admits: capacity 1, keys 0 1 0: loading 1 evicts 0 although 1 is
    # never requested again; a bypassing Belady would keep 0 and hit.
    assert flags["lcs-belady", 1, (0, 1, 0)] == "mmm"


def test_small_capacities_are_refused_with_the_reason():
    for policy, entry in external.EXTERNAL.items():
        if entry.min_capacity > 1:
            with pytest.raises(CacheSpecError, match=f"at least {entry.min_capacity}"):
                CacheSpec(policy, capacity=entry.min_capacity - 1)
    with pytest.raises(CacheSpecError, match="small FIFO"):
        CacheSpec("s3fifo", fraction=0.25).capacity_for(16)
    CacheSpec("s3fifo", capacity=0)  # 0 holds nothing: allowed for every policy


def test_missing_binding_names_the_extra(monkeypatch):
    monkeypatch.setattr(engine, "available", lambda: False)
    trace = random_trace(0, 1, 5, 1, 4)
    with pytest.raises(sim.SimulationError, match=r"pip install 'cacheable-moe\[cache-policies\]'"):
        sim.simulate([trace], [CacheSpec("arc", capacity=2)])


@needs_lcs
def test_a_libcachesim_abort_is_one_error_line(monkeypatch):
    """S3-FIFO below its minimum aborts the process it runs in: the worker's."""
    monkeypatch.setitem(external.EXTERNAL, "s3fifo", external.ExternalPolicy("S3FIFO"))
    trace = random_trace(0, 1, 20, 1, 8)
    with pytest.raises(sim.SimulationError, match=r"libCacheSim stopped .* s3fifo at capacity 2"):
        sim.simulate([trace], [CacheSpec("s3fifo", capacity=2)])
