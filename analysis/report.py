"""The results page of a study: what was run, on what, and finding by finding whether the paper's claims hold.

Usage::

    python -m analysis.report ROOT --name=cpu-study --out=DIR

writes ``DIR/<name>.md`` and its figures under ``DIR/<name>/`` (PNG). ROOT is a
sweep root (``python -m launch.sweep --root=ROOT``): its run directories, the
frontier.json of the runs the study's frontier covered, and the sweep's
status.json. Every number on the page is computed here from those files, by
the same functions as ``analysis.tables`` and ``analysis.verdict``; rerunning
the command on the same runs gives the same bytes, except the lines of the
"Timings" section (wall times and rates), which are the only measured-time
lines on the page.

The findings (:func:`findings`) are pure functions of the tables' rows and
the frontier points; each says whether the claim replicates here, in words
the numbers allow (a claim whose confidence interval straddles the line is
"not resolved", not "replicated").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis import (arm_m, balancing, run_args, complementarity, decode, figures, formatting, intervals,
                      stall_section, summary, tables, verdict)
from analysis.runs import AnalysisError, Run
from cachesim import cli_util, headline
from cachesim.files import write_together
from moe import rundir
from moe.rundir import sweep_root

if TYPE_CHECKING:
    import pandas as pd

TIMINGS_HEADING = "## Timings"
# The frontier's cache capacity (fraction of E): the headline cache's, as configs/study_cpu.py runs it.
CAPACITY = float(headline.LRU_FRACTION)
ELISION_EPSILON = 0.02
# Within this relative difference two load counts are "the same" (priming's "no gain").
NO_GAIN = 0.01


@dataclasses.dataclass(frozen=True)
class Finding:
    """One claim of the paper, and what this study's numbers say about it."""

    claim: str
    status: str   # "replicates", "partly replicates", "does not replicate", "not resolved", "not tested"
    evidence: str


# -- inputs ---------------------------------------------------------------------------------------
def _pct(x: float | None, digits: int = 1, signed: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return formatting.EMPTY
    return f"{x * 100:+.{digits}f}%" if signed else f"{x * 100:.{digits}f}%"


def _ci(low: float | None, high: float | None, digits: int = 1) -> str:
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "no CI"
    return f"95% CI [{_pct(low, digits)}, {_pct(high, digits)}]"


def data_manifests(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The prepared corpora the runs read: recipe, tokenizer hash and every file's SHA-256 (MANIFEST.json).

    Found from each run's recorded data config (moe.data.recipe.prepared_dir), so
    the page names exactly the bytes the runs were trained and evaluated on.
    """
    import ml_collections

    from moe.data import recipe as data_config
    from moe.data import store

    found: dict[str, dict[str, Any]] = {}
    for run in runs:
        data = (run.record.resolved_config or {}).get("data")
        if not data:
            continue
        directory = data_config.prepared_dir(ml_collections.ConfigDict(data))
        path = directory / store.MANIFEST
        if not path.is_file():
            found.setdefault(str(directory), {"missing": True, "corpus": data.get("corpus"), "runs": []})
        else:
            text = path.read_bytes()
            manifest = json.loads(text)
            entry = found.setdefault(str(directory), {
                "missing": False, "corpus": manifest["recipe"]["corpus"], "runs": [],
                "manifest_sha256": hashlib.sha256(text).hexdigest(),
                "tokenizer": manifest["tokenizer"]["name"], "tokenizer_sha256": manifest["tokenizer"]["sha256"],
                "files": {f["name"]: f["sha256"] for f in sorted(manifest["files"], key=lambda f: f["name"])}})
        found[str(directory)]["runs"].append(run.name)
    return list(found.values())


def sweep_machine(root: Path) -> str:
    """The machines the root's sweeps ran on, as status.json records them (launch.status.machine_line)."""
    try:
        sweeps = sweep_root.read_status(root, table=False)["sweeps"]
    except (OSError, ValueError):
        sweeps = []
    machines = list(dict.fromkeys(s["machine"] for s in sweeps if isinstance(s.get("machine"), str) and s["machine"]))
    return "; ".join(machines) or "not recorded (the sweep's status.json names no machine)"




def recorded_manifests(root: Path, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The data lines' manifests: those ROOT/analysis/data_manifests.json keeps, else this machine's
    (``data_manifests``), which are kept there when every corpus was found, so a page regenerated from the
    committed evidence on another machine names the same bytes."""
    path = root / sweep_root.DATA_MANIFESTS
    if path.is_file():
        return rundir.read_json(path)["manifests"]
    found = data_manifests(runs)
    if found and not any(m["missing"] for m in found):
        path.parent.mkdir(parents=True, exist_ok=True)
        rundir.write_json(path, {"manifests": found})
    return found


def run_timings(runs: Sequence[Run]) -> pd.DataFrame:
    """Per run: steps, tokens, wall time over its attempts and tokens/s (DONE and log.jsonl)."""
    import pandas as pd  # here, not at the top: --help need not wait for pandas and matplotlib

    records = []
    for run in runs:
        done = rundir.read_done(run.path) or {}
        log = rundir.read_log(run.path)
        rates = [r["tok_s"] for r in log if isinstance(r.get("tok_s"), (int, float))]
        records.append({"run": run.name, "steps": done.get("steps"), "tokens": run.tokens,
                        "wall_s": done.get("wall_s"), "completed_at": done.get("completed_at"),
                        "tok_s": float(pd.Series(rates).median()) if rates else None})
    return pd.DataFrame.from_records(records, columns=["run", "steps", "tokens", "wall_s", "completed_at", "tok_s"])


def sweep_wall_s(root: Path) -> float | None:
    """The runs' wall time: from the first sweep's start on this root (status.json) to the last run's DONE;
    runs a study step trained (fine-tunes, counted with the steps) aside."""
    import pandas as pd  # here, not at the top: --help need not wait for pandas and matplotlib

    started = sweep_root.first_started(root)
    ends = []
    for path in sweep_root.run_dirs(root):
        if any(a.get("executor") == "study" for a in rundir.read_attempts(path)):
            continue
        done = rundir.read_done(path)
        if done and done.get("completed_at"):
            ends.append(pd.Timestamp(done["completed_at"]).timestamp())
    return max(ends) - started if started is not None and ends else None


def study_steps_s(root: Path) -> dict[str, float]:
    """Wall seconds of each study step after the runs (fine-tune, frontier, stall, decode); {} if none ran."""
    path = root / sweep_root.STEP_TIMES
    return rundir.read_json(path) if path.is_file() else {}


def wall_time_lines(wall_s: float | None, steps_s: Mapping[str, float]) -> list[str]:
    """The study's wall time: the runs, the steps after them, and their sum."""
    runs = (rundir.format_duration(wall_s) if wall_s is not None else "unknown (no status.json)")
    out = [f"* Runs (the first sweep's start to the last run's end): {runs}."]
    if steps_s:
        out.append("* Study steps after the runs (summed over sweep invocations): "
                   + ", ".join(f"{name} {rundir.format_duration(s)}" for name, s in steps_s.items()) + ".")
        if wall_s is not None:
            out.append(f"* Study wall time, runs and steps (the tables, verdict and page aside): "
                       f"{rundir.format_duration(wall_s + sum(steps_s.values()))}.")
    return out


TRAINING_CODE = ("main.py", "moe", "losses", "configs")  # what a run's numbers depend on


def code_commits(runs: Sequence[Run]) -> dict[str, Any]:
    """The commits the runs recorded, the most runs' first: {"runs": {commit: names}, "changed": {commit:
    training-code files changed against the first, or None where git cannot tell}}."""
    grouped: dict[str, list[str]] = {}
    for r in sorted(runs, key=lambda r: r.name):
        if r.config.get("git_commit"):
            grouped.setdefault(str(r.config["git_commit"]), []).append(r.name)
    by_commit = dict(sorted(grouped.items(), key=lambda item: (-len(item[1]), item[0])))
    first = next(iter(by_commit), None)
    return {"runs": by_commit, "changed": {c: _changed_files(first, c) for c in list(by_commit)[1:]}}


def _changed_files(old: str, new: str) -> list[str] | None:
    """Training-code files that differ between two commits of this repository (git), None if git cannot tell."""
    proc = subprocess.run(["git", "diff", "--name-only", old, new, "--", *TRAINING_CODE], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1])
    return proc.stdout.split() if proc.returncode == 0 else None


def code_lines(root_label: str, commits: Mapping[str, Any]) -> list[str]:
    """Which code made which runs, and what differed between the commits (pure)."""
    by_commit = commits["runs"]
    short = lambda c: f"`{c[:7]}`"  # noqa: E731
    if len(by_commit) <= 1:
        commit = short(next(iter(by_commit))) if by_commit else "unrecorded"
        return [f"* Runs under `{root_label}`; code at git commit {commit} (recorded by each run)."]
    out = [f"* Runs under `{root_label}`; code at the git commits each run recorded: "
           + "; ".join(f"{short(c)} ({', '.join(names)})" for c, names in by_commit.items()) + "."]
    first = next(iter(by_commit))
    for c, files in commits["changed"].items():
        since = f"{short(c)} against {short(first)}"
        out.append(f"* Training code ({', '.join(TRAINING_CODE)}) of {since}: "
                   + ("unknown (this checkout has no git history of both)" if files is None else
                      "identical" if not files else "differs in " + ", ".join(f"`{f}`" for f in files)) + ".")
    return out


# -- findings (pure) ------------------------------------------------------------------------------
def b_grids(found: Sequence[verdict.Verdict]) -> dict[str, list[verdict.Verdict]]:
    """{series: its counted arm-B RQ1 configurations with a baseline, by λ}: the λ grids the findings judge."""
    out: dict[str, list[verdict.Verdict]] = {}
    for v in found:
        if v.criterion == "RQ1" and v.arm == "B" and v.counted and v.state != "NO BASELINE" and v.lam > 0:
            out.setdefault(v.series, []).append(v)
    return {k: sorted(g, key=lambda v: v.lam) for k, g in out.items()}


def _judged(j: verdict.Judged, digits: int, signed: bool) -> str:
    """'+56.2% (95% CI [+7.1%, +84.0%], own 3 seeds)': a confidence-verdict gate's point and interval."""
    if j.interval is None:
        return f"{_pct(j.point, digits, signed)} (no interval: {j.note.split(';')[0]})"
    where = {"own": "own seeds", "borrowed": "pooled seed-paired SD"}.get(j.noise, j.noise)
    return f"{_pct(j.point, digits, signed)} ({_ci(*j.interval, digits)}, {where})"


def _step(lo: verdict.Judged, hi: verdict.Judged) -> str:
    """'up', 'down' or 'open': whether the larger λ's interval lies wholly above (below) the smaller λ's."""
    if lo.interval is None or hi.interval is None:
        return "open"
    if hi.interval[0] > lo.interval[1]:
        return "up"
    if hi.interval[1] < lo.interval[0]:
        return "down"
    return "open"


def dose_response_finding(found: Sequence[verdict.Verdict]) -> Finding:
    claim = "The dose-response is monotone: a larger λ gives fewer misses and a higher PPL."
    criterion = ("Criterion: between adjacent λ of one grid, both the seed-paired miss reduction and ΔPPL rise, "
                 "a step counting as a rise (or a fall) only when the confidence verdict's two 95% intervals lie "
                 "apart; overlapping intervals leave the step open.")
    grids = {k: g for k, g in b_grids(found).items() if len(g) >= 2}
    if not grids:
        return Finding(claim, "not tested", f"{criterion} No grid of counted arm-B configurations has two or more "
                                            "λ values.")
    steps, parts = [], []
    for series, grid in grids.items():
        points = " → ".join(f"λ={v.lam:g} ({len(v.runs)} seed{'s' if len(v.runs) > 1 else ''}): miss red. "
                            f"{_judged(v.metric, 1, True)}, ΔPPL {_judged(v.quality, 2, True)}" for v in grid)
        moves = []
        for lo, hi in zip(grid, grid[1:]):
            miss, ppl = _step(lo.metric, hi.metric), _step(lo.quality, hi.quality)
            steps += [miss, ppl]
            moves.append(f"{lo.lam:g}→{hi.lam:g}: misses {'fall' if miss == 'up' else 'rise' if miss == 'down' else 'open'}, "
                         f"PPL {'rises' if ppl == 'up' else 'falls' if ppl == 'down' else 'open'}")
        parts.append(f"{series}: {points}. Steps: {'; '.join(moves)}")
    status = ("does not replicate" if "down" in steps else "replicates" if set(steps) == {"up"} else "not resolved")
    return Finding(claim, status, f"{criterion} {steps.count('up')} of {len(steps)} step-wise comparisons rise, "
                                  f"{steps.count('down')} fall. " + " ".join(p + "." for p in parts))


def gates_finding(conf: Sequence[verdict.Verdict], pre: Sequence[verdict.Verdict]) -> Finding:
    claim = (f"The gates are coupled: no λ meets both the miss gate (≥ {verdict.RQ1_MIN_MISS_REDUCTION:.0%} fewer "
             f"LRU misses @25%) and the quality gate (ΔPPL ≤ +{verdict.RQ1_MAX_PPL_COST:.0%}).")
    criterion = ("Criterion: a λ meets both gates when the confidence verdict PASSes both over their whole 95% "
                 "intervals, and misses them when either gate FAILs over its whole interval; otherwise it is open.")
    grids = b_grids(conf)
    if not grids:
        return Finding(claim, "not tested", f"{criterion} No counted arm-B configuration has an arm-A baseline.")
    at_point = {(v.series, v.lam): v for v in pre}
    states, parts = [], []
    for series, grid in grids.items():
        for v in grid:
            both = v.metric.state == v.quality.state == "PASS"
            state = ("meets both" if both else "misses" if "FAIL" in (v.metric.state, v.quality.state) else "open")
            states.append(state)
            p = at_point.get((series, v.lam))
            point = (f"; at the points (pre-registered verdict): miss gate {p.metric.state}, ΔPPL gate "
                     f"{p.quality.state}" if p is not None and p.metric is not None else "")
            parts.append(f"{series}, λ={v.lam:g}: miss gate {v.metric.state} at {_judged(v.metric, 1, True)}, "
                         f"ΔPPL gate {v.quality.state} at {_judged(v.quality, 2, True)}: {state}{point}")
    status = ("does not replicate" if "meets both" in states else
              "replicates" if set(states) == {"misses"} else "not resolved")
    return Finding(claim, status, f"{criterion} " + "; ".join(parts) + ".")


def _frontier_points(points: Sequence[Mapping[str, Any]], *, epsilon: float = 0.0, prime: bool = False,
                     stream: str = "domains") -> dict[float, Mapping[str, Any]]:
    """{τ: point} of one frontier: the τ series at the study's capacity, other interventions as given."""
    out = {}
    for p in points:
        s = p["setting"]
        if (p["stream"] == stream and math.isclose(p["capacity_fraction"], CAPACITY) and s["cache_prior"] == 0
                and s.get("max_rank") is None and math.isclose(s["epsilon"], epsilon) and s["prime"] == prime):
            out[float(s["tau"])] = p
    return out


def rerouting_finding(frontiers: Mapping[str, Sequence[Mapping[str, Any]]], a_run: str, b_run: str) -> Finding:
    claim = "τ-rerouting costs less PPL on B than on A (the trained locality and the inference-time steering stack)."
    if a_run not in frontiers or b_run not in frontiers:
        missing = a_run if a_run not in frontiers else b_run
        return Finding(claim, "not tested", f"no frontier.json for {missing or 'an arm-A or arm-B run'}")
    a, b = _frontier_points(frontiers[a_run]), _frontier_points(frontiers[b_run])
    taus = sorted(t for t in a.keys() & b.keys() if t > 0)
    if not taus:
        return Finding(claim, "not tested", "the frontiers share no τ > 0")
    parts, judged = [], []
    for t in taus:
        ca, cb = a[t]["ppl_cost_vs_tau0"], b[t]["ppl_cost_vs_tau0"]
        ma, mb = a[t]["miss_reduction_vs_tau0"], b[t]["miss_reduction_vs_tau0"]
        series = [_window_series(p, "ce") for p in (a[0.0], a[t], b[0.0], b[t])] if 0.0 in a and 0.0 in b else [None]
        few = _too_few_windows(series) if all(x is not None for x in series) else None
        where = few or "no per-window values in frontier.json, so no interval"
        if all(x is not None for x in series) and not few:
            per_domain = {d: np.array([x[d] for x in series]) for d in series[0]}

            def difference(means: Mapping[str, np.ndarray]) -> np.ndarray:
                ppl = np.mean([np.exp(m) for m in means.values()], axis=0)  # (4, R): A τ=0, A τ, B τ=0, B τ
                return (ppl[3] / ppl[2] - 1) - (ppl[1] / ppl[0] - 1)

            low, high = intervals.paired_bootstrap(per_domain, difference)
            judged.append("B cheaper" if high < 0 else "A cheaper" if low > 0 else "open")
            where = f"window-bootstrap 95% CI [{low * 100:+.2f}, {high * 100:+.2f}] points"
        else:
            judged.append("open")
        parts.append(f"τ={t:g}: PPL cost A {_pct(ca, 2)} vs B {_pct(cb, 2)} (B − A {(cb - ca) * 100:+.2f} points, "
                     f"{where}), miss reduction A {_pct(ma)} vs B {_pct(mb)}")
    status = ("replicates" if all(j == "B cheaper" for j in judged) else
              "does not replicate" if all(j == "A cheaper" for j in judged) else
              "partly replicates" if "B cheaper" in judged and "open" not in judged else "not resolved")
    return Finding(claim, status, f"Criterion: at every τ, B's PPL cost (against its own τ = 0) is below A's over the "
                                  f"whole window interval of B − A. B cheaper at {judged.count('B cheaper')} of "
                                  f"{len(taus)} τ values, A cheaper at {judged.count('A cheaper')} ({a_run} vs "
                                  f"{b_run}). " + "; ".join(parts) + ".")


def _window_series(p: Mapping[str, Any], key: str) -> dict[str, list[float]] | None:
    """{stream part: per-window values of ``key``} a frontier point kept, or None (a frontier.json without them)."""
    windows = p.get("windows") or {}
    return {d: w[key] for d, w in windows.items()} if windows and all(key in w for w in windows.values()) else None


def _too_few_windows(series: Sequence[Mapping[str, Sequence[float]]]) -> str | None:
    """Why these frontier points' per-window values allow no window interval (intervals.too_few_windows)."""
    return intervals.too_few_windows({d: len(v) for d, v in series[0].items()})


def elision_finding(frontiers: Mapping[str, Sequence[Mapping[str, Any]]], a_run: str, b_run: str) -> Finding:
    claim = (f"ε-elision (ε = {ELISION_EPSILON:g}) drops more expert loads on B than on A. Criterion: B's miss "
             "reduction from elision (against its own ε = 0) exceeds A's at the same ε over the whole "
             "window-bootstrap 95% CI of the difference.")
    pairs = {}
    for run in (a_run, b_run):
        if run not in frontiers:
            return Finding(claim, "not tested", f"no frontier.json for {run or 'an arm-A or arm-B run'}")
        plain = _frontier_points(frontiers[run]).get(0.0)
        elided = _frontier_points(frontiers[run], epsilon=ELISION_EPSILON).get(0.0)
        if plain is None or elided is None:
            return Finding(claim, "not tested", f"{run}'s frontier has no τ = 0 point at ε = {ELISION_EPSILON:g}")
        pairs[run] = (plain, elided)
    words = "; ".join(f"{run}: misses/token {p['misses_per_token']:.3f} → {e['misses_per_token']:.3f} "
                      f"({_pct(e['miss_reduction_vs_tau0'])}) at a PPL cost of {_pct(e['ppl_cost_vs_tau0'], 2)}"
                      for run, (p, e) in pairs.items())
    series = [_window_series(p, "misses") for pair in pairs.values() for p in pair]
    if any(s is None for s in series):
        return Finding(claim, "not resolved", f"{words}; no per-window values in frontier.json, so the "
                                              "difference has no interval")
    if _too_few_windows(series):
        return Finding(claim, "not resolved", f"{words}; {_too_few_windows(series)}")
    per_domain = {d: np.array([s[d] for s in series]) for d in series[0]}

    def difference(means: Mapping[str, np.ndarray]) -> np.ndarray:
        m = np.mean(list(means.values()), axis=0)  # (4, R): A plain, A elided, B plain, B elided
        return (1 - m[3] / m[2]) - (1 - m[1] / m[0])

    point = float(difference({d: v.mean(axis=1, keepdims=True) for d, v in per_domain.items()})[0])
    low, high = intervals.paired_bootstrap(per_domain, difference)
    status = "replicates" if low > 0 else "does not replicate" if high < 0 else "not resolved"
    return Finding(claim, status, f"B − A miss reduction from elision {point * 100:+.1f} points (window-bootstrap "
                                  f"95% CI [{low * 100:+.1f}, {high * 100:+.1f}] points). {words}.")


def priming_finding(frontiers: Mapping[str, Sequence[Mapping[str, Any]]], runs: Sequence[str]) -> Finding:
    claim = "Domain priming (prefetching a domain's experts at a domain switch) gives no gain in total loads."
    criterion = (f"Criterion: priming saves at most {NO_GAIN:.0%} of the mixed stream's loads (misses + prefetches "
                 "per token) against the same run unprimed, over the whole window-bootstrap 95% CI of the saving; "
                 "more than that over the whole interval is a gain.")
    parts, judged = [], []
    for name in runs:
        if name not in frontiers:
            continue
        plain = _frontier_points(frontiers[name], stream="mixed").get(0.0)
        primed = _frontier_points(frontiers[name], stream="mixed", prime=True).get(0.0)
        if plain is None or primed is None:
            continue
        loads = {k: p["misses_per_token"] + p["prefetch_loads_per_token"] for k, p in (("plain", plain), ("primed", primed))}
        gain = 1 - loads["primed"] / loads["plain"] if loads["plain"] > 0 else float("nan")
        series = [_window_series(p, "loads") for p in (plain, primed)]
        where = "no per-window values in frontier.json, so no interval"
        state = "open"
        if all(x is not None for x in series):
            per_part = {d: np.array([x[d] for x in series]) for d in series[0]}
            low, high = intervals.paired_bootstrap(
                per_part, lambda means: 1 - np.mean([m[1] for m in means.values()], axis=0)
                / np.mean([m[0] for m in means.values()], axis=0))
            where = f"window-bootstrap 95% CI [{_pct(low)}, {_pct(high)}]"
            state = "no gain" if high <= NO_GAIN else "gain" if low > NO_GAIN else "open"
        judged.append(state)
        parts.append(f"{name}: loads/token (misses + prefetches) {loads['plain']:.3f} unprimed vs "
                     f"{loads['primed']:.3f} primed ({_pct(gain)} saved, {where}; demand misses "
                     f"{plain['misses_per_token']:.3f} → {primed['misses_per_token']:.3f})")
    if not judged:
        return Finding(claim, "not tested", f"{criterion} No arm-C run with primed and unprimed mixed-stream "
                                            "frontier points (priming is judged on arm C against its unprimed self).")
    status = ("replicates" if set(judged) == {"no gain"} else "does not replicate" if "gain" in judged
              else "not resolved")
    return Finding(claim, status, f"{criterion} " + "; ".join(parts) + ".")


def findings(rows: Sequence[Mapping[str, Any]], conf: Sequence[verdict.Verdict], pre: Sequence[verdict.Verdict],
             frontiers: Mapping[str, Sequence[Mapping[str, Any]]], frontier_runs: Sequence[str]) -> list[Finding]:
    """The paper's claims the page checks, judged on the confidence verdict (``conf``; the pre-registered
    verdict's points, ``pre``, beside). ``frontier_runs``: [arm-A run, arm-B run]. Priming is judged on arm C,
    whose domain slices are its own (arms A and B have none, so "no gain" would be guaranteed there);
    collapse at high λ is no claim of the paper: the verdict's collapse lines report it."""
    a_run, b_run = (list(frontier_runs) + ["", ""])[:2]
    c_runs = [r["run"] for r in rows if r["arm"] == "C"]
    return [dose_response_finding(conf), gates_finding(conf, pre), rerouting_finding(frontiers, a_run, b_run),
            elision_finding(frontiers, a_run, b_run), priming_finding(frontiers, c_runs)]


# -- deviations from the paper's protocol ---------------------------------------------------------
def _model_line(run: Run) -> str:
    model = (run.record.resolved_config or {}).get("model") or {}
    parts = [run.size]
    if run.params:
        parts.append(f"{run.params:,} parameters")
    for key, label in (("d_model", "d_model"), ("n_layers", "layers"), ("num_experts", "E"), ("top_k", "k")):
        if key in model:
            parts.append(f"{label} {model[key]}" if label in ("d_model", "layers") else f"{label} = {model[key]}")
    return ", ".join(parts)


def deviations(runs: Sequence[Run], frontier_runs: Sequence[str]) -> list[tuple[str, str, str]]:
    """(aspect, the paper's protocol, this study's runs) rows, read from the run records."""
    complete = [r for r in runs if r.complete]

    def distinct(values) -> str:
        return "; ".join(dict.fromkeys(str(v) for v in values if v not in (None, ""))) or "unrecorded"

    models = distinct(_model_line(r) for r in complete)
    corpus = distinct(r.config.get("corpus") or ((r.record.resolved_config or {}).get("data") or {}).get("corpus")
                      for r in complete)
    lams = sorted({r.lam for r in complete if r.arm == "B"})
    seeds = "; ".join(f"arm {arm}: {', '.join(str(s) for s in sorted({r.seed for r in complete if r.arm == arm and r.seed is not None}))}"
                      for arm in sorted({r.arm for r in complete}))
    dtype = distinct(((r.record.resolved_config or {}).get("model") or {}).get("compute_dtype") for r in complete)
    windows = distinct(
        f"{r.window_tokens}-token windows, " + ", ".join(f"{d} {ev.tokens // r.window_tokens}" for d, ev in r.domains.items())
        if r.window_tokens else f"{', '.join(f'{d} {ev.tokens:,} tokens' for d, ev in r.domains.items())}"
        for r in complete)
    with_frontier = [r.name for r in complete if rundir.has_frontier(r.path)]
    here = {
        "model": models,
        "training tokens": distinct(rundir.format_tokens(t) for t in sorted({r.tokens for r in complete})),
        "corpus": corpus,
        "λ grid (arm B)": ", ".join(f"{x:g}" for x in lams) or "no arm-B run",
        "seeds": seeds or "none",
        "precision": f"{dtype} compute",
        "context": distinct(f"{r.config.get('seq')} tokens" for r in complete if r.config.get("seq")),
        "evaluation": windows,
        "frontier (τ/ε)": (f"frontier.json of {', '.join(with_frontier)}; the findings compare "
                           f"{', '.join(frontier_runs) or 'none'}" if with_frontier else "no frontier.json"),
        "collapse": f"experts under {headline.COLLAPSE_PERCENT} of the run's evaluation tokens pooled over domains",
    }
    balancings = sorted({r.balancing for r in complete})
    if balancings != [""]:  # a run balanced otherwise than the paper's arms (loss.balance, loss.router_z)
        here["balancing"] = "; ".join(
            f"{b or 'the Switch loss'} ({sum(r.balancing == b for r in complete)} runs)" for b in balancings)
    # The protocol rows read the run records; the verdicts' own departures follow, from the same list.
    rows = [(verdict.deviation(key).aspect, verdict.deviation(key).paper, text) for key, text in here.items()]
    return rows + [(d.aspect, d.paper, d.here) for d in map(verdict.deviation, verdict.deviations_used(runs))]


# -- figures --------------------------------------------------------------------------------------
def deciding(conf: Sequence[verdict.Verdict]) -> verdict.Verdict | None:
    """The configuration that decides RQ1's gates: on the counted arm-B grid with the most λ (from scratch
    before branched, the Switch loss before another balancing), the smallest λ whose seed-paired miss
    reduction reaches the miss gate, else its largest λ."""
    grids = b_grids(conf)
    if not grids:
        return None
    grid = max(grids.values(), key=lambda g: (len(g), not g[0].fork_step, not g[0].balancing))
    return next((v for v in grid if verdict.passes(v.metric.point, verdict.RQ1_MIN_MISS_REDUCTION, True)), grid[-1])


def write_figures(runs: Sequence[Run], out: Path, frontier_runs: Sequence[str],
                  conf: Sequence[verdict.Verdict] = ()) -> dict[str, Path]:
    """{caption: PNG path} of the page's figures, drawn into ``out``."""
    from analysis import study  # here, not at the top: --help need not wait for pandas and matplotlib

    drawn: dict[str, Path] = {}
    complete = [r for r in runs if r.complete]

    def attempt(caption: str, draw) -> None:
        try:
            drawn[caption] = draw()
        except AnalysisError:
            pass  # the figure's inputs are absent (e.g. no arm-B run); the page lists what it has

    attempt("Dose-response: the confidence verdict's seed-paired LRU miss reduction @25% and PPL cost of arm B "
            "vs arm A at each tested λ (no line joins them). Filled circles with solid bars: the seed mean and "
            "its 95% t-interval over its own seeds; open squares with dashed bars: one seed, judged at the "
            "study's pooled seed-paired SD; small dots: each seed. Shaded: the 95% range of one seed pair's "
            "effect when there is none (the pooled seed-paired SD); dashed: the RQ1 gates",
            lambda: study.write_dose_response(complete, out / "dose_response.png"))
    attempt("Training curves: training LM loss and validation PPL per domain vs tokens, one colour per run and "
            "one line style per arm (lines: validation during training on the windows the panel titles name; "
            "stars: the final evaluation on every window; an arm-M run starts at its base's tokens)",
            lambda: study.write_training_curves(runs, out / "training_curves.png"))
    names = [n for n in frontier_runs if n]
    attempt(f"τ/ε frontier of {' and '.join(names) or 'the frontier runs'} on shared axes: PPL cost vs LRU "
            "miss reduction on the domains stream, one colour per run, one line style per intervention, "
            "τ written beside the rerouting points where it fits",
            lambda: study.write_frontier(complete, out / "frontier.png", names=names))
    decide = deciding(conf)
    if decide is not None:
        attempt(f"Hit rate vs cache budget at the deciding λ ({decide.config}: the smallest λ whose "
                f"seed-paired miss reduction reaches {verdict.RQ1_MIN_MISS_REDUCTION:.0%}, else the largest "
                "tested), its seeds' mean over arm A's",
                lambda: study.write_hit_vs_budget_a_vs_b(complete, out / "hit_vs_budget.png", config=decide.config))
    counts = ", ".join(f"{r.name}: {summary.pooled_collapsed(r)[0]}" for r in complete)
    attempt(f"Expert usage per layer, pooled over each run's evaluation tokens of every domain (one log colour "
            f"scale for every run). x: an expert under {headline.COLLAPSE_PERCENT} of the pooled tokens, the "
            f"experts the verdicts count as collapsed ({counts})",
            lambda: study.write_pooled_usage(complete, out / "usage.png"))
    return drawn


# -- the page -------------------------------------------------------------------------------------
def _table_md(table: formatting.Table) -> str:
    return formatting.render(table, "markdown").rstrip() + "\n"


def _training_lines(runs: Sequence[Run], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Arm A's end-of-training PPLs, and whether every run's validation PPL was still falling at the end."""
    lines = []
    a_rows = [r for r in rows if r["arm"] == "A"]
    for r in a_rows:
        per = ", ".join(f"{d} {v['ppl']:.2f}" for d, v in r["domains"].items())
        lines.append(f"* Arm A `{r['run']}`: mean PPL **{r['ppl']:.2f}** after {rundir.format_tokens(r['tokens'])} "
                     f"tokens ({per}).")
    falling, flat = [], []
    for run in runs:
        evals = rundir.read_log(run.path, name=rundir.EVAL_LOG)
        if len(evals) < 2:
            continue
        before, last = (sum(v["ppl"] for v in e["domains"].values()) / len(e["domains"]) for e in evals[-2:])
        (falling if last < before else flat).append(f"{run.name} ({before:.1f} → {last:.1f})")
    if falling or flat:
        lines.append(f"* Validation PPL (mean over domains, last two evaluations during training) still falling at "
                     f"the end: {len(falling)} of {len(falling) + len(flat)} runs"
                     + (f"; not falling: {', '.join(flat)}" if flat else "") + ".")
    return lines


def render_page(*, name: str, root_label: str, command: str, rows, found: Sequence[Finding],
                testability: Sequence[str], deviation_rows: Sequence[tuple[str, str, str]],
                table_md: Sequence[str], verdict_txt: str, figure_paths: Mapping[str, str],
                manifests: Sequence[Mapping[str, Any]], commits: Mapping[str, Any], machine_line: str,
                training: Sequence[str], timings: pd.DataFrame, wall_s: float | None, steps_s: Mapping[str, float],
                melinoe: Sequence[str] = (), stall_md: Sequence[str] = (), decode_md: Sequence[str] = (),
                plan_md: Sequence[str] = (), balance_md: Sequence[str] = ()) -> str:
    """The markdown page (pure: every input given)."""
    import pandas as pd  # here, not at the top: --help need not wait for pandas and matplotlib

    replicated = sum(f.status == "replicates" for f in found)
    out = [f"# Results: {name}", "",
           f"Our own study, from configs to verdict: {len(rows)} runs, {replicated} of {len(found)} of the paper's "
           "qualitative findings replicate at this scale (table below). Every number is regenerated by the command "
           "below. Effects are seed-paired (each run against arm A of its own seed). Each interval is labelled "
           "with the noise it covers: window-bootstrap 95% CIs cover the choice of evaluation windows only; "
           "seed-level 95% t-intervals (2 or more seeds) cover training noise; the verdict states which one it "
           "judged at.", ""]
    # The overall words of the verdict below, first: each names the rule it answers by.
    overall = [line for line in verdict_txt.splitlines() if line.startswith(("RQ1 overall", "RQ2 overall"))]
    out += ["## Answer", "", *[f"* {line}" for line in overall], ""]
    if figure_paths:
        caption, path = next(iter(figure_paths.items()))
        out += [f"![{caption}]({path})", ""]
    out += ["## How this page was made", "", "```", command, "```", "",
            *code_lines(root_label, commits),
            f"* Machine (where the sweep ran): {machine_line}."]
    for m in manifests:
        if m["missing"]:
            out.append(f"* Data ({m['corpus']}): the prepared corpus is not on this machine; no hashes.")
            continue
        out.append(f"* Data: `{m['corpus']}` corpus, tokenizer {m['tokenizer']} (sha256 `{m['tokenizer_sha256'][:16]}…`), "
                   f"MANIFEST.json sha256 `{m['manifest_sha256']}`; files: "
                   + ", ".join(f"{n} `{h[:16]}…`" for n, h in m["files"].items()) + ".")
    if plan_md:
        out += ["", "## Pre-registration", "", *plan_md]
    out += ["", "## Training", "", *training, ""]
    if balance_md:
        out += [balancing.HEADING, "", *balance_md, ""]
    out += ["## Findings", "", "| claim | here | evidence |", "|---|---|---|"]
    out += [f"| {f.claim} | **{f.status}** | {f.evidence} |" for f in found]
    out += ["", "## Can this scale answer the questions?", "", *testability, ""]
    out += ["## Deviations from the paper's protocol", "", "| | the paper | this study |", "|---|---|---|"]
    out += [f"| {aspect} | {paper} | {here} |" for aspect, paper, here in deviation_rows]
    out += ["", "## ΔPPL and miss reduction vs arm A, per run", "",
            "Seed-paired first: each run against the arm-A run of its own seed (same batches), an arm-M run against "
            "its control (else its base); the pooled columns compare with arm A's mean over its seeds (none for arm M). Every interval is a 95% "
            "window-bootstrap CI of the number beside it: it covers the choice of evaluation windows, not training "
            "noise (the verdict below gives seed-level intervals where a configuration has 2 or more seeds).", "",
            "| run | λ | μ | seed | paired with | ΔPPL (paired) | 95% CI (windows) | miss red. @25% (paired) | "
            "95% CI (windows) | ΔPPL vs pooled A | 95% CI (windows) | miss red. vs pooled A | 95% CI (windows) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["arm"] == "A":
            continue
        paired = r["paired_baseline"] if r["pairing"] == "seed" else "— (no same-seed A)"

        def cell(key: str, digits: int) -> str:
            ci = r.get(f"{key}_ci") or (None, None)
            return f"{_pct(r[key], digits)} | {_ci(*ci, digits)}"

        first = (f"{cell('delta_ppl', 2)} | {cell('miss_reduction_25', 1)}" if r["pairing"] == "seed"
                 else f"— | — | — | —")
        out.append(f"| {r['run']} | {r['lam']:g} | {r['mu']:g} | {r['seed']} | {paired} | {first} | "
                   f"{cell('delta_ppl_pooled', 2)} | {cell('miss_reduction_25_pooled', 1)} |")
    if melinoe:
        out += ["", "## MELINOE (arm M): its own question, against its control", "", *melinoe]
    if stall_md:
        out += ["", "## Stall (timed tier)", "", *stall_md]
    if decode_md:
        out += ["", "## Offloaded decode: measured against the timed model", "", *decode_md]
    out += ["", "## Tables", ""]
    for md in table_md:
        out += [md]
    out += ["## Verdict (SPEC §9)", "", "```", verdict_txt.rstrip(), "```", ""]
    out += ["## Figures", ""]
    for caption, path in list(figure_paths.items()):
        out += [f"**{caption}**", "", f"![{caption}]({path})", ""]
    out += [TIMINGS_HEADING, "",
            "Measured wall times (the only lines that change when the page is regenerated).", "",
            *wall_time_lines(wall_s, steps_s), "",
            "| run | steps | tokens | wall | tokens/s (median) |", "|---|---|---|---|---|"]
    for t in timings.itertuples():
        out.append(f"| {t.run} | {t.steps} | {rundir.format_tokens(t.tokens)} | "
                   f"{rundir.format_duration(t.wall_s) if pd.notna(t.wall_s) else '—'} | "
                   f"{f'{t.tok_s:,.0f}' if pd.notna(t.tok_s) else '—'} |")
    return "\n".join(out) + "\n"


def strip_timings(page: str) -> str:
    """The page without its Timings section: what must be byte-identical when it is regenerated."""
    return page.split(TIMINGS_HEADING, 1)[0]


def preregistration_lines(root: Path) -> list[str]:
    """The plan the study registered before its first run, its hash, the commit that wrote it, and any change
    made once runs existed (each a deviation); none for a study without a plan."""
    from moe.rundir import preregistration

    doc = preregistration.read(root)
    if doc is None:
        return []
    lines = [f"Registered before the first run in `{preregistration.PREREGISTRATION}`: sha256 `{doc['sha256']}`, "
             f"written by commit `{doc['commit']}` from `{doc['source']}`.", "",
             "```json", json.dumps(doc["plan"], indent=1, ensure_ascii=False, sort_keys=True), "```"]
    for change in doc.get("plan_changes", []):
        lines.append(f"* Deviation: the plan changed after runs started, sha256 `{change['from'][:12]}` -> "
                     f"`{change['to'][:12]}` (commit `{change['commit']}`, `{change['command']}`).")
    return lines


def _melinoe(runs: Sequence[Run]) -> list[str]:
    """The MELINOE section's lines and transfers table; none for a study without arm-M runs."""
    if not any(r.finetuned for r in runs):
        return []
    studies = arm_m.load_transfers(runs)
    return [*arm_m.melinoe_lines(arm_m.transfers_rows(runs, studies)), "",
            _table_md(arm_m.transfers_table(runs, studies))]


def _stall(root: Path) -> list[str]:
    """The stall section's lines and table; none for a study without a stall step."""
    docs = stall_section.load_stall(root)
    if not docs:
        return []
    rows = stall_section.stall_rows(docs)
    return [*stall_section.stall_lines(rows), "", *stall_section.stall_table_md(rows)]


def _decode(root: Path) -> list[str]:
    """The decode section's lines and table; none for a study without a decode step."""
    docs = decode.load_decode(root)
    if not docs:
        return []
    rows = decode.decode_rows(docs)
    return [*decode.decode_lines(docs, rows), "", *decode.decode_table_md(rows)]


def build(root: Path, name: str, out: Path, *, command: str, frontier_runs: Sequence[str],
          cache_dir: str | None = None, jobs: int | None = None, skip_broken: bool = False) -> Path:
    """Writes out/<name>.md and out/<name>/*.png together (a failure keeps the old ones whole); returns the
    page's path."""
    from analysis import study  # here, not at the top: --help need not wait for pandas and matplotlib

    runs = study.load_study(root, cache_dir=cache_dir, jobs=jobs, skip_broken=skip_broken)
    complete = [r for r in runs if r.complete]
    if not complete:
        raise AnalysisError(f"no complete runs under {root}; run the sweep first")
    rows = tables.main_rows(runs)
    conf, pre = verdict.confidence(runs), verdict.preregistered(runs)
    frontiers = complementarity.load_frontiers(complete)
    found = findings(rows, conf, pre, frontiers, frontier_runs)
    built = tables.build_tables(runs, ["main", "per_domain", "complementarity"] if frontiers else
                                ["main", "per_domain"], frontiers, {})
    figure_dir = out / name
    from analysis import plots
    with plots.held() as figure_files:  # published with the page below, all or none
        drawn = write_figures(runs, figure_dir, frontier_runs, conf)
    figure_paths = {c: f"{name}/{p.name}" for c, p in drawn.items()}
    commits = code_commits(complete)
    page = render_page(name=name, root_label=root.name, command=command, rows=rows, found=found,
                       testability=verdict.testability(runs),
                       deviation_rows=deviations(runs, frontier_runs),
                       table_md=[_table_md(t) for t in built],
                       verdict_txt=verdict.verdict_text(runs, verdict.registered_target(root), verdict.registered_decision(root)),
                       figure_paths=figure_paths, manifests=recorded_manifests(root, complete), commits=commits,
                       machine_line=sweep_machine(root), training=_training_lines(complete, rows),
                       timings=run_timings(complete), wall_s=sweep_wall_s(root), steps_s=study_steps_s(root),
                       melinoe=_melinoe(complete),
                       stall_md=_stall(root), decode_md=_decode(root), plan_md=preregistration_lines(root),
                       balance_md=balancing.section_lines(complete))
    path = out / f"{name}.md"
    write_together({**figure_files, path: page})  # the page last: it never names a figure not yet in place
    return path


COMMAND = run_args.run_command("python -m analysis.report", "The results page of a study: what was run, on "
                               "what, and finding by finding whether the paper's claims hold.")
COMMAND.define("string", "name", None, "the page's name: writes OUT/<name>.md and its figures under OUT/<name>/")
COMMAND.define("string", "out", None, "the folder of the page (e.g. docs/results)")
COMMAND.define("string", "frontier_runs", "",
               "comma-separated [arm-A run, arm-B run] whose frontier.json the findings compare "
               "(default: the first arm-A and the first arm-B run under ROOT that hold a frontier.json)")
COMMAND.define("string", "command", "", "the command lines the page states (default: every sweep command that "
               "wrote ROOT, from its status.json, then this one, each exactly as run)")


def _default_frontier_runs(root: Path) -> list[str]:
    """The first arm-A and the first arm-B run (by name) holding a frontier.json: the study's frontier runs."""
    found = sorted(p.name for p in root.iterdir() if rundir.has_frontier(p))
    a = [n for n in found if n.startswith("a-")]
    b = [n for n in found if n.startswith("b-")]
    return (a[:1] + b[:1]) if a or b else found[:2]


def provenance(root: Path, report_argv: Sequence[str]) -> str:
    """The commands that made the page, exactly as run: each sweep command that wrote ``root``, in the order
    they first ran, with the folder it ran from (``(cd FOLDER && ...)``, whatever folder this report runs from,
    so the page regenerated from the kept evidence anywhere states the same), then this report's."""
    try:
        sweeps = sweep_root.read_status(root, table=False)["sweeps"]
    except FileNotFoundError:
        sweeps = []
    lines = [f"(cd {shlex.quote(s['cwd'])} && {s['command']})" if s.get("cwd") else s["command"] for s in sweeps]
    if not lines:
        lines = [f"# no sweep command recorded: {root / sweep_root.STATUS} is missing"]
    return "\n".join([*lines, shlex.join(["python", "-m", "analysis.report", *report_argv])])


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = run_args.parse_runs(COMMAND, argv)
    if not args.name or not args.out:
        raise ValueError("--name and --out are required: the page is written to OUT/<name>.md")
    cli_util.check_writable(args.out, folder=True)
    if len(args.paths) != 1 or not Path(args.paths[0]).is_dir():
        raise ValueError(f"give one sweep root directory (got {' '.join(args.paths)})")
    root, out = Path(args.paths[0]), Path(args.out)
    frontier_runs = [n for n in args.frontier_runs.split(",") if n] or _default_frontier_runs(root)
    path = build(root, args.name, out, command=args.command or provenance(root, argv),
                 frontier_runs=frontier_runs, cache_dir=args.cache_dir, jobs=args.jobs, skip_broken=args.skip_broken)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_args.run_main(main))
