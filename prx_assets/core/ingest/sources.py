"""Source readers: the base class, keys, and the object-store prefix, Parquet and WebDataset readers
(folders: :mod:`.folder`; which reader serves which kind: :mod:`.readers`).

A source is listed as *units* (a file, a Parquet row group, a tar shard); ingest batches
group units. Reading a unit yields :class:`SourceItem` objects, one per candidate image,
whose bytes may be fetched lazily (so worker threads do the I/O in parallel).

Unit and item keys are relative to the source's location (its folder, bucket prefix, Parquet or
tar folder): ``people/a.jpg``, ``2024/x.parquet#rg=3``, ``shard-0001.tar#sample_07``. An image's id
is a hash of its source's name and its item key, so a source mounted elsewhere or copied to
another prefix, and re-pointed in sources.yaml, keeps every id and is not ingested again. Keys
written before keys were relative (absolute paths and URIs in older manifests) are read as they
are (:func:`locate`). Items also carry ``uri``, where they were read from this time (kept in the
lab as lineage).

Add a kind by writing a :class:`SourceReader` subclass and registering it in
:data:`~prx_assets.core.ingest.readers.READERS`.
"""

from __future__ import annotations

import io
import json
import logging
import os
import posixpath
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from prx_assets.core.config.project import SourceConfig
from prx_assets.core.config.storage import ObjectStoreSettings, is_remote
from prx_assets.core.config.stores import split_object_uri, store_for
from prx_assets.errors import ConfigError, SourceError

log = logging.getLogger(__name__)

S3ClientFactory = Callable[[], Any]


@dataclass(frozen=True)
class Unit:
    """One listable piece of a source: a file, a Parquet row group, or a tar shard.

    ``key`` identifies the unit within the source and never changes; ``size`` and
    ``stamp`` (mtime or ETag) detect changed files; ``weight`` counts toward the
    batch size.
    """

    key: str
    size: int
    stamp: str
    weight: int = 1

    def to_json(self) -> dict[str, Any]:
        """Plain-dict form stored in batch manifests."""
        return {"key": self.key, "size": self.size, "stamp": self.stamp, "weight": self.weight}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Unit:
        """Inverse of :meth:`to_json`."""
        return cls(key=d["key"], size=int(d["size"]), stamp=str(d["stamp"]),
                   weight=int(d.get("weight", 1)))


def is_absolute(key: str) -> bool:
    """Whether a unit or item key is an absolute path or URI (written before keys were relative)."""
    return key.startswith("/") or is_remote(key)


def locate(location: str, key: str) -> str:
    """Where the unit or item ``key`` of a source at ``location`` is: the location joined with the
    key; for a source that is one file (a Parquet file, a tar), whose key is its name, the location
    itself; an absolute key as it is.

    >>> locate("s3://b/pub", "2024/a.jpg"), locate("/d/cat.parquet", "cat.parquet#row=3"), locate("/d", "/x/a.jpg")
    ('s3://b/pub/2024/a.jpg', '/d/cat.parquet#row=3', '/x/a.jpg')
    """
    if is_absolute(key):
        return key
    base = location.rstrip("/")
    head, sep, tail = key.partition("#")
    if base.rsplit("/", 1)[-1] == head:  # the source is this one file
        return base + sep + tail
    return f"{base}/{key}"


def normalized(location: str, key: str) -> str:
    """``key`` relative to ``location`` when it is an absolute key under it (written before keys were
    relative), else as it is.

    >>> normalized("s3://b/p", "s3://b/p/x.parquet#rg=0"), normalized("s3://b/p", "a.jpg"), normalized("/q", "/x/a.jpg")
    ('x.parquet#rg=0', 'a.jpg', '/x/a.jpg')
    """
    if not is_absolute(key):
        return key
    head, sep, tail = key.partition("#")
    base = location.rstrip("/")
    if head != base and not head.startswith(base + "/"):
        return key
    return relative(location, head) + sep + tail


def relative(location: str, where: str) -> str:
    """The key of ``where`` (a path or URI at or below ``location``) relative to ``location``;
    for a source that is one file, the file's name.

    >>> relative("s3://b/pub", "s3://b/pub/2024/a.jpg"), relative("/d/cat.parquet", "/d/cat.parquet")
    ('2024/a.jpg', 'cat.parquet')
    """
    base = location.rstrip("/")
    if where == base:
        return base.rsplit("/", 1)[-1]
    if not where.startswith(base + "/"):
        raise SourceError(f"{where} is not under the source's location {location}")
    return where[len(base) + 1:]


@dataclass
class SourceItem:
    """One candidate image from a unit.

    ``key`` names it within its source (relative to the source's location: what its image id is
    made of); ``uri`` is where it was read from. ``data`` holds the bytes when the reader already
    has them (Parquet, tar); otherwise ``fetch`` reads them on demand. ``error`` is set when the
    item could not be read at all (it becomes a ``read_error`` or ``no_image_member`` reject).
    """

    key: str
    uri: str
    data: bytes | None = None
    fetch: Callable[[], bytes] | None = None
    caption: str | None = None
    license: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error: tuple[str, str] | None = None

    def read(self) -> bytes:
        """The item's bytes (fetching them if needed)."""
        if self.data is None and self.fetch is not None:
            self.data = self.fetch()
        return self.data if self.data is not None else b""


class SourceReader:
    """Base class: list a source's units and read items from them."""

    kind: ClassVar[str] = ""

    def __init__(self, config: SourceConfig, s3_client: S3ClientFactory | None = None) -> None:
        self.config = config
        self._s3_factory = s3_client or (lambda: ObjectStoreSettings.from_env().boto3_client())
        self._client: Any = None
        self._stores: dict[str, Any] = {}
        self.last_listed_key: str | None = None  # of the last object-store listing

    @property
    def s3(self) -> Any:
        """Lazily created boto3 client."""
        if self._client is None:
            self._client = self._s3_factory()
        return self._client

    def locate(self, key: str) -> str:
        """Where one of this source's unit or item keys is now (see :func:`locate`)."""
        return locate(self.config.location, key)

    def key_of(self, unit: Unit) -> str:
        """The unit's key relative to the source's location (see :func:`normalized`)."""
        return normalized(self.config.location, unit.key)

    def store(self, uri: str) -> Any:
        """The object store holding ``uri`` (S3 through this reader's boto3 client, or GCS)."""
        scheme = split_object_uri(uri)[0]
        if scheme not in self._stores:
            self._stores[scheme] = store_for(uri, ObjectStoreSettings.from_env(),
                                             s3_client=self.s3 if scheme == "s3" else None)
        return self._stores[scheme]

    def list_units(self, known_files: Mapping[str, str] | None = None) -> list[Unit]:
        """All units currently in the source, sorted by key.

        ``known_files`` maps file keys already batched to their stamp; readers whose
        listing must open files (Parquet) skip unchanged known files.
        """
        raise NotImplementedError

    def list_new(self, known_files: Mapping[str, str],
                 state: Mapping[str, Any] | None) -> tuple[list[Unit], dict[str, Any] | None]:
        """The units to diff against the known ones, and a listing state to pass next time
        (``None``: this kind keeps none and lists everything each time, as ``list_units``).
        Readers that can skip what did not change since ``state`` override it and return only
        new units (known files are then not re-checked: see ``discover(full=True)``)."""
        return self.list_units(known_files), None

    def read_unit(self, unit: Unit) -> Iterator[SourceItem]:
        """Yield the items of one unit."""
        raise NotImplementedError

    def read_uri(self, uri: str) -> bytes:
        """Read the original bytes of one item by its URI (as stored in the table)."""
        raise NotImplementedError

    # helpers shared by kinds whose units may live on local disk or S3
    def _wants(self, name: str) -> bool:
        exts = self.config.extensions
        base = posixpath.basename(name)
        if base.startswith("."):
            return False
        if exts is None:
            return True
        return base.rsplit(".", 1)[-1].lower() in exts if "." in base else False

    def _open_bytes(self, location: str) -> bytes:
        if is_remote(location):
            _, bucket, key = split_object_uri(location)
            try:
                return self.store(location).get(bucket, key)
            except Exception as e:
                raise SourceError(f"source {self.config.name!r}: cannot read {location}: {e}") from e
        return Path(location).read_bytes()

    def _list_objects(self, uri: str, want: Callable[[str], bool], start_after: str | None = None) -> list[Unit]:
        """The wanted objects below ``uri`` (after the key ``start_after`` if given), sorted, keyed
        relative to the source's location; the last key listed, wanted or not, is left in
        ``self.last_listed_key``."""
        scheme, bucket, prefix = split_object_uri(uri)
        units = []
        self.last_listed_key = None
        try:
            for obj in self.store(uri).list(bucket, prefix, start_after):
                self.last_listed_key = obj.key
                if want(obj.key):
                    units.append(Unit(key=relative(self.config.location, f"{scheme}://{bucket}/{obj.key}"),
                                      size=obj.size, stamp=obj.stamp))
        except Exception as e:
            hint = ("AWS_ENDPOINT_URL and credentials" if scheme == "s3" else
                    "Google credentials (GOOGLE_APPLICATION_CREDENTIALS or workload identity)")
            raise SourceError(
                f"source {self.config.name!r}: cannot list {uri}: {e} (check the bucket name, {hint})") from e
        return sorted(units, key=lambda u: u.key)


#: Hours between full listings of an S3 prefix (between them, only keys after the last one listed).
S3_FULL_LISTING_HOURS = 24.0


class S3PrefixReader(SourceReader):
    """An ``s3://bucket/prefix`` (kind ``s3``) or ``gs://bucket/prefix`` (kind ``gcs``): every object
    below it with a wanted extension."""

    kind = "s3"

    def list_units(self, known_files: Mapping[str, str] | None = None) -> list[Unit]:
        return self._list_objects(self.config.location, self._wants)

    def list_new(self, known_files: Mapping[str, str],
                 state: Mapping[str, Any] | None) -> tuple[list[Unit], dict[str, Any] | None]:
        """Objects after the last key listed (S3 and GCS list keys in order: ``start_after`` skips every
        key at or before it without listing it), so a drop under keys that sort last (dated or
        numbered prefixes, the usual layout) costs the new objects, not the prefix. Objects added
        under keys that sort earlier are found by the full listing every ``S3_FULL_LISTING_HOURS``
        (``PRX_S3_FULL_LISTING_HOURS``; 0: every time) or by ``discover --full``."""
        prev = dict(state or {})
        if prev.get("location", self.config.location) != self.config.location:
            prev = {}  # the source was re-pointed: its cursor is a key of the old prefix
        cursor, full_at = prev.get("start_after"), float(prev.get("full_at", 0.0))
        every = float(os.environ.get("PRX_S3_FULL_LISTING_HOURS", S3_FULL_LISTING_HOURS)) * 3600
        now = time.time()
        where = {"location": self.config.location}
        if cursor is None or now - full_at >= every:
            units = self._list_objects(self.config.location, self._wants)
            return units, {"start_after": self.last_listed_key or cursor, "full_at": now, **where}
        units = self._list_objects(self.config.location, self._wants, start_after=str(cursor))
        return units, {"start_after": self.last_listed_key or cursor, "full_at": full_at, **where}

    def read_unit(self, unit: Unit) -> Iterator[SourceItem]:
        key = self.key_of(unit)
        uri = self.locate(key)
        yield SourceItem(key=key, uri=uri, fetch=lambda: self.read_uri(uri), license=self.config.license,
                         caption=self._sidecar_caption(uri))

    def _sidecar_caption(self, uri: str) -> str | None:
        if not self.config.caption_field:
            return None
        side = uri.rsplit(".", 1)[0] + "." + self.config.caption_field.lstrip(".")
        try:
            return self.read_uri(side).decode("utf-8").strip()
        except Exception:  # no sidecar object (NoSuchKey) or undecodable: no caption
            return None

    def read_uri(self, uri: str) -> bytes:
        _, bucket, key = split_object_uri(uri)
        return self.store(uri).get(bucket, key)


def _list_files(reader: SourceReader, location: str, suffixes: tuple[str, ...]) -> list[Unit]:
    def want(name: str) -> bool:
        return name.lower().endswith(suffixes) and not posixpath.basename(name).startswith(".")

    if is_remote(location):
        if location.lower().endswith(suffixes):
            units = reader._list_objects(location, lambda k: k == split_object_uri(location)[2])
        else:
            units = reader._list_objects(location.rstrip("/") + "/", want)
        return units
    root = Path(location)
    if root.is_file():
        st = root.stat()
        return [Unit(key=root.name, size=st.st_size, stamp=str(st.st_mtime_ns))]
    if not root.is_dir():
        raise ConfigError(f"path {location!r} does not exist",
                          entry=f"source {reader.config.name!r}",
                          fix="point 'path' at a file or a folder of files")
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and want(p.name):
            st = p.stat()
            out.append(Unit(key=p.relative_to(root).as_posix(), size=st.st_size, stamp=str(st.st_mtime_ns)))
    return out


class ParquetReader(SourceReader):
    """Parquet files with an image-bytes column; one unit per row group.

    The image column may hold raw bytes or a Hugging Face ``{bytes, path}`` struct.
    ``caption_field`` / ``license_field`` / ``carry`` name other columns to keep.
    """

    kind = "parquet"

    def _open(self, location: str) -> Any:
        import pyarrow.parquet as pq

        if is_remote(location):
            scheme = split_object_uri(location)[0]
            fs = ObjectStoreSettings.from_env().pyarrow_fs(scheme)
            return pq.ParquetFile(fs.open_input_file(location[len(scheme) + 3:]))
        return pq.ParquetFile(location)

    def list_units(self, known_files: Mapping[str, str] | None = None) -> list[Unit]:
        units = []
        for f in _list_files(self, self.config.location, (".parquet", ".pq")):
            if known_files and known_files.get(f.key) == f.stamp:
                continue  # already batched and unchanged: no need to open it
            try:
                pf = self._open(self.locate(f.key))
            except Exception as e:
                log.warning("source %r: cannot open %s (%s: %s); its ingest records it as a reject",
                            self.config.name, f.key, type(e).__name__, e)
                units.append(Unit(key=f"{f.key}#rg=0", size=f.size, stamp=f.stamp, weight=1))
                continue
            names = pf.schema_arrow.names
            if self.config.image_column not in names:
                raise ConfigError(
                    f"{f.key} has no column {self.config.image_column!r} (columns: {names})",
                    entry=f"source {self.config.name!r}",
                    fix="set image_column to the column holding image bytes")
            for rg in range(pf.num_row_groups):
                units.append(Unit(key=f"{f.key}#rg={rg}", size=f.size, stamp=f.stamp,
                                  weight=pf.metadata.row_group(rg).num_rows))
        return units

    def _columns(self, available: list[str]) -> list[str]:
        wanted = [self.config.image_column, self.config.caption_field, self.config.license_field,
                  *self.config.carry]
        missing = [c for c in wanted if c and c not in available]
        if missing:
            raise ConfigError(f"columns {missing} not in the Parquet schema ({available})",
                              entry=f"source {self.config.name!r}",
                              fix="fix caption_field / license_field / carry")
        return list(dict.fromkeys(c for c in wanted if c))

    def read_unit(self, unit: Unit) -> Iterator[SourceItem]:
        file_key, _, rg = self.key_of(unit).rpartition("#rg=")
        path = self.locate(file_key)
        pf = self._open(path)
        table = pf.read_row_group(int(rg), columns=self._columns(pf.schema_arrow.names))
        offset = sum(pf.metadata.row_group(i).num_rows for i in range(int(rg)))
        rows = table.to_pylist()
        for i, row in enumerate(rows):
            img = row[self.config.image_column]
            if isinstance(img, dict):
                img = img.get("bytes")
            key, uri = f"{file_key}#row={offset + i}", f"{path}#row={offset + i}"
            if img is not None and not isinstance(img, bytes | bytearray | memoryview):
                yield SourceItem(key=key, uri=uri, error=(
                    "bad_row", f"column {self.config.image_column!r} holds {type(img).__name__}, not image bytes"))
                continue
            item = SourceItem(
                key=key, uri=uri,
                data=bytes(img) if img is not None else b"",
                caption=_str_or_none(row.get(self.config.caption_field)) if self.config.caption_field else None,
                license=_str_or_none(row.get(self.config.license_field)) if self.config.license_field
                else self.config.license,
                extra={c: row.get(c) for c in self.config.carry},
            )
            yield item

    def read_uri(self, uri: str) -> bytes:
        path, _, row = uri.rpartition("#row=")
        pf = self._open(path)
        row_i = int(row)
        start = 0
        for rg in range(pf.num_row_groups):
            n = pf.metadata.row_group(rg).num_rows
            if row_i < start + n:
                t = pf.read_row_group(rg, columns=[self.config.image_column])
                img = t.column(0)[row_i - start].as_py()
                return bytes(img.get("bytes") if isinstance(img, dict) else img)
            start += n
        raise SourceError(f"row {row_i} not found in {path}")


_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff", "jfif")


def _wds_split(name: str) -> tuple[str, str]:
    """WebDataset convention: key is the path up to the first dot of the basename."""
    d, base = posixpath.split(name)
    stem, _, ext = base.partition(".")
    return posixpath.join(d, stem), ext.lower()


class WebDatasetReader(SourceReader):
    """WebDataset ``.tar`` shards: samples grouped by key, first image member used.

    ``caption_field`` names the caption extension (e.g. ``txt``); ``carry`` names keys
    of the ``json`` member to keep.
    """

    kind = "webdataset"

    def list_units(self, known_files: Mapping[str, str] | None = None) -> list[Unit]:
        return _list_files(self, self.config.location, (".tar",))

    def _samples(self, data: bytes) -> Iterator[tuple[str, dict[str, bytes]]]:
        current: str | None = None
        members: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf:
                if not m.isfile():
                    continue
                key, ext = _wds_split(m.name)
                if current is not None and key != current:
                    yield current, members
                    members = {}
                current = key
                f = tf.extractfile(m)
                members[ext] = f.read() if f else b""
        if current is not None:
            yield current, members

    def read_unit(self, unit: Unit) -> Iterator[SourceItem]:
        """The shard's samples, streamed; a shard that cannot be read, or breaks part way (truncated,
        corrupt), ends with one ``unreadable_unit`` reject and keeps the samples read before."""
        shard = self.key_of(unit)
        where = self.locate(shard)
        try:
            data = self._open_bytes(where)
        except (OSError, SourceError) as e:
            yield SourceItem(key=shard, uri=where, error=("read_error", f"cannot read tar shard: {e}"))
            return
        done = 0
        try:
            for key, members in self._samples(data):
                done += 1
                yield self._item(shard, key, members)
        except (tarfile.TarError, OSError, EOFError) as e:
            when = f"after {done} samples" if done else "before its first sample"
            yield SourceItem(key=shard, uri=where, error=("unreadable_unit", f"tar shard breaks {when}: {e}"))

    def _item(self, shard: str, key: str, members: dict[str, bytes]) -> SourceItem:
        """The item of one sample of tar ``shard`` (its key: the image member, caption, license, carried
        fields)."""
        item_key, uri = f"{shard}#{key}", f"{self.locate(shard)}#{key}"
        image_ext = next((e for e in _IMAGE_EXTS if e in members), None)
        meta: dict[str, Any] = {}
        if "json" in members:
            try:
                meta = json.loads(members["json"].decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                meta = {}
        caption = None
        if self.config.caption_field and self.config.caption_field in members:
            caption = members[self.config.caption_field].decode("utf-8", "replace").strip()
        license_ = _str_or_none(meta.get(self.config.license_field)) if self.config.license_field \
            else self.config.license
        extra = {c: meta.get(c) for c in self.config.carry}
        if image_ext is None:
            return SourceItem(key=item_key, uri=uri, error=(
                "no_image_member", f"sample has no image member (members: {sorted(members)})"))
        return SourceItem(key=item_key, uri=uri, data=members[image_ext], caption=caption, license=license_,
                          extra=extra)

    def read_uri(self, uri: str) -> bytes:
        shard, _, key = uri.rpartition("#")
        for k, members in self._samples(self._open_bytes(shard)):
            if k == key:
                ext = next((e for e in _IMAGE_EXTS if e in members), None)
                if ext:
                    return members[ext]
        raise SourceError(f"sample {key!r} not found in {shard}")


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)
