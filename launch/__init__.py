"""Launching the study: sweeps of runs on this machine or a SLURM cluster.

``python -m launch.sweep`` is the entry point (see launch/sweep.py). Modules:
plan (grid -> named runs and command lines), status (status.json, the table), resources (cores/GPUs per worker), local /
slurm / execute (executors), vmap_seeds (S seeds in one jit), memory
(--dry_run estimates), cli (the flags). Multi-process start-up is moe/distributed.py.
"""
