"""Token streams to decode from: the run's own held-out text."""

from __future__ import annotations

import numpy as np

from moe.decode.restore import DecodeError


def eval_text(data_cfg, domain: str, batch: int, length: int) -> np.ndarray:
    """(batch, length) int32: stream b is tokens [b·length, (b+1)·length) of `domain`'s validation split."""
    from moe.data import DOMAINS, pipeline

    if domain not in DOMAINS:
        raise DecodeError(f"unknown --domain {domain!r}; use one of {', '.join(DOMAINS)}")
    val = pipeline.open_prepared(data_cfg).val_tokens(domain)
    if len(val) < batch * length:
        raise DecodeError(f"the {domain} validation split has {len(val):,} tokens, fewer than {batch} streams x "
                          f"{length} tokens; decode fewer --tokens or --batch")
    return np.asarray(val[:batch * length], np.int32).reshape(batch, length)
