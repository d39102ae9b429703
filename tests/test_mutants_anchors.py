"""Every mutant in tests/mutants.py still finds its anchor: the text it replaces occurs exactly once."""

import importlib.util
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_mutants():
    # By path: tests/ is not a package, and mutants.py imports nothing heavy (no jax).
    spec = importlib.util.spec_from_file_location("mutants", REPO / "tests" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module.MUTANTS


MUTANTS = load_mutants()


def test_mutant_names_are_unique():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)) and names


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_anchor_occurs_exactly_once_and_the_mutant_changes_it(mutant):
    text = (REPO / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.path}: anchor of {mutant.name} occurs {text.count(mutant.old)} times"
    assert mutant.new != mutant.old


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_named_test_exists(mutant):
    # A renamed test would make the mutant "caught" by a collection error, not by the test.
    for test in mutant.tests:
        path, _, name = test.partition("::")
        source = (REPO / path).read_text()
        assert not name or re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{test} not found"
