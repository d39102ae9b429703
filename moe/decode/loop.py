"""Autoregressive decoding with a KV cache, the experts fetched layer by layer.

The model is cut at its expert boundary. Per decode step and layer the loop
calls the model's own pieces in order (`Block.attend`, `MoELayer.route`, then
`Block.finish` with the expert weights it was handed):

    x, h, kv = block.attend(x, kv)         # jitted, with the router: topk to the host
    weights = experts.acquire(step, layer, union of the step's top-k)   # may block on I/O
    x = block.finish(x, h, topk, gates, weights)                        # jitted

so the router's decision is on the host before the layer's experts are
needed, and an `ExpertProvider` decides where their bytes come from: the
model's own parameters (`InMemoryExperts`, the reference) or an offloaded
store (`moe.decode.offload`). The decode's device state holds no expert weights at
all: they are replaced by empty placeholders, so an offloaded decode cannot
silently read them.

Batch B streams decode in lockstep (one position each per step); the union of
a step's experts is in first-request order (stream-major, top-1 first), the
order the timed model's step unions use. A finish call receives the union's
weights sorted by expert id, so its float sums run in the order of a full
E-expert mixture and every provider yields bit-identical outputs.

Positions past the model's context start a fresh KV window (the last token
becomes the new window's first input); the expert caches persist.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moe.dispatch import ExpertWeights

# The MoE layer's parameters that hold expert weights (LoRA adapters included).
EXPERT_PARAMS = frozenset({"w_gate", "w_up", "w_down", "lora_up_a", "lora_up_b", "lora_down_a", "lora_down_b"})
MODES = ("greedy", "sample", "teacher")

# One expert's SwiGLU weights as one flat float32 array: w_gate (d, f), w_up (d, f),
# w_down (f, d), each C order, concatenated. One array per expert keeps a
# store's read to a single device transfer; the jitted finish splits it.
Expert = jax.Array


def flat_expert(weights: ExpertWeights, expert: int) -> np.ndarray:
    """Expert `expert` of a layer's (E, ...) weights in the flat layout (float32, 3·d·f values)."""
    return np.concatenate([np.asarray(w[expert], np.float32).reshape(-1) for w in weights])


def split_experts(flat: jax.Array, d: int, f: int) -> ExpertWeights:
    """(U, 3·d·f) flat experts -> ExpertWeights of (U, d, f), (U, d, f), (U, f, d)."""
    u = flat.shape[0]
    return ExpertWeights(flat[:, :d * f].reshape(u, d, f), flat[:, d * f:2 * d * f].reshape(u, d, f),
                         flat[:, 2 * d * f:].reshape(u, f, d))


def _is_expert_param(path, _value) -> bool:
    return len(path) >= 2 and path[-2] == "moe" and path[-1] in EXPERT_PARAMS


class ExpertProvider(Protocol):
    """Where a decode's expert weights come from."""

    def begin_step(self, step: int) -> None:
        """Called as each decode step starts (a store refills its per-step prefetch allowance here)."""

    def acquire(self, step: int, layer: int, union: Sequence[int]) -> tuple[list[Expert], float, float]:
        """The weights of `union`'s experts (in that order) once present, and
        (need, ready): perf_counter times at which the layer asked for bytes it
        lacked and at which the last of them arrived (equal when none was missing)."""


def step_union(topk: np.ndarray) -> list[int]:
    """A step's distinct experts in first-request order: topk (B, k), stream-major, top-1 first."""
    return list(dict.fromkeys(topk.reshape(-1).tolist()))


class DecodeModel:
    """A restored model as the jitted pieces one decode step calls, expert weights held apart.

    ``expert_weights[l]`` are layer l's float32 (E, ...) weights with LoRA
    applied (what the layer computes with); a store is written from them.
    """

    def __init__(self, graphdef, params, model_cfg):
        model = nnx.merge(graphdef, params)
        self.num_layers = len(model.blocks)
        self.num_experts = int(model_cfg.num_experts)
        self.k = int(model_cfg.top_k)
        self.context = int(model_cfg.context)
        self.vocab_size = int(model_cfg.vocab_size)
        self.expert_weights = [ExpertWeights(*(np.asarray(w, np.float32) for w in block.moe.expert_weights()))
                               for block in model.blocks]
        _, d, f = self.expert_weights[0].w_gate.shape
        block_def, experts, _ = nnx.split(model.blocks[0], _is_expert_param, ...)
        absent = jax.tree.map(lambda a: jnp.zeros((0,), a.dtype), experts)
        self.block_states = [nnx.split(block, _is_expert_param, ...)[2] for block in model.blocks]
        shell_def, shell_experts, shell_state = nnx.split(model, _is_expert_param, ...)
        shell_absent = jax.tree.map(lambda a: jnp.zeros((0,), a.dtype), shell_experts)
        # The embedding and the head only need the model's outer parameters; the
        # blocks' dense weights travel along (their expert weights are absent).
        self.shell_state = shell_state
        self._caches = model.init_cache

        def attend_route(state, x, cache):
            block = nnx.merge(block_def, absent, state)
            x, h, cache = block.attend(x, cache)
            routing = block.moe.route(h)
            return x, h, cache, routing.topk, routing.gates, routing.probs

        def finish(state, x, h, topk, gates, ids, weights):
            block = nnx.merge(block_def, absent, state)
            stacked = split_experts(jnp.stack(weights), d, f)
            local = jnp.argmax(topk[..., None] == ids, axis=-1).astype(jnp.int32)
            return block.finish(x, h, local, gates, stacked)

        def embed(state, tokens):
            return nnx.merge(shell_def, shell_absent, state).embed(tokens[:, None])

        def head(state, x, key, temperature, greedy: bool):
            shell = nnx.merge(shell_def, shell_absent, state)
            logits = shell.logits(shell.final_norm(x[:, -1]))
            if greedy:
                token = jnp.argmax(logits, axis=-1)
            else:
                token = jax.random.categorical(key, logits / temperature, axis=-1)
            return logits, token.astype(jnp.int32)

        self.attend_route = jax.jit(attend_route)
        self.finish = jax.jit(finish)
        self.embed = jax.jit(embed)
        self.head = jax.jit(head, static_argnames=("greedy",))

    def init_cache(self, batch: int) -> list:
        return self._caches(batch, self.context)

    def warm_up(self, batch: int, experts: Sequence[Sequence[Expert]]) -> None:
        """Compiles every piece for `batch` streams (a finish per union size) so no step pays a compile.

        `experts[l]` holds any E' >= batch·k flat experts of layer l (shapes only matter).
        """
        tokens = jnp.zeros((batch,), jnp.int32)
        x = self.embed(self.shell_state, tokens)
        cache = self.init_cache(batch)[0]
        x, h, cache, topk, gates, _ = self.attend_route(self.block_states[0], x, cache)
        for size in range(self.k, min(batch * self.k, self.num_experts) + 1):
            ids = jnp.arange(size, dtype=jnp.int32)
            self.finish(self.block_states[0], x, h, topk % size, gates, ids, tuple(experts[0][:size]))
        for greedy in (True, False):
            jax.block_until_ready(self.head(self.shell_state, x, jax.random.key(0), jnp.float32(1.0), greedy))


class InMemoryExperts:
    """The reference provider: every expert resident as a device array, nothing to wait for."""

    def __init__(self, model: DecodeModel):
        self.weights = [[jnp.asarray(flat_expert(layer, e)) for e in range(model.num_experts)]
                        for layer in model.expert_weights]

    def begin_step(self, step):
        pass

    def acquire(self, step, layer, union):
        now = time.perf_counter()
        return [self.weights[layer][e] for e in union], now, now


@dataclasses.dataclass
class Timeline:
    """perf_counter seconds of one decode: per (step, layer) its start, need, ready and end; per step its span.

    A layer's time splits into waiting for expert bytes (ready - need) and
    everything else (attention, routing, bookkeeping, the experts' compute).
    """

    layer_start: np.ndarray
    need: np.ndarray
    ready: np.ndarray
    layer_end: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray

    @classmethod
    def empty(cls, steps: int, layers: int) -> Timeline:
        grid = lambda: np.zeros((steps, layers))  # noqa: E731
        return cls(grid(), grid(), grid(), grid(), np.zeros(steps), np.zeros(steps))

    @property
    def wait_s(self) -> np.ndarray:
        return self.ready - self.need

    @property
    def layer_compute_s(self) -> np.ndarray:
        return (self.layer_end - self.layer_start) - self.wait_s

    @property
    def before_need_s(self) -> np.ndarray:
        """Per (step, layer): attention, routing and the cache step, before the layer asks for bytes."""
        return self.need - self.layer_start

    @property
    def after_ready_s(self) -> np.ndarray:
        """Per (step, layer): the experts' mixing (dispatch) and bookkeeping, once every byte is in."""
        return self.layer_end - self.ready

    @property
    def overhead_s(self) -> np.ndarray:
        """Per step: the time outside the layers (embedding, head, sampling)."""
        return (self.step_end - self.step_start) - (self.layer_end - self.layer_start).sum(axis=1)


@dataclasses.dataclass
class DecodeResult:
    """inputs/tokens (B, N): the token fed at step j and the one predicted there;
    experts (L, N, B, k) int16 router top-k; probs (L, N, B, E) float16;
    logits (N, B, V) float32 when recorded."""

    inputs: np.ndarray
    tokens: np.ndarray
    experts: np.ndarray
    probs: np.ndarray
    timeline: Timeline
    logits: np.ndarray | None = None

    @property
    def steps(self) -> int:
        return self.tokens.shape[1]

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    def trace_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(experts (L, N·B, k), probs (L, N·B, E)): the step's streams are consecutive positions."""
        layers, steps, batch = self.experts.shape[:3]
        return (self.experts.reshape(layers, steps * batch, -1),
                self.probs.reshape(layers, steps * batch, -1))


def decode(model: DecodeModel, experts: ExpertProvider, *, prompt: np.ndarray, steps: int, mode: str = "greedy",
           teacher: np.ndarray | None = None, temperature: float = 1.0, seed: int = 0,
           record_logits: bool = False, on_step: Callable[[int], None] | None = None) -> DecodeResult:
    """Decodes `steps` positions of B streams, one per step.

    Args:
      prompt: (B, P) int tokens fed as the first P inputs (P >= 1).
      steps: positions to decode (>= P); each commits one token per stream.
      mode: "greedy" (argmax), "sample" (softmax at `temperature`, seeded per
        step, so reruns decode the same tokens) or "teacher" (inputs after the
        prompt come from `teacher` (B, >= steps), e.g. evaluation text).
      record_logits: keep every step's (B, V) float32 logits.
      on_step: called after each step with its index (progress).
    """
    if mode not in MODES:
        raise ValueError(f"unknown decode mode {mode!r}; use one of {MODES}")
    prompt = np.asarray(prompt, np.int32)
    batch, prompt_len = prompt.shape
    if prompt_len < 1 or steps < prompt_len:
        raise ValueError(f"need a prompt of >= 1 token and steps >= its length, got {prompt_len} and {steps}")
    fed = prompt if mode != "teacher" else np.asarray(teacher, np.int32)[:, :steps]
    if fed.shape[1] < (steps if mode == "teacher" else prompt_len):
        raise ValueError(f"teacher forcing needs {steps} tokens per stream, got {fed.shape[1]}")
    forced = [jnp.asarray(fed[:, j]) for j in range(fed.shape[1])]
    layers = model.num_layers
    timeline = Timeline.empty(steps, layers)
    topks = np.zeros((layers, steps, batch, model.k), np.int16)
    probs = np.zeros((layers, steps, batch, model.num_experts), np.float16)
    logits_out = [] if record_logits else None
    inputs, outputs = [], []
    caches = model.init_cache(batch)
    window = 0
    key = jax.random.key(seed)
    temperature = jnp.float32(temperature)
    token = forced[0]
    for j in range(steps):
        timeline.step_start[j] = time.perf_counter()
        experts.begin_step(j)
        if window == model.context:  # a fresh KV window; stale entries are masked by position
            caches = [c._replace(length=jnp.zeros((), jnp.int32)) for c in caches]
            window = 0
        if j < len(forced) and (j < prompt_len or mode == "teacher"):
            token = forced[j]
        inputs.append(token)
        x = model.embed(model.shell_state, token)
        for layer in range(layers):
            timeline.layer_start[j, layer] = time.perf_counter()
            x, h, caches[layer], topk, gates, p = model.attend_route(model.block_states[layer], x, caches[layer])
            topk_host, p_host = jax.device_get((topk, p))  # the router's decision, on the host
            topk_host = topk_host.reshape(batch, model.k)
            union = step_union(topk_host)
            weights, timeline.need[j, layer], timeline.ready[j, layer] = experts.acquire(j, layer, union)
            order = sorted(range(len(union)), key=union.__getitem__)
            ids = jnp.asarray([union[i] for i in order], jnp.int32)
            x = model.finish(model.block_states[layer], x, h, topk, gates, ids, tuple(weights[i] for i in order))
            topks[layer, j] = topk_host
            probs[layer, j] = p_host.reshape(batch, -1)
            timeline.layer_end[j, layer] = time.perf_counter()
        window += 1
        logits, token = model.head(model.shell_state, x, jax.random.fold_in(key, j), temperature,
                                   greedy=mode != "sample")
        # Wait for the step here, so the head's compute is this step's overhead rather
        # than hidden in the next step's first routing sync.
        token.block_until_ready()
        outputs.append(token)
        if record_logits:
            logits_out.append(logits)
        if on_step is not None:
            on_step(j)
        timeline.step_end[j] = time.perf_counter()
    return DecodeResult(inputs=np.stack(jax.device_get(inputs), axis=1), tokens=np.stack(jax.device_get(outputs), 1),
                        experts=topks, probs=probs, timeline=timeline,
                        logits=None if logits_out is None else np.stack(jax.device_get(logits_out)))
