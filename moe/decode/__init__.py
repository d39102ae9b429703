"""Autoregressive decoding of trained runs, one seam with one entry point (`python -m moe.decode`: `moe.decode.cli`).

| module | job |
|---|---|
| `loop` | the decode loop over an ExpertProvider: DecodeModel, decode, step_union, InMemoryExperts |
| `restore` | a trained run restored for decoding: restore_run, RestoredRun, DecodeError |
| `text` | prompts and generated text through the run's tokenizer |
| `offload/` | experts on slower tiers, measured against the timed model (its own table) |
| `cli` | the command line: decode a run offloaded, measured vs modelled stall |

Import from the modules: this package loads nothing, so the command's `--help` need not wait for jax.
"""
