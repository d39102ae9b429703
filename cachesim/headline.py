"""The study's headline cache rules: one definition each, imported by the simulator, the run, launch and analysis.

They live in cachesim because the simulator needs them and cachesim imports
nothing of the project; stdlib only, so a command's ``--help`` reads them
without loading the simulator. (The pre-registered gates are analysis's:
``analysis.verdict``.)
"""

from __future__ import annotations

# SPEC §9's cache of record, RQ1's miss metric: LRU holding a quarter of each layer's E experts. The fraction
# is a decimal string: the key paper_metrics files it under and the value a --capacity flag takes.
LRU_POLICY = "lru"
LRU_FRACTION = "0.25"
# Experts used by fewer than this fraction of tokens count as collapsed (SPEC §6, §9), and its spelling in text.
COLLAPSE_THRESHOLD = 0.01
COLLAPSE_PERCENT = f"{COLLAPSE_THRESHOLD:.0%}"
# The timed model's prefetch admission policies, as --prefetch_policy names them (cachesim.timed.prefetch ranks them).
ADMISSIONS = ("none", "highest_prob", "prob_per_byte", "earliest_deadline", "esv_per_byte", "oracle")
