"""What the timed model simulates: a memory hierarchy and a model's byte sizes.

Two frozen descriptions, both loadable from small JSON presets shipped with
the package (`cachesim/timed/hardware/*.json`, `cachesim/timed/models/*.json`) or from a
user's own file:

* `Hardware`: tiers fastest first. Tier 0 is the compute tier (GPU memory):
  it holds the dense weights, the expert cache and the prefetch staging slots,
  and its bandwidth sets the (bandwidth-bound) decode compute time. Every
  other tier is a storage tier that experts are streamed from, over a link of
  `bandwidth_Bps` shared by all transfers from that tier.
* `ModelShape`: layers, experts, k and the bytes of every weight group at a
  quantisation. Presets store architecture dimensions, from which parameter
  counts are derived and checked against the published total.

`compute_times` turns the pair into the decode-time roofline: reading a
layer's dense weights, then each selected expert's weights, from tier 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np


class StallConfigError(ValueError):
    """A hardware/model description or a stall-model option is invalid."""


# Average bits per weight of common formats. GGUF k-quants mix block types, so
# their figures are file-size averages (Q4_K_M: mostly Q4_K at 4.5 bpw with some
# Q6_K at 6.56 bpw, ~4.85 overall; Qwen3 Q4_K_M files weigh ~4.8-4.9 bpw).
QUANT_BITS: dict[str, float] = {
    "f32": 32.0,
    "bf16": 16.0,
    "f16": 16.0,
    "q8_0": 8.5,
    "q6_k": 6.5625,
    "q4_k_m": 4.85,
    "q4_0": 4.5,
    "int4": 4.0,
}


@dataclasses.dataclass(frozen=True)
class Tier:
    """One level of the memory hierarchy.

    Attributes:
      name: e.g. "vram", "ram", "nvme".
      capacity_bytes: total size.
      reserved_bytes: part not available for weights (KV cache, OS, CUDA context).
      bandwidth_Bps: aggregate bytes/s from this tier into compute memory (for
        tier 0: the bytes/s the compute reads its own memory at).
      latency_s: fixed set-up time of one read (holds an I/O worker, moves no bytes).
      stream_bandwidth_Bps: the most one transfer can get; None means a single
        transfer can saturate the link.
    """

    name: str
    capacity_bytes: int
    bandwidth_Bps: float
    latency_s: float = 0.0
    reserved_bytes: int = 0
    stream_bandwidth_Bps: float | None = None

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise StallConfigError("every tier needs a non-empty string 'name'")
        if self.capacity_bytes < 0 or self.reserved_bytes < 0:
            raise StallConfigError(f"tier {self.name!r}: capacity and reserved bytes must be >= 0")
        if self.reserved_bytes > self.capacity_bytes:
            raise StallConfigError(f"tier {self.name!r}: reserved_bytes exceeds capacity_bytes")
        if not (self.bandwidth_Bps > 0 and math.isfinite(self.bandwidth_Bps)):
            raise StallConfigError(f"tier {self.name!r}: bandwidth_Bps must be a positive number, "
                                   f"got {self.bandwidth_Bps}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise StallConfigError(f"tier {self.name!r}: latency_s must be >= 0, "
                                   f"got {self.latency_s}")
        if self.stream_bandwidth_Bps is not None and not self.stream_bandwidth_Bps > 0:
            raise StallConfigError(f"tier {self.name!r}: stream_bandwidth_Bps must be > 0 or null")

    @property
    def usable_bytes(self) -> int:
        return self.capacity_bytes - self.reserved_bytes

    @property
    def stream_Bps(self) -> float:
        """Bandwidth a lone transfer gets."""
        if self.stream_bandwidth_Bps is None:
            return self.bandwidth_Bps
        return min(self.stream_bandwidth_Bps, self.bandwidth_Bps)

    def read_time(self, num_bytes: float) -> float:
        """Seconds for one read of `num_bytes` on an otherwise idle link."""
        return self.latency_s + num_bytes / self.stream_Bps


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A memory hierarchy, fastest tier first; tier 0 is where compute happens.

    Attributes:
      io_workers: concurrent reads in flight (the I/O queue's workers), shared by
        every storage tier.
      token_overhead_s: fixed per-step time outside the layers (sampling, launch).
    """

    name: str
    tiers: tuple[Tier, ...]
    io_workers: int = 1
    token_overhead_s: float = 0.0
    description: str = ""

    def __post_init__(self):
        if len(self.tiers) < 2:
            raise StallConfigError(f"hardware {self.name!r} needs a compute tier and at least one "
                                   "storage tier")
        names = [tier.name for tier in self.tiers]
        if len(set(names)) != len(names):
            raise StallConfigError(f"hardware {self.name!r}: tier names must be unique, "
                                   f"got {names}")
        if isinstance(self.io_workers, bool) or not isinstance(self.io_workers, int) \
                or self.io_workers < 1:
            raise StallConfigError(f"hardware {self.name!r}: io_workers must be an int >= 1")
        if not self.token_overhead_s >= 0:
            raise StallConfigError(f"hardware {self.name!r}: token_overhead_s must be >= 0")

    @property
    def compute_tier(self) -> Tier:
        return self.tiers[0]

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(tier.name for tier in self.tiers)

    def tier_index(self, name: str) -> int:
        if name not in self.tier_names:
            raise StallConfigError(f"hardware {self.name!r} has no tier {name!r}; tiers are "
                                   f"{list(self.tier_names)}")
        return self.tier_names.index(name)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelShape:
    """Byte sizes of a MoE model at one quantisation.

    Attributes:
      expert_bytes: (L, E) int64 bytes of each expert's weights.
      layer_dense_bytes: per layer, the non-expert weights read every token
        (attention, router, norms).
      embedding_bytes: token embedding (resident; one row read per token).
      head_bytes: LM head read every token (the embedding itself when tied).
      tied_embeddings: whether the head is the embedding (stored once).
      final_norm_bytes: the final RMSNorm (resident, read every token).
      attn_compute_s, expert_compute_s, token_compute_s: optional overrides of
        the roofline times (per layer before the experts, per expert, per token
        after the last layer); None derives them from tier-0 bandwidth.
      tail_compute_s: per layer, compute after all its experts are done (an
        engine that mixes a layer's experts in one call once every byte is in
        spends its mixing time here, with expert_compute_s = 0); default 0.
    """

    name: str
    num_layers: int
    num_experts: int
    k: int
    expert_bytes: np.ndarray
    layer_dense_bytes: int = 0
    embedding_bytes: int = 0
    head_bytes: int = 0
    tied_embeddings: bool = True
    final_norm_bytes: int = 0
    quant: str = ""
    attn_compute_s: float | None = None
    expert_compute_s: float | None = None
    token_compute_s: float | None = None
    tail_compute_s: float = 0.0

    def __post_init__(self):
        for field in ("num_layers", "num_experts", "k"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise StallConfigError(f"model {self.name!r}: {field} must be an int >= 1, "
                                       f"got {value!r}")
        if self.k > self.num_experts:
            raise StallConfigError(f"model {self.name!r}: k = {self.k} exceeds num_experts")
        eb = np.asarray(self.expert_bytes)
        if eb.shape != (self.num_layers, self.num_experts):
            raise StallConfigError(f"model {self.name!r}: expert_bytes must have shape "
                                   f"(layers, experts) = {(self.num_layers, self.num_experts)}, "
                                   f"got {eb.shape}")
        if not np.issubdtype(eb.dtype, np.integer) or (eb <= 0).any():
            raise StallConfigError(f"model {self.name!r}: expert_bytes must be positive integers")
        object.__setattr__(self, "expert_bytes", eb.astype(np.int64))
        for field in ("layer_dense_bytes", "embedding_bytes", "head_bytes", "final_norm_bytes"):
            if getattr(self, field) < 0:
                raise StallConfigError(f"model {self.name!r}: {field} must be >= 0")
        for field in ("attn_compute_s", "expert_compute_s", "token_compute_s", "tail_compute_s"):
            value = getattr(self, field)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise StallConfigError(f"model {self.name!r}: {field} must be >= 0 or None")

    @property
    def uniform_expert_bytes(self) -> int | None:
        """The common expert size, or None when sizes differ."""
        first = int(self.expert_bytes.flat[0])
        return first if (self.expert_bytes == first).all() else None

    @property
    def mean_expert_bytes(self) -> float:
        return float(self.expert_bytes.mean())

    @property
    def dense_resident_bytes(self) -> int:
        """Non-expert weights that live in the compute tier."""
        head = 0 if self.tied_embeddings else self.head_bytes
        return (self.num_layers * self.layer_dense_bytes + self.embedding_bytes + head
                + self.final_norm_bytes)

    @property
    def dense_read_bytes_per_token(self) -> int:
        """Non-expert weights read per decoded token (layers' dense parts + LM head)."""
        return self.num_layers * self.layer_dense_bytes + self.head_bytes + self.final_norm_bytes

    @property
    def expert_read_bytes_per_token(self) -> float:
        """Expert bytes one token reads: k mean-sized experts per layer."""
        return float(self.k * self.expert_bytes.mean(axis=1).sum())

    @property
    def total_bytes(self) -> int:
        return int(self.expert_bytes.sum()) + self.dense_resident_bytes

    def for_trace_shape(self, num_layers: int, num_experts: int, k: int) -> ModelShape:
        """The same per-expert and per-layer sizes on another (L, E, k).

        Used to put one model's byte sizes on another model's trace (e.g. a
        Qwen3-235B-sized expert on the 48-layer Qwen3-30B traces); requires
        uniform expert sizes, since per-expert sizes cannot be re-mapped.
        """
        size = self.uniform_expert_bytes
        if size is None:
            raise StallConfigError(f"model {self.name!r} has non-uniform expert sizes; it cannot "
                                   "be resized to another trace shape")
        if (num_layers, num_experts, k) == (self.num_layers, self.num_experts, self.k):
            return self
        return dataclasses.replace(
            self, name=f"{self.name}@L{num_layers}E{num_experts}k{k}", num_layers=num_layers,
            num_experts=num_experts, k=k,
            expert_bytes=np.full((num_layers, num_experts), size, np.int64))


@dataclasses.dataclass(frozen=True)
class ComputeTimes:
    """Decode compute per step: `attn_s` per layer before its experts are needed,
    `expert_s[l, e]` per expert computed, `tail_s` per layer once its experts are
    done, `token_s` after the last layer."""

    attn_s: float
    expert_s: np.ndarray
    token_s: float
    tail_s: float = 0.0


def compute_times(model: ModelShape, hardware: Hardware) -> ComputeTimes:
    """Bandwidth-bound decode times: bytes read from tier 0 / its bandwidth.

    Decoding one token (or a few speculative positions) is memory-bound, so
    a layer's time is the time to read its weights from GPU memory once. The
    model's explicit overrides win where given.
    """
    bw = hardware.compute_tier.bandwidth_Bps
    attn = (model.attn_compute_s if model.attn_compute_s is not None
            else model.layer_dense_bytes / bw)
    if model.expert_compute_s is not None:
        expert = np.full(model.expert_bytes.shape, model.expert_compute_s, np.float64)
    else:
        expert = model.expert_bytes / bw
    token = (model.token_compute_s if model.token_compute_s is not None
             else (model.head_bytes + model.final_norm_bytes) / bw)
    return ComputeTimes(attn_s=float(attn), expert_s=expert,
                        token_s=float(token) + hardware.token_overhead_s, tail_s=float(model.tail_compute_s))


# ---------------------------------------------------------------- presets

def _preset_names(folder: str) -> list[str]:
    root = resources.files("cachesim.timed").joinpath(folder)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def model_presets() -> list[str]:
    return _preset_names("models")


def _read_preset(name_or_path: str | Path, folder: str, kind: str) -> dict[str, Any]:
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        text = path.read_text()
        origin = str(path)
    else:
        resource = resources.files("cachesim.timed").joinpath(folder, f"{name_or_path}.json")
        if not resource.is_file():
            presets = ", ".join(_preset_names(folder))
            raise StallConfigError(f"unknown {kind} {str(name_or_path)!r}; use a preset "
                                   f"({presets}) or a path to a .json file")
        text = resource.read_text()
        origin = f"preset {name_or_path}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StallConfigError(f"{origin}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StallConfigError(f"{origin}: a {kind} description must be a JSON object")
    return data


def _require(data: dict[str, Any], key: str, origin: str) -> Any:
    if key not in data:
        raise StallConfigError(f"{origin}: missing field {key!r}")
    return data[key]


def hardware_from_dict(data: dict[str, Any]) -> Hardware:
    """Builds a `Hardware` from its JSON form (see cachesim/timed/hardware/*.json)."""
    origin = f"hardware {data.get('name', '?')!r}"
    tiers = []
    for raw in _require(data, "tiers", origin):
        try:
            tiers.append(Tier(
                name=_require(raw, "name", origin),
                capacity_bytes=int(_require(raw, "capacity_bytes", origin)),
                bandwidth_Bps=float(_require(raw, "bandwidth_Bps", origin)),
                latency_s=float(raw.get("latency_s", 0.0)),
                reserved_bytes=int(raw.get("reserved_bytes", 0)),
                stream_bandwidth_Bps=(None if raw.get("stream_bandwidth_Bps") is None
                                      else float(raw["stream_bandwidth_Bps"]))))
        except (TypeError, AttributeError) as exc:
            raise StallConfigError(f"{origin}: malformed tier {raw!r} ({exc})") from None
    return Hardware(name=str(_require(data, "name", origin)), tiers=tuple(tiers),
                    io_workers=int(data.get("io_workers", 1)),
                    token_overhead_s=float(data.get("token_overhead_s", 0.0)),
                    description=str(data.get("description", "")))


def load_hardware(name_or_path: str | Path) -> Hardware:
    """A hardware preset by name (e.g. "rtx3070-ddr4-nvme") or a JSON file path."""
    return hardware_from_dict(_read_preset(name_or_path, "hardware", "hardware"))


def parameter_counts(arch: dict[str, Any]) -> dict[str, int]:
    """Parameter counts of a pre-norm SwiGLU MoE decoder from its dimensions.

    Per layer: q, k, v, o projections (grouped-query attention), optional
    per-head q/k RMSNorm weights, two RMSNorms, the router; each expert is a
    SwiGLU (gate, up, down). Plus embedding, an untied head and a final norm.
    """
    d = arch["hidden"]
    heads, kv_heads, head_dim = arch["heads"], arch["kv_heads"], arch["head_dim"]
    attention = d * heads * head_dim + 2 * d * kv_heads * head_dim + heads * head_dim * d
    qk_norm = 2 * head_dim if arch.get("qk_norm", False) else 0
    layer_dense = attention + qk_norm + 2 * d + d * arch["num_experts"]
    expert = 3 * d * arch["expert_ff"]
    embedding = arch["vocab"] * d
    head = 0 if arch["tied_embeddings"] else embedding
    total = (arch["num_layers"] * (layer_dense + arch["num_experts"] * expert)
             + embedding + head + d)
    return {"expert": expert, "layer_dense": layer_dense, "embedding": embedding,
            "head": embedding, "final_norm": d, "total": total}


def model_from_dict(data: dict[str, Any], quant: str | None = None) -> ModelShape:
    """Builds a `ModelShape` from its JSON form (see cachesim/timed/models/*.json)."""
    origin = f"model {data.get('name', '?')!r}"
    arch = _require(data, "architecture", origin)
    for key in ("num_layers", "num_experts", "k", "hidden", "heads", "kv_heads", "head_dim",
                "expert_ff", "vocab", "tied_embeddings"):
        _require(arch, key, origin)
    counts = parameter_counts(arch)
    if "total_params" in data and counts["total"] != data["total_params"]:
        raise StallConfigError(f"{origin}: dimensions give {counts['total']:,} parameters but "
                               f"total_params says {data['total_params']:,}; fix the dimensions")
    quant = quant or data.get("default_quant", "bf16")
    if quant not in QUANT_BITS:
        raise StallConfigError(f"unknown quantisation {quant!r}; use one of {sorted(QUANT_BITS)}")
    bits = QUANT_BITS[quant]

    def nbytes(params: int) -> int:
        return math.ceil(params * bits / 8)

    num_layers, num_experts = arch["num_layers"], arch["num_experts"]
    overrides = data.get("compute_s", {}) or {}
    return ModelShape(
        name=str(_require(data, "name", origin)), num_layers=num_layers, num_experts=num_experts,
        k=arch["k"], expert_bytes=np.full((num_layers, num_experts), nbytes(counts["expert"]),
                                          np.int64),
        layer_dense_bytes=nbytes(counts["layer_dense"]),
        embedding_bytes=nbytes(counts["embedding"]), head_bytes=nbytes(counts["head"]),
        tied_embeddings=bool(arch["tied_embeddings"]),
        final_norm_bytes=nbytes(counts["final_norm"]), quant=quant,
        attn_compute_s=overrides.get("attn"), expert_compute_s=overrides.get("expert"),
        token_compute_s=overrides.get("token"))


def load_model(name_or_path: str | Path, quant: str | None = None) -> ModelShape:
    """A model preset by name (e.g. "qwen3-235b-a22b") or JSON path, at `quant`
    (default: the preset's `default_quant`)."""
    return model_from_dict(_read_preset(name_or_path, "models", "model"), quant)


# ---------------------------------------------------------------- byte budgets

_BYTE_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str, expert_bytes: float | None = None) -> float:
    """Parses "800MB", "1.5GB", "3e9", "96x" (96 mean-sized experts) or "inf"."""
    raw = str(text).strip().lower()
    if raw in ("inf", "unlimited"):
        return math.inf
    match = _BUDGET_RE.match(raw)
    if not match:
        raise StallConfigError(f"cannot read byte amount {text!r}; write e.g. 800MB, 1.5GB, 96x "
                               "(experts) or inf")
    value, unit = float(match.group(1)), match.group(2)
    if unit == "x":
        if expert_bytes is None:
            raise StallConfigError(f"{text!r} counts experts but no expert size is known")
        return value * expert_bytes
    if unit not in _BYTE_UNITS and unit != "":
        raise StallConfigError(f"unknown byte unit {unit!r} in {text!r}; use B, kB, MB, GB, TB, "
                               "KiB, MiB, GiB or x (experts)")
    return value * _BYTE_UNITS.get(unit, 1)
