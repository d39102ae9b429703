"""A study's plan, fixed before its first run: ``ROOT/preregistration.json`` and its SHA-256.

A study config's ``plan(arg)`` states the estimands and gates, α and the
interval method of each, the design (arms, λ/μ grid, seeds, budgets, trunk
fraction), the decision rule, and what counts as a deviation. The sweep writes
it into the root before any run starts; analysis judges by the file, not by
the config as it reads today. A plan that changes once runs exist is refused,
or, with ``--replan``, kept with the change recorded as a deviation.

The hash is over the plan's canonical JSON (sorted keys, no spaces), so it is
the same for the same plan whatever the config file's layout.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import time
from collections.abc import Mapping
from typing import Any

from moe.rundir.names import read_json, write_json
from moe.rundir.records import git_commit
from moe.rundir.sweep_root import PREREGISTRATION

REQUIRED = ("estimands", "design", "decision_rule", "deviations")


class PreregistrationError(ValueError):
    """A plan that cannot be registered or that differs from the registered one; the message names the fix."""


def canonical(plan: Mapping[str, Any]) -> str:
    return json.dumps(plan, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def plan_hash(plan: Mapping[str, Any]) -> str:
    """SHA-256 of the plan's canonical JSON."""
    return hashlib.sha256(canonical(plan).encode("utf-8")).hexdigest()


def check_plan(plan: Any, source: str) -> dict[str, Any]:
    """The plan as a JSON round trip (what the file will hold), or one line naming what it lacks."""
    if not isinstance(plan, Mapping):
        raise PreregistrationError(f"{source}: plan() must return a dict, got {type(plan).__name__}")
    missing = [k for k in REQUIRED if k not in plan]
    if missing:
        raise PreregistrationError(f"{source}: plan() lacks {', '.join(missing)}; a pre-registration states "
                                   f"{', '.join(REQUIRED)}")
    for name, estimand in dict(plan["estimands"]).items():
        lacking = [k for k in ("gate", "alpha", "interval") if k not in estimand]
        if lacking:
            raise PreregistrationError(f"{source}: estimand {name!r} lacks {', '.join(lacking)}")
    try:
        return json.loads(canonical(plan))
    except (TypeError, ValueError) as e:
        raise PreregistrationError(f"{source}: plan() is not JSON ({e}); use numbers, strings, lists and dicts")


def read(root: pathlib.Path) -> dict[str, Any] | None:
    """The root's registered document, or None where the study has no plan."""
    path = pathlib.Path(root) / PREREGISTRATION
    if not path.exists():
        return None
    doc = read_json(path, fix=f"restore {PREREGISTRATION} from the study's evidence, or delete it and rerun the "
                              "sweep with --replan (the change is then a deviation)")
    if plan_hash(doc.get("plan", {})) != doc.get("sha256"):
        raise PreregistrationError(f"{path}: the plan does not hash to its recorded sha256 (edited by hand?); "
                                   "restore the file from the study's evidence")
    return doc


def register(root: pathlib.Path, plan: Mapping[str, Any], *, runs_started: bool, replan: bool, command: str,
             source: str, echo=print) -> dict[str, Any]:
    """Writes the plan into ``root`` before the first run; an unchanged plan is left as registered."""
    plan = check_plan(plan, source)
    digest = plan_hash(plan)
    old = read(root)
    if old is not None and old["sha256"] == digest:
        return old
    deviations = list(old.get("plan_changes", [])) if old else []
    if old is not None and runs_started:
        if not replan:
            raise PreregistrationError(
                f"{root / PREREGISTRATION}: {source}'s plan() differs from the registered plan "
                f"(sha256 {old['sha256'][:12]} -> {digest[:12]}) and runs exist; restore the plan, or pass "
                "--replan to record the change as a deviation")
        deviations.append({"from": old["sha256"], "to": digest, "at": time.time(), "command": command,
                           "commit": git_commit()})
        echo(f"preregistration: plan changed after runs started ({old['sha256'][:12]} -> {digest[:12]}); "
             "recorded as a deviation")
    doc = {"plan": plan, "sha256": digest, "commit": git_commit(), "written": time.time(), "command": command,
           "source": source, "plan_changes": deviations}
    write_json(pathlib.Path(root) / PREREGISTRATION, doc)
    if old is None:
        echo(f"preregistration: {root / PREREGISTRATION} sha256 {digest}")
    return doc
