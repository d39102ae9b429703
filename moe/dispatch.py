"""Expert dispatch strategies: route N tokens to their k experts and combine.

Every strategy implements one function

    dispatch(x, topk, gates, experts, *, capacity_factor, block_size) -> (y, dropped)

with x (N, d) in the compute dtype, topk (N, k) int, gates (N, k) (rows sum to
1), ``experts`` the SwiGLU weights (w_gate, w_up: (E, d, f); w_down: (E, f, d))
as the parameters hold them (float32; each strategy computes in x's dtype, and
``sparse`` casts inside its hand-written VJP, so that its weight gradients
leave in float32 without a round trip through bfloat16), y (N, d) and
``dropped`` the number of (token, expert)
assignments that were not computed (always 0 for the dropless strategies).
``capacity_factor`` is used by ``capacity`` only and ``block_size`` by the two
``sparse`` strategies; the others ``del`` them.

* ``dense``    — every expert on every token, combined by the gates: a scan
  over experts (MaxText's per-expert loop). O(E/k) more FLOPs than needed, but
  trivially exact: the reference every other strategy is tested against.
* ``sparse``   — block-sparse and dropless (MegaBlocks' idea in plain JAX): sort
  the N·k assignments by expert, pad each expert's group to a multiple of
  ``block_size`` b (at most N·k + E·(b−1) rows, a static bound) and run the
  SwiGLU block by block with each block's own expert weights, in a loop that
  stops after the last non-empty block. Computes only the routed rows plus
  < b padding rows per expert. Hand-written VJP (the same loop backwards).
* ``sparse_batched`` — the same layout, every block at once as one batched
  matmul against weights gathered per block: one big kernel instead of a loop
  (what an accelerator wants), at the cost of an (R/b, d, f) weight gather and
  of running the trailing all-padding blocks too.
* ``ragged``   — sort the N·k assignments by expert and run grouped matmuls
  with ``jax.lax.ragged_dot``; dropless. XLA:CPU expands ragged_dot into a
  dense masked matmul against all E experts (E× the routed FLOPs).
* ``tokamax``  — ``ragged`` with tokamax's ``ragged_dot`` (Pallas GPU/TPU
  kernels, XLA fallback elsewhere); registered only where tokamax is installed
  (the optional ``gpu`` extra).
* ``capacity`` — sort, then scatter into fixed (E, C, d) buffers with
  C = ceil(capacity_factor · N·k / E); assignments past an expert's capacity
  are dropped (their gate mass is lost) and counted.

``select_dispatch("auto")`` and ``select_block_size(0)`` return the fastest
dropless strategy and its block size measured per backend (``AUTO_DISPATCH``,
from ``benchmarks/results/dispatch_<backend>.json``).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from losses import dots


class ExpertWeights(NamedTuple):
    w_gate: jax.Array  # (E, d, f)
    w_up: jax.Array    # (E, d, f)
    w_down: jax.Array  # (E, f, d)


def _swiglu(x, w_gate, w_up, w_down, matmul):
    return matmul(jax.nn.silu(matmul(x, w_gate)) * matmul(x, w_up), w_down)


def in_dtype(experts: ExpertWeights, dtype) -> ExpertWeights:
    """The expert weights cast to the compute dtype (a no-op where they already are)."""
    return ExpertWeights(*(w.astype(dtype) for w in experts))


DEFAULT_BLOCK_SIZE = 64  # the sparse strategies' b when called without one (AUTO_DISPATCH picks per backend)


def dense_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 0.0,
                   block_size: int = DEFAULT_BLOCK_SIZE):
    del capacity_factor, block_size
    experts = in_dtype(experts, x.dtype)
    num_experts = experts.w_gate.shape[0]
    # combine[e, n] = gate of expert e for token n (0 when e is not among its top-k).
    combine = jnp.sum(jax.nn.one_hot(topk, num_experts, dtype=jnp.float32) * gates[..., None], axis=1).T

    # One expert at a time (MaxText's per-expert loop as a scan) with the expert's
    # activations rematerialised: peak memory is one (N, d_ff) activation instead of
    # E of them, which is what lets the 137m step fit 8 GiB with this reference.
    @jax.checkpoint
    def one_expert(w_gate, w_up, w_down, weight):
        out = _swiglu(x, w_gate, w_up, w_down, jnp.matmul)
        return out.astype(jnp.float32) * weight[:, None]

    def body(y, per_expert):
        return y + one_expert(*per_expert), None

    y, _ = jax.lax.scan(body, jnp.zeros(x.shape, jnp.float32),
                        (experts.w_gate, experts.w_up, experts.w_down, combine))
    return y.astype(x.dtype), jnp.zeros((), jnp.int32)


def _sorted_assignments(topk):
    """Flattens (N, k) assignments and sorts them by expert (stable)."""
    with jax.named_scope("layout"):
        flat_expert = topk.reshape(-1)
        order = jnp.argsort(flat_expert, stable=True)
        token_of = order // topk.shape[1]
    return flat_expert, order, token_of


def _ragged_with(ragged_dot, x, topk, gates, experts: ExpertWeights):
    """Sorted assignments through grouped matmuls ``ragged_dot(lhs (M, d), rhs (E, d, f), group_sizes)``."""
    experts = in_dtype(experts, x.dtype)
    num_experts = experts.w_gate.shape[0]
    flat_expert, order, token_of = _sorted_assignments(topk)
    group_sizes = jnp.bincount(flat_expert, length=num_experts).astype(jnp.int32)
    xs = x[token_of]  # (N*k, d), grouped by expert

    def matmul(a, w):
        return ragged_dot(a, w, group_sizes)

    ys = _swiglu(xs, experts.w_gate, experts.w_up, experts.w_down, matmul)
    weighted = ys * gates.reshape(-1)[order][:, None].astype(ys.dtype)
    y = jnp.zeros_like(x).at[token_of].add(weighted)
    return y, jnp.zeros((), jnp.int32)


def ragged_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 0.0,
                    block_size: int = DEFAULT_BLOCK_SIZE):
    del capacity_factor, block_size
    return _ragged_with(jax.lax.ragged_dot, x, topk, gates, experts)


def tokamax_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 0.0,
                     block_size: int = DEFAULT_BLOCK_SIZE):
    del capacity_factor, block_size
    # Imported on first use: tokamax is an optional extra and costs ~2 s to import.
    import tokamax
    from absl import flags

    # tokamax reads its options from absl flags and, outside absl.app.run (pytest, a
    # notebook), would parse sys.argv itself and fail on foreign arguments: use defaults.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return _ragged_with(tokamax.ragged_dot, x, topk, gates, experts)


def expert_capacity(num_tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
    return max(1, math.ceil(capacity_factor * num_tokens * k / num_experts))


def capacity_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 1.25,
                      block_size: int = DEFAULT_BLOCK_SIZE):
    del block_size
    experts = in_dtype(experts, x.dtype)
    num_experts = experts.w_gate.shape[0]
    n, k = topk.shape
    cap = expert_capacity(n, k, num_experts, capacity_factor)
    flat_expert, order, token_of = _sorted_assignments(topk)
    sorted_expert = flat_expert[order]
    # Position of each sorted assignment inside its expert's group.
    group_start = jnp.searchsorted(sorted_expert, jnp.arange(num_experts), side="left")
    slot = jnp.arange(n * k) - group_start[sorted_expert]
    kept = slot < cap
    # Dropped assignments are routed to an out-of-bounds slot and discarded by the scatter.
    slot = jnp.where(kept, slot, cap)
    buf = jnp.zeros((num_experts, cap, x.shape[1]), x.dtype)
    buf = buf.at[sorted_expert, slot].set(x[token_of], mode="drop")
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", buf, experts.w_gate)) * jnp.einsum(
        "ecd,edf->ecf", buf, experts.w_up)
    out = jnp.einsum("ecf,efd->ecd", h, experts.w_down)
    ys = out.at[sorted_expert, slot].get(mode="fill", fill_value=0)
    weighted = ys * (gates.reshape(-1)[order] * kept)[:, None].astype(ys.dtype)
    y = jnp.zeros_like(x).at[token_of].add(weighted)
    return y, jnp.sum(~kept).astype(jnp.int32)


# ---------------------------------------------------------------- block-sparse dispatch


class BlockLayout(NamedTuple):
    """Where the N·k assignments sit in the expert-sorted, block-padded rows.

    Assignment a = n·k + j is token n's j-th choice. R = ``padded_rows_bound``
    rows, R/b blocks; each expert's group starts on a block boundary.
    """

    row_of: jax.Array        # (N·k,) int32 padded row of each assignment
    source_of: jax.Array     # (R,) int32 assignment in each row; N·k (out of range) for padding
    block_expert: jax.Array  # (R/b,) int32 expert whose weights each block uses
    used_blocks: jax.Array   # () int32 blocks up to the last non-empty one; the rest are padding


def padded_rows_bound(num_assignments: int, num_experts: int, block_size: int) -> int:
    """Static row count for any routing: each non-empty group adds < b padding rows.

    Σ_e ceil(c_e/b)·b ≤ N·k + G·(b−1) with G = min(E, N·k) non-empty groups at
    most; the sum is a multiple of b, so it also fits the bound rounded down to one.
    """
    groups = min(num_experts, num_assignments)
    return (num_assignments + groups * (block_size - 1)) // block_size * block_size


def _group_sizes(topk, num_experts: int, block_size: int):
    """(assignments per expert, the same padded up to a multiple of b)."""
    counts = jnp.bincount(topk.reshape(-1), length=num_experts).astype(jnp.int32)
    return counts, (counts + block_size - 1) // block_size * block_size


def padded_rows(topk, num_experts: int, block_size: int) -> jax.Array:
    """Rows the ``sparse`` loop computes for this routing: Σ_e ceil(c_e/b)·b."""
    return jnp.sum(_group_sizes(topk, num_experts, block_size)[1])


def block_layout(topk, num_experts: int, block_size: int) -> BlockLayout:
    flat = topk.reshape(-1)
    n_assign = flat.shape[0]
    rows = padded_rows_bound(n_assign, num_experts, block_size)
    counts, padded = _group_sizes(topk, num_experts, block_size)
    padded_end = jnp.cumsum(padded)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)  # sorted position -> assignment
    sorted_expert = flat[order]
    rank = jnp.arange(n_assign, dtype=jnp.int32) - (jnp.cumsum(counts) - counts)[sorted_expert]
    row_sorted = (padded_end - padded)[sorted_expert] + rank
    row_of = jnp.zeros(n_assign, jnp.int32).at[order].set(row_sorted, unique_indices=True)
    source_of = jnp.full(rows, n_assign, jnp.int32).at[row_sorted].set(order, unique_indices=True)
    # Blocks past the last group get the last expert: they hold only padding (zeros).
    block_start = jnp.arange(rows // block_size, dtype=jnp.int32) * block_size
    block_expert = jnp.minimum(jnp.searchsorted(padded_end, block_start, side="right"), num_experts - 1)
    return BlockLayout(row_of, source_of, block_expert.astype(jnp.int32),
                       (padded_end[-1] // block_size).astype(jnp.int32))


@jax.custom_vjp
def permute_rows(v, index, inverse):
    """``v[index]``, out-of-range rows zero; ``inverse`` undoes ``index`` where it is in range.

    Both layout moves (tokens -> padded rows, padded rows -> assignments) are
    injective, so their transposes are gathers by the inverse map too: no
    scatter-add (serial on XLA:CPU) in the forward or backward pass.
    """
    return v.at[index].get(mode="fill", fill_value=0, unique_indices=True)


def _permute_rows_fwd(v, index, inverse):
    return permute_rows(v, index, inverse), (index, inverse)


def _permute_rows_bwd(residuals, ct):
    index, inverse = residuals
    return permute_rows(ct, inverse, index), None, None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


def _rows(v, block: jax.Array, block_size: int):
    return jax.lax.dynamic_slice_in_dim(v, block * block_size, block_size)


def _put_rows(buf, block: jax.Array, block_size: int, value):
    return jax.lax.dynamic_update_slice_in_dim(buf, value.astype(buf.dtype), block * block_size, 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _loop_swiglu(block_size: int, xs, block_expert, used_blocks, w_gate, w_up, w_down):
    """SwiGLU of each b-row block of ``xs`` (R, d) with its expert's weights, cast to xs's dtype; blocks past
    ``used_blocks`` -> 0."""
    return _loop_swiglu_fwd(block_size, xs, block_expert, used_blocks, w_gate, w_up, w_down)[0]


def _loop_swiglu_fwd(block_size, xs, block_expert, used_blocks, *weights):
    # The residuals keep the weights as given (the parameters, alive anyway), not their cast copies.
    residual_weights = weights
    w_gate, w_up, w_down = in_dtype(ExpertWeights(*weights), xs.dtype)
    rows, f = xs.shape[0], w_gate.shape[-1]

    def body(j, carry):
        out, pre_gate, pre_up = carry
        e, xb = block_expert[j], _rows(xs, j, block_size)
        a, u = xb @ w_gate[e], xb @ w_up[e]
        y = (jax.nn.silu(a) * u) @ w_down[e]
        return (_put_rows(out, j, block_size, y), _put_rows(pre_gate, j, block_size, a),
                _put_rows(pre_up, j, block_size, u))

    # A while loop with the data-dependent trip count: the trailing all-padding
    # blocks cost nothing (a scan would run them; a cond inside one measured 2x slower).
    init = (jnp.zeros_like(xs), jnp.zeros((rows, f), xs.dtype), jnp.zeros((rows, f), xs.dtype))
    out, pre_gate, pre_up = jax.lax.fori_loop(0, used_blocks, body, init)
    return out, (xs, block_expert, used_blocks, *residual_weights, pre_gate, pre_up)


def _loop_swiglu_bwd(block_size, residuals, d_out):
    xs, block_expert, used_blocks, *weights, pre_gate, pre_up = residuals
    # Every product goes through losses.dots, so that in bfloat16 each runs on XLA:CPU's bf16 GEMM: the products
    # with a weight take it as is (x @ Wᵀ), and the weight gradients, which contract a block's rows, take the
    # (d, b) column blocks of the rows and their cotangents, transposed once for all blocks, as left operands.
    # dW_down accumulates transposed, (E, d, f) += dyᵀ h, for the same reason.
    w_gate, w_up, w_down = in_dtype(ExpertWeights(*weights), xs.dtype)
    xs_t, d_out_t = dots.transposed(xs), dots.transposed(d_out, xs.dtype)

    def columns(v_t, j):
        return jax.lax.dynamic_slice_in_dim(v_t, j * block_size, block_size, axis=1)

    def body(j, carry):
        dx, dw_gate, dw_up, dw_down_t = carry
        e = block_expert[j]
        dy = _rows(d_out, j, block_size)
        a, u = (_rows(v, j, block_size).astype(jnp.float32) for v in (pre_gate, pre_up))
        sig = jax.nn.sigmoid(a)
        silu = a * sig
        dh = dots.matmul_nt(dy, w_down[e], xs.dtype).astype(jnp.float32)
        da = (dh * u * sig * (1 + a * (1 - sig))).astype(xs.dtype)  # d silu(a)/da = σ(a)(1 + a(1−σ(a)))
        du = (dh * silu).astype(xs.dtype)
        h = (silu * u).astype(xs.dtype)
        xb_t = columns(xs_t, j)
        # Weight gradients accumulate over the blocks of one expert: in float32, so a
        # bfloat16 run does not round once per block.
        return (_put_rows(dx, j, block_size, dots.matmul_nt(da, w_gate[e], xs.dtype)
                          + dots.matmul_nt(du, w_up[e], xs.dtype)),
                dw_gate.at[e].add(dots.matmul(xb_t, da)), dw_up.at[e].add(dots.matmul(xb_t, du)),
                dw_down_t.at[e].add(dots.matmul(columns(d_out_t, j), h)))

    shapes = (w_gate.shape, w_up.shape, (w_down.shape[0], w_down.shape[2], w_down.shape[1]))
    init = (jnp.zeros_like(xs), *(jnp.zeros(shape, jnp.float32) for shape in shapes))
    dx, dw_gate, dw_up, dw_down_t = jax.lax.fori_loop(0, used_blocks, body, init)
    # In the dtype of the weights as given (the float32 parameters: no rounding through bfloat16).
    return (dx, None, None, *(g.astype(w.dtype) for g, w in zip(
        (dw_gate, dw_up, jnp.swapaxes(dw_down_t, 1, 2)), weights)))


_loop_swiglu.defvjp(_loop_swiglu_fwd, _loop_swiglu_bwd)


def _looped_blocks(xs, layout: BlockLayout, experts: ExpertWeights, block_size: int):
    return _loop_swiglu(block_size, xs, layout.block_expert, layout.used_blocks, *experts)


def _batched_blocks(xs, layout: BlockLayout, experts: ExpertWeights, block_size: int):
    experts = in_dtype(experts, xs.dtype)
    blocks = xs.reshape(-1, block_size, xs.shape[1])
    per_block = (jnp.take(w, layout.block_expert, axis=0) for w in experts)  # (R/b, d, f) each
    return _swiglu(blocks, *per_block, jnp.matmul).reshape(xs.shape)


def block_sparse(blocks_fn, x, topk, gates, experts: ExpertWeights, block_size: int):
    """The block-sparse dispatch around ``blocks_fn(xs (R, d), layout, experts, b) -> (R, d)``: sort, pad, combine."""
    n, k = topk.shape
    with jax.named_scope("layout"):  # the sort, the moves and the combine, apart from the SwiGLU in profiles
        layout = block_layout(topk, experts.w_gate.shape[0], block_size)
        xs = permute_rows(jnp.repeat(x, k, axis=0), layout.source_of, layout.row_of)  # (R, d)
    out = blocks_fn(xs, layout, experts, block_size)
    with jax.named_scope("layout"):
        per_choice = permute_rows(out, layout.row_of, layout.source_of).reshape(n, k, -1)
        y = jnp.einsum("nk,nkd->nd", gates.astype(jnp.float32), per_choice.astype(jnp.float32))
    return y.astype(x.dtype), jnp.zeros((), jnp.int32)


def sparse_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 0.0,
                    block_size: int = DEFAULT_BLOCK_SIZE):
    del capacity_factor
    return block_sparse(_looped_blocks, x, topk, gates, experts, block_size)


def sparse_batched_dispatch(x, topk, gates, experts: ExpertWeights, *, capacity_factor: float = 0.0,
                            block_size: int = DEFAULT_BLOCK_SIZE):
    del capacity_factor
    return block_sparse(_batched_blocks, x, topk, gates, experts, block_size)


Dispatcher = Callable[..., tuple[jax.Array, jax.Array]]

DISPATCHERS: dict[str, Dispatcher] = {
    "dense": dense_dispatch,
    "sparse": sparse_dispatch,
    "sparse_batched": sparse_batched_dispatch,
    "ragged": ragged_dispatch,
    "capacity": capacity_dispatch,
}
if importlib.util.find_spec("tokamax") is not None:
    DISPATCHERS["tokamax"] = tokamax_dispatch

DROPLESS = tuple(name for name in DISPATCHERS if name != "capacity")

# backend -> (dispatcher, block size) for model.dispatch="auto" / model.block_size=0.
# cpu: a dropless entry within AUTO_TIE of the fastest in every run AUTO_SOURCE names in
# benchmarks/results/dispatch_cpu.json (benchmarks/dispatch_bench.py; a test reads
# the file and checks this table): the rounds of one run differ by more than 5%, so a
# smaller lead is not a measured difference, and one choice serves both dtypes.
# gpu/tpu: NOT MEASURED yet (benchmarks/gpu_check.sh measures gpu): the block-sparse
# layout as one batched matmul rather than a loop of small ones (a loop launches
# kernels per block), blocks of 128 rows for the MXU / tensor-core tiles. Capacity is never "auto": it can drop.
AUTO_DISPATCH: dict[str, tuple[str, int]] = {
    "cpu": ("sparse", 128),
    "gpu": ("sparse_batched", 128),
    "tpu": ("sparse_batched", 128),
}
# The benchmark runs (keys in benchmarks/results/dispatch_<backend>.json) each measured entry comes from.
AUTO_SOURCE = {"cpu": ("137m/1x1024/float32/remat=none", "137m/1x1024/bfloat16/remat=none")}
AUTO_TIE = 0.95  # the slowest fraction of the fastest dropless entry's tokens/s that counts as a tie
_AUTO_FALLBACK = ("sparse_batched", 128)  # any other backend, or a measured choice not installed: dropless, built in


def _auto(backend: str | None) -> tuple[str, int]:
    """AUTO_DISPATCH's entry, or the fallback where that dispatcher is not installed here (tokamax)."""
    name, block = AUTO_DISPATCH.get(backend or jax.default_backend(), _AUTO_FALLBACK)
    return (name, block) if name in DISPATCHERS else _AUTO_FALLBACK


def select_dispatch(name: str, backend: str | None = None) -> str:
    """The dispatcher name for ``model.dispatch`` (``auto`` -> AUTO_DISPATCH)."""
    return _auto(backend)[0] if name == "auto" else name


def select_block_size(block_size: int, backend: str | None = None) -> int:
    """The block size for ``model.block_size`` (0 -> AUTO_DISPATCH's, measured with its dispatcher)."""
    return int(block_size) or _auto(backend)[1]
