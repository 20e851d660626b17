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
import json
import re
from dataclasses import dataclass, field
from typing import Any

from prx_assets.core import layout
from prx_assets.core.config.project import SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.sources import SourceReader, Unit
from prx_assets.errors import PartitionKeyError, StorageError

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


def load_manifests(root: DataRoot, source: str) -> list[BatchManifest]:
    """All manifests of a source, in batch order."""
    out = []
    for rel in root.list(layout.batches_dir(source)):
        if rel.endswith(".json"):
            out.append(BatchManifest.from_bytes(root.read_bytes(rel)))
    return sorted(out, key=lambda m: m.seq)


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


def discover(config: SourceConfig, reader: SourceReader, root: DataRoot,
             max_attempts: int = 5) -> DiscoveryReport:
    """Create manifests for units not yet in any batch of this source.

    Safe to run concurrently with another discoverer: batch numbers are claimed with
    create-if-absent writes, and a lost claim restarts discovery from the manifests.
    Changed files (same key, different size or stamp) are reported, not re-batched:
    re-materialize their partition to pick the change up.
    """
    claimed: list[str] = []
    for _ in range(max_attempts):
        manifests = load_manifests(root, config.name)
        known: dict[str, Unit] = {u.key: u for m in manifests for u in m.units}
        known_files = {_file_of(k): u.stamp for k, u in known.items()}
        units = reader.list_units(known_files)
        report = DiscoveryReport(source=config.name, all_batches=[m.key for m in manifests],
                                 known_units=len(known), new_batches=list(claimed))
        new = []
        for u in units:
            old = known.get(u.key)
            if old is None:
                new.append(u)
            elif (old.size, old.stamp) != (u.size, u.stamp):
                report.changed_units.append(u.key)
        report.new_units = len(new)
        next_seq = (manifests[-1].seq + 1) if manifests else 1
        lost_race = False
        for group in group_units(new, config.batch_size):
            manifest = BatchManifest(source=config.name, seq=next_seq, units=tuple(group))
            if not root.write_new(manifest_path(config.name, next_seq), manifest.to_bytes()):
                lost_race = True
                break
            claimed.append(manifest.key)
            report.new_batches.append(manifest.key)
            report.all_batches.append(manifest.key)
            next_seq += 1
        if not lost_race:
            return report
    raise StorageError(f"source {config.name!r}: could not claim a batch number after "
                       f"{max_attempts} attempts; another discoverer keeps writing manifests")
