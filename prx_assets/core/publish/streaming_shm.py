"""MosaicML streaming's leaked shared memory, cleaned without touching datasets still in use.

Every ``StreamingDataset`` registers a numbered prefix of POSIX shared-memory segments
(``/dev/shm/000000_locals``, ``000000_epoch_data``, ...). A process that dies without closing its
dataset leaves them behind: RAM that stays allocated until someone unlinks it (the epoch's sample
ids alone are 8 bytes a sample). Streaming's own ``clean_stale_shared_memory()`` unlinks *every*
segment of every prefix, including those of a training job that is still running on the same
node, whose workers then attach to a newer dataset's segments of the same name. This module
unlinks only what no live process maps.

It sees the processes of its own PID namespace: containers that share ``/dev/shm`` with each
other (``--ipc=host``) but not their process tables would see each other's live segments as
unmapped. Give each container its own ``/dev/shm`` (the default in Docker and Kubernetes).

It also closes a race in streaming's prefix registration (mosaicml/streaming#884, #901, open):
a new dataset's local leader looks for the first free prefix, and creates its ``_locals``
segment some moments later, so two datasets started together on one node (two training jobs,
two ``mds_readback`` checks) can pick the same number, and one fails with ``FileExistsError:
'/000135_locals'``. :func:`streaming_registration` serializes that step node-wide.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PROC = Path("/proc")
#: Segments younger than this are left alone: a dataset may be creating them right now (the
#: segment exists a moment before its creator maps it).
MIN_AGE_S = 60.0
#: The node-wide lock file that serializes streaming's prefix registration (in ``/dev/shm``, the
#: namespace the prefixes live in; the temp folder where there is none).
REGISTRATION_LOCK = "prx-streaming-registration.lock"
#: How long a dataset waits for that lock before it registers without it (see
#: :func:`streaming_registration`); registering takes well under a second with local streams.
REGISTRATION_WAIT_S = 300.0


def mapped_shm_names(proc: Path = PROC) -> set[str] | None:
    """The ``/dev/shm`` names that some live process maps (from ``/proc/<pid>/maps``), or ``None``
    where there is no ``/proc`` to ask (not Linux). Processes whose maps cannot be read (another
    user's) are skipped: their segments are not ours to unlink either."""
    if not (proc / "self" / "maps").exists():
        return None
    names: set[str] = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "maps"), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:  # gone, or not ours
            continue
        if "/dev/shm/" not in text:
            continue
        for line in text.splitlines():
            at = line.find("/dev/shm/")
            if at >= 0:
                names.add(line[at + len("/dev/shm/"):].removesuffix(" (deleted)"))
    return names


def is_streaming_segment(name: str, kinds: frozenset[str]) -> bool:
    """Whether ``name`` is one of streaming's segments: a 6-digit prefix, ``_``, a known kind.

    >>> is_streaming_segment("000012_epoch_data", frozenset({"epoch_data"}))
    True
    >>> is_streaming_segment("psm_1a2b", frozenset({"epoch_data"}))
    False
    """
    prefix, sep, kind = name.partition("_")
    return bool(sep) and len(prefix) == 6 and prefix.isdigit() and kind in kinds


def clean_stale_streaming_shm(shm_dir: Path = SHM_DIR, proc: Path = PROC, min_age_s: float = MIN_AGE_S) -> list[str]:
    """Unlink streaming's shared-memory segments that no live process maps and that are older than
    ``min_age_s``; return their names. Where ``/proc`` or ``/dev/shm`` is missing nothing is
    removed: a leaked prefix there costs memory, never an error (a new dataset takes the next free
    prefix)."""
    from streaming.base.constant import SHM_TO_CLEAN

    kinds = frozenset(SHM_TO_CLEAN)
    if not shm_dir.is_dir():
        return []
    candidates = [e for e in os.scandir(shm_dir) if is_streaming_segment(e.name, kinds)]
    if not candidates:
        return []
    mapped = mapped_shm_names(proc)
    if mapped is None:
        return []
    removed = []
    now = time.time()
    for entry in candidates:
        if entry.name in mapped:
            continue
        try:
            if now - entry.stat().st_mtime < min_age_s:
                continue
            os.unlink(entry.path)
        except (FileNotFoundError, PermissionError):  # gone already, or another user's
            continue
        removed.append(entry.name)
    return removed


def _lock_path(shm_dir: Path) -> Path:
    return (shm_dir if shm_dir.is_dir() else Path(tempfile.gettempdir())) / REGISTRATION_LOCK


@contextlib.contextmanager
def streaming_registration(shm_dir: Path = SHM_DIR, proc: Path = PROC,
                           wait_s: float = REGISTRATION_WAIT_S) -> Iterator[None]:
    """Construct a ``StreamingDataset`` inside this block: stale segments are cleaned first
    (:func:`clean_stale_streaming_shm`) and no other dataset on the node registers a prefix
    until the block ends.

    The node's local leader (local rank 0, as streaming detects it) holds an exclusive ``flock``
    on :data:`REGISTRATION_LOCK` for the block; with ``torch.distributed`` initialized, the other
    ranks wait at a barrier until it holds it, because streaming has every rank compute the
    prefix and only the leader create it. Every rank must enter the block, as every rank
    constructs the dataset. The lock goes with the process, so a crashed one never leaves it held.
    The block covers the whole constructor, index loading included (the prefix step is inside
    it), so datasets over remote streams that start together on a node load their indexes one
    after the other; a wait for the lock is logged with its path.

    A leader waits at most ``wait_s`` seconds, then goes on without the lock (a warning says so):
    two multi-node jobs that share nodes could otherwise each hold one node's lock while their
    ranks on the other node wait for it, inside streaming's barriers, for ever. Going on risks
    only the race the lock closes.
    """
    from streaming.base.world import World

    log = logging.getLogger(__name__)
    leader = World.detect().is_local_leader
    fd = None
    if leader:
        path = _lock_path(shm_dir)
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        with contextlib.suppress(OSError):  # another user's jobs on the node take it too
            os.fchmod(fd, 0o666)
        if not _flock(fd, 0.0):
            log.info("waiting for %s: another dataset on this node is registering its streaming prefix", path)
            if not _flock(fd, wait_s):
                log.warning("%s still held after %.0f s: registering this dataset's streaming prefix without it "
                            "(a dataset started at the same moment may collide with it)", path, wait_s)
                os.close(fd)
                fd = None
    try:
        clean_stale_streaming_shm(shm_dir, proc)
        _barrier()
        yield
    finally:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _flock(fd: int, wait_s: float) -> bool:
    """Take an exclusive ``flock`` on ``fd`` within ``wait_s`` seconds (polled); whether it was taken."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _barrier() -> None:
    """``torch.distributed.barrier()`` where a process group is initialized (as streaming does)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
