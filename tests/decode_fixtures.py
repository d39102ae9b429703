"""A tiny trained run for the decode tests, trained once per test process.

Arm B at the `tiny` size on the synthetic corpus with the byte tokenizer
(vocab 256), trained for its 12 steps by `moe.run.run` exactly as main.py does,
so the run directory is a real one: config.json, checkpoints, traces.
pytest makes a separate session fixture per importing module, so the run is
kept in this module's `_SESSION`; xdist workers share one run (helpers.shared_dir:
the first to ask trains it, the others wait and read it). Tests only read it.
"""

from __future__ import annotations

import pathlib

import pytest

from helpers import shared_dir

_SESSION: dict[str, pathlib.Path] = {}


def train_tiny_run(directory: pathlib.Path, arm: str = "B") -> pathlib.Path:
    from configs import arm_a, arm_b
    from moe.run import run

    config = (arm_a if arm == "A" else arm_b).get_config("tiny")
    config.data.tokenizer = "byte"  # a small LM head keeps the decode tests fast
    config.data.dir = str(directory / "corpus")
    finished = run(config, directory / "run", log=lambda _msg: None)
    assert finished
    return directory / "run"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> pathlib.Path:
    """The directory of a finished tiny arm-B run."""
    if "B" not in _SESSION:
        _SESSION["B"] = shared_dir(tmp_path_factory, "decode-run", train_tiny_run) / "run"
    return _SESSION["B"]
