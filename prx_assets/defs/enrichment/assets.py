"""recaptions and image_embeddings: per-image model outputs for each ingest batch."""

from typing import Any

import dagster as dg

from prx_assets.core.enrich.enrichment import EnrichResult
from prx_assets.core.lab.schema import CAPTIONS_TABLE, embeddings_table
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.core.stages.enrich import split_recaption_key as stage_key_parts
from prx_assets.defs.ingest import raw_images
from prx_assets.defs.keys import IMAGE_EMBEDDINGS, RAW_IMAGES, RECAPTIONS, group
from prx_assets.infra.partitions import raw_batches, recaption_partitions
from prx_assets.infra.pictures import caption_pictures
from prx_assets.infra.remote import run_stage, run_stages, stage_resources
from prx_assets.infra.staleness import (
    FINGERPRINT_KEY,
    FINGERPRINTS_KEY,
    FingerprintContext,
    digest,
    previous_data_version,
)
from prx_assets.resources.models import CaptionerResource, EmbedderResource
from prx_assets.resources.slurm import SlurmResource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

RECAPTION_CODE_VERSION = "recaption-1"


EMBEDDING_CODE_VERSION = "embedding-1"


def split_recaption_key(key: str | dg.MultiPartitionKey) -> tuple[str, str]:
    """``(batch, captioner_id)`` of a recaptions partition key (string or MultiPartitionKey)."""
    if isinstance(key, dg.MultiPartitionKey):
        dims = key.keys_by_dimension
        return dims["batch"], dims["captioner"]
    return stage_key_parts(str(key))


def _upstream_version(ctx: FingerprintContext, batch: str) -> str:
    return ctx.data_version(RAW_IMAGES, batch)


def recaptions_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """Code version + captioner id + the upstream batch's data version."""
    batch, captioner_id = split_recaption_key(partition_key or "")
    return digest(RECAPTION_CODE_VERSION, captioner_id, _upstream_version(ctx, batch))


def embeddings_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """Code version + embedder id + the upstream batch's data version."""
    models = ctx.models
    embedder_id = models.embedder.embedder_id() if models and models.embedder else ""
    return digest(EMBEDDING_CODE_VERSION, embedder_id, _upstream_version(ctx, partition_key or ""))






def _data_version(context: dg.AssetExecutionContext, res: EnrichResult) -> dg.DataVersion:
    if res.partition_version is not None:  # the version that last wrote these rows: the same for every
        return dg.DataVersion(str(res.partition_version))  # run that finds them, however runs interleave
    if not res.changed:  # nothing written: keep the previous version so nothing looks stale
        tag = previous_data_version(context)
        if tag:
            return dg.DataVersion(tag)
    return dg.DataVersion(str(res.version if res.version is not None else 0))


def _enrich_metadata(res: EnrichResult, uri: str, fingerprint: str) -> dict[str, Any]:
    return {
        "dagster/row_count": dg.MetadataValue.int(res.written),
        "images_in_batch": res.images,
        "missing_before": res.missing,
        "computed": res.computed,
        "reused_same_content": res.reused,
        "lance_uri": dg.MetadataValue.path(uri),
        "lance_version": res.version if res.version is not None else -1,
        "seconds": round(res.seconds, 3),
        "model_seconds": round(res.compute_seconds, 3),
        "model_load_seconds": round(res.load_seconds, 3),
        "images_per_second": round(res.computed / res.compute_seconds, 3) if res.compute_seconds else 0.0,
        FINGERPRINT_KEY: dg.MetadataValue.text(fingerprint),
    }


@dg.asset(
    partitions_def=recaption_partitions,
    deps=[raw_images],  # each (batch, captioner) partition reads the raw_images batch partition
    group_name=group(RECAPTIONS),
    kinds={"pytorch", "lance"},
    code_version=RECAPTION_CODE_VERSION,
    owners=["team:data"],
    tags={"stage": "recaption"},
)
def recaptions(context: dg.AssetExecutionContext, storage: StorageResource, project: ProjectConfigResource,
               captioner: CaptionerResource, slurm: SlurmResource) -> dg.MaterializeResult:
    """VLM captions of one ingest batch by one captioner (partition ``batch|captioner``).

    Captions are stored per image and captioner id (model + prompt + generation
    settings) in the Lance ``captions`` table with token count and timing; several
    captioners coexist. Incremental: only images without a caption from this captioner
    for their current content are processed; identical images are captioned once. A run
    with nothing missing loads no model and writes nothing.
    """
    _, captioner_id = split_recaption_key(context.partition_key)
    models = project.models()
    spec = models.captioner(captioner_id)
    root = storage.root()
    res = run_stage(context, slurm, "recaptions", str(context.partition_key),
                    stage_resources(storage=storage, project=project, captioner=captioner))
    context.log.info(f"{context.partition_key}: {res.summary()}")
    fp = recaptions_fingerprint(FingerprintContext(root=root, sources=None, instance=context.instance,
                                                   models=models), context.partition_key)
    md = _enrich_metadata(res, table_uri(root, CAPTIONS_TABLE), fp)
    md["captioner_id"] = captioner_id
    md["model"] = spec.model
    md["prompt"] = dg.MetadataValue.text(spec.prompt)
    md.update(caption_pictures(root, split_recaption_key(context.partition_key)[0], captioner_id))
    return dg.MaterializeResult(metadata=md, data_version=_data_version(context, res))


#: Partitions per run in a backfill of image_embeddings: the embedder loads once per run
#: instead of once per partition, and Dagster starts one run process per 8 batches.
EMBED_PARTITIONS_PER_RUN = 8


@dg.asset(
    partitions_def=raw_batches,
    deps=[raw_images],
    group_name=group(IMAGE_EMBEDDINGS),
    kinds={"pytorch", "lance"},
    code_version=EMBEDDING_CODE_VERSION,
    owners=["team:data"],
    tags={"stage": "embed"},
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=EMBED_PARTITIONS_PER_RUN),
)
def image_embeddings(context: dg.AssetExecutionContext, storage: StorageResource,
                     project: ProjectConfigResource, embedder: EmbedderResource,
                     slurm: SlurmResource) -> dg.MaterializeResult:
    """Image vectors of one ingest batch from the embedder in models.yaml (SigLIP/CLIP).

    L2-normalized float32 vectors per image and embedder id, in the Lance table
    ``embeddings_<embedder id>``, for vector search and semantic dedup. Incremental, and
    identical images share one vector. A backfill runs up to ``EMBED_PARTITIONS_PER_RUN``
    batches per run (the model loads once); such a run records totals, a per-batch table
    and each batch's fingerprint.
    """
    models = project.models()
    if models.embedder is None:
        raise dg.Failure(f"no embedder configured in {models.path}; add embedder: {{model: ...}}")
    spec = models.embedder
    embedder_id = spec.embedder_id()
    root = storage.root()
    name = embeddings_table(embedder_id)
    keys = list(context.partition_keys)
    resources = stage_resources(storage=storage, project=project, embedder=embedder)
    results = run_stages(context, slurm, "image_embeddings", keys, resources)  # one process: one model load
    table = open_table(table_uri(root, name), root.storage_options())
    dim = table.schema.field("embedding").type.list_size if table is not None else 0
    fctx = FingerprintContext(root=root, sources=None, instance=context.instance, models=models)
    if len(keys) == 1:
        res = results[keys[0]]
        md = _enrich_metadata(res, table_uri(root, name), embeddings_fingerprint(fctx, keys[0]))
        version = _data_version(context, res)
    else:
        total = EnrichResult(batch=f"{keys[0]}..{keys[-1]}", key=embedder_id)
        for r in results.values():
            for f in ("images", "missing", "computed", "reused", "written", "seconds", "compute_seconds",
                      "load_seconds"):
                setattr(total, f, getattr(total, f) + getattr(r, f))
        total.version = table.version if table is not None else None
        md = _enrich_metadata(total, table_uri(root, name), "")
        del md[FINGERPRINT_KEY]
        md[FINGERPRINTS_KEY] = dg.MetadataValue.json({pk: embeddings_fingerprint(fctx, pk) for pk in keys})
        md["partitions_in_run"] = len(keys)
        md["per_batch"] = dg.MetadataValue.md("\n".join(
            ["| batch | images | computed | reused | Lance version |", "|---|---|---|---|---|"] +
            [f"| {pk} | {r.images} | {r.computed} | {r.reused} | {r.version} |" for pk, r in results.items()]))
        version = dg.DataVersion(str(total.version if total.version is not None else 0))
    md["embedder_id"] = embedder_id
    md["model"] = spec.model
    md["dim"] = dim
    return dg.MaterializeResult(metadata=md, data_version=version)


