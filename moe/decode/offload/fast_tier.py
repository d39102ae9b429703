"""The fast tier: C experts per layer resident as device arrays, run by cachesim's policy step.

`OffloadedExperts` is the decode's `ExpertProvider` when experts live in a
slow tier. Per (step, layer):

1. `cachesim.online.cache_token_step` — the project's one implementation of
   the cache rules (SPEC §7) — serves the union's requests in order and says
   which missed; the resident device arrays follow its resident set exactly
   (checked every layer).
2. A missed expert comes from its staged prefetch if one finished
   ("staged"), from its prefetch promoted to a demand read if one is under way
   ("late_prefetch"), or from a fresh demand read ("demand"). Prefetches for
   this target that it does not miss are cancelled.
3. Still at the need time, the prefetch source sees the union and the
   admission policy plans further reads (`moe.decode.offload.admission`), as in the
   timed model; they queue behind the layer's demand reads.
4. The layer blocks until its reads are done: that wait, from the demand
   reads' issue (the need time) to the last byte present, is W. (The
   admission's own Python time runs inside it, hidden by the reads it
   overlaps; on a layer with nothing to wait for it is compute.)

A token's experts are kept for its compute even when the cache does not keep
them (capacity < k, or capacity 0): they live in the step's working set, as
the timed model's staging slots do.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from cachesim.online import cache_token_step, init_cache_state
from moe.decode.offload.admission import Prefetcher
from moe.decode.offload.io_pool import DONE, IOPool, Read
from moe.decode.offload.measure import DEMAND, HIT, LATE, STAGED, Recorder

_cache_step = jax.jit(cache_token_step)


class OffloadedExperts:
    """Experts from `pool`'s slow tier through a per-layer cache of `capacity` experts."""

    def __init__(self, pool: IOPool, recorder: Recorder, *, num_layers: int, num_experts: int, width: int,
                 capacity: int, policy_code: int, horizon: int, prefetcher: Prefetcher | None = None):
        self.pool, self.recorder, self.prefetcher = pool, recorder, prefetcher
        self.num_layers, self.num_experts, self.width = num_layers, num_experts, width
        self.nbytes = pool.layout.file_bytes
        self._args = (jnp.zeros((width,), jnp.int32), jnp.int32(policy_code), jnp.int32(capacity),
                      jnp.int32(horizon))
        self.states = [init_cache_state(num_experts) for _ in range(num_layers)]
        self.masks = [np.zeros(num_experts, bool) for _ in range(num_layers)]
        self.resident: list[dict[int, tuple]] = [{} for _ in range(num_layers)]
        self.misses = 0

    def warm_up(self) -> None:
        """Compiles the cache step on a throwaway state."""
        padded = jnp.full((self.width,), -1, jnp.int32)
        jax.block_until_ready(_cache_step(init_cache_state(self.num_experts), padded, self._args[0], jnp.int32(0),
                                          *self._args[1:]))

    def begin_step(self, step):
        if self.prefetcher is not None:
            self.prefetcher.begin_step()  # the step's prefetch byte allowance, as the model refills it

    def acquire(self, step, layer, union):
        padded = np.full(self.width, -1, np.int32)
        padded[:len(union)] = union
        self.states[layer], miss = _cache_step(self.states[layer], jnp.asarray(padded), self._args[0],
                                               jnp.int32(step), *self._args[1:])
        miss, mask = jax.device_get((miss, self.states[layer].resident))
        miss = miss[:len(union)].tolist()
        order = step * self.num_layers + layer
        staged = self.prefetcher.take(order) if self.prefetcher is not None else {}
        need = time.perf_counter()
        served: list[tuple[int, str, Read | None]] = []
        waiting = []
        for i, expert in enumerate(union):
            if not miss[i]:
                served.append((expert, HIT, None))
                continue
            read = staged.pop(expert, None)
            if read is None:
                read = Read(layer, expert, self.nbytes, demand=True, key=(0, order, i), issue_t=need)
                self.pool.submit(read)
                outcome = DEMAND
            elif read.state == DONE:
                outcome = STAGED
            else:
                self.pool.promote(read, (0, order, i))
                outcome = LATE
            served.append((expert, outcome, read))
            waiting.append(read)
        for read in staged.values():  # the target does not miss them: stale
            self.pool.cancel(read)
            self.recorder.stale(step, layer, read, need)
        if self.prefetcher is not None:
            # Admitted at the need time, as in the model: behind this layer's demand reads in the
            # queue, and beside them where a worker is free. Its own Python time overlaps the reads.
            self.masks[layer] = mask
            self.prefetcher.observe_and_admit(step, layer, union, need, self.masks.__getitem__)
        self.pool.wait(waiting)
        ready = time.perf_counter() if waiting else need
        self.misses += len(waiting)

        weights = [self.resident[layer][e] if read is None else read.result for e, _, read in served]
        self._follow(layer, mask, served)
        self.recorder.layer(step, layer, union, served, need)
        return weights, need, ready

    def _follow(self, layer: int, mask: np.ndarray, served) -> None:
        """Makes the layer's resident arrays the cache step's resident set."""
        held = self.resident[layer]
        for expert in [e for e in held if not mask[e]]:
            del held[expert]
        for expert, _, read in served:
            if read is not None and mask[expert]:
                held[expert] = read.result
        if sorted(held) != np.flatnonzero(mask).tolist():
            raise AssertionError(f"layer {layer}: resident arrays {sorted(held)} differ from the cache state "
                                 f"{np.flatnonzero(mask).tolist()}")
        self.masks[layer] = mask

    def close(self) -> list[Read]:
        """Cancels prefetches whose target never came; returns them (their bytes were wasted)."""
        leftover = self.prefetcher.leftover() if self.prefetcher is not None else []
        for read in leftover:
            self.pool.cancel(read)
        return leftover
