"""Input fingerprints: how `prx-assets run` decides a partition is stale.

Each asset registers a function that hashes everything its output depends on (code
version, relevant config, upstream data versions, the batch manifest). The asset
records the fingerprint in its materialization metadata under ``prx/fingerprint``;
a partition whose recorded fingerprint differs from the current one is stale.
"""


import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import DagsterEventType

from prx_assets.core.config.project import SourcesConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import load_manifest, manifest_hashes, parse_batch_key
from prx_assets.core.models.config import ModelsConfig
from prx_assets.resources.storage import ProjectConfigResource

#: The tag a materialization's data version is stored under (Dagster's documented tag name; the
#: constant itself is only in ``dagster._core``).
DATA_VERSION_TAG = "dagster/data_version"

FINGERPRINT_KEY = "prx/fingerprint"
#: In a run over several partitions (a batched backfill): JSON {partition key: fingerprint}.
FINGERPRINTS_KEY = "prx/fingerprints"


@dataclass(frozen=True)
class FingerprintContext:
    """What a fingerprint function may read."""

    root: DataRoot
    sources: SourcesConfig | None
    instance: dg.DagsterInstance | None = None
    models: ModelsConfig | None = None
    project: ProjectConfigResource | None = None
    #: Planning many partitions: read each asset's latest data versions and each source's manifest
    #: hashes once (a few queries and files per asset) instead of once per partition.
    bulk: bool = False
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False)

    def config(self) -> ProjectConfigResource:
        """The config folder (the run's resource; by default ``$PRX_CONFIG_DIR``)."""
        return self.project or ProjectConfigResource()

    def data_version(self, key: dg.AssetKey | str, partition: str | None) -> str:
        """The data version of an asset partition's latest materialization ('' without one)."""
        if self.instance is None:
            return ""
        if not self.bulk or partition is None:
            return latest_data_version(self.instance, key, partition)
        akey = dg.AssetKey.from_coercible(key)
        versions = self.cache.get(("data_versions", akey))
        if versions is None:
            versions = latest_data_versions(self.instance, akey)
            self.cache[("data_versions", akey)] = versions
        return versions.get(partition, "")

    def manifest_hash(self, batch: str) -> str:
        """The content hash of a batch manifest (raises PartitionKeyError for an unknown batch)."""
        if not self.bulk:
            return load_manifest(self.root, batch).content_hash()
        source = parse_batch_key(batch)[0]
        hashes = self.cache.get(("manifests", source))
        if hashes is None:
            hashes = manifest_hashes(self.root, source)
            self.cache[("manifests", source)] = hashes
        return hashes[batch] if batch in hashes else load_manifest(self.root, batch).content_hash()


#: An asset's input fingerprint: one pure function of the context and a partition key, which both
#: the asset (it records it) and planning (it compares it) call; the table is
#: :data:`prx_assets.defs.fingerprints.FINGERPRINTS`.
FingerprintFn = Callable[[FingerprintContext, str | None], str]


def digest(*parts: object) -> str:
    """Short stable hash of the given parts."""
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:20]


#: Materialization records fetched per query when reading the latest one of every partition.
RECORDS_PER_QUERY = 500


def latest_data_versions(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, str]:
    """``{partition: data version}`` of the latest materialization of every partition (one query)."""
    tags = instance.event_log_storage.get_latest_tags_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG])
    return {pk: t.get(DATA_VERSION_TAG, "") for pk, t in tags.items()}


def recorded_fingerprint(mat: dg.AssetMaterialization) -> str:
    """The fingerprint a materialization recorded for its partition ('' without one)."""
    ranged = mat.metadata.get(FINGERPRINTS_KEY)
    if ranged is not None and isinstance(ranged.value, dict):
        return str(ranged.value.get(mat.partition, ""))
    value = mat.metadata.get(FINGERPRINT_KEY)
    return str(value.value) if value is not None else ""


def _history_origin(instance: dg.DagsterInstance, key: dg.AssetKey) -> str:
    """The storage id and time of the asset's first materialization: changes when its history is
    wiped or the event log is a different one (storage ids then mean other events)."""
    first = instance.fetch_materializations(key, limit=1, ascending=True).records
    return f"{first[0].storage_id}@{first[0].timestamp}" if first else ""


def recorded_fingerprints(instance: dg.DagsterInstance, key: dg.AssetKey,
                          cache_dir: Path | None = None, save: bool = True) -> dict[str | None, str]:
    """Latest recorded fingerprint per partition key (``None`` for unpartitioned).

    With ``cache_dir``, the fingerprints read are kept in a Parquet file per asset beside the
    storage id of the event they came from. The next call asks the event log for the latest
    storage id of every partition (one query) and reads only the records whose id is not cached
    (partitions materialized since): a plan over 10^5 partitions reads what changed, not
    everything. Event ids never change meaning within one history (checked by its first event).
    ``save=False`` reads the cache without updating it.
    """
    ids = dict(instance.event_log_storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION))
    origin = _history_origin(instance, key) if cache_dir is not None and ids else ""
    cached = _load_cache(cache_dir, key, origin) if origin else {}
    out: dict[str | None, str] = {}
    missing: list[int] = []
    for pk, sid in ids.items():
        hit = cached.get(pk)
        if hit is not None and hit[0] == sid:
            out[pk] = hit[1]
        else:
            missing.append(sid)
    for a in range(0, len(missing), RECORDS_PER_QUERY):
        part = sorted(missing[a:a + RECORDS_PER_QUERY])
        res = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, storage_ids=part), limit=len(part))
        for rec in res.records:
            if rec.asset_materialization is not None:
                out[rec.asset_materialization.partition] = recorded_fingerprint(rec.asset_materialization)
    if origin and missing and save:
        _save_cache(cache_dir, key, origin, {pk: (ids[pk], out[pk]) for pk in ids if pk in out})
    latest = instance.fetch_materializations(key, limit=1).records
    if latest and latest[0].asset_materialization is not None and latest[0].asset_materialization.partition is None:
        out[None] = recorded_fingerprint(latest[0].asset_materialization)
    return out


def _cache_path(cache_dir: Path, key: dg.AssetKey) -> Path:
    return cache_dir / f"{'__'.join(key.path)}.parquet"


def _load_cache(cache_dir: Path | None, key: dg.AssetKey, origin: str) -> dict[str, tuple[int, str]]:
    import pyarrow.parquet as pq

    if cache_dir is None or not _cache_path(cache_dir, key).is_file():
        return {}
    try:
        table = pq.read_table(_cache_path(cache_dir, key))
    except Exception:
        return {}
    if (table.schema.metadata or {}).get(b"origin", b"").decode() != origin:
        return {}
    cols = [table.column(c).to_pylist() for c in ("partition", "storage_id", "fingerprint")]
    return {pk: (sid, fp) for pk, sid, fp in zip(*cols, strict=True)}


def _save_cache(cache_dir: Path | None, key: dg.AssetKey, origin: str, rows: dict[str, tuple[int, str]]) -> None:
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    if cache_dir is None:
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    table = pa.table({"partition": list(rows), "storage_id": [v[0] for v in rows.values()],
                      "fingerprint": [v[1] for v in rows.values()]}).replace_schema_metadata({"origin": origin})
    path = _cache_path(cache_dir, key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def latest_materialization(instance: dg.DagsterInstance | None, key: dg.AssetKey | str,
                           partition: str | None) -> dg.AssetMaterialization | None:
    """The latest materialization of an asset partition (``None`` without one or without an instance)."""
    if instance is None:
        return None
    rec = instance.get_latest_data_version_record(dg.AssetKey.from_coercible(key), partition_key=partition)
    return rec.asset_materialization if rec is not None else None


def latest_data_version(instance: dg.DagsterInstance | None, key: dg.AssetKey | str, partition: str | None) -> str:
    """The data version of an asset partition's latest materialization ('' without one)."""
    mat = latest_materialization(instance, key, partition)
    return mat.tags.get("dagster/data_version", "") if mat is not None else ""


def previous_data_version(context: dg.AssetExecutionContext) -> str | None:
    """The data version of this asset partition's latest materialization, if any.

    Assets whose run changed nothing reuse it, so downstream assets do not look stale.
    """
    res = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=context.asset_key,
                              asset_partitions=[context.partition_key] if context.has_partition_key else None),
        limit=1)
    if not res.records or res.records[0].asset_materialization is None:
        return None
    return res.records[0].asset_materialization.tags.get("dagster/data_version")


def latest_storage_id(instance: dg.DagsterInstance, key: dg.AssetKey | str) -> int:
    """Storage id of an asset's latest materialization (any partition); 0 without one."""
    res = instance.fetch_materializations(dg.AssetKey.from_coercible(key), limit=1)
    return res.records[0].storage_id if res.records else 0


def data_changed_since(instance: dg.DagsterInstance, key: dg.AssetKey | str, cursor: int) -> bool:
    """Whether a materialization of ``key`` after storage id ``cursor`` carries a data version its
    partition did not have at ``cursor`` (Dagster's own rule for partitioned inputs).

    Reads only the materializations since ``cursor``, so it costs what changed: re-materializing a
    partition with unchanged content (same data version) is not a change.
    """
    akey = dg.AssetKey.from_coercible(key)
    known: dict[str | None, str | None] = {}
    page: str | None = None
    while True:
        res = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=akey, after_storage_id=cursor),
                                              limit=500, cursor=page, ascending=True)
        for rec in res.records:
            mat = rec.asset_materialization
            if mat is None:
                continue
            pk = mat.partition
            if pk not in known:
                before = instance.get_latest_data_version_record(akey, partition_key=pk, before_cursor=cursor + 1)
                known[pk] = before.asset_materialization.tags.get("dagster/data_version") \
                    if before is not None and before.asset_materialization is not None else None
            if mat.tags.get("dagster/data_version") != known[pk]:
                return True
        if not res.has_more:
            return False
        page = res.cursor
