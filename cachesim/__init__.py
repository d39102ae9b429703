"""cachesim: per-layer expert-cache simulation and routing profiles (SPEC §6-8). A leaf library.

Traces in (`cachesim.trace`, importers in `cachesim.importers`), cache specs
(`cachesim.policies`), the JAX grid simulator (`cachesim.simulate`), one cache
token by token (`cachesim.online`), the plain-Python ground truth
(`cachesim.reference`), metrics (`cachesim.metrics`) and the timed
storage-tier model (`cachesim.timed`). CLIs: `python -m cachesim`,
`python -m cachesim.profile`, `.importers`, `.stall`, `.bandwidth`; JSON
output documented in cachesim/README.md.

The package imports nothing: the project's light modules (`cachesim.cli_util`,
`cachesim.files`, `cachesim.headline`) load without the simulator.
"""
