"""Erasure in published shard sets: the samples of erased images blanked in the shards that hold them.

A legal removal must take an image's bytes out of every file. The streams of shard sets are
shared between set versions (a delta reuses its base's streams; sidecars are aligned with them by
sample index), so an erased sample is *blanked where it is* rather than removed: each shard file
that holds one is read with streaming's own reader and written again by ``MDSWriter`` with that
sample's fields emptied (its ``image_id`` kept, for the record), under the same name, and the
stream's ``index.json`` entry (sizes, hashes) replaced, so the integrity checks keep passing.
Sample indices do not move, so skip lists, sidecars and ``samples.parquet`` stay aligned, and only
the shards that held an erased sample are rewritten: one shard (``size_limit``, 64 MB by default)
in memory at a time.

A set version whose skip list does not hide every blanked sample it reads would yield empty
samples: it is *withdrawn* (``withdrawn.json`` beside its manifest) and the loader refuses it and
every mixture spec that names it. The next run publishes the current subsets as new versions whose
skip lists hide the erased images.

Shard sets on an object-store data root are not rewritten by this module (it works on the local
files of a folder or shared-filesystem root).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.manifests import ShardSetManifest
from prx_assets.core.publish.incremental import SAMPLES_FILE
from prx_assets.errors import PrxError

__all__ = ["StreamErasure", "blank_streams", "withdraw_sets"]
#: Scratch folders an erasure writes beside the shards it rewrites (removed as it goes, and by the next one).
SCRATCH_PREFIX = ".erase-"


@dataclass(frozen=True)
class StreamErasure:
    """What blanking did to one MDS stream folder."""

    stream: str
    positions: tuple[int, ...]  # sample indices blanked
    shards_rewritten: tuple[str, ...]
    shards_total: int


def stream_folders(root: DataRoot) -> Iterator[Path]:
    """Every MDS stream folder under the data root's ``mds/`` (sets, deltas, sidecars, bucket
    streams, staging leftovers): each folder holding an ``index.json``."""
    base = Path(root.join(layout.MDS_DIR))
    if base.is_dir():
        yield from sorted(p.parent for p in base.rglob(layout.MDS_INDEX) if not _scratch(p))


def _scratch(path: Path) -> bool:
    """Inside a scratch folder an erasure writes and removes (``.erase-*``)."""
    return any(part.startswith(SCRATCH_PREFIX) for part in path.parts)


def remove_scratch(root: DataRoot) -> int:
    """Remove the scratch folders an interrupted erasure left (they may hold decoded erased bytes)."""
    base = Path(root.join(layout.MDS_DIR))
    left = sorted(p for p in base.rglob(f"{SCRATCH_PREFIX}*") if p.is_dir()) if base.is_dir() else []
    for p in left:
        shutil.rmtree(p, ignore_errors=True)
    return len(left)


def erased_positions(folder: Path, ids: set[str]) -> list[int]:
    """Sample indices of ``ids`` in a stream: from its ``samples.parquet``, else from the shards'
    own ``image_id`` column."""
    samples = folder / SAMPLES_FILE
    if samples.is_file():
        col = pq.read_table(samples, columns=["image_id"]).column("image_id")
        hit = pc.is_in(col, value_set=pa.array(sorted(ids), pa.string()))
        return [int(i) for i in np.flatnonzero(hit.to_numpy(zero_copy_only=False))]
    out, start = [], 0
    for entry in json.loads((folder / layout.MDS_INDEX).read_text())["shards"]:
        if "image_id" in entry.get("column_names", []):
            try:
                with _shard_reader(folder, entry) as reader:
                    out += [start + i for i in range(entry["samples"]) if reader.get_item(i)["image_id"] in ids]
            except Exception as e:  # unreadable: it may hold one (see _drop_unreadable)
                if ".quarantine" not in folder.parts:
                    _drop_unreadable(folder, entry, e)
                out += list(range(start, start + entry["samples"]))
        start += entry["samples"]
    return out


class _shard_reader:
    """Streaming's reader for one shard of ``folder`` (a compressed one decompressed to a temp folder)."""

    def __init__(self, folder: Path, entry: dict[str, Any]) -> None:
        self.folder, self.entry, self.tmp = folder, entry, None

    def __enter__(self) -> Any:
        from streaming.base.compression import decompress
        from streaming.base.format import reader_from_json

        raw = self.entry["raw_data"]["basename"]
        where = self.folder
        if not (self.folder / raw).is_file() and self.entry.get("zip_data"):
            self.tmp = tempfile.TemporaryDirectory(dir=self.folder, prefix=SCRATCH_PREFIX)
            where = Path(self.tmp.name)
            data = (self.folder / self.entry["zip_data"]["basename"]).read_bytes()
            (where / raw).parent.mkdir(parents=True, exist_ok=True)  # a merged index names part-*/shard.*
            (where / raw).write_bytes(decompress(self.entry["compression"], data))
        return reader_from_json(str(where), None, self.entry)

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            self.tmp.cleanup()


def blank_value(name: str, encoding: str, value: Any) -> Any:
    """The empty value of an MDS column (``image_id`` is kept: it names what was erased)."""
    if name == "image_id":
        return value
    if encoding == "bytes":
        return b""
    if encoding == "str":
        return ""
    if encoding.startswith("ndarray"):
        arr = np.asarray(value)
        return np.zeros_like(arr) if len(encoding.split(":")) == 3 else np.zeros(0, arr.dtype)
    if encoding == "json":
        return {}
    if isinstance(value, int | float | np.number):
        return type(value)(0)
    raise ValueError(f"cannot blank MDS column {name!r} of encoding {encoding!r}: erasure knows bytes, str, "
                     "numbers, ndarray and json columns (fix: add the encoding to blank_value)")


def rewrite_shard(folder: Path, entry: dict[str, Any], blank_at: set[int]) -> dict[str, Any]:
    """Rewrite one shard of ``folder`` with the samples at ``blank_at`` (indices within the shard)
    blanked, under the same file names; its new ``index.json`` entry."""
    from streaming import MDSWriter

    names, encodings = entry["column_names"], entry["column_encodings"]
    with _shard_reader(folder, entry) as reader:
        samples = [reader.get_item(i) for i in range(entry["samples"])]
    for i in blank_at:
        samples[i] = {n: blank_value(n, e, samples[i][n]) for n, e in zip(names, encodings, strict=True)}
    with tempfile.TemporaryDirectory(dir=folder, prefix=SCRATCH_PREFIX) as tmp:
        with MDSWriter(out=tmp, columns=dict(zip(names, encodings, strict=True)), compression=entry.get("compression"),
                       hashes=entry.get("hashes") or None, size_limit=None) as writer:
            for s in samples:
                writer.write(s)
        (new,) = json.loads((Path(tmp) / layout.MDS_INDEX).read_text())["shards"]
        for kind in ("raw_data", "zip_data"):
            if new.get(kind) and entry.get(kind):
                written = Path(tmp) / new[kind]["basename"]
                if written.is_file():
                    os.replace(written, folder / entry[kind]["basename"])
                elif (folder / entry[kind]["basename"]).is_file():  # a decompressed copy of the old bytes
                    (folder / entry[kind]["basename"]).unlink()
                new[kind]["basename"] = entry[kind]["basename"]
    return new


def _drop_unreadable(folder: Path, entry: dict[str, Any], error: Exception) -> str:
    """A shard holding an erased sample that cannot be read: deleted when its set is quarantined
    (``doctor --verify --repair`` moved it aside as corrupt: nothing reads it), else refused."""
    name = entry["raw_data"]["basename"]
    if ".quarantine" not in folder.parts:
        raise PrxError(f"cannot read shard {folder / name} to blank the erased samples in it ({type(error).__name__}: "
                       f"{error}); fix: run `prx-assets doctor --verify --repair` (it quarantines corrupt shard sets), "
                       "then erase again") from error
    for kind in ("raw_data", "zip_data"):
        if entry.get(kind):
            (folder / entry[kind]["basename"]).unlink(missing_ok=True)
    return f"{name} (unreadable, in quarantine: deleted)"


def blank_stream(folder: Path, ids: set[str], done: dict[str, dict[str, Any]] | None = None) -> StreamErasure | None:
    """Blank the samples of ``ids`` in one stream folder; ``None`` when it holds none of them.
    ``done`` maps shard files already rewritten by this erasure (a set's merged ``index.json``
    names its parts' shard files) to their new entry: those only get their entry updated."""
    done = {} if done is None else done
    positions = erased_positions(folder, ids)
    if not positions:
        return None
    index_path = folder / layout.MDS_INDEX
    index = json.loads(index_path.read_text())
    rewritten, start = [], 0
    for n, entry in enumerate(index["shards"]):
        local = {p - start for p in positions if start <= p < start + entry["samples"]}
        real = os.path.realpath(folder / entry["raw_data"]["basename"])
        if local and real in done:
            index["shards"][n] = {**done[real], **{k: {**done[real][k], "basename": entry[k]["basename"]}
                                                   for k in ("raw_data", "zip_data") if done[real].get(k)}}
        elif local:
            try:
                index["shards"][n] = done[real] = rewrite_shard(folder, entry, local)
                rewritten.append(entry["raw_data"]["basename"])
            except Exception as e:  # a corrupt shard: it cannot be read to be blanked
                rewritten.append(_drop_unreadable(folder, entry, e))
        start += entry["samples"]
    tmp = index_path.with_name(f".{layout.MDS_INDEX}.erase")
    tmp.write_text(json.dumps(index, sort_keys=True))
    os.replace(tmp, index_path)
    return StreamErasure(str(folder), tuple(positions), tuple(rewritten), len(index["shards"]))


def blank_streams(root: DataRoot, ids: set[str]) -> list[StreamErasure]:
    """Blank the samples of ``ids`` in every stream under the data root (see the module docs)."""
    if root.remote:
        raise PrxError(f"erasing from shard sets on an object-store root ({root.uri}) is not supported: "
                       "run the erasure against the root mounted as a folder (e.g. a shared filesystem)")
    remove_scratch(root)
    rewritten: dict[str, dict[str, Any]] = {}
    return [e for folder in stream_folders(root) if (e := blank_stream(folder, ids, rewritten)) is not None]


def _skipped(manifest: ShardSetManifest) -> set[tuple[int, int]]:
    try:
        return set(manifest.skip_pairs())
    except (OSError, ValueError):  # a skip list gone or modified hides nothing: withdraw on the streams alone
        return set()


def exposed(manifest: ShardSetManifest, blanked: dict[str, set[int]]) -> int:
    """How many blanked samples reading ``manifest`` would yield (those its skip list does not hide)."""
    skipped = _skipped(manifest)
    n = 0
    for i, stream in enumerate(manifest.physical_streams()):
        hit = set(blanked.get(os.path.realpath(stream["uri"]), set()))
        for side in stream.get("sidecars") or ():
            hit |= blanked.get(os.path.realpath(side["uri"]), set())
        n += sum(1 for p in hit if (i, p) not in skipped)
    return n


def withdraw_sets(root: DataRoot, erased: list[StreamErasure], request_id: str) -> list[dict[str, Any]]:
    """Withdraw every published set version that would yield a blanked sample; what was withdrawn."""
    blanked = {os.path.realpath(e.stream): set(e.positions) for e in erased}
    out = []
    for recipe in root.folders(layout.MDS_DIR):
        for set_id in root.folders(layout.recipe_shards_dir(recipe)):
            rel = layout.shard_set_manifest(recipe, set_id)
            if set_id.startswith(".") or not root.exists(rel):
                continue
            manifest = ShardSetManifest.from_json(root.read_bytes(rel), root.join(rel))
            n = exposed(manifest, blanked)
            if n:
                doc = {"request_id": request_id, "samples": n, "shard_set_id": set_id, "recipe": recipe}
                root.write_bytes(layout.withdrawal(recipe, set_id), json.dumps(doc, indent=1).encode())
                out.append(doc)
    return out
