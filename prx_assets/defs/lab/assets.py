"""lance_table (the lab) and the lance_maintenance job."""

import dagster as dg
from pydantic import Field

from prx_assets.core.lab.schema import IMAGES_TABLE
from prx_assets.core.lab.sync import PUBLISHED_TAG, sync_lab
from prx_assets.core.lab.table import table_uri
from prx_assets.core.models.config import ModelsConfig
from prx_assets.defs.enrichment import image_embeddings, recaptions
from prx_assets.defs.ingest import raw_images
from prx_assets.defs.keys import LANCE_TABLE, group
from prx_assets.infra.staleness import (
    FINGERPRINT_KEY,
    FingerprintContext,
    data_changed_since,
    digest,
    latest_materialization,
    latest_storage_id,
)
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

LAB_CODE_VERSION = "lab-1"


#: Dagster concurrency pool of the lab's writers (lab sync, maintenance). The instance's
#: ``concurrency.pools`` (dagster.yaml: ``default_limit: 1``, ``granularity: run``) queues
#: UI-launched runs that use it one at a time; the lab lease covers every other writer.
LAB_POOL = "prx_lab"


#: The assets the lab reads; its inputs change when one of their partitions gets a new data version.
LAB_INPUTS = ("raw_images", "recaptions", "image_embeddings")


#: Metadata key: storage id of each input's latest materialization when the lab last synced.
CURSOR_KEY = "prx/input_cursor"


def lab_fingerprint_of(models: ModelsConfig | None, inputs_changed: bool) -> str:
    """The one formula: code version + configured captioners/embedder + whether any input's data
    changed since the last sync (what a sync would see)."""
    ids = models.captioner_ids() if models else []
    emb = models.embedder.embedder_id() if models and models.embedder else ""
    return digest(LAB_CODE_VERSION, ids, emb, "inputs changed" if inputs_changed else "inputs synced")


def lab_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """The fingerprint a run now would record: stale when an input partition got a new data version
    since the last sync (re-materializing one with the same content is no change)."""
    mat = latest_materialization(ctx.instance, LANCE_TABLE, None)
    cursor = mat.metadata.get(CURSOR_KEY) if mat is not None else None
    if ctx.instance is None or cursor is None or not isinstance(cursor.value, dict):
        return lab_fingerprint_of(ctx.models, inputs_changed=True)
    changed = any(data_changed_since(ctx.instance, k, int(cursor.value.get(k, 0))) for k in LAB_INPUTS)
    return lab_fingerprint_of(ctx.models, inputs_changed=changed)




def _md(mat: dg.AssetMaterialization, key: str) -> object:
    value = mat.metadata.get(key)
    return value.value if value is not None else None


class LabConfig(dg.Config):
    """Run configuration of lance_table."""

    vector_index_min_rows: int = Field(
        default=10_000, description="Build the IVF_PQ index once this many rows have vectors "
                                    "(below it, vector search is exact).")


@dg.asset(
    deps=[raw_images, recaptions, image_embeddings],
    group_name=group(LANCE_TABLE),
    kinds={"lance"},
    code_version=LAB_CODE_VERSION,
    owners=["team:data"],
    tags={"stage": "lab"},
    pool=LAB_POOL,
)
def lance_table(context: dg.AssetExecutionContext, config: LabConfig, storage: StorageResource,
                project: ProjectConfigResource) -> dg.MaterializeResult:
    """The lab: one row per accepted image, captions and embeddings joined in as columns.

    Each configured captioner becomes a column ``caption__<captioner id>`` and the
    embedder a column ``emb__<embedder id>``, added and filled with Lance schema
    evolution (no image data rewritten). Scalar (BTREE, BITMAP), full-text (INVERTED)
    and vector (IVF_PQ) indexes are created and kept current. The data version is the
    Lance version produced, tagged ``published``. Query it with ``prx-assets query``.
    """
    models = project.models()
    root = storage.root()
    cursor = {k: latest_storage_id(context.instance, k) for k in LAB_INPUTS}  # before reading: races count as new
    embedders = [models.embedder.embedder_id()] if models.embedder else []
    res = sync_lab(root, captioner_ids=models.captioner_ids(), embedder_ids=embedders,
                   vector_index_min_rows=config.vector_index_min_rows)
    context.log.info(f"lab at version {res.version}: {res.rows} rows, {res.fragments} fragments, "
                     f"added {res.columns_added}, updated {res.rows_updated}, indexes {res.indexes_created}")
    coverage = "\n".join(
        ["| index | type | columns | indexed | unindexed |", "|---|---|---|---|---|"] +
        [f"| {ix['name']} | {ix['type']} | {', '.join(ix['columns'])} | {ix['indexed_rows']} | "
         f"{ix['unindexed_rows']} |" for ix in res.indexes])
    previous = latest_materialization(context.instance, LANCE_TABLE, None)
    same_content = previous is not None and not res.columns_added and not any(res.rows_updated.values()) \
        and res.input_version == _md(previous, "lance_version")
    version = previous.tags.get("dagster/data_version", "") if same_content and previous else str(res.version)
    if same_content:
        context.log.info("the lab's content did not change: data version kept (indexes may have been refreshed)")
    return dg.MaterializeResult(
        data_version=dg.DataVersion(version or str(res.version)),
        metadata={
            "dagster/row_count": dg.MetadataValue.int(res.rows),
            "lance_uri": dg.MetadataValue.path(table_uri(root, IMAGES_TABLE)),
            "lance_version": res.version,
            "tags": dg.MetadataValue.json(res.tags),
            "published_tag": PUBLISHED_TAG,
            "fragments": res.fragments,
            "size_bytes": res.size_bytes,
            "columns_added": dg.MetadataValue.json(res.columns_added),
            "rows_updated": dg.MetadataValue.json(res.rows_updated),
            "sync_modes": dg.MetadataValue.json(res.modes),
            "sync_seconds": dg.MetadataValue.json(res.seconds),
            "indexes_created": dg.MetadataValue.json(res.indexes_created),
            "index_coverage": dg.MetadataValue.md(coverage),
            CURSOR_KEY: dg.MetadataValue.json(cursor),
            FINGERPRINT_KEY: dg.MetadataValue.text(lab_fingerprint_of(models, inputs_changed=False)),
        },
    )
