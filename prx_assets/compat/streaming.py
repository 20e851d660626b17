"""MosaicML streaming 0.13: the four places where prx_assets reaches past its public API.

- **Extra files per stream** (sidecar columns, :mod:`prx_assets.core.publish.columns`): a
  ``Stream`` downloads its shards through ``Stream._download_file`` and its ``_downloader``;
  there is no hook for other files a stream's shards need (no upstream issue filed).
- **A shard cut at a given sample** (:func:`flush_shard`): ``MDSWriter.flush_shard`` writes the
  pending samples but leaves them in the writer's cache until ``_reset_cache``; streaming itself
  calls both (``write`` and ``finish``). A republish that keeps shard boundaries needs it.
- **The shared memory of a dataset** (:func:`release_shared_memory`): streaming frees a
  dataset's segments only at process exit (mosaicml/streaming#781, #767, open).
- **A ``GCSDownloader`` that pickles** (:func:`gcs_downloader_picklable`): 0.13 keeps its
  google-cloud-storage client in its state, so a dataset that read a ``gs://`` index cannot go
  to DataLoader workers; ``S3Downloader`` drops its client the same way (no upstream issue filed).
"""

from __future__ import annotations

import atexit
from typing import Any

from streaming import Stream
from streaming.base.format.base.writer import JointWriter
from streaming.base.util import retry

from prx_assets.compat import guard

CHECKED = ">=0.13,<0.14"
UPSTREAM = "mosaicml/streaming#781"
#: The attributes of a ``StreamingDataset`` that hold its shared memory in 0.13.
SHARED_ATTRIBUTES = ("_locals_shm", "_shared_barrier", "_next_epoch", "_cache_usage", "_shard_states",
                     "_shard_access_times", "_resume_shm")


def _guard(what: str) -> None:
    guard("mosaicml-streaming", CHECKED, what, UPSTREAM)


class ExtraFilesStream(Stream):
    """A ``Stream`` that can download files besides its shards: a subclass answers
    :meth:`extra_file` for the basenames it owns and fetches them with :meth:`fetch`."""

    def __init__(self, **kwargs: Any) -> None:
        _guard("ExtraFilesStream (files besides a stream's shards)")
        super().__init__(**kwargs)

    def extra_file(self, from_basename: str, to_basename: str | None) -> str | None:
        """The local path of ``from_basename`` once downloaded, or ``None`` when it is a shard file."""
        return None

    def _download_file(self, from_basename: str, to_basename: str | None = None) -> str:
        got = self.extra_file(from_basename, to_basename)
        return got if got is not None else super()._download_file(from_basename, to_basename)

    def fetch(self, remote: str, local: str) -> None:
        """Download ``remote`` to ``local`` with the stream's downloader, retries and timeout."""
        downloader = self._downloader
        retry(clean_up_fn=downloader.clean_up, num_attempts=self.download_retry)(
            lambda: downloader.download(remote, local, self.download_timeout))()


def flush_shard(writer: JointWriter) -> None:
    """Write ``writer``'s pending samples as one shard and start the next one empty."""
    _guard("flush_shard (a shard cut at a given sample)")
    writer.flush_shard()
    writer._reset_cache()


def release_shared_memory(dataset: Any) -> None:
    """Close and unlink the shared memory a ``StreamingDataset`` created in this process.

    Streaming registers every block with ``atexit``, so a process that opens many datasets (a
    Dagster run checking shard sets, a test session) would hold their file descriptors until it
    exits. Call this when no worker or rank still uses the dataset.
    """
    _guard("release_shared_memory")
    from streaming.base.shared.memory import SharedMemory

    seen: set[int] = set()

    def walk(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        if isinstance(obj, SharedMemory):
            atexit.unregister(obj.cleanup)
            obj.cleanup()
            return
        for value in getattr(obj, "__dict__", {}).values():
            if type(value).__module__.startswith("streaming.base.shared"):
                walk(value, depth + 1)

    for name in SHARED_ATTRIBUTES:
        if hasattr(dataset, name):
            walk(getattr(dataset, name), 0)


def gcs_downloader_picklable() -> None:
    """Make streaming's ``GCSDownloader`` drop its client when pickled (a worker builds its own on
    its first download), as its ``S3Downloader`` does. Idempotent."""
    _guard("gcs_downloader_picklable")
    from streaming.base.storage.download import GCSDownloader

    if "__getstate__" in GCSDownloader.__dict__:
        return

    def __getstate__(self: Any) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_gcs_client"] = None
        return state

    GCSDownloader.__getstate__ = __getstate__  # type: ignore[method-assign]
