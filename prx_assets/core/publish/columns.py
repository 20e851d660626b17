"""Sidecar column streams: new columns for published MDS shards, joined by sample index on read.

A sidecar holds new columns (a new captioner's caption column, a text tower's latents) for
every sample of one physical stream of a shard set, without touching its shards:

- it is an MDS folder of its own (``index.json``, shards, ``samples.parquet``) with one shard
  per shard of the stream it extends, holding exactly as many samples in the same order,
  plus ``image_id`` so a reader can check the alignment;
- the shard set manifest lists it under the stream (``{"uri", "columns", "written_by"}`` in
  ``stream["sidecars"]``); later sets carry it on, and can add more;
- :class:`SidecarStream` (a ``Stream``) wraps each stream shard reader and its sidecar shard
  readers in one :class:`JoinedReader`, so ``StreamingDataset`` downloads, validates (hashes),
  caches and evicts the sidecar shard with the shard it extends, and yields joined samples.

This module does not import Dagster or Lance: it runs inside training jobs.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from streaming.base.format import reader_from_json
from streaming.base.format.base.reader import Reader

from prx_assets.compat.streaming import ExtraFilesStream
from prx_assets.core.config.storage import read_uri
from prx_assets.core.layout import SIDECAR_DIR

__all__ = ["SIDECAR_DIR", "JoinedReader", "SidecarMismatch", "SidecarStream"]
CACHE_PREFIX = "_prx_sidecar"  # remote sidecars are cached under <stream cache>/_prx_sidecar<k>/


class SidecarMismatch(ValueError):
    """A sidecar does not line up with the stream it extends (another stream's sidecar, or a modified set)."""


class JoinedReader(Reader):
    """A shard of a stream and the aligned shards of its sidecars, read as one shard."""

    def __init__(self, base: Reader, sidecars: Sequence[tuple[Reader, Sequence[str]]]) -> None:
        super().__init__(base.dirname, base.split, base.compression, base.hashes, base.samples, base.size_limit)
        self.base = base
        self.sidecars = [(reader, tuple(cols)) for reader, cols in sidecars]
        self.file_pairs = [*base.file_pairs, *(p for reader, _ in self.sidecars for p in reader.file_pairs)]

    def validate(self, allow_unsafe_types: bool) -> None:
        """Validate the stream shard and every sidecar shard."""
        self.base.validate(allow_unsafe_types)
        for reader, _ in self.sidecars:
            reader.validate(allow_unsafe_types)

    def decode_sample(self, data: bytes) -> dict[str, Any]:
        """Decode a sample of the stream shard (sidecar columns are added by :meth:`get_item`)."""
        return self.base.decode_sample(data)

    def get_sample_data(self, idx: int) -> bytes:
        """The stream shard's raw sample ``idx``."""
        return self.base.get_sample_data(idx)

    def get_item(self, idx: int) -> dict[str, Any]:
        """Sample ``idx`` of the shard with its sidecar columns joined."""
        sample = self.base.get_item(idx)
        for reader, cols in self.sidecars:
            extra = reader.get_item(idx)
            if extra.get("image_id") != sample.get("image_id"):
                raise SidecarMismatch(
                    f"sidecar shard {reader.file_pairs[0][0].basename} sample {idx} is "
                    f"{extra.get('image_id')!r} but the shard it extends has {sample.get('image_id')!r}; "
                    "the shard set was modified after publication: republish it")
            sample.update({c: extra[c] for c in cols})
        return sample


def _prefixed(info: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(info))
    for key in ("raw_data", "zip_data", "raw_meta", "zip_meta"):
        if out.get(key):
            out[key]["basename"] = f"{prefix}/{out[key]['basename']}"
    return out


class SidecarStream(ExtraFilesStream):
    """A ``Stream`` whose samples get the columns of its sidecars (see module docs).

    ``sidecars`` are the stream's manifest entries (``{"uri", "columns"}``), oldest first. A
    local stream reads sidecars where they are; a remote one caches them under its ``local``.
    """

    def __init__(self, *, sidecars: Sequence[Mapping[str, Any]] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sidecars = [{"uri": str(s["uri"]), "columns": list(s["columns"])} for s in sidecars]

    def _prefix(self, k: int) -> str:
        if self.remote is None:  # files are read in place: a path relative to the stream folder
            return os.path.relpath(self.sidecars[k]["uri"], os.path.join(self.local, self.split))
        return f"{CACHE_PREFIX}{k}"

    def extra_file(self, from_basename: str, to_basename: str | None) -> str | None:
        """Download a sidecar file (its basename starts with the sidecar's cache prefix); ``None``
        for the stream's own files."""
        for k, side in enumerate(self.sidecars):
            prefix = f"{CACHE_PREFIX}{k}/"
            if self.remote is not None and from_basename.startswith(prefix):
                remote = f"{side['uri'].rstrip('/')}/{from_basename[len(prefix):]}"
                local = os.path.join(self.local, self.split, to_basename or from_basename)
                os.makedirs(os.path.dirname(local), exist_ok=True)
                self.fetch(remote, local)
                return local
        return None

    def get_shards(self, world: Any, allow_unsafe_types: bool) -> list[Reader]:
        """The stream's shard readers, each joined with its sidecars' aligned shards."""
        shards = super().get_shards(world, allow_unsafe_types)
        if not self.sidecars:
            return shards
        per_sidecar = []
        for k, side in enumerate(self.sidecars):
            index = json.loads(read_uri(f"{side['uri'].rstrip('/')}/index.json"))
            infos = index["shards"]
            if len(infos) != len(shards) or any(int(i["samples"]) != s.samples for i, s in zip(infos, shards,
                                                                                              strict=True)):
                raise SidecarMismatch(
                    f"sidecar {side['uri']} has {[int(i['samples']) for i in infos][:8]} samples per shard, the "
                    f"stream {self.remote or self.local} has {[s.samples for s in shards][:8]}; it was written "
                    "for another stream or the set was modified after publication: republish it")
            readers = []
            for info in infos:
                reader = reader_from_json(self.local, self.split, _prefixed(info, self._prefix(k)))
                reader.validate(allow_unsafe_types)
                readers.append(reader)
            per_sidecar.append((readers, side["columns"]))
        return [JoinedReader(shard, [(readers[j], cols) for readers, cols in per_sidecar])
                for j, shard in enumerate(shards)]

    def set_up_local(self, shards: list[Reader], cache_usage_per_shard: Any) -> None:
        """As ``Stream.set_up_local``, with sidecar files read in place counted as present (never evicted)."""
        local_dirname = os.path.join(self.local, self.split)
        listing = set()
        for dirname, _, subfiles in os.walk(local_dirname):
            listing.update(os.path.join(dirname, f) for f in subfiles)
        if self.remote is None:
            for shard in shards:
                for raw, zipped in shard.file_pairs:
                    for info in (raw, zipped):
                        if info is not None:
                            path = os.path.join(self.local, self.split, info.basename)
                            if os.path.isfile(path):
                                listing.add(path)
        for i, shard in enumerate(shards):
            cache_usage_per_shard[i] = shard.set_up_local(listing, self.safe_keep_zip)
