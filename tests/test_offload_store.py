"""The tiered expert store: files, tiers, the I/O pool, the fast tier against cachesim."""

import json
import os
import time

import numpy as np
import pytest

from cachesim.policies import policy_code
from cachesim.policies import CacheSpec
from cachesim.simulate import simulate
from cachesim.trace import make_trace
from moe.decode.loop import DecodeModel, InMemoryExperts, decode, flat_expert
from moe.decode.restore import DecodeError, restore_run
from moe.decode.offload import diskio
from moe.decode.offload.diskio import ALIGN, Link
from moe.decode.offload.fast_tier import OffloadedExperts
from moe.decode.offload.io_pool import CANCELLED, DONE, IOPool, Read
from moe.decode.offload.measure import Recorder
from moe.decode.offload.calibrate import Calibration
from moe.decode.offload.model_check import build_hardware, capacity_spec, decode_workload, parse_bandwidth
from moe.decode.offload.expert_store import MANIFEST, DiskTier, StoreLayout, ensure_store, expert_path, open_tier
from decode_fixtures import tiny_run  # noqa: F401 — a session fixture


@pytest.fixture(scope="module")
def model(tiny_run):  # noqa: F811
    run = restore_run(tiny_run)
    return DecodeModel(run.graphdef, run.params, run.config.model)


@pytest.fixture(scope="module")
def store_dir(model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("store") / "experts"
    assert ensure_store(directory, model.expert_weights, {"run": "tiny"})
    return directory


def test_the_store_holds_one_padded_file_per_expert_and_is_reused(model, store_dir):
    layout = StoreLayout.of(model.expert_weights)
    assert layout.file_bytes % ALIGN == 0 and layout.file_bytes >= layout.weight_bytes
    manifest = json.loads((store_dir / MANIFEST).read_text())
    assert manifest["num_experts"] == model.num_experts and manifest["file_bytes"] == layout.file_bytes
    for layer in range(model.num_layers):
        for expert in range(model.num_experts):
            raw = expert_path(store_dir, layer, expert).read_bytes()
            assert len(raw) == layout.file_bytes
            np.testing.assert_array_equal(np.frombuffer(raw[:layout.weight_bytes], np.float32),
                                          flat_expert(model.expert_weights[layer], expert))
    stamp = expert_path(store_dir, 0, 0).stat().st_mtime_ns
    assert not ensure_store(store_dir, model.expert_weights, {"run": "tiny"})  # same weights: reused
    assert expert_path(store_dir, 0, 0).stat().st_mtime_ns == stamp


def test_a_store_of_other_weights_is_rewritten_and_a_foreign_directory_refused(model, tmp_path):
    directory = tmp_path / "s"
    ensure_store(directory, model.expert_weights, {})
    changed = [w._replace(w_up=w.w_up + 1.0) for w in model.expert_weights]
    assert ensure_store(directory, changed, {})
    raw = expert_path(directory, 0, 1).read_bytes()
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32, count=flat_expert(changed[0], 1).size),
                                  flat_expert(changed[0], 1))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(DecodeError, match="not an expert store"):
        ensure_store(foreign, model.expert_weights, {})


def test_an_unwritable_store_directory_is_one_clear_error(model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # refuses a directory inside it, even to root
    with pytest.raises(DecodeError, match="pass --store_dir with a writable directory"):
        ensure_store(blocker / "store", model.expert_weights, {})


def test_the_disk_tier_says_which_page_cache_bypass_runs(model, store_dir):
    tier = DiskTier(store_dir, StoreLayout.of(model.expert_weights))
    try:
        direct = diskio.probe_direct(expert_path(store_dir, 0, 0))
        assert tier.bypass.startswith(diskio.BYPASS_DIRECT if direct else diskio.BYPASS_FADVISE)
        assert tier.filesystem == diskio.filesystem_type(store_dir)
    finally:
        tier.close()


@pytest.mark.skipif(diskio.filesystem_type("/dev/shm") != "tmpfs", reason="no tmpfs at /dev/shm")
def test_a_store_on_tmpfs_says_its_reads_come_from_ram(model):
    directory = diskio.pathlib.Path("/dev/shm") / f"cacheable-moe-test-{os.getpid()}"
    try:
        ensure_store(directory, model.expert_weights, {})
        tier = DiskTier(directory, StoreLayout.of(model.expert_weights))
        tier.close()
        assert "tmpfs: the files are in RAM" in tier.bypass
    finally:
        import shutil
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(params=["ram", "disk"])
def pool(request, model, store_dir):
    tier = open_tier(request.param, model.expert_weights, store_dir, {"run": "tiny"})
    pool = IOPool(tier, StoreLayout.of(model.expert_weights), workers=2, chunk_bytes=8 * ALIGN, link=Link(None))
    yield pool
    pool.close()


def test_a_read_returns_the_experts_exact_bytes(model, pool):
    reads = [Read(layer, expert, pool.layout.file_bytes, demand=True, key=(0, i), issue_t=time.perf_counter())
             for i, (layer, expert) in enumerate([(0, 3), (1, 15), (1, 0)])]
    for read in reads:
        pool.submit(read)
    pool.wait(reads)
    for read in reads:
        assert read.state == DONE and read.moved == read.nbytes and read.ready_t >= read.issue_t
        np.testing.assert_array_equal(np.asarray(read.result), flat_expert(model.expert_weights[read.layer],
                                                                           read.expert))


def teacher_tokens(model, steps, seed=0):
    return np.random.default_rng(seed).integers(0, model.vocab_size, (1, steps)).astype(np.int32)


def offloaded(pool, model, capacity, steps, cache="lru", batch=1):
    spec = capacity_spec(str(capacity), model.num_experts, cache)
    recorder = Recorder(steps, model.num_layers, ("fast", pool.tier.name), pool.layout.file_bytes)
    provider = OffloadedExperts(pool, recorder, num_layers=model.num_layers, num_experts=model.num_experts,
                                width=batch * model.k, capacity=spec.capacity_for(model.num_experts),
                                policy_code=policy_code(spec), horizon=steps + 1)
    return provider, recorder, spec


@pytest.mark.parametrize("capacity,cache", [(0, "lru"), (1, "lru"), ("0.25", "lru"), ("0.25", "lfu"),
                                            ("0.25", "lru_token"), ("1.0", "lru")])
def test_offloaded_decode_is_bit_identical_and_misses_are_cachesims(model, pool, capacity, cache):
    steps = 24
    tokens = teacher_tokens(model, steps)
    reference = decode(model, InMemoryExperts(model), prompt=tokens[:, :1], steps=steps, mode="teacher",
                       teacher=tokens, record_logits=True)
    provider, recorder, spec = offloaded(pool, model, capacity, steps, cache)
    result = decode(model, provider, prompt=tokens[:, :1], steps=steps, mode="teacher", teacher=tokens,
                    record_logits=True)
    np.testing.assert_array_equal(result.logits, reference.logits)
    np.testing.assert_array_equal(result.experts, reference.experts)
    # Demand loads are exactly the cache simulator's misses on the same routing.
    experts, _ = result.trace_arrays()
    (misses,) = simulate([make_trace(experts, model.num_experts)], [spec])
    assert provider.misses == int(misses.sum())
    measured = recorder.finish(result.timeline, 1, 0)
    assert measured.demand[..., 1].sum() == provider.misses * pool.layout.file_bytes
    assert (measured.required == measured.demand[..., 1]).all() and measured.used.sum() == 0
    # ... and the timed model's residency pass agrees layer by layer.
    cal = Calibration(1e-4, 1e9, 1e9, 2e-4, 1e-4, 3e-4, 1, "back_to_back")
    work = decode_workload(result, "tiny", pool.layout.file_bytes,
                           build_hardware(cal, pool.tier.name, 2, pool.layout.total_bytes), spec)
    assert [[list(map(bool, m)) for m in s] for s in work.misses] == measured.misses
    if capacity == 0:
        assert provider.misses == steps * model.num_layers * model.k


def test_b_streams_share_one_union_per_step(model, pool):
    steps, batch = 10, 2
    tokens = np.random.default_rng(3).integers(0, model.vocab_size, (batch, steps)).astype(np.int32)
    reference = decode(model, InMemoryExperts(model), prompt=tokens[:, :1], steps=steps, mode="teacher",
                       teacher=tokens, record_logits=True)
    provider, _, spec = offloaded(pool, model, "0.25", steps, batch=batch)
    result = decode(model, provider, prompt=tokens[:, :1], steps=steps, mode="teacher", teacher=tokens,
                    record_logits=True)
    np.testing.assert_array_equal(result.logits, reference.logits)


def capped_pool(model, store_dir, tier, bandwidth, workers=1):
    return IOPool(open_tier(tier, model.expert_weights, store_dir, {}), StoreLayout.of(model.expert_weights),
                  workers=workers, chunk_bytes=ALIGN, link=Link(bandwidth))


def test_the_bandwidth_cap_slows_reads_to_the_cap(model, store_dir):
    cap = 5e6  # bytes/s, far below what RAM or a disk delivers: 8 reads take ~0.16 s
    pool = capped_pool(model, store_dir, "ram", cap, workers=2)
    try:
        reads = [Read(0, e, pool.layout.file_bytes, demand=True, key=(0, e), issue_t=0.0) for e in range(8)]
        start = time.perf_counter()
        for read in reads:
            pool.submit(read)
        pool.wait(reads)
        rate = sum(r.nbytes for r in reads) / (time.perf_counter() - start)
    finally:
        pool.close()
    # The link grants every chunk its time at the cap, so the rate cannot exceed it; a loaded
    # machine may make it slower, so the lower bound is generous.
    assert cap / 3 < rate <= cap * 1.02


def test_prefetches_are_cancelled_preempted_and_promoted(model, store_dir):
    nbytes = StoreLayout.of(model.expert_weights).file_bytes
    # One read takes 1 s at this cap, in 4 KiB chunks of ~40 ms: long enough that a loaded
    # machine's scheduling delays cannot let a read finish before the test looks at it.
    pool = capped_pool(model, store_dir, "ram", nbytes / 1.0)
    try:
        running = Read(0, 1, nbytes, demand=False, key=(1, 0), issue_t=0.0, target=5)
        queued = Read(0, 2, nbytes, demand=False, key=(1, 1), issue_t=0.0, target=5)
        pool.submit(running)
        pool.submit(queued)
        while running.moved == 0:
            time.sleep(0.001)
        pool.cancel(queued)  # never started: dropped at once, no bytes
        assert queued.state == CANCELLED and queued.prefetched_bytes == 0
        demand = Read(1, 3, nbytes, demand=True, key=(0, 0), issue_t=0.0)
        pool.submit(demand)  # the only worker is busy with a prefetch: it yields at its next chunk
        pool.wait([demand])
        assert running.state != DONE and 0 < running.moved < nbytes
        pool.promote(running, (0, 1))  # its target needs it now: it finishes as a demand read
        pool.wait([running])
        assert running.state == DONE and running.demand and 0 < running.prefetched_bytes < nbytes
        np.testing.assert_array_equal(np.asarray(running.result), flat_expert(model.expert_weights[0], 1))
        late = Read(0, 4, nbytes, demand=False, key=(1, 2), issue_t=0.0, target=6)
        pool.submit(late)
        while late.moved == 0:
            time.sleep(0.001)
        pool.cancel(late)  # stale while running: stops at its next chunk, the bytes it moved are wasted
        pool.drain()
        assert late.state == CANCELLED and 0 < late.prefetched_bytes == late.moved < nbytes
    finally:
        pool.close()


def test_prefetch_allowance_holds_back_prefetches_not_demand(model, store_dir):
    nbytes = StoreLayout.of(model.expert_weights).file_bytes
    pool = capped_pool(model, store_dir, "ram", None)
    try:
        pool.set_allowance(nbytes)  # room for one prefetch this step
        first = Read(0, 1, nbytes, demand=False, key=(1, 0), issue_t=0.0)
        second = Read(0, 2, nbytes, demand=False, key=(1, 1), issue_t=0.0)
        pool.submit(first)
        pool.submit(second)
        pool.wait([first])
        demand = Read(0, 3, nbytes, demand=True, key=(0, 0), issue_t=0.0)
        pool.submit(demand)
        pool.wait([demand])
        assert second.state == "queued" and second.moved == 0
        pool.set_allowance(nbytes)  # the next step's allowance lets it start
        pool.wait([second])
        assert second.state == DONE
    finally:
        pool.close()


def test_capacity_and_bandwidth_syntax():
    assert capacity_spec("0.25", 16).capacity_for(16) == 4
    assert capacity_spec("4", 16).capacity_for(16) == 4
    assert capacity_spec("16", 16).capacity_for(16) == 16
    for bad in ("17", "1.5", "-1", "a quarter"):
        with pytest.raises(DecodeError):
            capacity_spec(bad, 16)
    with pytest.raises(DecodeError, match="no online state"):
        capacity_spec("4", 16, "belady")
    assert parse_bandwidth("2.4GB/s") == pytest.approx(2.4e9)
    assert parse_bandwidth("500MB/s") == pytest.approx(5e8)
    assert parse_bandwidth("") is None and parse_bandwidth("none") is None
    for bad in ("fast", "0GB/s", "-1GB/s"):
        with pytest.raises(DecodeError, match="--bandwidth"):
            parse_bandwidth(bad)
    assert CacheSpec("lru", capacity=4) == capacity_spec("4", 16)


def test_a_capped_link_serves_demand_chunks_before_waiting_prefetch_chunks():
    link, cap = Link(10e6), 10e6
    ends = {}

    def read(name, nbytes, demand, delay):
        time.sleep(delay)
        started = time.perf_counter()
        link.throttle(nbytes, started, demand)
        ends[name] = (started, time.perf_counter())

    import threading
    threads = [threading.Thread(target=read, args=("prefetch", 2_000_000, False, 0.0)),   # 200 ms at the cap
               threading.Thread(target=read, args=("demand", 500_000, True, 0.02))]       # 50 ms, 20 ms later
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (p_start, p_end), (d_start, d_end) = ends["prefetch"], ends["demand"]
    assert d_end - d_start >= 500_000 / cap       # a grant is never shorter than its bytes at the cap
    assert d_end < p_end                          # the demand chunk did not queue behind the prefetch's
    assert p_end - p_start >= 2_500_000 / cap     # the prefetch was pushed back: the cap holds in total
