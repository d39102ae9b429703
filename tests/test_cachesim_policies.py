"""Cache policies as a seam: a policy is one record in one file, and the engines name none.

MRU below is a whole new policy written in this one file: registering it is
all that the grid replay (every capacity at once, chunked and verified), the
one-cache online step and the reference need.
"""

import ast
import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cachesim import online, reference as ref, simulate as sim
from cachesim.policies import CacheSpec, policy_code, record
from cachesim_fixtures import random_trace

REPO = pathlib.Path(__file__).resolve().parents[1]
ENGINES = ("cachesim/stack.py", "cachesim/online.py", "cachesim/simulate.py", "cachesim/reference.py",
           "cachesim/prefetched.py", "cachesim/timed/residency.py")


def replay_mru(tokens, capacity, **_):
    """Most recently used, by token: evicts the expert of the latest token, ties to the lowest id."""
    resident, last, flags = set(), {}, []
    for t, token in enumerate(tokens):
        row = []
        for expert in token:
            miss = expert not in resident
            if miss and capacity > 0:
                if len(resident) >= capacity:
                    resident.remove(max(resident, key=lambda e: (last[e], -e)))
                resident.add(expert)
            last[expert] = t
            row.append(miss)
        flags.append(row)
    return flags


MRU = record.Policy("mru", "mru", replay_mru, key=lambda r: r.horizon - r.step)


@pytest.fixture
def mru():
    policy = record.register(MRU)
    yield policy
    record.unregister(policy.label)


def test_a_policy_added_in_one_file_runs_in_every_engine(mru, monkeypatch):
    monkeypatch.setattr(sim, "_MIN_CHUNK", 8)  # 8 chunks of 8 tokens: the verified chunked replay
    monkeypatch.setattr(sim, "_TARGET_ELEMENTS", 64 * 16)
    trace = random_trace(3, 2, 64, 2, 6, skew=0.6)
    specs = [CacheSpec("mru", capacity=c) for c in range(8)]
    want = np.array([[sum(map(sum, ref.replay(layer.tolist(), spec, 6))) for spec in specs]
                     for layer in trace.experts])
    stats = {}
    (got,) = sim.simulate([trace], specs, stats=stats)
    assert stats["chunks"] == [8] and max(stats["passes"]) > 1  # wrong guesses, re-replayed
    np.testing.assert_array_equal(got, want)
    assert want[:, 3].sum() > 0 and not (want[:, 3] == want[:, 2]).all()  # capacity matters

    def one_cache(experts, capacity):  # a fresh jit: traced after the registration
        state = online.init_cache_state(6)
        return online.replay(state, experts, jnp.zeros_like(experts), mru.code, capacity, 64)[1].sum()
    step = jax.jit(jax.vmap(one_cache, in_axes=(0, None)))
    online_misses = [np.asarray(step(jnp.asarray(trace.experts, jnp.int32), c)) for c in (1, 3, 5)]
    np.testing.assert_array_equal(np.stack(online_misses, 1), want[:, [1, 3, 5]])
    assert CacheSpec("mru", capacity=2).label == "mru" and policy_code(specs[0]) == mru.code


def test_each_priority_key_has_one_defining_site_and_the_engines_name_no_policy():
    for policy in record.REPLAYED:
        site = pathlib.Path(inspect.getsourcefile(policy.key)).relative_to(REPO)
        assert site.parent == pathlib.Path("cachesim/policies"), (policy.label, site)
        assert site.read_text().count("register(Policy(") >= 1
    sites = [path.relative_to(REPO).as_posix() for path in (REPO / "cachesim").rglob("*.py")
             if "register(Policy(" in path.read_text()]
    assert sorted(sites) == sorted(f"cachesim/policies/{name}.py"
                                   for name in ("lru", "lfu", "static", "belady", "external"))
    constants, words = {"LRU_REQUEST", "LRU_TOKEN", "LFU", "BELADY"}, {"lru", "lru_token", "lfu", "belady", "static"}
    named = []
    for path in ENGINES:
        tree = ast.parse((REPO / path).read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node)}
        for node in ast.walk(tree):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if name in constants or (isinstance(node, ast.Constant) and node.value in words
                                     and id(node) not in docstrings):
                named.append(f"{path}:{node.lineno}: {name or node.value}")
    assert not named, "\n".join(named)
