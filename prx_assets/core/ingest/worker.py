"""The CPU part of ingesting one image (normalize, plus the q92 cycles when it is in the sample),
in this thread or in a pool of worker processes.

About 40% of a 1-Mpx JPEG's ingest runs Python with the GIL held (header and EXIF parsing,
hashing, the PSNR histograms, numpy), so threads alone top out near 1.4x on two cores. With
``processes`` above 1, threads still read the files (I/O) and hand the bytes to a pool of
processes (forkserver: clean children that fork fast, whatever threads Lance started in this
one) that stays up for the life of the process and is shared by every partition it ingests.
Items travel in chunks (:func:`normalize_many_in_pool`): one task and one round trip per chunk,
not per image, so the parent's share of the CPU, which the two cores also need, stays small.
A child that dies (a decoder crash, the OOM killer) breaks the pool: each item that was in flight
runs again in the rebuilt pool, one task per item, then alone in a fresh process if the pool
breaks again, and an item that kills its process alone too is rejected (``corrupt``); the run
goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any

from prx_assets.compat.stdlib import inheriting
from prx_assets.core.config.project import IngestSettings
from prx_assets.core.faults import CRASH_ENV, crash_point
from prx_assets.core.ingest.decoder_warnings import collect, record, routed
from prx_assets.core.ingest.images import ImageRejected, NormalizedImage, RejectReason, normalize
from prx_assets.core.ingest.jpeg_quality import check_curve


@dataclasses.dataclass(frozen=True)
class Normalized:
    """One image's CPU work: the normalized image (without its pixels), the q92 curve when it
    was sampled (``CycleCurve.to_json``) and the seconds that took."""

    image: NormalizedImage
    curve: dict[str, Any] | None = None
    q92_seconds: float = 0.0
    #: Seconds of the whole CPU work, where it ran (a worker process's, not a waiting thread's).
    seconds: float = 0.0


def normalize_item(data: bytes, settings: IngestSettings, sampled: bool, label: str) -> Normalized:
    """Normalize one image; a sampled one stored as the configured JPEG by choice (not under the
    size bound, see :func:`~prx_assets.core.ingest.images.store`) also runs the q92 cycles on its pixels.

    Raises
    ------
    ImageRejected
        As :func:`~prx_assets.core.ingest.images.normalize`.
    """
    begun = time.perf_counter()
    n = normalize(data, settings, keep_rgb=sampled)
    if not (sampled and n.stored_format == "jpeg" and n.lossless_reason is None and n.rgb is not None):
        return Normalized(dataclasses.replace(n, rgb=None), seconds=time.perf_counter() - begun)
    started = time.perf_counter()  # on the pixels just decoded: no second read, tiles only
    curve = check_curve(n.rgb, settings, label, jpeg=n.jpeg)
    done = time.perf_counter()
    return Normalized(dataclasses.replace(n, rgb=None), curve.to_json(), done - started, done - begun)


class DecoderError(Exception):
    """A decoder raised something other than a rejection (the caller records it as ``corrupt``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def normalize_here(data: bytes, settings: IngestSettings, sampled: bool, label: str) -> Normalized:
    """:func:`normalize_item` in this thread, with anything a decoder raises other than a rejection
    as :class:`DecoderError` (the caller records the file as ``corrupt``)."""
    try:
        return normalize_item(data, settings, sampled, label)
    except ImageRejected:
        raise
    except Exception as e:  # decoders raise assorted types on crafted input
        raise DecoderError(type(e).__name__, str(e)) from e


def _in_child(data: bytes, settings: IngestSettings, sampled: bool, label: str,
              crash_at: str | None = None) -> tuple[Any, ...]:
    """:func:`normalize_item` in a pool process: outcomes as plain tuples (exceptions with custom
    constructors do not survive pickling), with the file's decoder warnings. ``crash_at``: the
    parent's ``PRX_CRASH_AT`` (fault tests kill the child at ``ingest.worker:<file name>``)."""
    crash_point(f"ingest.worker:{label}", crash_at or "")
    with routed(), collect() as warns:
        try:
            return ("ok", normalize_item(data, settings, sampled, label), warns)
        except ImageRejected as e:
            return ("rejected", e.reason.value, e.message, warns)
        except Exception as e:  # decoders raise assorted types on crafted input
            return ("error", type(e).__name__, str(e), warns)


log = logging.getLogger(__name__)
_POOLS: dict[int, ProcessPoolExecutor] = {}  # by size: partitions with other settings never share one
_POOL_LOCK = threading.Lock()
_HOLDERS = [0]  # open worker_pools() blocks in this process


class PoolsClosed(Exception):
    """Worker processes were asked for outside a :func:`worker_pools` block (a programming error:
    a pool started there would have no owner to stop it). Not a ``RuntimeError``, so that no
    fallback path mistakes it for processes that cannot start."""


@contextlib.contextmanager
def worker_pools() -> Iterator[None]:
    """Let this block (and the threads it starts) use worker processes; the outermost open block
    shuts them down when it leaves, waiting for the tasks in flight (a chunk of a few images each)."""
    with _POOL_LOCK:
        _HOLDERS[0] += 1
    try:
        yield
    finally:
        with _POOL_LOCK:
            _HOLDERS[0] -= 1
            last = _HOLDERS[0] == 0
        if last:
            shutdown_pool()


def _die_with_parent() -> None:
    """Pool worker initializer: ask Linux to kill this process when its parent (the forkserver) dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError) as e:  # no prctl: the pool's own shutdown still stops it
            log.debug("PR_SET_PDEATHSIG unavailable: %s", e)


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["prx_assets.core.ingest.worker"])
    return ctx


def start_server() -> None:
    """Start the forkserver the worker processes fork from, and its import of this module, now:
    in its own process, on a core this one leaves idle while it imports and opens the Dagster
    instance (``prx-assets run`` calls it first). Idempotent; a failure here is met again, and
    reported, where the pool starts. The forkserver exits with this process."""
    from multiprocessing import forkserver

    try:
        _context()
        forkserver.ensure_running()
    except Exception as e:  # the pool's own start meets it again and reports it
        log.debug("forkserver not started ahead: %s", e)


def _new_pool(size: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=size, mp_context=_context(), initializer=_die_with_parent)


def _pool(size: int) -> ProcessPoolExecutor:
    with _POOL_LOCK:
        if _HOLDERS[0] == 0:
            raise PoolsClosed("ingest worker processes are only started inside `with worker_pools():` "
                              "(prx_assets.core.ingest.worker); ingest_batch and prx-assets run hold one")
        pool = _POOLS.get(size)
        if pool is None:
            pool = _POOLS[size] = _new_pool(size)
        return pool


def _reset(broken: ProcessPoolExecutor) -> None:
    with _POOL_LOCK:
        for size, pool in list(_POOLS.items()):
            if pool is broken:
                del _POOLS[size]
                pool.shutdown(wait=False, cancel_futures=True)


def shutdown_pool() -> None:
    """Stop this process's worker processes now, waiting for the tasks in flight (the outermost
    :func:`worker_pools` block calls it; tests call it too)."""
    with _POOL_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


_UNAVAILABLE: list[str] = []  # why worker processes cannot run in this process (then threads do the work)


def _unavailable(why: str) -> None:
    with _POOL_LOCK:
        if not _UNAVAILABLE:
            _UNAVAILABLE.append(why)
            log.warning("ingest worker processes are unavailable (%s); decoding in threads instead (the same "
                        "results, slower). A script that ingests needs `if __name__ == '__main__':` around its "
                        "top-level code (worker processes import the main module), or set ingest processes: 1",
                        why.strip().splitlines()[0][:300])


def _alone(*args: Any) -> tuple[Any, ...]:
    with _new_pool(1) as alone:
        return alone.submit(*args).result()


def _probe() -> bool:
    return True


def _healthy() -> bool:
    """Whether a fresh worker process can run a trivial task at all."""
    try:
        return bool(_alone(_probe))
    except (BrokenProcessPool, RuntimeError, OSError):
        return False


def normalize_in_pool(data: bytes, settings: IngestSettings, sampled: bool, label: str,
                      processes: int) -> Normalized:
    """:func:`normalize_item` in a pool of ``processes`` processes (blocking this thread until it
    is done); the child's decoder warnings join this thread's (see :func:`~.decoder_warnings.collect`).
    Where worker processes cannot start or die whatever they run, this process's threads do the
    work instead (logged once): the results are the same.

    Raises
    ------
    ImageRejected
        As :func:`normalize_item`, or ``corrupt`` when the file kills a worker process alone.
    DecoderError
        When a decoder raised anything else.
    """
    if _UNAVAILABLE:
        return normalize_here(data, settings, sampled, label)
    args = (_in_child, data, settings, sampled, label, os.environ.get(CRASH_ENV))
    try:
        pool = _pool(processes)
        try:
            out = pool.submit(*args).result()
        except BrokenProcessPool:  # a process of the pool died: this file's, or another in flight
            _reset(pool)
            try:
                out = _alone(*args)
            except BrokenProcessPool:
                if not _healthy():  # processes die whatever they run: not this file's doing
                    _unavailable("worker processes die before doing any work")
                    return normalize_here(data, settings, sampled, label)
                raise ImageRejected(RejectReason.CORRUPT, "the decoder's worker process died on this file, "
                                    "alone in a fresh process too (a decoder crash or the OOM killer)") from None
    except (RuntimeError, OSError) as e:  # processes cannot start here
        if inheriting():
            raise  # a worker importing an unguarded main script: fail its start-up, as multiprocessing does
        _unavailable(f"{type(e).__name__}: {str(e).strip()}")
        return normalize_here(data, settings, sampled, label)
    return _unpack(out)


#: One image for a worker process: its bytes, whether it is in the q92 sample, and its label.
Job = tuple[bytes, bool, str]


def _many_in_child(jobs: list[Job], settings: IngestSettings, crash_at: str | None = None) -> list[tuple[Any, ...]]:
    """:func:`_in_child` over a chunk of jobs, in one task."""
    return [_in_child(data, settings, sampled, label, crash_at) for data, sampled, label in jobs]


def _unpack(out: tuple[Any, ...]) -> Normalized:
    """A child's outcome tuple as :func:`normalize_in_pool` returns or raises it."""
    record(out[-1])
    if out[0] == "ok":
        return out[1]
    if out[0] == "rejected":
        raise ImageRejected(RejectReason(out[1]), out[2])
    raise DecoderError(out[1], out[2])


def normalize_many_in_pool(jobs: list[Job], settings: IngestSettings,
                           processes: int) -> list[Callable[[], Normalized]]:
    """:func:`normalize_in_pool` for a chunk of jobs sent as one task (blocking this thread until it
    is done). Returns one callable per job, in order, that records the job's decoder warnings in the
    calling thread's :func:`~.decoder_warnings.collect` list and returns its result or raises as
    :func:`normalize_in_pool` does: call each inside that image's ``collect``. When the pool breaks
    (a child died on this chunk or on another in flight), each job runs through
    :func:`normalize_in_pool` on its own, which finds the one that kills its process."""
    if not jobs:
        return []
    if _UNAVAILABLE:
        return [partial(normalize_here, data, settings, sampled, label) for data, sampled, label in jobs]
    try:
        pool = _pool(processes)
        outs = pool.submit(_many_in_child, jobs, settings, os.environ.get(CRASH_ENV)).result()
    except (RuntimeError, OSError) as e:  # BrokenProcessPool is a RuntimeError too
        if isinstance(e, BrokenProcessPool):  # a process of the pool died: on a job of this chunk, or of another
            _reset(pool)
        # one job at a time (processes that cannot start: that path decides and warns)
        return [partial(normalize_in_pool, data, settings, sampled, label, processes)
                for data, sampled, label in jobs]
    return [partial(_unpack, out) for out in outs]
