"""The timed storage-tier model (SPEC §8): expected foreground stall of MoE decoding.

Hit rate is not latency: this turns a router trace into decode time on a
modelled machine (GPU memory, DRAM, SSD), with an I/O queue, deadlines and
prefetch admission, and reports the stall per committed token
``S = sum_steps sum_layers W_{j,l} / sum_steps A_j`` with its tail.

Pipeline, one module per stage:

* ``spec``       hardware tiers and model byte sizes (JSON presets in
                 ``hardware/`` and ``models/``)
* ``residency``  step plan (speculation), request unions, cache residency —
                 taken from the simulator itself (``cachesim.online.replay``,
                 ``cachesim.policies.static.pinned_sets``) — and expert placement
* ``engine``     the event-driven timing pass (``io``: the I/O queue;
                 ``prefetch``: prediction sources and the admission planner)
* ``metrics``    the metric set and its JSON Lines export
* ``compare``    every admission policy x byte budget on one workload
* ``bandwidth``  first-principles and path-mapped throughput from the same
                 model and hardware descriptions

Residency is computed once per workload and shared by every admission policy
and budget, because prefetching never changes which experts the cache holds.
The timing pass is inherently sequential (queue state couples every layer to
the next) and runs as exact event simulation, one run per (policy, budget);
layers that meet an idle queue are memoised. The command lines are
``python -m cachesim.stall`` and ``python -m cachesim.bandwidth``.
"""

from cachesim.timed.compare import compare_policies, prepare
from cachesim.timed.engine import PrefetchConfig, TimedResult, Workload, build_workload, default_capacity, run_timed
from cachesim.timed.stall_metrics import summarize
from cachesim.timed.residency import Speculation

__all__ = ["PrefetchConfig", "Speculation", "TimedResult", "Workload", "build_workload", "compare_policies",
           "default_capacity", "prepare", "run_timed", "summarize"]
