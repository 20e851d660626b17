"""Input fingerprints: how `prx-assets run` decides a partition is stale.

Each asset registers a function that hashes everything its output depends on (code
version, relevant config, upstream data versions, the batch manifest). The asset
records the fingerprint in its materialization metadata under ``prx/fingerprint``;
a partition whose recorded fingerprint differs from the current one is stale.
"""


import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg

from prx_assets.core.config.project import SourcesConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.models.config import ModelsConfig
from prx_assets.resources.storage import ProjectConfigResource

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

    def config(self) -> ProjectConfigResource:
        """The config folder (the run's resource; by default ``$PRX_CONFIG_DIR``)."""
        return self.project or ProjectConfigResource()


FingerprintFn = Callable[[FingerprintContext, str | None], str]
_REGISTRY: dict[dg.AssetKey, FingerprintFn] = {}


def register_fingerprint(key: dg.AssetKey | str, fn: FingerprintFn) -> FingerprintFn:
    """Register the fingerprint function of an asset."""
    _REGISTRY[dg.AssetKey.from_coercible(key)] = fn
    return fn


def fingerprint_for(key: dg.AssetKey) -> FingerprintFn | None:
    """The registered function, if any."""
    return _REGISTRY.get(key)


def digest(*parts: object) -> str:
    """Short stable hash of the given parts."""
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:20]


def recorded_fingerprints(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str | None, str]:
    """Latest recorded fingerprint per partition key (``None`` for unpartitioned)."""
    out: dict[str | None, str] = {}
    cursor = None
    while True:
        res = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=500,
                                              cursor=cursor, ascending=False)
        for rec in res.records:
            mat = rec.asset_materialization
            if mat is None or mat.partition in out:
                continue
            value = mat.metadata.get(FINGERPRINT_KEY)
            ranged = mat.metadata.get(FINGERPRINTS_KEY)
            if ranged is not None and isinstance(ranged.value, dict):
                out[mat.partition] = str(ranged.value.get(mat.partition, ""))
            else:
                out[mat.partition] = str(value.value) if value is not None else ""
        if not res.has_more:
            return out
        cursor = res.cursor


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
