"""Cache specifications: which policy, how big, and the policy's options (SPEC §7).

A `CacheSpec` is independent of any trace: its capacity is either a count or a
fraction of E with a rounding mode, resolved per trace by `capacity_for(E)`.
Fractions are read as the decimal number written (0.1 is exactly 1/10), so
`ceil(0.1 * 30)` is 3, not the 4 that binary floating point would give.

Semantics shared by the JAX simulator and the plain-Python reference:

* A cache of capacity c holds at most c experts. A request for a resident
  expert is a hit; otherwise it is a demand miss that loads the expert,
  first evicting one resident expert when c experts are already resident.
* Capacity 0 holds nothing: every request misses and nothing is loaded.
  Capacity 1 <= c < k is simulated by the same rules: a token's later requests
  may evict the experts its earlier requests just loaded.
* Capacity >= E never evicts: only the first request of each expert misses.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

POLICIES = ("lru", "lfu", "static", "belady")
# Codes of the replayed policies, shared by every fast path (`cachesim.online`,
# `cachesim.stack`); static pinning has no per-token state.
LRU_REQUEST, LRU_TOKEN, LFU, BELADY = 0, 1, 2, 3
RECENCY_MODES = ("request", "token")
ROUNDING_MODES = ("ceil", "round", "floor")


class CacheSpecError(ValueError):
    """A cache specification is malformed; the message names the fix."""


def exact_decimal(value: float) -> Fraction:
    """The decimal number a user wrote, as an exact fraction (0.1 -> 1/10)."""
    return Fraction(repr(float(value)))


def capacity_from_fraction(fraction: float, num_experts: int, rounding: str = "ceil") -> int:
    """Rounds fraction * E to a count: `ceil` (the paper), `round` (Python's
    half-to-even `round`, the reference's trained-model tables) or `floor` (the
    reference's real-model study)."""
    if rounding not in ROUNDING_MODES:
        raise CacheSpecError(f"unknown rounding {rounding!r}; use one of {ROUNDING_MODES}")
    if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
        raise CacheSpecError(f"capacity fraction must be in [0, 1], got {fraction}; "
                             "give larger caches as a count")
    exact = exact_decimal(fraction) * num_experts
    if rounding == "ceil":
        return math.ceil(exact)
    if rounding == "floor":
        return math.floor(exact)
    return round(exact)


def warmup_tokens(warmup: float, num_tokens: int) -> int:
    """Length of the static policy's warm-up prefix: floor(w * T), w exact decimal."""
    return math.floor(exact_decimal(warmup) * num_tokens)


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """One cache configuration, applied independently to every layer.

    Attributes:
      policy: "lru", "lfu", "static" or "belady".
      capacity: the capacity as a count of experts; exclusive with `fraction`.
      fraction: the capacity as a fraction of E, rounded by `rounding`.
      rounding: "ceil" (default), "round" or "floor"; only with `fraction`.
      recency: LRU only. "request": every request refreshes recency in request
        order. "token": a token's requests share one timestamp, ties between
        equally old experts evict the lowest id.
      warmup: static only. Pin the top-c experts by request count in the first
        floor(warmup * T) tokens (ties to the lowest id; experts unseen in the
        warm-up fill remaining slots, lowest id first). The pinned set then
        serves the whole trace, warm-up included (w = 1.0 is the in-sample
        convention of the reference's trained-model tables).
    """

    policy: str
    capacity: int | None = None
    fraction: float | None = None
    rounding: str = "ceil"
    recency: str = "request"
    warmup: float = 1.0

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise CacheSpecError(f"unknown policy {self.policy!r}; use one of {POLICIES}")
        if (self.capacity is None) == (self.fraction is None):
            raise CacheSpecError("give exactly one of capacity (a count) or fraction")
        if self.capacity is not None:
            if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
                raise CacheSpecError(f"capacity must be an int count, got {self.capacity!r}")
            if self.capacity < 0:
                raise CacheSpecError(f"capacity must be >= 0, got {self.capacity}")
        else:
            capacity_from_fraction(self.fraction, 1, self.rounding)  # validates
        if self.rounding not in ROUNDING_MODES:
            raise CacheSpecError(f"unknown rounding {self.rounding!r}; use one of "
                                 f"{ROUNDING_MODES}")
        if self.recency not in RECENCY_MODES:
            raise CacheSpecError(f"unknown LRU recency {self.recency!r}; use one of "
                                 f"{RECENCY_MODES}")
        if not 0.0 < self.warmup <= 1.0:
            raise CacheSpecError(f"static warm-up fraction must be in (0, 1], got "
                                 f"{self.warmup}")

    def capacity_for(self, num_experts: int) -> int:
        """The capacity count for a model with `num_experts` experts."""
        if self.capacity is not None:
            return self.capacity
        return capacity_from_fraction(self.fraction, num_experts, self.rounding)

    @property
    def label(self) -> str:
        """A short name: lru, lru_token, lfu, static_w0.2, belady."""
        if self.policy == "lru":
            return "lru" if self.recency == "request" else "lru_token"
        if self.policy == "static":
            return f"static_w{self.warmup}"
        return self.policy


def policy_code(spec: CacheSpec) -> int:
    """The replay code of a stateful spec (LRU_REQUEST, LRU_TOKEN, LFU, BELADY)."""
    if spec.policy == "lru":
        return LRU_REQUEST if spec.recency == "request" else LRU_TOKEN
    if spec.policy == "lfu":
        return LFU
    if spec.policy == "belady":
        return BELADY
    raise ValueError("static pinning has no token-by-token state; see cachesim.simulate")


def parse_capacities(text: str) -> list[int | float]:
    """Command-line capacities, one syntax everywhere: a comma list in which a number written with a
    decimal point (or an exponent) is a fraction of E and an integer is a count of experts.

    ``"0.125,0.25"`` -> [0.125, 0.25] (fractions); ``"4,8"`` -> [4, 8] (counts); ``"0.25,4"`` mixes
    them. Write a whole cache as ``1.0`` (the fraction) or ``16`` (the count).
    """
    out: list[int | float] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        try:
            value: int | float = float(part) if any(c in part for c in ".eE") else int(part)
        except ValueError:
            raise CacheSpecError(f"--capacity: cannot read {part!r}; give fractions of E with a decimal point "
                                 "(0.25) or expert counts (4), comma-separated") from None
        if value < 0 or (isinstance(value, float) and not 0.0 <= value <= 1.0):
            raise CacheSpecError(f"--capacity: {part} is out of range; fractions lie in [0, 1], counts are >= 0")
        out.append(value)
    if not out:
        raise CacheSpecError("--capacity: empty list; give e.g. 0.25 or 4")
    return out


def spec_for(policy: str, capacity: int | float, **options) -> CacheSpec:
    """A CacheSpec from one parsed capacity: a float is a fraction of E, an int a count."""
    if isinstance(capacity, float):
        return CacheSpec(policy, fraction=capacity, **options)
    options.pop("rounding", None)  # counts need no rounding
    return CacheSpec(policy, capacity=capacity, **options)
