"""Ingest batches: immutable manifests that group a source's units into partitions.

Discovery lists a source, subtracts every unit already named by a batch manifest, and
writes new manifests for what is left (``batch_size`` units per batch, counting rows
for Parquet row groups). A manifest is never rewritten, so a batch's content is fixed
once created and new drops land in new batches without touching old ones.

Manifests live at ``<data root>/ingest/batches/<source>/<seq>.json``; the partition
key of a batch is ``<source>-<seq>`` (for example ``photos-00003``).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prx_assets.core import layout
from prx_assets.core.config.project import SourceConfig, SourcesConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.faults import crash_point
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.ingest.sources import S3ClientFactory, SourceReader, Unit, is_absolute, normalized
from prx_assets.errors import ConfigError, PartitionKeyError, StorageError

_KEY_RE = re.compile(r"^([a-z][a-z0-9_]*)-(\d{5,})$")


def batch_key(source: str, seq: int) -> str:
    """Partition key of batch ``seq`` of ``source``.

    >>> batch_key("photos", 3)
    'photos-00003'
    """
    return f"{source}-{seq:05d}"


def parse_batch_key(key: str) -> tuple[str, int]:
    """Inverse of :func:`batch_key`; raises PartitionKeyError naming the key."""
    m = _KEY_RE.match(key)
    if not m:
        raise PartitionKeyError(
            f"partition key {key!r} is not of the form '<source>-<5 digits>' (e.g. photos-00001)")
    return m.group(1), int(m.group(2))


@dataclass(frozen=True)
class BatchManifest:
    """The units of one ingest batch."""

    source: str
    seq: int
    units: tuple[Unit, ...]

    @property
    def key(self) -> str:
        """The partition key."""
        return batch_key(self.source, self.seq)

    @property
    def weight(self) -> int:
        """Files (or rows, or shards) in the batch."""
        return sum(u.weight for u in self.units)

    def content_hash(self) -> str:
        """Hash of the manifest content (changes only if the manifest is rewritten)."""
        return hashlib.sha256(self.to_bytes()).hexdigest()[:16]

    def to_bytes(self) -> bytes:
        """Serialized JSON."""
        doc = {"source": self.source, "seq": self.seq, "key": self.key,
               "units": [u.to_json() for u in self.units]}
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> BatchManifest:
        """Parse a manifest."""
        doc = json.loads(data)
        return cls(source=doc["source"], seq=int(doc["seq"]),
                   units=tuple(Unit.from_json(u) for u in doc["units"]))


def manifest_path(source: str, seq: int) -> str:
    """Path of a manifest relative to the data root."""
    return layout.batch_manifest(source, seq)


def _manifest_seq(rel: str) -> int | None:
    """The batch number of a manifest path (``None`` for the index and cursors beside them)."""
    name = rel.rsplit("/", 1)[-1]
    return int(name[:-5]) if name.endswith(".json") and name[:-5].isdigit() else None


def load_manifests(root: DataRoot, source: str) -> list[BatchManifest]:
    """All manifests of a source, in batch order (parses every one: for listings, not planning)."""
    out = []
    for rel in root.list(layout.batches_dir(source)):
        if _manifest_seq(rel) is not None:
            out.append(BatchManifest.from_bytes(root.read_bytes(rel)))
    return sorted(out, key=lambda m: m.seq)


UNITS_SCHEMA = pa.schema([("seq", pa.int64()), ("key", pa.string()), ("size", pa.int64()),
                          ("stamp", pa.string()), ("weight", pa.int64())])
#: Index segments read at most; past this many, discovery writes one segment covering them all.
MAX_SEGMENTS = 16


def _segment_path(source: str, first: int, last: int) -> str:
    return f"{layout.batches_dir(source)}/_index/{first:05d}-{last:05d}.parquet"


def _hashes_path(source: str, first: int, last: int) -> str:
    """Beside each index segment: ``{seq: content hash}`` of its manifests (what planning reads)."""
    return f"{layout.batches_dir(source)}/_index/{first:05d}-{last:05d}.hashes.json"


def _spans(listing: Iterable[str], suffix: str) -> list[tuple[int, int, str]]:
    """``(first, last, path)`` of the index files named ``<first>-<last><suffix>``."""
    spans = []
    for p in listing:
        name = p.rsplit("/", 1)[-1]
        if "/_index/" in p and name.endswith(suffix) and "-" in name:
            first, last = name[: -len(suffix)].split("-", 1)
            if first.isdigit() and last.isdigit():
                spans.append((int(first), int(last), p))
    return spans


def _contiguous(spans: list[tuple[int, int, str]]) -> tuple[list[str], int]:
    """The files that cover batches 1..n contiguously (longest first), and n."""
    covered, paths = 0, []
    for first, last, p in sorted(spans, key=lambda x: (x[0], -x[1])):
        if first == covered + 1 and last > covered:
            paths.append(p)
            covered = last
    return paths, covered


def manifest_hashes(root: DataRoot, source: str) -> dict[str, str]:
    """``{partition key: manifest content hash}`` of every batch of ``source``, from the hash files
    beside the index segments plus the manifests past them: a few reads for any number of batches
    (planning asks this once per run instead of parsing every manifest)."""
    listing = root.list(layout.batches_dir(source))
    seqs = sorted(q for q in (_manifest_seq(p) for p in listing) if q is not None)
    paths, covered = _contiguous(_spans(listing, ".hashes.json"))
    hashes: dict[int, str] = {}
    for p in paths:
        hashes.update({int(k): str(v) for k, v in json.loads(root.read_bytes(p)).items()})
    for seq in seqs:
        if seq > covered or seq not in hashes:
            hashes[seq] = BatchManifest.from_bytes(root.read_bytes(manifest_path(source, seq))).content_hash()
    return {batch_key(source, q): hashes[q] for q in seqs}


def _units_of(segment: pa.Table) -> Iterator[Unit]:
    """The units of index-segment rows."""
    cols = (segment.column(c).to_pylist() for c in ("key", "size", "stamp", "weight"))
    for key, size, stamp, weight in zip(*cols, strict=True):
        yield Unit(key=key, size=size, stamp=stamp, weight=weight)


@dataclass
class KnownUnits:
    """Every unit already in a batch of a source: the manifest index's Parquet segments plus the
    manifests they do not cover yet (``extra``). Nothing is turned into Python objects up front:
    ``lookup`` finds given keys with a vectorized pass over the segments, so a discovery that
    finds a few new files costs a scan of the index in Arrow, not a dict of every known unit."""

    seqs: list[int]
    keys: list[str]  # partition keys of every batch, in order
    covered: int  # manifests 1..covered are in index segments
    segments: list[pa.Table] = field(default_factory=list)
    extra: dict[str, Unit] = field(default_factory=dict)
    _all: dict[str, Unit] | None = field(default=None, repr=False)

    @property
    def count(self) -> int:
        """Known units (a unit in two batches counts twice; discovery never writes that)."""
        return sum(t.num_rows for t in self.segments) + len(self.extra)

    @property
    def units(self) -> dict[str, Unit]:
        """Every known unit by key (materialized once, on first use: for full listings and tests)."""
        if self._all is None:
            self._all = {u.key: u for t in self.segments for u in _units_of(t)} | self.extra
        return self._all

    def lookup(self, keys: Iterable[str]) -> dict[str, Unit]:
        """The known units among ``keys``."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        if self._all is not None:
            return {k: self._all[k] for k in wanted if k in self._all}
        value_set = pa.array(wanted, pa.string())
        out: dict[str, Unit] = {}
        for t in self.segments:
            out.update((u.key, u) for u in _units_of(t.filter(pc.is_in(t.column("key"), value_set=value_set))))
        out.update({k: self.extra[k] for k in wanted if k in self.extra})
        return out

    def files(self) -> KnownFiles:
        """The known files (a unit key up to ``#rg=``) and their stamps, looked up lazily."""
        return KnownFiles(self)


class KnownFiles(Mapping[str, str]):
    """``{file key: stamp}`` of the known units. ``among(names)`` answers for many names in one
    vectorized pass; single-key access materializes the mapping once (readers that ask per file)."""

    def __init__(self, known: KnownUnits) -> None:
        self._known = known
        self._map: dict[str, str] | None = None

    def _mapping(self) -> dict[str, str]:
        if self._map is None:
            self._map = {_file_of(k): u.stamp for k, u in self._known.units.items()}
        return self._map

    def __getitem__(self, key: str) -> str:
        return self._mapping()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())

    def among(self, names: Sequence[str]) -> set[str]:
        """The file keys in ``names`` that are known."""
        if not names:
            return set()
        if self._map is not None:
            return {n for n in names if n in self._map}
        value_set = pa.array(list(names), pa.string())
        found: set[str] = set()
        for t in self._known.segments:
            files = t.column("key")
            if pc.any(pc.match_substring(files, "#rg=")).as_py():  # row-group units: their file
                files = pc.replace_substring_regex(files, pattern="#rg=.*$", replacement="")
            found.update(pc.filter(files, pc.is_in(files, value_set=value_set)).to_pylist())
        extra = {_file_of(k) for k in self._known.extra}
        found.update(n for n in names if n in extra)
        return found


def _relative_keys(table: pa.Table, location: str) -> pa.Table:
    """Index rows with their keys relative to ``location`` (absolute keys under it were written
    before keys were relative; see :func:`~prx_assets.core.ingest.sources.normalized`)."""
    keys = table.column("key")
    if not _any_absolute(keys):
        return table
    return table.set_column(table.schema.get_field_index("key"), "key",
                            pa.array([normalized(location, k) for k in keys.to_pylist()], pa.string()))


def _any_absolute(keys: pa.ChunkedArray | pa.Array) -> bool:
    """Whether any key is an absolute path or URI (one vectorized pass)."""
    return bool(pc.any(pc.or_(pc.starts_with(keys, "/"), pc.match_substring_regex(keys, r"^[a-z0-9]+://"))).as_py())


def _check_located(source: str, location: str, keys: Iterable[str]) -> None:
    """Refuse absolute keys that are not under the source's location: the source was re-pointed
    while its batches still name files by their old place, so every file would look new."""
    stray = next((k for k in keys if is_absolute(k)), None)
    if stray is not None:
        raise ConfigError(
            f"source {source!r}: its batches name files by their absolute place (e.g. {stray}), written "
            f"before keys were relative, and the source now points at {location}",
            entry=f"source {source!r}",
            fix="point the source back at where those files were and run `prx-assets migrate` (it rewrites the "
                "batch manifests with keys relative to the source), then re-point it")


def load_known(root: DataRoot, source: str, location: str | None = None) -> KnownUnits:
    """The units of every batch of ``source``: index segments, then manifests past them. With
    ``location`` (the source's), keys are made relative to it (see :func:`_relative_keys`)."""
    listing = root.list(layout.batches_dir(source))
    seqs = sorted(q for q in (_manifest_seq(p) for p in listing) if q is not None)
    paths, covered = _contiguous(_spans(listing, ".parquet"))
    tables = [pq.read_table(io.BytesIO(root.read_bytes(p))) for p in paths]
    covered = min(covered, seqs[-1] if seqs else 0)
    extra: dict[str, Unit] = {}
    for seq in seqs:
        if seq > covered:
            for u in BatchManifest.from_bytes(root.read_bytes(manifest_path(source, seq))).units:
                if location is not None:
                    u = Unit(key=normalized(location, u.key), size=u.size, stamp=u.stamp, weight=u.weight)
                extra[u.key] = u
    if location is not None:
        tables = [_relative_keys(t, location) for t in tables]
        for t in tables:
            if _any_absolute(t.column("key")):
                _check_located(source, location, t.column("key").to_pylist())
        _check_located(source, location, extra)
    return KnownUnits(seqs=seqs, keys=[batch_key(source, q) for q in seqs], covered=covered, segments=tables,
                      extra=extra)


def write_index(root: DataRoot, source: str, known: KnownUnits, new: list[BatchManifest]) -> None:
    """Record the manifests the index does not cover yet as one more segment (or, past
    ``MAX_SEGMENTS``, every manifest as one segment). Derived data: the manifests stay the truth."""
    manifests = [BatchManifest.from_bytes(root.read_bytes(manifest_path(source, q)))
                 for q in known.seqs if q > known.covered] + new
    if not manifests:
        return
    rows = [(m.seq, u.key, u.size, u.stamp, u.weight) for m in manifests for u in m.units]
    fresh = pa.table(dict(zip(UNITS_SCHEMA.names, map(list, zip(*rows, strict=True)), strict=True))
                     if rows else {n: [] for n in UNITS_SCHEMA.names}, schema=UNITS_SCHEMA)
    last = max(m.seq for m in manifests)
    hashes = {str(m.seq): m.content_hash() for m in manifests}
    if len(known.segments) + 1 > MAX_SEGMENTS:
        table, first = pa.concat_tables([*[t.cast(UNITS_SCHEMA) for t in known.segments], fresh]), 1
        old = {parse_batch_key(k)[1]: v for k, v in manifest_hashes(root, source).items()}
        hashes = {str(q): v for q, v in old.items() if q <= known.covered} | hashes
    else:
        table, first = fresh, known.covered + 1
    hash_first = first
    if first > 1:
        have = _contiguous(_spans(root.list(layout.batches_dir(source)), ".hashes.json"))[1]
        if have < first - 1:  # an index written before hash files existed: fill the gap once
            hashes = {str(q): BatchManifest.from_bytes(root.read_bytes(manifest_path(source, q))).content_hash()
                      for q in known.seqs if have < q < first} | hashes
            hash_first = have + 1
    buf = io.BytesIO()
    pq.write_table(table, buf)
    # Hash files stay contiguous from batch 1, so planning reads them instead of the manifests.
    root.write_bytes(_hashes_path(source, hash_first, last), json.dumps(hashes, sort_keys=True).encode())
    root.write_bytes(_segment_path(source, first, last), buf.getvalue())


def load_manifest(root: DataRoot, key: str) -> BatchManifest:
    """The manifest behind a partition key; raises PartitionKeyError if there is none."""
    source, seq = parse_batch_key(key)
    try:
        return BatchManifest.from_bytes(root.read_bytes(manifest_path(source, seq)))
    except FileNotFoundError:
        raise PartitionKeyError(
            f"no batch manifest for partition {key!r} under {root.join(layout.BATCHES_DIR)}; "
            "run `prx-assets discover` (or the raw_batch_sensor) to create batches") from None


@dataclass
class DiscoveryReport:
    """What discovery found for one source."""

    source: str
    new_batches: list[str] = field(default_factory=list)
    all_batches: list[str] = field(default_factory=list)
    new_units: int = 0
    known_units: int = 0
    changed_units: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary."""
        return {"source": self.source, "new_batches": self.new_batches,
                "batches": len(self.all_batches), "new_units": self.new_units,
                "known_units": self.known_units, "changed_units": len(self.changed_units)}


def _file_of(unit_key: str) -> str:
    return unit_key.split("#rg=", 1)[0]


def group_units(units: list[Unit], batch_size: int) -> list[list[Unit]]:
    """Split units, in order, into groups of at most ``batch_size`` weight.

    A unit heavier than ``batch_size`` forms a group of its own.
    """
    groups: list[list[Unit]] = []
    current: list[Unit] = []
    weight = 0
    for u in units:
        if current and weight + u.weight > batch_size:
            groups.append(current)
            current, weight = [], 0
        current.append(u)
        weight += u.weight
    if current:
        groups.append(current)
    return groups


def _listing_path(source: str) -> str:
    return f"{layout.batches_dir(source)}/_listing.json"


def discover(config: SourceConfig, reader: SourceReader, root: DataRoot,
             max_attempts: int = 5, full: bool = False, dry_run: bool = False) -> DiscoveryReport:
    """Create manifests for units not yet in any batch of this source.

    Known units come from the manifest index (Parquet segments under ``_index/``) and the
    manifests it does not cover yet, which this run then indexes. Safe to run concurrently
    with another discoverer: batch numbers are claimed with create-if-absent writes, and a
    lost claim restarts discovery from the manifests.
    Sources that keep a listing state (folders: per-folder mtimes in ``_listing.json``) list
    only what changed since the last discovery and never re-check known files; ``full=True``
    lists everything and reports changed files (same key, different size or stamp), which are
    not re-batched: re-materialize their partition to pick the change up.
    ``dry_run`` writes nothing (no manifest, index or listing state) and reports the batches that
    discovery would create now.
    """
    claimed: list[str] = []
    for _ in range(max_attempts):
        index = load_known(root, config.name, config.location)
        known_files = index.files()
        state = None
        if full:
            units = reader.list_units(known_files)
        else:
            try:
                previous = json.loads(root.read_bytes(_listing_path(config.name)))
            except (FileNotFoundError, OSError, ValueError):
                previous = None
            units, state = reader.list_new(known_files, previous)
        report = DiscoveryReport(source=config.name, all_batches=list(index.keys),
                                 known_units=index.count, new_batches=list(claimed))
        known = index.lookup(u.key for u in units)
        new = []
        for u in units:
            old = known.get(u.key)
            if old is None:
                new.append(u)
            elif (old.size, old.stamp) != (u.size, u.stamp):
                report.changed_units.append(u.key)
        report.new_units = len(new)
        next_seq = (index.seqs[-1] + 1) if index.seqs else 1
        lost_race = False
        written: list[BatchManifest] = []
        for group in group_units(new, config.batch_size):
            manifest = BatchManifest(source=config.name, seq=next_seq, units=tuple(group))
            if dry_run:
                report.new_batches.append(manifest.key)
                report.all_batches.append(manifest.key)
                next_seq += 1
                continue
            if not root.write_new(manifest_path(config.name, next_seq), manifest.to_bytes()):
                lost_race = True
                break
            claimed.append(manifest.key)
            written.append(manifest)
            report.new_batches.append(manifest.key)
            report.all_batches.append(manifest.key)
            next_seq += 1
        if dry_run:
            return report
        if not lost_race:
            if written:
                crash_point("discover.before_index")  # manifests claimed, the index not written
            if written or index.seqs[-1:] != [index.covered]:
                write_index(root, config.name, index, written)
            if state is not None:  # after the manifests: a crash before this only lists again
                root.write_bytes(_listing_path(config.name), json.dumps(state).encode())
            return report
    raise StorageError(f"source {config.name!r}: could not claim a batch number after "
                       f"{max_attempts} attempts; another discoverer keeps writing manifests")


def discover_sources(root: DataRoot, sources: SourcesConfig, s3_client: S3ClientFactory | None = None,
                     only: str | None = None, full: bool = False, dry_run: bool = False) -> list[dict[str, Any]]:
    """Run :func:`discover` for every source (or the one named ``only``) and return their summaries,
    each with ``all_batches`` (``full``: list every file again and report changed ones; ``dry_run``:
    write nothing, report what would be created)."""
    out = []
    for cfg in sources.sources:
        if only and cfg.name != only:
            continue
        rep = discover(cfg, reader_for(cfg, s3_client=s3_client), root, full=full, dry_run=dry_run)
        summary = rep.summary()
        summary["all_batches"] = rep.all_batches
        out.append(summary)
    return out


def relativize_manifests(root: DataRoot, config: SourceConfig) -> int:
    """Rewrite the source's batch manifests written before keys were relative (absolute paths or
    URIs) with keys relative to its location, and drop its manifest index (the next discovery
    writes it again from the manifests). Run it while the source still points at where those
    files were. Returns the manifests rewritten; idempotent.

    Raises
    ------
    ConfigError
        When a manifest names a file outside the source's location (it was re-pointed already).
    """
    listing = root.list(layout.batches_dir(config.name))
    rewritten = 0
    for seq in sorted(q for q in (_manifest_seq(p) for p in listing) if q is not None):
        manifest = BatchManifest.from_bytes(root.read_bytes(manifest_path(config.name, seq)))
        if not any(is_absolute(u.key) for u in manifest.units):
            continue
        units = tuple(Unit(key=normalized(config.location, u.key), size=u.size, stamp=u.stamp, weight=u.weight)
                      for u in manifest.units)
        _check_located(config.name, config.location, (u.key for u in units))
        root.write_bytes(manifest_path(config.name, seq), BatchManifest(config.name, seq, units).to_bytes())
        rewritten += 1
    if rewritten:
        for p in listing:
            if "/_index/" in p:
                root.delete(p)
    return rewritten
