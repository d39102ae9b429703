"""Pure, jit-compatible training losses (SPEC §3).

* `losses.lm`: chunked LM cross-entropy through the tied head (no (B, T, V) logits).
* `losses.router`: load balance, locality and domain confinement per MoE layer.
* `losses.melinoe`: MELINOE cache-simulation and rank-matching fine-tuning losses.
* `losses.errors`: `LossInputError`, raised on bad shapes or hyper-parameters.
"""
