"""Shared helpers for tests/test_arm_m_*.py: tiny arm M configs and a fake base run."""

from __future__ import annotations

import pathlib

import ml_collections
from flax import nnx
from hypothesis import HealthCheck, settings

from configs import arm_a, arm_m
from configs.base import num_train_steps
from moe import checkpoint
from moe.model import build_model, param_counts
from moe.config import resolve
from moe.rundir import write_json
from moe.run import config_record
from moe.train import init_state, make_optimizer
from moe.train_io import router_state
from model_fixtures import tiny_model_cfg

PROPERTY_SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE_STEP = 7  # the fake base run's checkpoint step


def base_config() -> ml_collections.ConfigDict:
    config = arm_a.get_config("tiny")
    config.eval.cache_metrics = False  # cachesim metrics are tested elsewhere
    return resolve(config)


def make_base_run(run_dir: pathlib.Path) -> tuple[ml_collections.ConfigDict, dict]:
    """A run directory as main.py leaves it (config.json + a checkpoint), without training.

    The weights are the seed's initialisation: fine-tuning tests need a base
    checkpoint, not a good model.
    """
    config = base_config()
    tx = make_optimizer(config.optim, num_train_steps(config))
    _, state = init_state(config, tx)
    run_dir.mkdir(parents=True)
    counts = param_counts(nnx.eval_shape(lambda: build_model(config.model, config.seed)))
    write_json(run_dir / "config.json", config_record(config, counts))
    mgr = checkpoint.manager(run_dir, keep=1)
    checkpoint.save(mgr, BASE_STEP, state, {"fake": True}, router_state(state))
    mgr.close()
    return config, state


def arm_m_config(init_from: pathlib.Path | str = "", **loss) -> ml_collections.ConfigDict:
    """A tiny arm M config (unresolved), with small predictor settings."""
    config = arm_m.get_config("tiny")
    config.init_from = str(init_from)
    config.eval.cache_metrics = False
    config.predictor.train_windows = 48
    config.loss.update(loss)
    return config
