"""The loader under a trainer's conditions: ranks, workers, batching methods, skip lists, resumption,
the skip list's memory and throughput against a plain ``StreamingDataset``.

- ``max_rank_batch_spread``, ``skipped_yielded``: one epoch of a two-set mixture (a base stream and a
  delta with a 20% clustered skip list, and a second set) on 2 and 4 ranks (processes on loopback,
  gloo) with 2 DataLoader workers each, under every batching method: the largest difference
  between two ranks' batch counts, and the skipped samples any rank received.
- ``resume_exact``: 2 ranks x 2 workers stopped after a third and after two thirds of an epoch,
  resumed in new processes from ``state_dict``: what came before plus what came after is exactly
  the epoch of an uninterrupted run (random and device_per_stream batching).
- ``skip_bytes_per_sample``: 10^7 skipped samples at the compaction bound (20% of 5x10^7), spread
  at random and clustered: bytes of the shared bitmap per skipped sample (the worst layout); the
  sparse case (10^7 of 10^9, 1%) is reported beside it, and what a DataLoader worker receives.
- ``samples_per_s_vs_plain``: one epoch through a DataLoader (2 workers) of our loader on a set
  with a 20% skip list against a plain ``StreamingDataset`` on the same shards without one,
  alternated (ABAB), median of 5 ratios of samples/s from the first batch to the epoch's end
  (``whole_epoch_vs_plain``: with construction and the DataLoader's start-up).
- ``arrange_s_vs_plain``: seconds to draw an epoch (``resample_streams``) over live samples
  against streaming's own draw over the same shards, at two sizes (growth).
"""

from __future__ import annotations

import os
import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROUNDS = int(os.environ.get("PRX_BENCH_ROUNDS", "5"))
METHODS = ("random", "stratified", "per_stream", "device_per_stream")
BATCH = 16


def _mixture(root: Path) -> tuple[str, set[int]]:
    from prx_assets.core.demo.shard_sets import skip_pattern, write_mixture, write_shard_set

    base, delta = skip_pattern(2560, 0.2, "clustered"), skip_pattern(640, 0.2, "spread")
    a = write_shard_set(root / "a", (2560, 640), [base, delta], recipe="a")
    b = write_shard_set(root / "b", (960,), recipe="b", first_uid=3200)
    write_mixture(root / "spec.json", "bench", [(a, {"proportion": 0.7}), (b, {"proportion": 0.3})])
    return str(root / "spec.json"), {int(i) for i in base} | {2560 + int(i) for i in delta}


def ranks_figures(root: Path) -> dict[str, Any]:
    """Batch-count spread and skipped samples yielded over world sizes 2, 4 x every batching method."""
    from bench.loader_ranks import run_ranks

    spec, skipped = _mixture(root / "sets")
    spread: dict[str, int] = {}
    yielded = 0
    for world in (2, 4):
        cases = [{"name": m, "spec": spec, "batch_size": BATCH, "batching": m} for m in METHODS]
        ranks = run_ranks(world, 2, cases, root / f"w{world}")
        for m in METHODS:
            counts = [len(r[m]["batches"]) for r in ranks]
            spread[f"{world}x{m}"] = max(counts) - min(counts)
            yielded += sum(1 for r in ranks for b in r[m]["batches"] for u in b if u in skipped)
    resume = {}
    for m in ("random", "device_per_stream"):
        base = {"spec": spec, "batch_size": BATCH, "batching": m}
        full = run_ranks(2, 2, [{**base, "name": "e"}], root / f"full-{m}")
        epoch = sorted(u for r in full for b in r["e"]["batches"] for u in b)
        n = len(full[0]["e"]["batches"])
        for k in (n // 3 - n // 3 % 2, 2 * n // 3 - 2 * n // 3 % 2):
            first = run_ranks(2, 2, [{**base, "name": "e", "stop_after": k}], root / f"first-{m}-{k}")
            rest = run_ranks(2, 2, [{**base, "name": "e", "resume": first[0]["e"]["state"]}], root / f"rest-{m}-{k}")
            got = sorted(u for run in (first, rest) for r in run for b in r["e"]["batches"] for u in b)
            resume[f"{m}@{k}/{n}"] = got == epoch
    return {"rank_batch_spread": spread, "max_rank_batch_spread": max(spread.values()), "skipped_yielded": yielded,
            "resume": resume, "resume_exact": all(resume.values())}


def skip_memory(folder: Path) -> dict[str, Any]:
    """Bytes per skipped sample of 10^7 skipped samples, three layouts; what a worker receives."""
    from prx_assets.core.demo.shard_sets import skip_pattern
    from prx_assets.core.publish.skiplist import SkipList

    n = 10_000_000
    layouts = {"spread_20pct": skip_pattern(5 * n, 0.2, "spread", seed=1),
               "clustered_20pct": skip_pattern(5 * n, 0.2, "clustered", seed=1)}
    rng = np.random.default_rng(2)
    sparse = np.unique(rng.integers(0, 1_000_000_000, int(n * 1.01)))
    layouts["spread_1pct_of_1e9"] = np.sort(rng.choice(sparse, n, replace=False))
    out: dict[str, Any] = {}
    for name, hidden in layouts.items():
        skips = SkipList.build(hidden // (1 << 30), hidden % (1 << 30), 1, folder=folder)
        out[name] = round(skips.nbytes / len(hidden), 4)
        out["worker_bytes"] = len(pickle.dumps(skips))
        os.unlink(skips.path)
    out["skip_bytes_per_sample"] = max(out["spread_20pct"], out["clustered_20pct"])
    return out


def _epoch_rate(make: Any) -> tuple[float, float]:
    """(samples/s from the first batch to the end of the epoch, samples/s of the whole epoch with
    the dataset's construction and the DataLoader's start) of one epoch, 2 workers."""
    from torch.utils.data import DataLoader

    from prx_assets.loader import release_shared_memory

    started = time.perf_counter()
    ds = make()
    try:
        loader = DataLoader(ds, batch_size=32, num_workers=2, collate_fn=len)
        batches = iter(loader)
        first = next(batches)
        t = time.perf_counter()
        n = sum(batches)
        end = time.perf_counter()
        return n / (end - t), (n + first) / (end - started)
    finally:
        release_shared_memory(ds)


def throughput(root: Path) -> dict[str, Any]:
    """samples/s of our loader (20% skip list) against plain streaming on the same shards, ABAB."""
    from streaming import Stream, StreamingDataset

    from prx_assets.core.demo.shard_sets import skip_pattern, write_shard_set
    from prx_assets.loader import PrxStreamingDataset

    samples = 40_000
    write_shard_set(root / "t", (samples,), [skip_pattern(samples, 0.2, "clustered")], payload_bytes=8192,
                    size_limit=1 << 24)

    def ours() -> Any:
        return PrxStreamingDataset(shard_sets=[str(root / "t")], batch_size=32, shuffle=True)

    def plain() -> Any:
        return StreamingDataset(streams=[Stream(local=str(root / "t" / "s0"))], batch_size=32, shuffle=True)

    _epoch_rate(ours), _epoch_rate(plain)  # warm both (page cache, imports)
    steady, whole, rates = [], [], []
    for _ in range(ROUNDS):
        a, b = _epoch_rate(ours), _epoch_rate(plain)
        rates.append((a[0], b[0]))
        steady.append(a[0] / b[0])
        whole.append(a[1] / b[1])
    return {"samples_per_s_vs_plain": round(statistics.median(steady), 3),
            "samples_per_s_vs_plain_spread": [round(min(steady), 3), round(max(steady), 3)],
            "whole_epoch_vs_plain": round(statistics.median(whole), 3),
            "ours_samples_per_s": round(statistics.median(r[0] for r in rates)),
            "plain_samples_per_s": round(statistics.median(r[1] for r in rates))}


def arrangement(root: Path) -> dict[str, Any]:
    """Seconds to draw an epoch (``resample_streams``) of our dataset over a set with a 20% skip list
    vs streaming's draw over the same shards without one, at two sizes, alternated."""
    from streaming import Stream, StreamingDataset

    from prx_assets.core.demo.shard_sets import skip_pattern, write_shard_set
    from prx_assets.loader import PrxStreamingDataset, release_shared_memory

    out = {}
    for samples in (200_000, 800_000):
        folder = root / f"a{samples}"
        write_shard_set(folder, (samples,), [skip_pattern(samples, 0.2, "spread")], payload_bytes=1, size_limit=1 << 18)
        ours_ds = PrxStreamingDataset(shard_sets=[str(folder)], batch_size=32)
        plain_ds = StreamingDataset(streams=[Stream(local=str(folder / "s0"))], batch_size=32)
        ours, plain = [], []
        for epoch in range(ROUNDS + 1):
            t = time.perf_counter()
            ours_ds.resample_streams(epoch)
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            plain_ds.resample_streams(epoch)
            plain.append(time.perf_counter() - t)
        out[str(samples)] = {"ours_s": round(statistics.median(ours[1:]), 4),
                             "plain_s": round(statistics.median(plain[1:]), 4)}
        release_shared_memory(ours_ds)
        release_shared_memory(plain_ds)
    return {"arrange": out, "arrange_s_vs_plain": round(out["800000"]["ours_s"] / out["800000"]["plain_s"], 2)}


def run() -> dict[str, Any]:
    """Run the benchmark and return its figures."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    root = Path(tempfile.mkdtemp(prefix="prx-bench-loader-"))
    try:
        result: dict[str, Any] = {}
        result.update(arrangement(root))
        result.update(skip_memory(root))
        result.update(throughput(root))
        result.update(ranks_figures(root))
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """The figures as a text table."""
    lines = [
        f"max rank batch spread (2, 4 ranks x 2 workers, 4 batching methods): {r['max_rank_batch_spread']}",
        f"skipped samples yielded: {r['skipped_yielded']}",
        f"resumption exact: {r['resume_exact']}  ({', '.join(f'{k}: {v}' for k, v in r['resume'].items())})",
        f"skip list bytes per skipped sample (10^7 skipped): {r['skip_bytes_per_sample']} at the 20% bound "
        f"(spread {r['spread_20pct']}, clustered {r['clustered_20pct']}); 1% of 10^9 spread: {r['spread_1pct_of_1e9']}",
        f"what a DataLoader worker receives of a skip list: {r['worker_bytes']} bytes (the shared file's path)",
        f"samples/s vs plain StreamingDataset: {r['samples_per_s_vs_plain']} (median of {ROUNDS}, "
        f"range {r['samples_per_s_vs_plain_spread']}; {r['ours_samples_per_s']} vs {r['plain_samples_per_s']}); "
        f"whole epoch with start-up: {r['whole_epoch_vs_plain']}",
        "epoch draw seconds (ours / streaming's): " + ", ".join(
            f"{k} samples {v['ours_s']} / {v['plain_s']}" for k, v in r["arrange"].items()),
    ]
    return "\n".join(lines)
