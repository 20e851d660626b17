"""Epoch arrangement over live samples: skipped samples leave an epoch before streaming splits it.

mosaicml-streaming arranges an epoch in one process per node: ``resample_streams`` draws each
stream's samples (proportion, repeat, choose), then the batching method (``random``,
``stratified``, ``per_stream``, ``device_per_stream``) shuffles and partitions them over nodes,
ranks and workers, padding so that every rank gets the same number of samples. Every batching
method draws through the public ``StreamingDataset.resample_streams``, so the loader overrides
that one method with :func:`resample_live`: the same algorithm on each shard's live samples.
Every rank then gets the same number of batches, a device batch of ``device_per_stream`` still
holds one stream, and ``state_dict`` positions (samples consumed) index the arranged epoch, so
resumption is exact. With no skipped sample the draw is streaming's own, number for number.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from streaming import Stream
from streaming.base.sampling import get_sampling

from prx_assets.core.publish.skiplist import SkipList


def live_choose(weights: Sequence[dict[str, Any]], live: Sequence[int], epoch_size: int | str | None,
                seed: int) -> list[int]:
    """Samples each stream contributes to an epoch, computed by streaming's own ``Stream.apply_weights``
    over the streams' *live* sample counts (``weights``: each stream's ``proportion`` / ``repeat`` /
    ``choose`` keyword, or none)."""
    scratch = tempfile.gettempdir()
    streams = [Stream(local=scratch, **w) for w in weights]
    if isinstance(epoch_size, str):
        from streaming.base.util import number_abbrev_to_int

        epoch_size = number_abbrev_to_int(epoch_size)
    Stream.apply_weights(streams, np.asarray(live, np.int64), epoch_size, seed)
    return [int(s.choose) for s in streams]


def live_per_shard(dataset: Any, skips: SkipList) -> NDArray[np.int64]:
    """Live samples of each shard of a constructed ``StreamingDataset`` (its shard order)."""
    out = np.array(dataset.samples_per_shard, np.int64)
    for shard_id in range(int(dataset.num_shards)):
        stream = int(dataset.stream_per_shard[shard_id])
        if not skips.per_stream[stream]:
            continue
        begin = int(dataset.sample_offset_per_shard[shard_id] - dataset.sample_offset_per_stream[stream])
        out[shard_id] -= skips.skipped_in(stream, begin, begin + int(out[shard_id]))
    return out


def resample_live(dataset: Any, skips: SkipList, live: NDArray[np.int64], epoch: int,
                  stream_id: int | None = None) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``StreamingDataset.resample_streams`` over live samples only: ``(shuffle units, sample ids)``.

    Mirrors streaming 0.13's draw (same generator, same calls) with each shard's live samples in
    place of all of them; shards with no live sample take no part."""
    rng = np.random.default_rng(dataset.shuffle_seed + epoch) if dataset.sampling_method == "balanced" \
        else np.random.default_rng(dataset.shuffle_seed)
    units: list[NDArray[np.int64]] = []
    ids: list[NDArray[np.int64]] = []
    for sid in range(dataset.num_streams) if stream_id is None else [stream_id]:
        first = int(dataset.shard_offset_per_stream[sid])
        shard_ids = first + np.arange(int(dataset.shards_per_stream[sid]))
        counts = live[shard_ids]
        if not counts.any():
            continue
        choose = np.zeros(len(shard_ids), np.int64)
        choose[counts > 0] = get_sampling(counts[counts > 0], int(dataset.streams[sid].choose),
                                          dataset.sampling_granularity, dataset.shuffle_seed, epoch,
                                          dataset.epoch_seed_change)
        mask = skips.live_mask(sid, int(dataset.samples_per_stream[sid])) if skips.per_stream[sid] else None
        stream_base = int(dataset.sample_offset_per_stream[sid])
        for shard_id, n, want in zip(shard_ids, counts, choose, strict=True):
            if not n:
                continue
            begin = int(dataset.sample_offset_per_shard[shard_id])
            size = int(dataset.samples_per_shard[shard_id])
            alive = np.arange(begin, begin + size, dtype=np.int64) if mask is None else \
                begin + np.flatnonzero(mask[begin - stream_base:begin - stream_base + size]).astype(np.int64)
            full, rest = divmod(int(want), int(n))
            units.append(np.array([n] * full + ([rest] if rest else []), np.int64))
            ids += [alive] * full
            if rest:
                ids.append(np.sort(alive[rng.choice(int(n), rest, False)]))
    empty = np.zeros(0, np.int64)
    return (np.concatenate(units) if units else empty), (np.concatenate(ids) if ids else empty)


def device_batch_quantum(dataset: Any) -> int:
    """Samples per stream per epoch that fill every rank's device batches evenly under
    ``device_per_stream``: canonical nodes x ranks per node x workers per rank x batch size.

    Streaming 0.13 gives the ranks of a node one device batch more or less when a node's full
    device batches are not a multiple of its ranks (the epoch's last global batch is part
    padding), and a rank that runs out first hangs the others in a collective. A draw per stream
    that is a multiple of this quantum leaves no partial batch: every rank gets the same count.
    """
    from streaming.base.world import World

    world = World.detect()
    return int(dataset.num_canonical_nodes or world.num_nodes) * world.ranks_per_node * \
        max(1, world.workers_per_rank) * int(dataset.batch_size)


def trim_draw(units: NDArray[np.int64], ids: NDArray[np.int64], quantum: int,
              seed: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """A stream's draw cut down to a multiple of ``quantum`` samples, the ones left out picked at
    random with ``seed`` (so not always the last shard's); ``units`` shrink to match.

    >>> trim_draw(np.array([3, 2]), np.arange(5), 2, 0)[0].sum()
    np.int64(4)
    """
    keep = len(ids) - len(ids) % quantum
    if keep == len(ids):
        return units, ids
    chosen = np.sort(np.random.default_rng(seed).choice(len(ids), keep, replace=False))
    unit_of = np.repeat(np.arange(len(units)), units)
    counts = np.bincount(unit_of[chosen], minlength=len(units))
    return counts[counts > 0].astype(np.int64), ids[chosen]
