"""Skip lists as shared roaring bitmaps, and the epoch draw over live samples."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from prx_assets.core.demo.shard_sets import skip_pattern, write_shard_set
from prx_assets.core.publish.arrangement import live_per_shard, resample_live, trim_draw
from prx_assets.core.publish.skiplist import SkipList
from prx_assets.loader import release_shared_memory


def test_a_skip_list_answers_per_stream_and_pickles_as_its_path(tmp_path: Path) -> None:
    streams = np.array([0, 0, 2, 2, 2])
    indices = np.array([3, 9, 0, 1, 7])
    skips = SkipList.build(streams, indices, 3, folder=tmp_path)
    assert skips.total == 5 and skips.per_stream == (2, 0, 3)
    assert skips.contains(0, 9) and not skips.contains(1, 9) and skips.contains(2, 7)
    assert skips.skipped_in(2, 0, 2) == 2 and skips.skipped_in(0, 4, 9) == 0
    assert skips.live_mask(0, 10).tolist() == [i not in (3, 9) for i in range(10)]
    assert skips.live_mask(1, 4).all()
    state = pickle.dumps(skips)
    assert len(state) < 400, "a worker receives the path, not the bitmap"
    again = pickle.loads(state)
    assert again._bitmap is None and again.contains(2, 1)  # read from the shared file on first use
    assert SkipList.build(streams, indices, 3, folder=tmp_path).path == skips.path  # content-addressed
    Path(skips.path).unlink()
    with pytest.raises(FileNotFoundError, match="construct the dataset again"):
        pickle.loads(state).contains(0, 3)


@pytest.mark.parametrize("pattern,bound", [("clustered", 0.01), ("spread", 1.0)])
def test_a_skip_list_costs_under_a_byte_a_skipped_sample(tmp_path: Path, pattern: str, bound: float) -> None:
    hidden = skip_pattern(500_000, 0.2, pattern, seed=3)
    skips = SkipList.build(np.zeros(len(hidden), np.int64), hidden, 1, folder=tmp_path)
    assert skips.total == len(hidden) == 100_000
    assert skips.nbytes / skips.total <= bound


def test_the_live_draw_is_streamings_own_when_nothing_is_skipped(tmp_path: Path) -> None:
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    write_shard_set(tmp_path / "set", [700, 300])
    streams = [Stream(local=str(tmp_path / "set" / "s0"), repeat=2.5), Stream(local=str(tmp_path / "set" / "s1"))]
    ds = StreamingDataset(streams=streams, batch_size=4, shuffle=True, shuffle_seed=5)
    none = SkipList.build(np.zeros(0, np.int64), np.zeros(0, np.int64), 2, folder=tmp_path)
    for epoch in (0, 3):
        for stream_id in (None, 0, 1):
            ours = resample_live(ds, none, live_per_shard(ds, none), epoch, stream_id)
            theirs = ds.resample_streams(epoch, stream_id)
            assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    release_shared_memory(ds)


def test_the_live_draw_leaves_skipped_samples_out_and_keeps_units_whole(tmp_path: Path) -> None:
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    write_shard_set(tmp_path / "set", [700])
    hidden = skip_pattern(700, 0.2, "clustered")
    skips = SkipList.build(np.zeros(len(hidden), np.int64), hidden, 1, folder=tmp_path)
    ds = StreamingDataset(streams=[Stream(local=str(tmp_path / "set" / "s0"), choose=1000)], batch_size=4)
    live = live_per_shard(ds, skips)
    assert live.sum() == 700 - len(hidden)
    units, ids = resample_live(ds, skips, live, 0)
    assert units.sum() == len(ids) == 1000
    assert not set(ids.tolist()) & set(hidden.tolist())
    assert set(ids.tolist()) == set(range(700)) - set(hidden.tolist())  # every live sample at least once
    release_shared_memory(ds)


def test_a_trimmed_draw_is_a_multiple_and_keeps_units_consistent() -> None:
    units = np.array([5, 5, 3])
    ids = np.arange(13)
    kept_units, kept = trim_draw(units, ids, 4, seed=1)
    assert len(kept) == 12 and kept_units.sum() == 12
    assert np.all(np.diff(kept) > 0)
    assert trim_draw(units, ids, 13, seed=1)[1] is ids


def test_unused_skip_lists_are_pruned_and_used_ones_kept(tmp_path: Path) -> None:
    import os

    from prx_assets.core.publish.skiplist import SHARED_DIR, prune

    old = SkipList.build(np.array([0]), np.array([1]), 1, folder=tmp_path)
    used = SkipList.build(np.array([0]), np.array([2]), 1, folder=tmp_path)
    week_ago = os.path.getmtime(old.path) - 8 * 86400
    for path in (old.path, used.path):
        os.utime(path, (week_ago, week_ago))
    pickle.loads(pickle.dumps(used)).contains(0, 2)  # a worker reads it: refreshed
    assert prune(tmp_path / SHARED_DIR) == [Path(old.path).name]
    assert Path(used.path).exists()
