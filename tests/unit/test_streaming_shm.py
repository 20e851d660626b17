"""Streaming's leaked shared memory is cleaned; a live dataset's is not."""

import contextlib
import doctest
import fcntl
import logging
import os
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np
import pytest

from prx_assets.core.publish import streaming_shm
from prx_assets.core.publish.streaming_shm import (
    SHM_DIR,
    clean_stale_streaming_shm,
    mapped_shm_names,
    streaming_registration,
)

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir() or not Path("/proc/self/maps").exists(),
                                reason="needs Linux /dev/shm and /proc")


def _segment(name: str, keep_mapped: bool) -> shared_memory.SharedMemory | None:
    """A POSIX segment named like streaming's; closed (as a dead process leaves it) unless kept."""
    shm = shared_memory.SharedMemory(name=name, create=True, size=64)
    resource_tracker.unregister(shm._name, "shared_memory")
    if keep_mapped:
        return shm
    shm.close()
    return None


def test_doctests() -> None:
    assert doctest.testmod(streaming_shm).failed == 0


def test_only_segments_no_live_process_maps_are_unlinked(tmp_path: Path) -> None:
    base = 900000 + (np.random.default_rng().integers(0, 99_000))
    live, leaked = f"{base:06}_epoch_data", f"{base + 1:06}_epoch_data"
    other = f"prx-test-{base}"  # not streaming's: never touched
    kept = _segment(live, keep_mapped=True)
    _segment(leaked, keep_mapped=False)
    _segment(other, keep_mapped=False)
    try:
        assert live in (mapped_shm_names() or set()) and leaked not in (mapped_shm_names() or set())
        assert clean_stale_streaming_shm() == []  # both are younger than the creation grace period
        with streaming_registration():  # no dataset elsewhere is creating its segments meanwhile
            removed = clean_stale_streaming_shm(min_age_s=0)
        assert leaked in removed and live not in removed and other not in removed
        assert (SHM_DIR / live).exists() and not (SHM_DIR / leaked).exists() and (SHM_DIR / other).exists()
    finally:
        assert kept is not None
        kept.close()
        for name in (live, leaked, other):
            (SHM_DIR / name).unlink(missing_ok=True)


def test_a_live_streaming_dataset_keeps_its_segments(tmp_path: Path) -> None:
    """What streaming's own cleaner would unlink while the dataset is in use is kept."""
    from streaming import MDSWriter, StreamingDataset

    out = tmp_path / "mds"
    with MDSWriter(out=str(out), columns={"x": "int"}) as w:
        for i in range(8):
            w.write({"x": i})
    with streaming_registration():  # other tests open datasets on this node at the same time
        ds = StreamingDataset(local=str(out), batch_size=2, shuffle=False)
    mine = {p.name for p in SHM_DIR.iterdir()} & (mapped_shm_names() or set())
    assert any(n.endswith("_locals") for n in mine)
    with streaming_registration():  # no dataset elsewhere is creating its segments meanwhile
        assert not set(clean_stale_streaming_shm(min_age_s=0)) & mine
    assert sorted(s["x"] for s in ds) == list(range(8))  # still usable


def _open_after_a_slow_prefix_search(args: tuple[str, object, float]) -> str:
    """Open a dataset over ``out`` once every process is ready, with streaming's free-prefix
    search slowed down: the window between picking a prefix and creating it, wide open."""
    import time

    import streaming.base.shared.prefix as prefix

    from prx_assets.core.publish.shards import open_stream
    from prx_assets.loader import release_shared_memory

    out, barrier, delay = args
    search = prefix._check_and_find_retrying

    def slow(*a: object, **k: object) -> int:
        found = search(*a, **k)
        time.sleep(delay)
        return found

    prefix._check_and_find_retrying = slow
    barrier.wait()  # type: ignore[attr-defined]
    ds = None
    try:
        ds = open_stream(out, batch_size=1, shuffle=False)
        got = f"ok {ds._shm_prefix_int} {sorted(s['x'] for s in ds)}"
    except Exception as e:  # reported to the test
        got = f"{type(e).__name__}: {e}"
    barrier.wait()  # type: ignore[attr-defined]  # all open at once: no released prefix is reused
    if ds is not None:
        release_shared_memory(ds)
    return got


def test_datasets_opened_together_on_one_node_get_distinct_prefixes(tmp_path: Path) -> None:
    """Streaming picks a free prefix and creates it a moment later: without the node-wide
    registration lock, three datasets opened together pick the same one and two fail with
    ``FileExistsError: '/<prefix>_locals'`` (mosaicml/streaming#884)."""
    import multiprocessing as mp

    from streaming import MDSWriter

    out = tmp_path / "mds"
    with MDSWriter(out=str(out), columns={"x": "int"}) as w:
        for i in range(4):
            w.write({"x": i})
    ctx = mp.get_context("spawn")
    n = 3
    with ctx.Manager() as manager:
        barrier = manager.Barrier(n)
        with ctx.Pool(n) as pool:
            results = pool.map(_open_after_a_slow_prefix_search, [(str(out), barrier, 0.5)] * n)
    assert all(r.startswith("ok ") and r.endswith("[0, 1, 2, 3]") for r in results), results
    assert len({r.split()[1] for r in results}) == n  # each its own prefix


@contextlib.contextmanager
def _lock_held_elsewhere(shm_dir: Path) -> Iterator[Path]:
    """The registration lock under ``shm_dir``, held through another open file (as another
    process would hold it) for the block; yields its path."""
    lock = shm_dir / streaming_shm.REGISTRATION_LOCK
    holder = os.open(lock, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        yield lock
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)


def test_registration_waits_for_the_node_lock_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """While another holder has the lock, a registration does not enter its block; it logs the
    wait with the lock's path and enters once the lock is released."""
    import threading
    import time

    entered = threading.Event()

    def register() -> None:
        with streaming_registration(shm_dir=tmp_path):
            entered.set()

    caplog.set_level(logging.INFO, logger=streaming_shm.__name__)
    with _lock_held_elsewhere(tmp_path) as lock:
        thread = threading.Thread(target=register, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60  # the thread imports streaming (and torch) first
        while not any(str(lock) in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(str(lock) in r.getMessage() for r in caplog.records)
        assert not entered.wait(0.5)  # held elsewhere: the block has not begun
    assert entered.wait(30)
    thread.join(30)


def test_a_registration_goes_on_without_a_lock_held_too_long(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A lock held past the wait (two multi-node jobs each holding one node's lock would wait
    for each other for ever) is given up with a warning naming it; the block still runs."""
    caplog.set_level(logging.INFO, logger=streaming_shm.__name__)
    ran = False
    with _lock_held_elsewhere(tmp_path) as lock, streaming_registration(shm_dir=tmp_path, wait_s=0.2):
        ran = True
    assert ran
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(lock) in warned[0].getMessage()
