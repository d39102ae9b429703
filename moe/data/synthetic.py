"""The synthetic corpus: three learnable, distinguishable token streams generated from a seed.

For fast unit tests of the model and training loop only; it is chosen
explicitly with ``data.corpus=synthetic`` and is never a fallback. Domain ``d``
draws from its own band of token ids (the ids other than EOT split in three)
with a sparse first-order Markov chain, so a model can learn each domain and
routers can tell them apart. Documents are 32-256 tokens plus EOT.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

ALPHABET = 64  # states per domain (fewer when the band is smaller, e.g. the byte vocabulary)
SUCCESSORS = 4
SUCCESSOR_PROBS = np.array([0.55, 0.25, 0.15, 0.05])


def token_documents(domain_index: int, *, seed: int, vocab_size: int, eot_id: int) -> Iterator[np.ndarray]:
    """Endless documents (token ids ending in EOT) of domain ``domain_index`` for ``seed``."""
    rng = np.random.default_rng([seed, domain_index])
    ids = np.array([i for i in range(vocab_size) if i != eot_id])
    band = np.array_split(ids, 3)[domain_index]
    alphabet = rng.choice(band, size=min(ALPHABET, len(band)), replace=False)
    successors = rng.integers(0, len(alphabet), size=(len(alphabet), SUCCESSORS))
    cumulative = np.cumsum(SUCCESSOR_PROBS)
    while True:
        length = int(rng.integers(32, 257))
        picks = np.searchsorted(cumulative, rng.random(length), side="right").clip(max=SUCCESSORS - 1)
        states = np.empty(length, dtype=np.int64)
        state = int(rng.integers(len(alphabet)))
        for t in range(length):
            states[t] = state
            state = int(successors[state, picks[t]])
        yield np.append(alphabet[states], eot_id)


def description(seed: int) -> dict:
    return dict(description=f"synthetic Markov token streams (seed {seed}); for tests only, not text")
