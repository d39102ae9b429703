"""Seed groups (``moe.seeds``, ``moe.run.run_group``) in-process: unrolled seed batching reproduces the solo run, across a resume.

``vmap`` batching (what ``auto`` picks on CPU below 50 steps) has the same parity test through
``launch.sweep --vmap_seeds`` in ``test_launch_sweep.py``, SIGKILLed and relaunched there.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launch import plan
from launch.vmap_seeds import train_seeds
from moe.seeds import SeedGroupError, choose_batching, split_seeds, stack
from launch_fixtures import ARM_B, TINY_OVERRIDES, TINY_STEPS, quiet, solo_run  # noqa: F401 (fixture)


def read_log(workdir):
    return [json.loads(line) for line in (workdir / "log.jsonl").read_text().splitlines()]


def test_auto_batching_unrolls_long_cpu_groups_only_and_unknown_modes_fail_with_the_choices():
    from moe.seeds import UNROLLED_MIN_STEPS_CPU as N
    assert choose_batching("auto", "cpu", N - 1) == "vmap" and choose_batching("auto", "cpu", N) == "unrolled"
    assert choose_batching("auto", "gpu", 10 * N) == "vmap" and choose_batching("auto", "tpu", 10 * N) == "vmap"
    assert choose_batching("unrolled", "gpu", 1) == "unrolled" and choose_batching("vmap", "cpu", 10 * N) == "vmap"
    with pytest.raises(SeedGroupError, match="unknown seed batching 'pmap'; choose one of auto, vmap, unrolled"):
        choose_batching("pmap", "cpu", 1)


def test_split_seeds_returns_each_seeds_exact_arrays():
    trees = [{"w": jnp.full((3, 2), s, jnp.float32) + jnp.arange(6.0).reshape(3, 2) / 7,
              "n": {"step": jnp.asarray(s, jnp.int32)}} for s in range(3)]
    parts = split_seeds(stack(trees), 3)
    for part, tree in zip(parts, trees):
        assert jax.tree.structure(part) == jax.tree.structure(tree)
        for a, b in zip(jax.tree.leaves(part), jax.tree.leaves(tree)):
            assert isinstance(a, jax.Array) and a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_an_unrolled_seed_interrupted_and_resumed_matches_its_solo_run(tmp_path, solo_run):
    batching = "unrolled"
    names = ["b-lam0.05-s1", "b-lam0.05-s2"]
    configs = [plan.build_config(f"{ARM_B}:tiny", {**TINY_OVERRIDES, "train.log_every": 1, "train.ckpt_every": 100,
                                                   "seed": seed, "run_name": name})
               for seed, name in zip((1, 2), names)]
    workdirs = [tmp_path / n for n in names]
    # Stopped after 2 of 4 steps (checkpointed as on SIGTERM), then the same call resumes and finishes.
    assert not train_seeds(configs, workdirs, log=quiet, stop_after=2, batching=batching)
    assert [r["step"] for r in read_log(workdirs[1])] == [1, 2]
    assert train_seeds(configs, workdirs, log=quiet, batching=batching)

    solo, batched = read_log(solo_run), read_log(workdirs[1])
    assert [r["step"] for r in batched] == [r["step"] for r in solo] == list(range(1, TINY_STEPS + 1))
    for a, b in zip(solo, batched):
        for key in ("loss", "lm", "bal", "loc", "dom", "grad_norm", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (batching, a["step"], key)
    solo_eval, batched_eval = (json.loads((d / "final_eval.json").read_text()) for d in (solo_run, workdirs[1]))
    for domain in ("prose", "code", "math"):
        assert batched_eval[domain]["val_loss"] == pytest.approx(solo_eval[domain]["val_loss"], rel=1e-5)
        assert batched_eval[domain]["tokens"] == solo_eval[domain]["tokens"]
    from cachesim.trace import load_trace
    for domain in ("prose", "code", "math"):
        t_solo, t_batched = (load_trace(d / f"trace_{domain}.npz") for d in (solo_run, workdirs[1]))
        assert np.array_equal(t_solo.experts, t_batched.experts)
    metrics = json.loads((workdirs[1] / "metrics.json").read_text())
    assert metrics["run"] == "b-lam0.05-s2" and metrics["final_train"]["loss"] == pytest.approx(solo[-1]["loss"],
                                                                                               rel=1e-5)
    assert read_log(workdirs[0])[-1]["loss"] != batched[-1]["loss"]  # seed 1 is its own run
