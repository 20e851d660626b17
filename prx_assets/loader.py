"""The loader side of PRX shard sets: a ``StreamingDataset`` that reads their streams and skip lists.

A published shard set may be one MDS stream, or the streams of an earlier set plus a delta
stream and a skip list (see :mod:`prx_assets.core.publish.incremental`). This dataset
resolves a set's ``manifest.json`` into its physical streams, joins the columns added to
them later as sidecars (:mod:`prx_assets.core.publish.columns`), and never yields a skipped
sample, so opt-outs, removals and new caption columns take effect without rewriting a shard. Any trainer that
uses ``StreamingDataset`` changes two lines::

    from prx_assets.loader import PrxStreamingDataset
    dataset = PrxStreamingDataset(shard_sets=["s3://bucket/prx/mds/photos/<shard set id>"], batch_size=32)

or, for a mixture spec written by ``training_mixture``::

    dataset = PrxStreamingDataset(spec="s3://bucket/prx/mixtures/main/<version>.json", batch_size=32)

Every other ``StreamingDataset`` argument (shuffle, epoch_size, DataLoader workers, ranks)
works as usual; ``live_samples`` is the number of samples an epoch over every stream yields.
No Dagster import: this runs inside training jobs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from streaming import Stream, StreamingDataset

from prx_assets.core.manifests import (
    MixtureSpec,
    MixtureStream,
    ShardSetManifest,
    read_mixture_spec_at,
    read_shard_set_at,
    refuse_withdrawn,
)
from prx_assets.core.publish.columns import SidecarStream
from prx_assets.core.publish.streaming_shm import streaming_registration


@dataclass(frozen=True)
class ResolvedStreams:
    """``StreamingDataset`` streams for some shard sets, and which of their samples to skip."""

    streams: list[Stream]
    skip: list[tuple[int, int]]  # (index into streams, sample index within that stream)
    live_samples: int
    epoch_size: int | None = None


def streaming_endpoint() -> None:
    """Point mosaicml-streaming at ``AWS_ENDPOINT_URL`` (it reads ``S3_ENDPOINT_URL``) when one is set
    (GCS: it honours ``STORAGE_EMULATOR_HOST`` and Application Default Credentials itself)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        os.environ.setdefault("S3_ENDPOINT_URL", endpoint)
    gcs_downloader_picklable()


def gcs_downloader_picklable() -> None:
    """mosaicml-streaming 0.13's ``GCSDownloader`` keeps its google-cloud-storage client when pickled
    (its ``S3Downloader`` drops it), so a dataset that has read a ``gs://`` index cannot go to
    DataLoader workers ("Pickling client objects is explicitly not supported"). Drop it the same
    way; a worker builds its own on first download."""
    from streaming.base.storage.download import GCSDownloader

    if "__getstate__" in GCSDownloader.__dict__:
        return

    def __getstate__(self: Any) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_gcs_client"] = None
        return state

    GCSDownloader.__getstate__ = __getstate__  # type: ignore[method-assign]


def read_manifest(shard_set: str | ShardSetManifest) -> ShardSetManifest:
    """A shard set's manifest from its folder or ``manifest.json`` (local or object store); a set
    an erasure withdrew is refused (:class:`~prx_assets.errors.WithdrawnError`)."""
    manifest = shard_set if isinstance(shard_set, ShardSetManifest) else read_shard_set_at(shard_set)
    refuse_withdrawn(manifest.uri)
    return manifest


def _stream(uri: str, cache_root: str | None, n: int, sidecars: Sequence[dict[str, Any]] = (),
            **weights: Any) -> Stream:
    """One physical stream; a :class:`SidecarStream` when columns were added to it by sidecars."""
    kind, extra = (SidecarStream, {"sidecars": sidecars}) if sidecars else (Stream, {})
    if "://" in uri:
        gcs_downloader_picklable()
        local = os.path.join(cache_root or tempfile.mkdtemp(prefix="prx-mds-cache-"), f"s{n}")
        return kind(remote=uri, local=local, **extra, **weights)
    return kind(local=uri, **extra, **weights)


def resolve(shard_sets: Sequence[str | ShardSetManifest] = (), spec: MixtureSpec | None = None,
            cache_root: str | None = None) -> ResolvedStreams:
    """Physical streams and skip pairs of ``shard_sets`` (all samples), or of a mixture ``spec``
    (each logical stream's proportion / repeat / choose split over its physical streams by their
    live sample counts)."""
    logical: list[tuple[ShardSetManifest, MixtureStream | None]] = (
        [(read_manifest(s.uri), s) for s in spec.streams] if spec is not None
        else [(read_manifest(s), None) for s in shard_sets])
    streams: list[Stream] = []
    skip: list[tuple[int, int]] = []
    live_total = 0
    for manifest, weighting in logical:
        pairs = manifest.skip_pairs()
        physical = manifest.physical_streams()
        skipped = [sum(1 for s, _ in pairs if s == i) for i in range(len(physical))]
        live = [int(p["samples"]) - skipped[i] for i, p in enumerate(physical)]
        total = sum(live) or 1
        placed: dict[int, int] = {}
        for i, p in enumerate(physical):
            if live[i] == 0 and len(physical) > 1:
                continue  # every sample of this stream is skipped: leave it out
            placed[i] = len(streams)
            weights: dict[str, Any] = {}
            if weighting is not None and weighting.proportion is not None:
                weights["proportion"] = float(weighting.proportion) * live[i] / total
            elif weighting is not None and weighting.repeat is not None:
                weights["repeat"] = float(weighting.repeat)
            elif weighting is not None and weighting.choose is not None:
                weights["choose"] = round(int(weighting.choose) * live[i] / total)
            streams.append(_stream(p["uri"], cache_root, len(streams), p.get("sidecars") or (), **weights))
        skip += [(placed[s], idx) for s, idx in pairs if s in placed]
        live_total += sum(live)
    return ResolvedStreams(streams=streams, skip=skip, live_samples=live_total,
                           epoch_size=spec.epoch_size if spec is not None else None)


def release_shared_memory(dataset: StreamingDataset) -> None:
    """Close and unlink the shared memory a ``StreamingDataset`` created in this process.

    mosaicml-streaming registers every block with ``atexit``, so a process that opens many
    datasets (a Dagster run checking shard sets, a test session) would hold their file
    descriptors until it exits. Call this when done with a dataset that no worker or rank
    still uses.
    """
    import atexit

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

    for name in ("_locals_shm", "_shared_barrier", "_next_epoch", "_cache_usage", "_shard_states",
                 "_shard_access_times", "_resume_shm"):
        if hasattr(dataset, name):
            walk(getattr(dataset, name), 0)


class PrxStreamingDataset(StreamingDataset):
    """``StreamingDataset`` over PRX shard sets (or a mixture spec) that honours their skip lists."""

    def __init__(self, *, shard_sets: Sequence[str | ShardSetManifest] = (), spec: MixtureSpec | str | None = None,
                 cache_root: str | None = None, **kwargs: Any) -> None:
        if isinstance(spec, str):
            spec = read_mixture_spec_at(spec)
        if not shard_sets and spec is None:
            raise ValueError("PrxStreamingDataset needs shard_sets=[folder or URI, ...] or spec=<mixture spec>")
        streaming_endpoint()
        resolved = resolve(shard_sets, spec, cache_root)
        if resolved.epoch_size is not None:
            kwargs.setdefault("epoch_size", resolved.epoch_size)
        with streaming_registration():
            super().__init__(streams=resolved.streams, **kwargs)
        offsets = self.sample_offset_per_stream
        self.skipped_ids = frozenset(int(offsets[s]) + int(i) for s, i in resolved.skip)
        self.live_samples = int(self.num_samples) - len(self.skipped_ids)

    def close(self) -> None:
        """Release this process's shared memory of the dataset (see :func:`release_shared_memory`)."""
        release_shared_memory(self)

    def __enter__(self) -> PrxStreamingDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def live_indices(self) -> Iterator[int]:
        """Every sample index an epoch over all streams yields (for random access and checks)."""
        return (i for i in range(int(self.num_samples)) if i not in self.skipped_ids)

    def _each_sample_id(self, it: Any) -> Iterator[int]:  # the per-worker yield loop of StreamingDataset
        for sample_id in super()._each_sample_id(it):
            if sample_id not in self.skipped_ids:
                yield sample_id
