"""Cache policies and cache specifications (SPEC §7, docs/spec.md).

Each policy is one module of this package (`lru`, `lfu`, `static`, `belady`, `external` for libCacheSim's),
registered as one `record.Policy`. A `CacheSpec` names a policy, a capacity (a count, or a fraction of E read
as the decimal written: ceil(0.1 · 30) is 3) and the policy's options; it is independent of any trace. Scopes:
a cache per layer, or one global cache of the L·E (layer, expert) keys requested layer-major within a token,
each (token, layer) one step, optionally split into per-layer quotas.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction

# Registration order is the CLI's order and the replay codes'.
from cachesim.policies import lru, lfu, static, belady, external  # noqa: F401, I001
from cachesim.policies.external import EXTERNAL as EXTERNAL_POLICIES
from cachesim.policies.record import Policy, lookup, names

# Every name of EXTERNAL_POLICIES runs through libCacheSim (`cachesim.lcs`), an optional extra.
ALL_POLICIES = tuple(names())
POLICIES = tuple(p for p in ALL_POLICIES if p not in EXTERNAL_POLICIES)  # cachesim's own
SCOPES = ("layer", "global")
QUOTAS = ("shared", "uniform", "demand")
# `--capacity all`: every capacity 0..E (0..L·E under the global scope).
ALL_CAPACITIES = "all"
# Replay codes of the policies callers name (`moe.cache_aware.reroute`).
LRU_REQUEST, LRU_TOKEN, LFU = lru.REQUEST.code, lru.TOKEN.code, lfu.LFU.code
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
    """One cache configuration: a cache per layer, or one for all layers.

    Attributes:
      policy: a registered policy's name (`names()`: "lru", "lfu", "static",
        "belady", or libCacheSim's "arc", "sieve", ...).
      capacity: a count of experts; exclusive with `fraction`, a fraction of E
        (L·E under the global scope) rounded by `rounding` ("ceil", "round", "floor").
      recency: LRU only: "request" or "token" (`cachesim.policies.lru`).
      warmup: static only: pin by the counts of the first floor(warmup · T) tokens;
        the pinned set serves the whole trace (w = 1.0: in-sample).
      scope: "layer" (a cache per layer) or "global" (one cache for the L·E keys).
      quota: global only: "shared" (one cache), or the budget split into per-layer
        caches, "uniform" or by "demand" (`layer_quotas`).
      fit: static only: None fits the pin on the scored trace; a label on the trace
        given for it to `cachesim.simulate.simulate(fits=...)` (out-of-sample).
    """

    policy: str
    capacity: int | None = None
    fraction: float | None = None
    rounding: str = "ceil"
    recency: str = "request"
    warmup: float = 1.0
    scope: str = "layer"
    quota: str = "shared"
    fit: str | None = None

    def __post_init__(self):
        if self.policy not in names():
            raise CacheSpecError(f"unknown policy {self.policy!r}; use one of "
                                 f"{', '.join(names())}")
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
        if self.scope not in SCOPES:
            raise CacheSpecError(f"unknown scope {self.scope!r}; use one of {SCOPES}")
        if self.quota not in QUOTAS:
            raise CacheSpecError(f"unknown quota {self.quota!r}; use one of {QUOTAS}")
        if self.quota != "shared" and self.scope != "global":
            raise CacheSpecError(f"quota {self.quota!r} splits a global budget; give "
                                 "scope='global' with it")
        if self.fit is not None and self.policy != "static":
            raise CacheSpecError(f"fit names the trace a static pin is fitted on; policy "
                                 f"{self.policy!r} has no pinned set")
        if self.capacity is not None:
            check_capacity(self.policy, self.capacity)

    @property
    def engine(self) -> str:
        """Who replays it: "cachesim" or "libcachesim"."""
        return "libcachesim" if self.policy in EXTERNAL_POLICIES else "cachesim"

    def capacity_for(self, num_experts: int) -> int:
        """The capacity count for `num_experts` keys (E per layer, L·E under the
        global scope: see `keys`)."""
        if self.capacity is not None:
            return self.capacity
        return check_capacity(self.policy,
                              capacity_from_fraction(self.fraction, num_experts, self.rounding))

    def keys(self, num_layers: int, num_experts: int) -> int:
        """How many keys a capacity fraction is taken of: E, or L·E (global)."""
        return num_experts * (num_layers if self.scope == "global" else 1)

    @property
    def label(self) -> str:
        """A short name: lru, lru_token, lfu, static_w0.2, belady, arc; the
        scope and fit appended when not the default (lru@global-uniform,
        static_w1.0@fit=train)."""
        name = policy_of(self).label
        if self.policy == "static":
            name = f"static_w{self.warmup}"
        if self.scope == "global":
            name += "@global" + ("" if self.quota == "shared" else f"-{self.quota}")
        if self.fit is not None:
            name += f"@fit={self.fit}"
        return name


def check_capacity(policy: str, capacity: int) -> int:
    """`capacity`, unless a libCacheSim policy is degenerate at that size (see
    `cachesim.policies.external`); 0 (holds nothing) is always allowed."""
    libcachesim = EXTERNAL_POLICIES.get(policy)
    if libcachesim is not None and 0 < capacity < libcachesim.min_capacity:
        raise CacheSpecError(f"{policy} needs a capacity of at least {libcachesim.min_capacity} "
                             f"(got {capacity}): {libcachesim.why}")
    return capacity


def layer_quotas(total: int, weights: Sequence[int], caps: Sequence[int]) -> list[int]:
    """Splits a budget of `total` entries into per-layer capacities.

    Each layer gets a share proportional to its weight, at most its cap (a
    layer never uses more slots than keys it requests); what a capped layer
    cannot use goes to the others. Shares are rounded by largest remainder
    (ties to the lowest layer), in exact fractions, so the quotas sum to
    min(total, sum of caps).
    """
    caps = [int(c) for c in caps]
    weights = [int(w) for w in weights]
    quotas = [0] * len(caps)
    open_layers = [i for i, (w, c) in enumerate(zip(weights, caps)) if w > 0 and c > 0]
    budget = min(int(total), sum(caps[i] for i in open_layers))
    while open_layers:
        weight = sum(weights[i] for i in open_layers)
        ideal = {i: Fraction(budget * weights[i], weight) for i in open_layers}
        full = [i for i in open_layers if ideal[i] >= caps[i]]
        if not full:
            break
        for i in full:  # capped layers take their cap; the rest share what is left
            quotas[i] = caps[i]
            budget -= caps[i]
        open_layers = [i for i in open_layers if i not in full]
    if open_layers:
        floors = {i: math.floor(ideal[i]) for i in open_layers}
        left = budget - sum(floors.values())
        by_remainder = sorted(open_layers, key=lambda i: (-(ideal[i] - floors[i]), i))
        for rank, i in enumerate(by_remainder):
            quotas[i] = floors[i] + (1 if rank < left else 0)
    return quotas


# ---------------------------------------------------------------- command-line words
# Small parsers of one option's text each (a comma list); they raise CacheSpecError.


def _words(text: str, what: str) -> list[str]:
    words = [w.strip() for w in str(text).split(",") if w.strip()]
    if not words:
        raise CacheSpecError(f"{what}: empty list")
    return words


def parse_scopes(text: str) -> list[tuple[str, str]]:
    """A comma list of layer, global, global-uniform, global-demand as
    (scope, quota) pairs."""
    out = []
    for word in _words(text, "scope"):
        scope, _, quota = word.partition("-")
        quota = quota or "shared"
        if scope not in SCOPES or quota not in QUOTAS or (scope == "layer" and quota != "shared"):
            raise CacheSpecError(f"unknown scope {word!r}; use layer, global, global-uniform or "
                                 "global-demand")
        out.append((scope, quota))
    return out


def parse_static_fits(text: str) -> list[str | None]:
    """A comma list of traces to fit static pins on; "self" (None) is the
    scored trace itself."""
    return [None if word == "self" else word for word in _words(text, "static fit")]


def policy_of(spec: CacheSpec) -> Policy:
    """The registered record of a spec's policy (and LRU recency mode)."""
    return lookup(spec.policy, spec.recency)


def policy_code(spec: CacheSpec) -> int:
    """The replay code of a spec whose policy has eviction state (`record.REPLAYED`)."""
    policy = policy_of(spec)
    if policy.key is None:
        raise ValueError(f"{spec.policy} has no token-by-token state (static pinning, or libCacheSim's); "
                         "see cachesim.simulate")
    return policy.code


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
