"""Importers: router traces recorded by other tools, turned into `Trace`s.

* llama-moe-trace binary records (llama.cpp eval callback, as used for the
  reference Qwen3 traces): repeated `int32 layer, int32 n_tokens, int32 k`
  then `n_tokens*k` int32 expert ids, little-endian, one record per MoE layer
  per decoded chunk. A layer's records are concatenated in file order.
* colibri route-trace text (`ROUTE_TRACE=`): one line per (moe call, batch
  row), `<call> <row> <layer> <id>:<gate> <id>:<gate> ...`. A layer's tokens
  are its lines ordered by (call, row). Gates are checked, not kept.
* Hugging Face `output_router_logits` tensors saved with numpy: one `.npy`
  array (L, T, E) or (L, B, S, E), or an `.npz` with one (T, E) or (B, S, E)
  array per layer, layers ordered by the integer in their names (`arr_0`,
  `layer_1`, ...). Top-k by logit, ties to the lowest id; optionally the
  softmax probabilities are kept.

Layers are renumbered 0..L-1 in ascending order of the recorded layer
numbers, which are kept in `meta["layer_ids"]`. E is always given by the
caller or by the logits' width, never inferred from the ids.

CLI: `python -m cachesim.importers FORMAT INPUT OUTPUT.npz [options]`.
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from cachesim.cli_util import CLI, error
from cachesim.trace import Trace, TraceError, load_error_detail, make_trace, save_trace

_HEADER = np.dtype("<i4")


def _stack_layers(per_layer: dict[int, list[np.ndarray]], path: Path) -> tuple[np.ndarray,
                                                                              list[int]]:
    if not per_layer:
        raise TraceError(f"{path}: no routing records found")
    layer_ids = sorted(per_layer)
    stacked = [np.concatenate(per_layer[layer], axis=0) for layer in layer_ids]
    lengths = {layer: len(ids) for layer, ids in zip(layer_ids, stacked)}
    if len(set(lengths.values())) != 1:
        raise TraceError(f"{path}: layers hold different token counts {lengths}; the trace "
                         "is incomplete (was the run cut short?)")
    return np.stack(stacked), layer_ids


def _expert_dtype(num_experts: int) -> type:
    return np.int16 if num_experts <= 2**15 else np.int32


def read_llama_moe_trace(path: str | Path, num_experts: int, *, model: str = "",
                         name: str | None = None) -> Trace:
    """Reads a llama-moe-trace binary stream (see module docstring)."""
    path = Path(path)
    data = path.read_bytes()
    per_layer: dict[int, list[np.ndarray]] = defaultdict(list)
    offset, k = 0, None
    while offset < len(data):
        if len(data) - offset < 12:
            raise TraceError(f"{path}: truncated record header at byte {offset}")
        layer, num_tokens, record_k = (int(v) for v in np.frombuffer(data, _HEADER, 3, offset))
        offset += 12
        if layer < 0 or num_tokens < 1 or record_k < 1:
            raise TraceError(f"{path}: bad record header at byte {offset - 12}: layer {layer}, "
                             f"n_tokens {num_tokens}, k {record_k}")
        if k is not None and record_k != k:
            raise TraceError(f"{path}: record at byte {offset - 12} has k = {record_k}, "
                             f"earlier records k = {k}")
        k = record_k
        size = num_tokens * k * 4
        if len(data) - offset < size:
            raise TraceError(f"{path}: record at byte {offset - 12} is truncated (needs "
                             f"{size} bytes of ids, {len(data) - offset} left)")
        ids = np.frombuffer(data, _HEADER, num_tokens * k, offset).reshape(num_tokens, k)
        per_layer[layer].append(ids)
        offset += size
    experts, layer_ids = _stack_layers(per_layer, path)
    _check_ids(experts, num_experts, path)
    return make_trace(experts.astype(_expert_dtype(num_experts)), num_experts, model=model,
                      source=f"llama-moe-trace binary {path.name}",
                      name=path.stem if name is None else name,
                      extra_meta={"layer_ids": layer_ids})


def read_route_trace(path: str | Path, num_experts: int, *, model: str = "",
                     name: str | None = None) -> Trace:
    """Reads colibri `ROUTE_TRACE=` text lines (see module docstring)."""
    path = Path(path)
    rows: dict[int, list[tuple[int, int, list[int]]]] = defaultdict(list)
    k = None
    with path.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            where = f"{path}:{line_number}"
            if len(fields) < 4:
                raise TraceError(f"{where}: expected '<call> <row> <layer> <id>:<gate> ...', "
                                 f"got {line.strip()!r}")
            try:
                call, row, layer = (int(v) for v in fields[:3])
                pairs = [field.split(":") for field in fields[3:]]
                ids = [int(pair[0]) for pair in pairs]
                gates = [float(pair[1]) for pair in pairs]
            except (ValueError, IndexError):
                raise TraceError(f"{where}: expected integers and <id>:<gate> pairs, got "
                                 f"{line.strip()!r}") from None
            if any(len(pair) != 2 for pair in pairs):
                raise TraceError(f"{where}: each expert must be written <id>:<gate>")
            if not all(math.isfinite(g) for g in gates):
                raise TraceError(f"{where}: non-finite gate value")
            if k is not None and len(ids) != k:
                raise TraceError(f"{where}: {len(ids)} experts on this line, {k} on earlier "
                                 "lines")
            k = len(ids)
            rows[layer].append((call, row, ids))
    per_layer = {layer: [np.array([ids for _, _, ids in sorted(entries, key=lambda e: e[:2])],
                                  dtype=np.int64)]
                 for layer, entries in rows.items()}
    experts, layer_ids = _stack_layers(per_layer, path)
    _check_ids(experts, num_experts, path)
    return make_trace(experts.astype(_expert_dtype(num_experts)), num_experts, model=model,
                      source=f"colibri route trace {path.name}",
                      name=path.stem if name is None else name,
                      extra_meta={"layer_ids": layer_ids})


def _layer_number(key: str) -> int:
    match = re.search(r"(\d+)$", key)
    if match is None:
        raise TraceError(f"array name {key!r} has no layer number; name per-layer arrays "
                         "like 'arr_0' or 'layer_0'")
    return int(match.group(1))


def read_hf_router_logits(path: str | Path, k: int, *, model: str = "",
                          name: str | None = None, keep_probs: bool = False) -> Trace:
    """Reads saved `output_router_logits` (see module docstring) and routes
    each token to its top-k experts by logit."""
    path = Path(path)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise TraceError(f"k must be a positive integer, got {k!r}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise TraceError(f"{path}: not a readable .npy/.npz file ({load_error_detail(exc)})") from None
    if isinstance(loaded, np.ndarray):
        logits = loaded
        if logits.ndim == 4:
            logits = logits.reshape(logits.shape[0], -1, logits.shape[-1])
        layer_ids = list(range(logits.shape[0])) if logits.ndim == 3 else []
    else:
        with loaded:
            keys = sorted(loaded.files, key=_layer_number)
            layer_ids = [_layer_number(key) for key in keys]
            arrays = [loaded[key] for key in keys]
        if not arrays:
            raise TraceError(f"{path}: the archive holds no arrays")
        arrays = [a.reshape(-1, a.shape[-1]) if a.ndim == 3 else a for a in arrays]
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1 or arrays[0].ndim != 2:
            raise TraceError(f"{path}: per-layer logits must all be (tokens, experts); got "
                             f"shapes {sorted(shapes)}")
        logits = np.stack(arrays)
    if logits.ndim != 3:
        raise TraceError(f"{path}: router logits must be (layers, tokens, experts) or "
                         f"(layers, batch, seq, experts), got shape {logits.shape}")
    if not np.issubdtype(logits.dtype, np.floating):
        raise TraceError(f"{path}: router logits must be floating point, got {logits.dtype}")
    if not np.isfinite(logits).all():
        raise TraceError(f"{path}: router logits contain NaN or inf")
    num_experts = logits.shape[-1]
    if k > num_experts:
        raise TraceError(f"{path}: k = {k} exceeds the {num_experts} experts in the logits")
    logits = logits.astype(np.float64)
    # Stable sort of -logits: ties go to the lowest id, as a top-k by index would.
    experts = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
    probs = None
    if keep_probs:
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float16)
    return make_trace(experts.astype(_expert_dtype(num_experts)), num_experts, probs=probs,
                      model=model, source=f"hf output_router_logits {path.name}",
                      name=path.stem if name is None else name,
                      extra_meta={"layer_ids": layer_ids})


def _check_ids(experts: np.ndarray, num_experts: int, path: Path) -> None:
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise TraceError(f"num_experts must be a positive integer, got {num_experts!r}")
    bad = (experts < 0) | (experts >= num_experts)
    if bad.any():
        layer, token, slot = (int(i) for i in np.argwhere(bad)[0])
        raise TraceError(f"{path}: expert id {int(experts[layer, token, slot])} at (layer, "
                         f"token, slot) = ({layer}, {token}, {slot}) is outside "
                         f"[0, {num_experts}); pass the model's true --num_experts")


FORMATS = {"llama-moe-trace": read_llama_moe_trace, "route-trace": read_route_trace,
           "hf-router-logits": read_hf_router_logits}


COMMAND = CLI("python -m cachesim.importers", "Convert a recorded router trace into the reference .npz format.",
              positional="FORMAT INPUT OUTPUT.npz", positional_help=f"FORMAT one of {', '.join(sorted(FORMATS))}")
COMMAND.define("integer", "num_experts", None, "E (required for llama-moe-trace and route-trace)")
COMMAND.deprecated("num-experts", "num_experts")
COMMAND.define("integer", "k", None, "top-k (required for hf-router-logits)")
COMMAND.define("string", "model", "", "model name stored in meta")
COMMAND.define("bool", "keep_probs", False, "hf-router-logits: also store softmax probabilities")
COMMAND.deprecated("keep-probs", "keep_probs")


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    try:
        if len(args.positional) != 3 or args.positional[0] not in FORMATS:
            raise TraceError(f"give FORMAT INPUT OUTPUT, FORMAT one of {', '.join(sorted(FORMATS))}")
        args.format, args.input, args.output = args.positional[0], Path(args.positional[1]), Path(args.positional[2])
        if args.format == "hf-router-logits":
            if args.k is None:
                raise TraceError("hf-router-logits needs --k (the router's top-k)")
            trace = read_hf_router_logits(args.input, args.k, model=args.model,
                                          keep_probs=args.keep_probs)
        else:
            if args.num_experts is None:
                raise TraceError(f"{args.format} needs --num_experts (E is never inferred "
                                 "from the ids)")
            trace = FORMATS[args.format](args.input, args.num_experts, model=args.model)
        save_trace(args.output, trace)
    except (TraceError, OSError) as exc:
        return error(exc)
    print(f"{args.output}: experts {trace.experts.shape} (layers, tokens, k), "
          f"num_experts {trace.num_experts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
