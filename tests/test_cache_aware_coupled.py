"""moe.cache_aware.coupled: all-off == plain evaluation; rerouting == a token-by-token decoder; carrying the cache."""

import jax
import numpy as np
import pytest
from flax import nnx

from cachesim.policies import CacheSpec
from moe.cache_aware.reroute import RerouteError, Setting, exclusive_experts
from cachesim.simulate import simulate
from cachesim.trace import make_trace
from moe.cache_aware.coupled import CoupledEvaluator, domain_stats, window_stats
from moe.evaluate import evaluate_windows, make_eval_step
from moe.model import build_model
from cache_aware_fixtures import step_by_step_reference, tiny_model_config

CAPACITY = 3  # of 8 experts


@pytest.fixture(scope="module")
def tiny():
    config = tiny_model_config()
    model = build_model(config.model, seed=3)
    graphdef, params = nnx.split(model, nnx.Param)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.model.vocab_size, (3, config.model.context + 1)).astype(np.int32)
    return config, model, graphdef, params, tokens


@pytest.fixture(scope="module")
def plain(tiny):
    config, _, graphdef, params, tokens = tiny
    return evaluate_windows(make_eval_step(graphdef, config, with_probs=False), params, tokens, batch_size=2)


def lru_misses(experts, num_experts, capacity):
    """(L,) demand misses of the plain simulator on an (L, T, k) trace."""
    return simulate([make_trace(experts, num_experts)], [CacheSpec("lru", capacity=capacity)])[0][:, 0]


def test_all_off_reproduces_the_plain_evaluation_and_its_cache_misses(tiny, plain):
    config, _, graphdef, params, tokens = tiny
    evaluator = CoupledEvaluator(graphdef, config)  # persist: one stream over the windows
    # batch_size 2 over 3 windows: a padded last call, and the state carried between calls.
    result, state = evaluator(params, tokens, np.zeros_like(tokens), [Setting()], [CAPACITY], batch_size=2)
    np.testing.assert_allclose(result.ce[0], plain["ce"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(result.experts[0], plain["experts"])
    np.testing.assert_array_equal(result.misses[0].sum(axis=1), lru_misses(plain["experts"], 8, CAPACITY))
    assert result.prefetches.sum() == result.elided.sum() == result.skipped.sum() == 0
    assert int(state.clock) == tokens.shape[0] * (tokens.shape[1] - 1)
    stats = domain_stats(result, 0)
    assert stats["tokens"] == plain["ce"].size
    np.testing.assert_allclose(stats["loss"], plain["ce"].mean(), rtol=1e-6)
    misses = lru_misses(plain["experts"], 8, CAPACITY).sum()
    assert stats["misses_per_token"] == pytest.approx(misses / plain["ce"].size)
    # Per-window values (frontier.json keeps them for window intervals): equal windows, so their mean is the stream's.
    windows = window_stats(result, 0)
    assert len(windows["ce"]) == len(windows["misses"]) == tokens.shape[0]
    np.testing.assert_allclose(windows["ce"], plain["ce"].mean(axis=1), rtol=1e-6)
    assert np.mean(windows["misses"]) == pytest.approx(stats["misses_per_token"], rel=1e-12)
    assert windows["loads"] == windows["misses"]  # no prefetch in the plain setting

    # The same stream in two calls, the state handed over, gives the same result.
    first, mid = evaluator(params, tokens[:2], np.zeros_like(tokens[:2]), [Setting()], [CAPACITY], batch_size=2)
    second, end = evaluator(params, tokens[2:], np.zeros_like(tokens[2:]), [Setting()], [CAPACITY], batch_size=2,
                            state=mid)
    np.testing.assert_array_equal(np.concatenate([first.misses, second.misses], axis=2), result.misses)
    for a, b in zip(jax.tree.leaves(end), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)


def test_all_off_routes_with_the_routing_bias_as_the_plain_evaluation_does(tiny, plain):
    # loss.balance=bias: the frontier's own router must rank logits + bias as the model does (gates unbiased).
    _, _, _, _, tokens = tiny
    biased = tiny_model_config(router_bias=True)
    model = build_model(biased.model, seed=3)  # `tiny`'s weights: the bias takes no randomness
    for index, block in enumerate(model.blocks):
        block.moe.route_bias[...] = jax.random.normal(jax.random.key(index), (8,))  # large enough to reroute
    graphdef, params = nnx.split(model, nnx.Param)
    routed = evaluate_windows(make_eval_step(graphdef, biased, with_probs=False), params, tokens, batch_size=2)
    assert not np.array_equal(routed["experts"], plain["experts"])  # the bias changes the routing
    result, _ = CoupledEvaluator(graphdef, biased)(params, tokens, np.zeros_like(tokens), [Setting()], [CAPACITY],
                                                   batch_size=2)
    np.testing.assert_array_equal(result.experts[0], routed["experts"])
    np.testing.assert_allclose(result.ce[0], routed["ce"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(result.misses[0].sum(axis=1), lru_misses(routed["experts"], 8, CAPACITY))


def test_reset_per_window_starts_every_window_with_an_empty_cache(tiny, plain):
    config, _, graphdef, params, tokens = tiny
    evaluator = CoupledEvaluator(graphdef, config, carry="reset")
    result, _ = evaluator(params, tokens, np.zeros_like(tokens), [Setting()], [CAPACITY], batch_size=2)
    np.testing.assert_allclose(result.ce[0], plain["ce"], rtol=1e-6, atol=1e-6)
    length = tokens.shape[1] - 1
    for w in range(tokens.shape[0]):
        window = plain["experts"][:, w * length:(w + 1) * length]
        np.testing.assert_array_equal(result.misses[0][:, w * length:(w + 1) * length].sum(axis=1),
                                      lru_misses(window, 8, CAPACITY))
    # LRU holds the c most recently requested experts; a carried cache only adds older ones to that set,
    # so it never misses more than an emptied one.
    persist, _ = CoupledEvaluator(graphdef, config)(params, tokens, np.zeros_like(tokens), [Setting()], [CAPACITY],
                                                    batch_size=2)
    assert persist.misses.sum() <= result.misses.sum()


@pytest.mark.parametrize("policy", ["lru", "lru_token", "lfu"])
def test_all_off_with_every_policy_and_capacity_edges_equals_the_python_reference(tiny, plain, policy):
    # Capacity 0 (holds nothing: every request misses), 3, E (never evicts) and > E, one vmapped call.
    from cachesim.reference import replay_lfu, replay_lru
    replay = {"lru": replay_lru, "lru_token": lambda t, c: replay_lru(t, c, "token"), "lfu": replay_lfu}[policy]
    config, _, graphdef, params, tokens = tiny
    capacities = [0, CAPACITY, 8, 11]
    result, _ = CoupledEvaluator(graphdef, config, policy=policy)(
        params, tokens, np.zeros_like(tokens), [Setting()] * len(capacities), capacities, batch_size=2)
    experts = np.asarray(plain["experts"])  # (L, T, k)
    for s, capacity in enumerate(capacities):
        np.testing.assert_allclose(result.ce[s], plain["ce"], rtol=1e-6, atol=1e-6)
        want = [[sum(flags) for flags in replay(experts[layer].tolist(), capacity)] for layer in range(len(experts))]
        np.testing.assert_array_equal(result.misses[s], want, err_msg=f"{policy} capacity {capacity}")
    assert (result.misses[0] == experts.shape[2]).all()  # capacity 0: all k requests of every token miss
    distinct = [len(np.unique(layer)) for layer in experts]
    assert result.misses[2].sum(axis=1).tolist() == result.misses[3].sum(axis=1).tolist() == distinct


SETTINGS = [
    Setting(tau=0.5),
    Setting(tau=1.0, epsilon=0.45),
    Setting(max_rank=(0, 4), prime=True),
    # Not 1.0: at the first token Δ_avg is that token's range, and λ = 1 lifts a resident minimum-logit
    # expert exactly onto the maximum, a tie that float rounding decides.
    Setting(cache_prior=0.6, prime=True),
]


@pytest.mark.slow
def test_interventions_match_a_token_by_token_decoder(tiny):
    """Every rule, vmapped over settings and carried over two windows with a domain switch inside the
    second, equals a decoder that re-runs the prefix with earlier routing forced."""
    config, model, graphdef, params, tokens = tiny
    tokens = tokens[:2]
    length = tokens.shape[1] - 1
    domains = np.zeros_like(tokens)
    domains[1, 3:] = 1  # a switch inside window 1
    table = exclusive_experts(8)
    result, _ = CoupledEvaluator(graphdef, config)(params, tokens, domains, SETTINGS, [CAPACITY] * len(SETTINGS),
                                                   batch_size=2)
    for s, setting in enumerate(SETTINGS):
        state = None
        for w in range(2):
            ref = step_by_step_reference(model, tokens[w], domains[w, :-1], setting, CAPACITY, prime_table=table,
                                         state=state)
            state = ref["state"]
            span = slice(w * length, (w + 1) * length)
            np.testing.assert_allclose(result.ce[s, w], ref["ce"], rtol=2e-5, atol=2e-5)
            np.testing.assert_array_equal(result.experts[s][:, span], ref["experts"], err_msg=setting.label)
            for name in ("misses", "prefetches", "elided", "skipped"):
                np.testing.assert_array_equal(getattr(result, name)[s][:, span], ref[name],
                                              err_msg=f"{setting.label}: {name}")
    # The sweep is not vacuous: the rules changed routing, primed, and elided.
    assert result.prefetches[2:].sum() > 0 and result.elided[1].sum() > 0
    assert (result.experts[0] != result.experts[3]).any()


def test_priming_on_a_mixed_stream_counts_prefetches_apart_from_misses(tiny):
    config, _, graphdef, params, tokens = tiny
    domains = np.repeat(np.arange(3)[:, None], tokens.shape[1], axis=1).astype(np.int32)  # one domain per window
    result, _ = CoupledEvaluator(graphdef, config)(params, tokens, domains, [Setting(), Setting(prime=True)],
                                                   [4, 4], batch_size=3)
    # Three switches x 2 layers; each primes the domain's 2 exclusive experts (E = 8: [0,1], [2,3], [4,5]).
    assert result.prefetches[0].sum() == 0
    assert 0 < result.prefetches[1].sum() <= 3 * 2 * 2
    np.testing.assert_array_equal(result.prefetches[1].sum(axis=0).reshape(3, -1)[:, 1:], 0)  # only at switches
    # Priming changes no routing decision (no rerouting here), so the perplexity is unchanged.
    np.testing.assert_array_equal(result.experts[0], result.experts[1])
    np.testing.assert_allclose(result.ce[0], result.ce[1], rtol=1e-6)
    for d in range(3):
        stats = domain_stats(result, 1, d)
        assert stats["tokens"] == tokens.shape[1] - 1 and stats["prefetch_loads_per_token"] > 0


def test_bad_inputs_are_rejected(tiny):
    config, _, graphdef, params, tokens = tiny
    evaluator = CoupledEvaluator(graphdef, config)
    with pytest.raises(RerouteError, match="equal"):
        evaluator(params, tokens, tokens[:1], [Setting()], [2], batch_size=2)
    with pytest.raises(RerouteError, match="batch_size"):
        evaluator(params, tokens, tokens, [Setting()], [2], batch_size=0)
    with pytest.raises(RerouteError, match="carry"):
        CoupledEvaluator(graphdef, config, carry="sometimes")
    with pytest.raises(RerouteError, match="tau"):
        evaluator(params, tokens, tokens, [Setting(tau=2.0)], [2], batch_size=2)
