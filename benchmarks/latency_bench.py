"""Latency figures the tests used to assert as wall-clock thresholds (now measured here instead).

    python benchmarks/latency_bench.py [--rounds=3] [--quick]

The tests check the causes (a bounded timeout is passed, no run is started, the workers
are stopped before they finish); how long each takes on this machine is a benchmark:

1. ``hub_probe_s``: the paper corpus' hub probe failing against a closed port
   (``HF_ENDPOINT=http://127.0.0.1:9``); bounded by ``HUB_PROBE_TIMEOUT_S``.
2. ``sweep_stop_s``: a local sweep of two 60 s sleeper runs (a fake ``python``), from
   its SIGTERM to ``SweepInterrupted`` (the old test: "under 30 s").
3. The restart of a finished sweep (the old "restart_s < 30") is item 3 of
   benchmarks/launch_bench.py.

Each figure is the best of ``--rounds`` (``--quick``: one round); the 1-minute load
average is printed beside them. The last line is one JSON object.

JSON keys: hub_probe_s, sweep_stop_s, load_before, load_after
"""

from __future__ import annotations

import io
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bench_common import command, emit, parse  # noqa: E402

CLI = command(__file__, __doc__, "--rounds=1")
CLI.define("integer", "rounds", 3, "rounds per figure (the best is kept)")


def hub_probe_s() -> float:
    from moe.data import paper
    from moe.data.errors import SourceError
    start = time.perf_counter()
    try:
        paper.check_hub_reachable("http://127.0.0.1:9")
    except SourceError:
        pass
    return time.perf_counter() - start


def sweep_stop_s() -> float:
    from launch import execute, status
    from launch.local import LocalExecutor
    from launch.plan import Job, RunSpec
    from launch.resources import Slot
    from launch_fixtures import FAKE_MAIN
    from moe import rundir

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        fake = root / "fake_python"
        fake.write_text(f"#!{sys.executable}\n" + FAKE_MAIN.format(tests=str(REPO / "tests"), repo=str(REPO)))
        fake.chmod(0o755)
        specs = [RunSpec(n, "configs/arm_b.py:tiny", (("seed", 1), ("sleep", 60), ("run_name", n)), root / n, 4)
                 for n in ("slow-a", "slow-b")]
        states = {s.name: status.RunState(s) for s in specs}
        writer = status.StatusWriter(root, list(states.values()), parallel=2, meta={}, print_every=0,
                                     out=io.StringIO())
        executor = LocalExecutor([Slot(0, (0,), None), Slot(1, (1,), None)], retries=0, python=str(fake),
                                 echo=lambda _m: None, poll_s=0.05)
        sent = {}

        def stop():
            while not all(rundir.read_progress(s.workdir) for s in specs):
                time.sleep(0.02)
            sent["t"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGTERM)

        thread = threading.Thread(target=stop)
        thread.start()
        try:
            executor.run([Job((s,)) for s in specs], states, writer)
        except execute.SweepInterrupted:
            pass
        thread.join()
        return time.perf_counter() - sent["t"]


def main(argv=None) -> None:
    args = parse(CLI, argv)
    if args.quick:
        args.rounds = 1
    load_before = os.getloadavg()[0]
    figures = {"hub_probe_s": min(hub_probe_s() for _ in range(args.rounds)),
               "sweep_stop_s": min(sweep_stop_s() for _ in range(args.rounds))}
    for name, value in figures.items():
        print(f"{name}: {value:.3f} s")
    emit({**figures, "load_before": load_before, "load_after": os.getloadavg()[0]}, __doc__)


if __name__ == "__main__":
    main()
