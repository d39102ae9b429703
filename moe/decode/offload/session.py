"""A measured decode session: one run's experts offloaded, decoded under prefetch policies, each checked.

`OffloadSession` opens the slow tier (writing the disk store once), starts
the I/O pool, calibrates the tier, and then `measure` decodes the same
tokens once per admission policy. The demand-only decode ("none") always
runs first: it is the baseline S_0 of η and the first pass whose recorded
routing the oracle replays. Every later decode must route exactly as it did
(decoding is deterministic and the store returns the very bytes the model
holds); a difference is an error, never ignored. Each decode is also fed to
the timed model — its routing, its measured compute, the calibrated tier —
and both are summarised by the model's own `summarize`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import time
from typing import Callable

import numpy as np

from cachesim.headline import LRU_FRACTION
from cachesim.policies import policy_code
from moe.decode.loop import DecodeModel, DecodeResult, InMemoryExperts, decode
from moe.decode.restore import DecodeError, RestoredRun
from moe.decode.text import eval_text
from moe.decode.offload.admission import Prefetcher
from moe.decode.offload.calibrate import Calibration, Probes, probe_back_to_back, probe_in_decode
from moe.decode.offload.diskio import Link
from moe.decode.offload.fast_tier import OffloadedExperts
from moe.decode.offload.io_pool import IOPool
from moe.decode.offload.measure import Recorder
from moe.decode.offload.model_check import (ADMISSIONS, Hardware, PrefetchConfig, TimedResult, Workload, build_hardware,
                                     capacity_spec, decode_workload, measured_result, modelled, parse_budget,
                                     prefetch_source, summarize, target_misses)
from moe.decode.offload.expert_store import StoreLayout, default_store_dir, open_tier


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
    """Where the experts live and how they are fetched."""

    tier: str = "disk"
    capacity: str = LRU_FRACTION    # a fraction of E (0.25) or a count (4)
    cache: str = "lru"
    bandwidth_Bps: float | None = None
    workers: int = 2
    chunk_bytes: int = 128 * 1024
    queue_slots: int = 32
    budget: str | None = None        # prefetch bytes per step; default one expert per layer
    source: str = "prev_token"
    store_dir: pathlib.Path | None = None
    calibration_samples: int = 48


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """What is decoded: `tokens` steps of `batch` streams, the first `prompt_tokens` from `domain`'s text."""

    tokens: int = 256
    batch: int = 1
    mode: str = "sample"
    temperature: float = 1.0
    seed: int = 0
    prompt_tokens: int = 16
    domain: str = "prose"


@dataclasses.dataclass
class PolicyRun:
    """One measured decode and the timed model's prediction of it."""

    policy: str
    result: DecodeResult
    workload: Workload
    calibration: Calibration             # the in-decode figures the model was fed
    load_average: float                  # the machine's 1-minute load when the decode ended
    measured: TimedResult
    read_s: dict                         # mean start-to-ready time of demand and of prefetch reads
    modelled: TimedResult | None = None               # fed the in-decode calibration
    modelled_back_to_back: TimedResult | None = None  # fed the back-to-back calibration


class OffloadSession:
    def __init__(self, run: RestoredRun, config: OffloadConfig, log: Callable[[str], None] = lambda _m: None):
        self.run, self.config, self.log = run, config, log
        if config.workers < 1:
            raise DecodeError(f"--workers must be >= 1, got {config.workers}")
        if config.chunk_bytes < 4096 or config.chunk_bytes % 4096:
            raise DecodeError(f"--chunk must be a positive multiple of 4096 bytes (O_DIRECT), got {config.chunk_bytes}")
        if config.queue_slots < 0:
            raise DecodeError(f"--queue must be >= 0, got {config.queue_slots}")
        self.model = DecodeModel(run.graphdef, run.params, run.config.model)
        self.layout = StoreLayout.of(self.model.expert_weights)
        self.spec = capacity_spec(config.capacity, self.model.num_experts, config.cache)
        self.capacity = self.spec.capacity_for(self.model.num_experts)
        self.budget_bytes = parse_budget(config.budget, self.layout.file_bytes, self.model.num_layers)
        self.store_dir = pathlib.Path(config.store_dir or default_store_dir(run.path, run.step))
        t0 = time.perf_counter()
        self.tier = open_tier(config.tier, self.model.expert_weights, self.store_dir,
                              {"run": str(run.path), "run_name": run.name, "step": run.step})
        if config.tier == "disk":
            log(f"store: {self.store_dir} ({self.layout.total_bytes / 1e6:.1f} MB, {self.tier.filesystem}, "
                f"reads with {self.tier.bypass}; {time.perf_counter() - t0:.1f}s)")
        self.pool = IOPool(self.tier, self.layout, workers=config.workers, chunk_bytes=config.chunk_bytes,
                           link=Link(config.bandwidth_Bps))
        self.calibrations: dict[str, Calibration] = {}
        self.hardware: dict[str, Hardware] = {}
        self.calibration_rounds: list[dict[str, Calibration]] = []
        self._warm = False

    def calibrate(self, cfg: DecodeConfig, probes: dict[str, Probes] | None = None,
                  samples: int | None = None) -> dict[str, Calibration]:
        """Measures the tier back to back and from inside a decode of `cfg`'s text (compiling first, once).

        The timed model is fed the in-decode figures (see `moe.decode.offload.calibrate`);
        the back-to-back ones are kept to show what a calibration that ignores
        the decode's rhythm would predict. With `probes`, the new reads join
        those already there and the calibration fits them all (`measure_policies`
        probes between a round's decodes this way).
        """
        if not self._warm:
            self.model.warm_up(cfg.batch, InMemoryExperts(self.model).weights)
        prompt, _ = self.text(cfg)
        samples = samples or self.config.calibration_samples
        probes = probes or {"back_to_back": Probes(self.pool), "in_decode": Probes(self.pool)}
        probe_back_to_back(probes["back_to_back"], samples)
        probe_in_decode(probes["in_decode"], self.model, prompt, samples)
        self.calibrations = {rhythm: p.calibration(rhythm) for rhythm, p in probes.items()}
        self.hardware = {rhythm: build_hardware(cal, self.config.tier, self.config.workers, self.layout.total_bytes)
                         for rhythm, cal in self.calibrations.items()}
        if not self._warm:
            short = dataclasses.replace(cfg, tokens=min(cfg.tokens, 8))
            self._decode("none", short, *self.text(short), None, None)  # untimed: the store path's first steps
            self._warm = True
        return self.calibrations

    def _log_calibration(self) -> None:
        for rhythm, cal in self.calibrations.items():
            self.log(f"calibration ({rhythm.replace('_', ' ')}, {cal.samples} reads of each kind): "
                     f"{cal.read_s * 1e6:.0f} us per {self.layout.file_bytes / 1e3:.0f} kB read = "
                     f"{cal.latency_s * 1e6:.0f} us + bytes at {cal.stream_Bps / 1e9:.3f} GB/s; two together "
                     f"{cal.pair_s * 1e6:.0f} us (link {cal.link_Bps / 1e9:.3f} GB/s)")

    @property
    def calibration(self) -> Calibration:
        """The figures the timed model is fed (and the prefetcher's read-time estimate)."""
        if not self.calibrations:
            raise DecodeError("call OffloadSession.calibrate before measuring")
        return self.calibrations["in_decode"]

    def text(self, cfg: DecodeConfig) -> tuple[np.ndarray, np.ndarray]:
        """(prompt (B, P), the domain's text (B, tokens) for teacher forcing)."""
        if cfg.tokens < 1 or cfg.batch < 1:
            raise DecodeError(f"--tokens and --batch must be >= 1, got {cfg.tokens} and {cfg.batch}")
        prompt_len = max(1, min(cfg.prompt_tokens, cfg.tokens))
        text = eval_text(self.run.config.data, cfg.domain, cfg.batch, cfg.tokens)
        return text[:, :prompt_len], text

    def measure(self, policy: str, cfg: DecodeConfig, first: PolicyRun | None = None,
                on_step: Callable[[int], None] | None = None) -> PolicyRun:
        """Decodes `cfg` with admission `policy`; `first` is the demand-only pass (required unless policy is none)."""
        if policy not in ADMISSIONS:
            raise DecodeError(f"unknown policy {policy!r}; use a comma list of {', '.join(ADMISSIONS)}")
        if policy != "none" and first is None:
            raise DecodeError("prefetch policies need the demand-only pass first (policy none)")
        prompt, text = self.text(cfg)
        run = self._decode(policy, cfg, prompt, text, first, on_step)
        if first is not None and not np.array_equal(run.result.experts, first.result.experts):
            raise DecodeError(f"the {policy} decode routed differently from the demand-only pass on the same "
                              "tokens: the decode is not deterministic here, so the oracle and the comparison "
                              "are void; use --mode greedy or teacher")
        return run

    def _decode(self, policy: str, cfg: DecodeConfig, prompt, text, first: PolicyRun | None,
                on_step) -> PolicyRun:
        model, layers = self.model, self.model.num_layers
        nbytes = self.layout.file_bytes
        prefetch = PrefetchConfig(admission=policy, source=self.config.source, budget_bytes=self.budget_bytes,
                                  queue_slots=self.config.queue_slots)
        hardware = self.hardware["in_decode"] if self.hardware else None
        if hardware is None:
            raise DecodeError("call OffloadSession.calibrate before measuring")
        recorder = Recorder(cfg.tokens, layers, hardware.tier_names, nbytes)
        prefetcher = None
        if policy != "none":
            prefetcher = Prefetcher(
                self.pool, policy=policy, source=prefetch_source(self.config.source, first.workload),
                budget_bytes=self.budget_bytes, queue_slots=self.config.queue_slots, nbytes=nbytes,
                read_s=self.calibration.read_time(nbytes), bandwidth_Bps=self.calibration.link_Bps,
                num_layers=layers, oracle_misses=target_misses(first.workload) if policy == "oracle" else None)
        provider = OffloadedExperts(self.pool, recorder, num_layers=layers, num_experts=model.num_experts,
                                    width=cfg.batch * model.k, capacity=self.capacity,
                                    policy_code=policy_code(self.spec), horizon=cfg.tokens + 1,
                                    prefetcher=prefetcher)
        provider.warm_up()
        self.pool.set_allowance(float("inf"))
        start = time.perf_counter()
        result = decode(model, provider, prompt=prompt, steps=cfg.tokens, mode=cfg.mode, teacher=text,
                        temperature=cfg.temperature, seed=cfg.seed, on_step=on_step)
        wall = time.perf_counter() - start
        provider.close()
        self.pool.drain()
        measured_bytes = recorder.finish(result.timeline, cfg.batch, prefetcher.admitted if prefetcher else 0)
        work = decode_workload(result, f"{self.run.name}@{self.config.tier}", nbytes, hardware, self.spec)
        run = PolicyRun(policy=policy, result=result, workload=work, calibration=self.calibration,
                        load_average=os.getloadavg()[0],
                        measured=measured_result(work, prefetch, result, measured_bytes, wall),
                        read_s={kind: float(times.mean()) if times.size else None for kind, times in
                                (("demand", measured_bytes.demand_read_s), ("prefetch", measured_bytes.prefetch_read_s))})
        self._predict(run)
        return run

    def _predict(self, run: PolicyRun) -> None:
        """The timed model's runs of `run`'s decode, fed the session's current calibrations."""
        name, nbytes = run.workload.trace_name, self.layout.file_bytes
        prefetch = run.measured.prefetch
        run.calibration = self.calibration
        run.workload = decode_workload(run.result, name, nbytes, self.hardware["in_decode"], self.spec)
        run.measured = dataclasses.replace(run.measured, workload=run.workload)
        run.modelled = modelled(run.workload, prefetch)
        run.modelled_back_to_back = modelled(
            decode_workload(run.result, name, nbytes, self.hardware["back_to_back"], self.spec), prefetch)

    def measure_policies(self, policies: list[str], cfg: DecodeConfig, *, rounds: int = 1,
                         on_start: Callable[[str], Callable[[int], None] | None] | None = None
                         ) -> list[list[PolicyRun]]:
        """`rounds` rounds of every policy: demand-only first, then the others in rotated order, so slow
        drifts of a shared machine do not favour one policy. Calibration reads (`calibration_samples` of each
        kind per round) are taken before, between and after the round's decodes, and every decode of the
        round is predicted from all of them. Returns runs[round][policy index], policies in the order given
        (demand-only first). `on_start(policy)` may return a per-step progress callback."""
        unknown = [p for p in policies if p not in ADMISSIONS]
        if unknown or not policies:
            raise DecodeError(f"unknown policies {unknown or policies!r}; use a comma list of {', '.join(ADMISSIONS)}")
        others = [p for p in dict.fromkeys(policies) if p != "none"]
        start = on_start or (lambda _policy: None)
        # A round's calibration reads are spread before and between its decodes.
        chunk = max(1, math.ceil(self.config.calibration_samples / (len(others) + 2)))
        rounds_out = []
        for r in range(rounds):
            probes = {"back_to_back": Probes(self.pool), "in_decode": Probes(self.pool)}
            self.calibrate(cfg, probes, chunk)
            first = self.measure("none", cfg, on_step=start("none"))
            shift = r % len(others) if others else 0
            done = {"none": first}
            for policy in others[shift:] + others[:shift]:
                self.calibrate(cfg, probes, chunk)
                done[policy] = self.measure(policy, cfg, first, on_step=start(policy))
            self.calibrate(cfg, probes, chunk)
            self._log_calibration()
            self.calibration_rounds.append(self.calibrations)
            for run in done.values():  # every decode of the round predicted from all of the round's reads
                self._predict(run)
            rounds_out.append([done[p] for p in ["none", *others]])
        return rounds_out

    def close(self) -> None:
        self.pool.close()


def summaries(run: PolicyRun, baseline: PolicyRun) -> tuple[dict, dict]:
    """(measured, modelled) metric sets of one run, η against the same side of the demand-only run."""
    return (summarize(run.measured, summarize(baseline.measured)["stall_per_token_s"]),
            summarize(run.modelled, summarize(baseline.modelled)["stall_per_token_s"]))
