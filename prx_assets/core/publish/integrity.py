"""Shard files checked against the per-shard hashes MDS recorded when it wrote them.

``MDSWriter`` records a hash of every shard file in its stream's ``index.json`` (``xxh64`` by
default, ``ShardSettings.hashes``). A read-back that decodes a sample of samples cannot see a
corrupt shard it does not sample; hashing every shard file of every stream a set reads (its own,
the base streams a delta reuses, their sidecars) costs one read of the bytes and no decoding, and
finds any flipped byte. The hash function is streaming's own (``streaming.base.hashing.get_hash``),
the one that wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prx_assets.core.config.storage import ObjectStoreSettings, is_remote
from prx_assets.core.config.stores import split_object_uri, store_for
from prx_assets.core.manifests import ShardSetManifest


@dataclass(frozen=True)
class ShardCheck:
    """What hashing one stream's shard files found."""

    stream: str
    shards: int
    bytes: int
    corrupt: tuple[str, ...]  # shard files whose bytes do not hash to the recorded value, or are missing


def _read(uri: str) -> bytes:
    if is_remote(uri):
        _, bucket, key = split_object_uri(uri)
        return store_for(uri, ObjectStoreSettings.from_env()).get(bucket, key)
    return Path(uri).read_bytes()


def _shards(index: dict[str, Any]) -> Iterator[tuple[str, dict[str, str]]]:
    """``(file, {algorithm: hash})`` of every file an MDS ``index.json`` lists (raw or compressed)."""
    for shard in index.get("shards", []):
        data = shard.get("zip_data") or shard.get("raw_data") or {}
        if data.get("basename"):
            yield data["basename"], dict(data.get("hashes") or {})


def check_stream(uri: str) -> ShardCheck:
    """Hash every shard file of the MDS stream at ``uri`` against its ``index.json``."""
    from streaming.base.hashing import get_hash

    base = uri.rstrip("/")
    index = json.loads(_read(f"{base}/index.json"))
    corrupt, shards, size = [], 0, 0
    for name, hashes in _shards(index):
        shards += 1
        try:
            data = _read(f"{base}/{name}")
        except (OSError, FileNotFoundError) as e:
            corrupt.append(f"{base}/{name} (unreadable: {e})")
            continue
        size += len(data)
        bad = [algo for algo, want in hashes.items() if get_hash(algo, data) != want]
        if bad:
            corrupt.append(f"{base}/{name} ({', '.join(bad)} mismatch)")
    return ShardCheck(stream=base, shards=shards, bytes=size, corrupt=tuple(corrupt))


def set_streams(manifest: ShardSetManifest) -> list[str]:
    """Every MDS stream a shard set's readers read: its physical streams (base ones included) and
    their sidecar streams."""
    out = []
    for s in manifest.physical_streams():
        out.append(str(s["uri"]))
        out += [str(side["uri"]) for side in s.get("sidecars") or []]
    return out


def check_shard_set(manifest: ShardSetManifest) -> list[ShardCheck]:
    """:func:`check_stream` over every stream the set reads."""
    return [check_stream(uri) for uri in set_streams(manifest)]
