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

A trainer whose dataset already subclasses ``StreamingDataset`` puts :class:`PrxShardSets` first
among its bases instead. Every other ``StreamingDataset`` argument (shuffle, epoch_size,
batching_method, DataLoader workers, ranks, state_dict) works as usual, over live samples
only: skipped samples leave the epoch before streaming splits it over ranks and workers.
``live_samples`` is the number of samples an epoch over every stream once holds.
No Dagster import: this runs inside training jobs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from streaming import Stream, StreamingDataset

from prx_assets.compat.streaming import gcs_downloader_picklable, release_shared_memory
from prx_assets.core.manifests import (
    MixtureSpec,
    MixtureStream,
    ShardSetManifest,
    read_mixture_spec_at,
    read_shard_set_at,
    refuse_withdrawn,
)
from prx_assets.core.publish.arrangement import (
    device_batch_quantum,
    live_choose,
    live_per_shard,
    resample_live,
    trim_draw,
)
from prx_assets.core.publish.columns import SidecarStream
from prx_assets.core.publish.skiplist import SkipList
from prx_assets.core.publish.streaming_shm import streaming_registration


@dataclass(frozen=True)
class ResolvedStreams:
    """``StreamingDataset`` streams for some shard sets, and which of their samples to skip."""

    uris: list[str]  # per stream
    sidecars: list[Sequence[dict[str, Any]]]  # per stream: its sidecar entries
    skip_streams: np.ndarray  # index into streams, per skipped sample
    skip_indices: np.ndarray  # sample index within that stream
    live: list[int]  # live samples per stream
    weights: list[dict[str, Any]]  # proportion / repeat / choose keyword per stream (or none)
    epoch_size: int | None = None

    @property
    def live_samples(self) -> int:
        """Samples an epoch over every stream once holds."""
        return sum(self.live)

    def streams(self, cache_root: str | None = None, chosen: Sequence[int] | None = None) -> list[Stream]:
        """The ``Stream`` objects, weighted as resolved or by absolute counts ``chosen``."""
        return [_stream(uri, cache_root, n, side, **(self.weights[n] if chosen is None else {"choose": chosen[n]}))
                for n, (uri, side) in enumerate(zip(self.uris, self.sidecars, strict=True))]


def streaming_endpoint() -> None:
    """Point mosaicml-streaming at ``AWS_ENDPOINT_URL`` (it reads ``S3_ENDPOINT_URL``) when one is set
    (GCS: it honours ``STORAGE_EMULATOR_HOST`` and Application Default Credentials itself)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        os.environ.setdefault("S3_ENDPOINT_URL", endpoint)
    gcs_downloader_picklable()


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
            phase: str | None = None) -> ResolvedStreams:
    """Physical streams and skipped samples of ``shard_sets`` (all samples), or of a mixture ``spec``
    (of its ``phase`` when it has phases; each logical stream's proportion / repeat / choose split
    over its physical streams by their live sample counts)."""
    in_phase = spec.phase(phase) if spec is not None else None
    mixed = in_phase.streams if in_phase is not None else spec.streams if spec is not None else ()
    logical: list[tuple[ShardSetManifest, MixtureStream | None]] = (
        [(read_manifest(s.uri), s) for s in mixed] if spec is not None
        else [(read_manifest(s), None) for s in shard_sets])
    uris: list[str] = []
    sidecars: list[Sequence[dict[str, Any]]] = []
    skip_streams: list[np.ndarray] = []
    skip_indices: list[np.ndarray] = []
    lives: list[int] = []
    weights: list[dict[str, Any]] = []
    for manifest, weighting in logical:
        hidden_streams, hidden = manifest.skip_arrays()
        physical = manifest.physical_streams()
        skipped = np.bincount(hidden_streams, minlength=len(physical))
        live = [int(p["samples"]) - int(skipped[i]) for i, p in enumerate(physical)]
        total = sum(live) or 1
        placed = np.full(len(physical), -1, np.int64)
        for i, p in enumerate(physical):
            if live[i] == 0 and len(physical) > 1:
                continue  # every sample of this stream is skipped: leave it out
            placed[i] = len(uris)
            weights.append(_weight(weighting, live[i], total))
            lives.append(live[i])
            uris.append(p["uri"])
            sidecars.append(p.get("sidecars") or ())
        kept = placed[hidden_streams] >= 0 if len(hidden_streams) else np.zeros(0, bool)
        skip_streams.append(placed[hidden_streams[kept]])
        skip_indices.append(hidden[kept])
    return ResolvedStreams(uris=uris, sidecars=sidecars, skip_streams=np.concatenate(skip_streams or [np.zeros(0, np.int64)]),
                           skip_indices=np.concatenate(skip_indices or [np.zeros(0, np.int64)]), live=lives,
                           weights=weights, epoch_size=in_phase.epoch_size if in_phase is not None else
                           spec.epoch_size if spec is not None else None)


def _weight(weighting: MixtureStream | None, live: int, total: int) -> dict[str, Any]:
    """One physical stream's share of its logical stream's weighting (split by live samples)."""
    if weighting is not None and weighting.proportion is not None:
        return {"proportion": float(weighting.proportion) * live / total}
    if weighting is not None and weighting.repeat is not None:
        return {"repeat": float(weighting.repeat)}
    if weighting is not None and weighting.choose is not None:
        return {"choose": round(int(weighting.choose) * live / total)}
    return {}



class PrxShardSets:
    """Mixin that gives a ``StreamingDataset`` class (or any subclass of it) PRX shard sets: their
    streams, sidecar columns and skip lists.

    Put it first among the bases; the constructor takes ``shard_sets=[...]`` or ``spec=`` (a
    mixture spec or its URI; ``phase=`` names the phase of a phased mixture), ``cache_root=``
    (where remote streams are cached), and passes every other keyword to the dataset class::

        class TrainingData(PrxShardSets, StreamingProcessedDataset):
            pass

        data = TrainingData(spec="s3://bucket/prx/mixtures/main/<version>.json", batch_size=32, shuffle=True)

    Skipped samples leave the epoch where streaming arranges it (:mod:`prx_assets.core.publish.arrangement`):
    stream weights, ``epoch_size`` and every batching method count live samples only, every rank
    gets the same number of batches, and ``state_dict`` / ``load_state_dict`` resume exactly.
    """

    skip_list: SkipList | None
    live_samples: int

    def __init__(self, *, shard_sets: Sequence[str | ShardSetManifest] = (), spec: MixtureSpec | str | None = None,
                 phase: str | None = None, cache_root: str | None = None, **kwargs: Any) -> None:
        if isinstance(spec, str):
            spec = read_mixture_spec_at(spec)
        if not shard_sets and spec is None:
            raise ValueError(f"{type(self).__name__} needs shard_sets=[folder or URI, ...] or spec=<mixture spec>")
        streaming_endpoint()
        resolved = resolve(shard_sets, spec, phase)
        absolute = any("repeat" in w or "choose" in w for w in resolved.weights)
        asked = kwargs.pop("epoch_size", None)
        epoch_size = asked or (None if absolute else resolved.epoch_size)
        skipping = bool(len(resolved.skip_indices))
        chosen = None
        seed = int(kwargs.get("shuffle_seed", 9176))
        if absolute and asked:  # repeat / choose streams keep their shares of an epoch of the size asked
            shares = live_choose(resolved.weights, resolved.live, None, seed)
            chosen = live_choose([{"proportion": max(c, 1)} for c in shares], resolved.live, asked, seed)
        elif skipping:  # weights over live samples, as absolute counts (streaming's own arithmetic)
            chosen = live_choose(resolved.weights, resolved.live, epoch_size, seed)
        elif epoch_size is not None:
            kwargs["epoch_size"] = epoch_size
        with streaming_registration():
            super().__init__(streams=resolved.streams(cache_root, chosen), **kwargs)  # type: ignore[call-arg]
        self.skip_list = SkipList.build(resolved.skip_streams, resolved.skip_indices, len(resolved.uris)) \
            if skipping else None
        self._live_per_shard = live_per_shard(self, self.skip_list) if self.skip_list is not None else None
        self.live_samples = resolved.live_samples

    def resample_streams(self, epoch: int, stream_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Streaming's per-epoch draw of each stream's samples, over live samples only; under
        ``device_per_stream`` each stream's draw is a whole number of global batches
        (:func:`~prx_assets.core.publish.arrangement.device_batch_quantum`)."""
        if self.skip_list is None:
            units, ids = super().resample_streams(epoch, stream_id)  # type: ignore[misc]
        else:
            units, ids = resample_live(self, self.skip_list, self._live_per_shard, epoch, stream_id)
        if stream_id is not None and self.batching_method == "device_per_stream":  # type: ignore[attr-defined]
            seed = int(self.shuffle_seed) + epoch * 1_000_003 + stream_id  # type: ignore[attr-defined]
            units, ids = trim_draw(units, ids, device_batch_quantum(self), seed)
        return units, ids

    def is_skipped(self, sample_id: int) -> bool:
        """Whether the dataset's sample ``sample_id`` (random-access index) is hidden by a skip list."""
        if self.skip_list is None:
            return False
        stream = int(np.searchsorted(self.sample_offset_per_stream, sample_id, side="right")) - 1  # type: ignore[attr-defined]
        return self.skip_list.contains(stream, int(sample_id - self.sample_offset_per_stream[stream]))  # type: ignore[attr-defined]

    def live_indices(self) -> Iterator[int]:
        """Every sample index an epoch over all streams yields (for random access and checks)."""
        return (i for i in range(int(self.num_samples)) if not self.is_skipped(i))  # type: ignore[attr-defined]

    def close(self) -> None:
        """Release this process's shared memory of the dataset (see :func:`release_shared_memory`)."""
        release_shared_memory(self)  # type: ignore[arg-type]

    def __enter__(self) -> PrxShardSets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PrxStreamingDataset(PrxShardSets, StreamingDataset):
    """``StreamingDataset`` over PRX shard sets (or a mixture spec); see :class:`PrxShardSets`."""
