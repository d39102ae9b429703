"""KV-cache decoding: the training path is unchanged, and decoding reproduces it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe.decode.loop import DecodeModel, InMemoryExperts, decode, step_union
from moe.decode.restore import restore_run
from moe.model import build_model
from decode_fixtures import tiny_run  # noqa: F401 — a session fixture
from test_model import model_cfg


def pre_cache_forward(model, tokens):
    """The model's forward as written before the KV cache existed (rope on 0..T-1, causal attention)."""
    def rope(x, base):
        t, d = x.shape[1], x.shape[-1]
        inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
        angles = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]
        cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
        x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)

    def attention(attn, x):
        b, t, _ = x.shape
        q, k, v = jnp.split(attn.qkv(x).reshape(b, t, 3 * attn.n_heads, attn.head_dim), 3, axis=2)
        q, k = rope(q, attn.rope_base), rope(k, attn.rope_base)
        return attn.out(jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, -1))

    x = model.embed(tokens)
    topks = []
    for block in model.blocks:
        x = x + attention(block.attn, block.attn_norm(x))
        y, router = block.moe(block.moe_norm(x))
        x = x + y
        topks.append(router.topk)
    return model.final_norm(x), jnp.stack(topks)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_training_forward_is_bit_identical_to_the_pre_cache_model(remat):
    model = build_model(model_cfg(remat=remat), seed=3)
    tokens = jax.random.randint(jax.random.key(4), (2, 16), 0, 97)
    graphdef, params = nnx.split(model)
    hidden, router = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, tokens)
    ref_hidden, ref_topk = jax.jit(lambda p, t: pre_cache_forward(nnx.merge(graphdef, p), t))(params, tokens)
    np.testing.assert_array_equal(np.asarray(hidden), np.asarray(ref_hidden))
    np.testing.assert_array_equal(np.asarray(router.topk), np.asarray(ref_topk))


@pytest.fixture(scope="module")
def restored(tiny_run):  # noqa: F811
    run = restore_run(tiny_run)
    return run, DecodeModel(run.graphdef, run.params, run.config.model)


@nnx.jit
def _forward(model, tokens):
    """The training forward, jitted (one compile per model and batch shape, not one per eager op)."""
    hidden, router = model(tokens)
    return model.logits(hidden), router.topk


def training_logits(run, tokens):
    """The training forward's logits (B, T, V) and router top-k (L, B, T, k)."""
    logits, topk = _forward(nnx.merge(run.graphdef, run.params), jnp.asarray(tokens))
    return np.asarray(logits), np.asarray(topk)


def test_teacher_forced_decode_reproduces_training_logits_and_routing(restored):
    run, dm = restored
    tokens = np.random.default_rng(0).integers(0, dm.vocab_size, (2, dm.context)).astype(np.int32)
    result = decode(dm, InMemoryExperts(dm), prompt=tokens[:, :1], steps=dm.context, mode="teacher",
                    teacher=tokens, record_logits=True)
    logits, topk = training_logits(run, tokens)
    np.testing.assert_allclose(result.logits, logits.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result.experts, topk.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(result.inputs, tokens)


def test_positions_past_the_context_start_a_fresh_kv_window(restored):
    run, dm = restored
    # Two streams, as above, so the decode pieces and the training forward compiled there are reused.
    tokens = np.random.default_rng(1).integers(0, dm.vocab_size, (2, 2 * dm.context)).astype(np.int32)
    result = decode(dm, InMemoryExperts(dm), prompt=tokens[:, :1], steps=2 * dm.context, mode="teacher",
                    teacher=tokens, record_logits=True)
    second, topk = training_logits(run, tokens[:, dm.context:])
    np.testing.assert_allclose(result.logits[dm.context:], second.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result.experts[:, dm.context:], topk.transpose(0, 2, 1, 3))


def test_streams_decode_independently_and_sampling_is_seeded(restored):
    _, dm = restored
    experts = InMemoryExperts(dm)
    prompt = np.array([[3], [7]], np.int32)
    both = decode(dm, experts, prompt=prompt, steps=12, mode="sample", seed=5, record_logits=True)
    again = decode(dm, experts, prompt=prompt, steps=12, mode="sample", seed=5)
    np.testing.assert_array_equal(both.tokens, again.tokens)
    other_seed = decode(dm, experts, prompt=prompt, steps=12, mode="sample", seed=6)
    assert not np.array_equal(both.tokens, other_seed.tokens)
    # Each stream alone, teacher-forced on what it was fed in the batch, computes the same.
    for b in range(2):
        alone = decode(dm, experts, prompt=both.inputs[b:b + 1, :1], steps=12, mode="teacher",
                       teacher=both.inputs[b:b + 1], record_logits=True)
        np.testing.assert_allclose(alone.logits[:, 0], both.logits[:, b], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(alone.experts[:, :, 0], both.experts[:, :, b])
    greedy = decode(dm, experts, prompt=prompt, steps=6, mode="greedy", record_logits=True)
    np.testing.assert_array_equal(greedy.tokens, greedy.logits.argmax(-1).T)
    np.testing.assert_array_equal(greedy.inputs[:, 1:], greedy.tokens[:, :-1])  # feeds its own output


def test_the_decode_state_holds_no_expert_weights(restored):
    _, dm = restored
    e, d, f = dm.expert_weights[0].w_gate.shape
    shapes = [leaf.shape for state in [dm.shell_state, *dm.block_states] for leaf in jax.tree.leaves(state)]
    assert shapes and not any(len(s) == 3 and s[0] == e for s in shapes)
    assert all(w.shape[0] == e for layer in dm.expert_weights for w in layer)


def test_step_union_is_first_request_order_stream_major():
    assert step_union(np.array([[4, 1], [1, 7], [7, 4]])) == [4, 1, 7]
