"""A dataset's skip list as one compressed bitmap, in a file that every process on a node shares.

A shard set published as a delta hides samples of its earlier streams through ``skip.parquet``
(see :mod:`prx_assets.core.publish.incremental`). The loader needs those samples where an epoch
is arranged, which streaming does once per node and epoch, in one process. This module holds
them as one roaring bitmap (pyroaring's ``BitMap64``; key ``stream << 32 | index``): runs,
arrays and bitmaps chosen per 2^16 keys by the library, so a clustered opt-out costs almost
nothing and a spread one under a byte a skipped sample at the compaction bound (measured by
``python -m bench loader``: docs/benchmarks.md). The bitmap is written once,
content-addressed, under the node's temp folder; what a DataLoader worker receives is its path,
and only the process that arranges an epoch reads it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: Folder (under the temp folder) where skip bitmaps are shared between the processes of a node.
SHARED_DIR = "prx-skip-lists"
STREAM_SHIFT = 32


def _bitmap_class() -> Any:
    from pyroaring import BitMap64  # only datasets with a skip list need it

    return BitMap64


def keys(streams: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Bitmap keys of ``(stream, sample index within that stream)`` pairs.

    >>> keys(np.array([0, 2]), np.array([5, 7])).tolist()
    [5, 8589934599]
    """
    if len(indices) and int(np.max(indices)) >= 1 << STREAM_SHIFT:
        raise ValueError(f"a stream holds sample index {int(np.max(indices))}, above 2^32: split the stream")
    return (streams.astype(np.uint64) << np.uint64(STREAM_SHIFT)) | indices.astype(np.uint64)


#: A shared skip list no dataset has been built over for this long is removed (the next build writes it again).
KEEP_S = 7 * 86400


def prune(where: Path, keep_s: float = KEEP_S) -> list[str]:
    """Remove skip-list files of ``where`` unused for ``keep_s`` seconds (and temp files a killed
    writer left); return their names. Every build and every read refreshes a file's time, and a
    running dataset reads its file at least once an epoch."""
    removed = []
    now = time.time()
    for entry in os.scandir(where):
        try:
            if now - entry.stat().st_mtime > keep_s:
                os.unlink(entry.path)
                removed.append(entry.name)
        except FileNotFoundError:  # another process pruned it first
            continue
    return removed


@dataclass
class SkipList:
    """Skipped samples of a dataset's physical streams, shared through ``path``; pickles as the path."""

    path: str
    total: int
    per_stream: tuple[int, ...]
    _bitmap: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, streams: np.ndarray, indices: np.ndarray, num_streams: int,
              folder: str | os.PathLike[str] | None = None) -> SkipList:
        """The skip list of ``(stream, index)`` pairs, written to the shared folder unless there already."""
        bitmap = _bitmap_class()(np.unique(keys(streams, indices)))
        bitmap.run_optimize()
        data = bitmap.serialize()
        where = Path(folder or tempfile.gettempdir()) / SHARED_DIR
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{hashlib.sha256(data).hexdigest()[:32]}.roaring"
        if path.exists():
            os.utime(path)  # in use: not pruned
        else:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        prune(where)
        per_stream = tuple(bitmap.range_cardinality(s << STREAM_SHIFT, (s + 1) << STREAM_SHIFT)
                           for s in range(num_streams))
        return cls(path=str(path), total=len(bitmap), per_stream=per_stream, _bitmap=bitmap)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "total": self.total, "per_stream": self.per_stream, "_bitmap": None}

    @property
    def bitmap(self) -> Any:
        """The bitmap, read from the shared file on first use in this process."""
        if self._bitmap is None:
            try:
                data = Path(self.path).read_bytes()
                os.utime(self.path)  # in use: not pruned
            except FileNotFoundError:
                raise FileNotFoundError(f"skip list {self.path} is gone (a temp-folder cleaner?): construct the "
                                        "dataset again, which writes it anew") from None
            self._bitmap = _bitmap_class().deserialize(data)
        return self._bitmap

    @property
    def nbytes(self) -> int:
        """Bytes the bitmap takes serialized (what a process that reads it holds, within a few percent)."""
        return os.path.getsize(self.path)

    def contains(self, stream: int, index: int) -> bool:
        """Whether sample ``index`` of physical stream ``stream`` is skipped."""
        return (stream << STREAM_SHIFT | index) in self.bitmap

    def skipped_in(self, stream: int, begin: int, end: int) -> int:
        """How many samples ``begin <= index < end`` of ``stream`` are skipped."""
        base = stream << STREAM_SHIFT
        return int(self.bitmap.range_cardinality(base + begin, base + end))

    def live_mask(self, stream: int, samples: int) -> np.ndarray:
        """``samples`` booleans, False where that sample of ``stream`` is skipped (1 byte a sample, transient)."""
        mask = np.ones(samples, bool)
        if self.per_stream[stream]:
            base = stream << STREAM_SHIFT
            first = self.bitmap.rank(base - 1) if base else 0
            picked = self.bitmap[first:first + self.per_stream[stream]]
            mask[np.asarray(picked.to_array(), np.uint64) - np.uint64(base)] = False
        return mask
