"""Synthetic shard sets for loader tests and benchmarks: MDS streams, a skip list, a manifest.

Each sample carries ``uid`` (its index over the whole set, stream by stream), ``stream`` and a
``payload`` of a chosen size, so a test can tell exactly which samples an epoch yielded. The
set is laid out as the publisher lays out a delta: physical streams listed in
``manifest.json``, skipped samples in ``skip.parquet`` with the sha256 the loader checks.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prx_assets.core import layout
from prx_assets.core.manifests import MixtureSpec, MixtureStream, ShardSetManifest

#: Skip patterns :func:`skip_pattern` knows.
PATTERNS = ("none", "spread", "clustered")


def skip_pattern(samples: int, share: float, pattern: str, seed: int = 0) -> np.ndarray:
    """Sorted sample indices to skip: ``share`` of ``samples``, ``spread`` uniformly at random or
    ``clustered`` in a few runs (as one contributor's opt-out is)."""
    count = round(samples * share)
    if pattern == "none" or count == 0:
        return np.zeros(0, np.int64)
    rng = np.random.default_rng(seed)
    if pattern == "spread":
        return np.sort(rng.choice(samples, count, replace=False)).astype(np.int64)
    if pattern != "clustered":
        raise ValueError(f"skip pattern {pattern!r}: expected one of {PATTERNS}")
    runs = max(1, min(8, count // 16))
    starts = np.sort(rng.choice(samples - count // runs, runs, replace=False))
    picked = np.unique(np.concatenate([np.arange(s, s + count // runs) for s in starts]))
    extra = np.setdiff1d(np.arange(samples), picked)[:count - len(picked)]
    return np.sort(np.concatenate([picked, extra])).astype(np.int64)


def write_stream(folder: Path, first_uid: int, samples: int, name: str, payload_bytes: int = 16,
                 size_limit: int = 1 << 14) -> None:
    """One MDS stream of ``samples`` samples (uids from ``first_uid``), in shards of ``size_limit`` bytes."""
    from streaming import MDSWriter

    pad = bytes(payload_bytes)
    with MDSWriter(out=str(folder), columns={"uid": "int64", "stream": "str", "payload": "bytes"},
                   size_limit=size_limit) as writer:
        for uid in range(first_uid, first_uid + samples):
            writer.write({"uid": uid, "stream": name, "payload": pad})


def write_shard_set(folder: Path, stream_samples: Sequence[int], skip: Sequence[np.ndarray] = (),
                    recipe: str = "synthetic", payload_bytes: int = 16, size_limit: int = 1 << 14,
                    first_uid: int = 0) -> ShardSetManifest:
    """A shard set of ``len(stream_samples)`` physical streams, ``skip[i]`` hiding samples of stream ``i``;
    uids count from ``first_uid``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    streams = []
    uid = first_uid
    for i, n in enumerate(stream_samples):
        write_stream(folder / f"s{i}", uid, n, f"{recipe}/s{i}", payload_bytes, size_limit)
        streams.append({"uri": str(folder / f"s{i}"), "samples": n, "role": "base" if i == 0 else "delta"})
        uid += n
    pairs = [(i, idx) for i, hidden in enumerate(skip) for idx in np.asarray(hidden).tolist()]
    skip_uri = sha = None
    if pairs:
        table = pa.table({"stream": pa.array([p[0] for p in pairs], pa.int32()),
                          "index": pa.array([p[1] for p in pairs], pa.int64()),
                          "image_id": pa.array([f"{recipe}-{s}-{i}" for s, i in pairs], pa.string())})
        sink = io.BytesIO()
        pq.write_table(table, sink)
        data = sink.getvalue()
        (folder / "skip.parquet").write_bytes(data)
        skip_uri, sha = str(folder / "skip.parquet"), hashlib.sha256(data).hexdigest()
    manifest = ShardSetManifest(
        shard_set_id=hashlib.sha256(f"{recipe}:{list(stream_samples)}:{len(pairs)}".encode()).hexdigest()[:16],
        recipe=recipe, subset_id="synthetic", lance_uri="", lance_version=0, uri=str(folder), samples=uid - first_uid,
        shards=0, bytes=0, streams=tuple(streams), skip_uri=skip_uri, skip_sha256=sha, skipped=len(pairs),
        layout="delta" if pairs or len(streams) > 1 else "full")
    (folder / layout.SHARD_SET_MANIFEST).write_bytes(manifest.to_json())
    return manifest


def write_mixture(path: Path, name: str, streams: Sequence[tuple[ShardSetManifest, dict[str, float | int]]],
                  epoch_size: int | None = None) -> MixtureSpec:
    """A mixture spec over synthetic sets (``weighting``: ``{"proportion": 0.7}``, ``{"repeat": 2}``,
    ``{"choose": 500}`` or ``{}``), written as JSON to ``path``."""
    mixed = tuple(MixtureStream(recipe=m.recipe, shard_set_id=m.shard_set_id, uri=m.uri, samples=m.samples, **w)
                  for m, w in streams)
    epoch = epoch_size or sum(m.samples - m.skipped for m, _ in streams)
    spec = MixtureSpec(name=name, epoch_size=epoch, streams=mixed,
                       expected_samples_per_stream={m.recipe: m.samples - m.skipped for m, _ in streams}).versioned()
    path.write_bytes(spec.to_json())
    return spec
