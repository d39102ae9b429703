"""Reads which rematerialisation the lowered computation holds (so a no-op remat fails a test).

Numerical equality of remat on and off cannot tell a working remat from none at
all; the jaxpr can: ``nnx.remat``/``jax.checkpoint`` leaves a ``checkpoint``
(primitive ``remat2``) equation carrying its policy. The dense dispatcher holds
policy-less checkpoints of its own, so only the ones with a policy are counted.
"""

from __future__ import annotations

import jax


def checkpoint_policies(fn, *args) -> list:
    """The policy of every ``checkpoint`` equation with one, at any depth of ``make_jaxpr(fn)(*args)``."""
    found: list = []

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("remat2", "checkpoint") and eqn.params.get("policy") is not None:
                found.append(eqn.params["policy"])
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    inner = getattr(inner, "jaxpr", inner) if not hasattr(inner, "eqns") else inner
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found
