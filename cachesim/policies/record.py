"""A cache policy as one record: all any engine reads of it, registered by label.

The grid replay (`cachesim.stack`) reads each request's priority `key`, the
one-cache step (`cachesim.online`) its `update`, `cachesim.reference` its
`replay`. A miss with a full cache evicts the resident key of smallest (key, id).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple


class Request(NamedTuple):
    """What a priority key reads of one request (ints, numpy or jax arrays)."""

    index: Any    # its place t·k + j in the cache's request stream
    step: Any     # its step t (a token; a (token, layer) under the global scope)
    count: Any    # requests of the expert so far, this one included (None online)
    next: Any     # the next step strictly after t requesting the expert, else horizon
    horizon: Any  # larger than every step


@dataclasses.dataclass(frozen=True)
class Policy:
    """One policy; `key` is None without eviction state (static) and for libCacheSim's (`external`)."""

    name: str                          # the CLI word, `CacheSpec.policy`
    label: str                         # unique: the name, or name_recency for a variant
    replay: Callable[..., list] | None  # reference: (tokens, capacity, **context) -> miss flags
    key: Callable[[Request], Any] | None = None
    update: Callable[[Any, Request], Any] | None = None  # online key after a request; default key
    recency: str | None = None         # the LRU recency mode this record is
    rotation: bool = False             # each request's key is the largest yet (a recency stack)
    clairvoyant: bool = False          # keys read the future: a step's experts re-keyed first
    external: Any = None               # `cachesim.policies.external.ExternalPolicy`
    code: int = -1                     # replay code, set by `register`

    def online(self, key, request: Request):
        return self.update(key, request) if self.update else self.key(request)


POLICIES: dict[str, Policy] = {}   # by label, in registration order
REPLAYED: list[Policy] = []        # policies with a key, by code


def register(policy: Policy) -> Policy:
    """Adds `policy` (a replayed one gets the next code); returns the registered record."""
    if policy.label in POLICIES:
        raise ValueError(f"policy {policy.label!r} is registered twice")
    if policy.key is not None:
        policy = dataclasses.replace(policy, code=len(REPLAYED))
        REPLAYED.append(policy)
    POLICIES[policy.label] = policy
    return policy


def unregister(label: str) -> None:
    """Removes the last registered policy (a test's), so that codes stay dense."""
    if POLICIES.pop(label).key is not None:
        REPLAYED.pop()


def names() -> list[str]:
    """The CLI words, each once, in registration order."""
    return list(dict.fromkeys(p.name for p in POLICIES.values()))


def lookup(name: str, recency: str = "request") -> Policy:
    """The record of a policy word (and LRU recency mode, for the variants that have one)."""
    for policy in POLICIES.values():
        if policy.name == name and policy.recency in (None, recency):
            return policy
    raise KeyError(name)
