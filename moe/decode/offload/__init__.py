"""Experts offloaded to slower tiers for a real decode (`python -m moe.decode`), and the timed model checked against it.

| module | job |
|---|---|
| `diskio` | aligned expert files, O_DIRECT / posix_fadvise(DONTNEED) reads, the bandwidth cap |
| `expert_store` | the disk store (one file per (layer, expert), written once) and the RAM tier |
| `io_pool` | W I/O worker threads: demand first, prefetch preemption, cancellation |
| `fast_tier` | C resident experts per layer via cachesim's policy step: the decode's ExpertProvider |
| `admission` | the timed model's prefetch sources and admission policies on real reads |
| `calibrate` | the tier's latency, stream and link bandwidth, measured through the read path |
| `measure` | per-step and per-layer records in the timed model's terms and JSON Lines schema |
| `step_records` | one reader of that schema for measured and modelled traces |
| `model_check` | the one adapter to `cachesim.timed` |
| `session` | a session: store, pool, calibration, one measured + modelled decode per policy |
| `comparison` | the comparison table and JSON |
"""
