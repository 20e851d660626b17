"""mds_shards: one immutable MDS shard set per recipe, verified by reading it back."""

import json

import dagster as dg
from pydantic import Field

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.curate.subsets import read_subset_manifest, read_subset_table
from prx_assets.core.lab.sql import open_pinned
from prx_assets.core.manifests import ManifestError, ShardSetManifest
from prx_assets.core.publish.shards import (
    LAB_CACHE_BYTES,
    SHARDS_CODE_VERSION,
    ShardSettings,
    read_shard_set_manifest,
    write_shard_set,
)
from prx_assets.defs.curation import curated_subsets
from prx_assets.defs.keys import CURATED_SUBSETS, MDS_SHARDS, group
from prx_assets.infra.partitions import recipe_partitions
from prx_assets.infra.pictures import shard_set_pictures
from prx_assets.infra.staleness import (
    FINGERPRINT_KEY,
    FingerprintContext,
    digest,
    latest_data_version,
    previous_data_version,
)
from prx_assets.resources.storage import ProjectConfigResource, StorageResource


class ShardConfig(dg.Config):
    """How shard sets are written."""

    size_limit_mb: int = Field(default=64, description="Shard size limit in MiB.")
    compression: str | None = Field(default=None, description="MDS compression, e.g. zstd (JPEGs gain little).")
    hashes: list[str] = Field(default=["xxh64"], description="Hashes recorded per shard and checked on read.")
    workers: int = Field(default=2, description="Parallel writers (their indexes are merged).")
    by_bucket: bool = Field(default=False, description="Also one sub-stream (own index.json) per aspect bucket.")
    compact_above: float = Field(
        default=0.2, description="A changed subset is published as a delta (new samples in one more stream, removed "
                                 "ones in a skip list, new caption columns in sidecars beside the shards) until "
                                 "deltas plus skipped samples pass this share of the set; then the set is written "
                                 "whole. 0 always writes whole.")
    precomputed_latents: bool = Field(
        default=False, description="Also store text latents of every caption column, computed with models.yaml's "
                                   "text_encoder (latent_{caption_key}_{tower}, attention_mask_...). Off by "
                                   "default: the trainer encodes captions on the fly.")


def shards_fingerprint_of(subset_id: str, recipe: Recipe) -> str:
    """The one formula: code version + the subset written + the caption weights that pick each
    sample's published caption (a ``caption_mix`` change keeps the subset id but changes the set;
    recipes without one keep the fingerprint of before)."""
    mix = [json.dumps(sorted(recipe.caption_mix))] if recipe.caption_mix else []
    return digest(SHARDS_CODE_VERSION, subset_id, *mix)


def shards_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """The fingerprint a run now would record: of the recipe's current subset id and caption weights."""
    recipes = ctx.cache.get("recipes")
    if recipes is None:
        recipes = ctx.cache["recipes"] = ctx.config().recipes()
    return shards_fingerprint_of(ctx.data_version(CURATED_SUBSETS, partition_key), recipes.get(partition_key or ""))




def _subset_of(context: dg.AssetExecutionContext) -> str:
    version = latest_data_version(context.instance, CURATED_SUBSETS, context.partition_key)
    if not version:
        raise dg.Failure(f"curated_subsets has no materialization for recipe {context.partition_key!r}; "
                         "materialize it first")
    return version


def _published(context: dg.AssetExecutionContext, root: DataRoot) -> ShardSetManifest | None:
    """The recipe's currently published set (the base of a delta), if it is still readable."""
    set_id = latest_data_version(context.instance, MDS_SHARDS, context.partition_key)
    if not set_id:
        return None
    try:
        return read_shard_set_manifest(root, context.partition_key, set_id)
    except (FileNotFoundError, OSError, ManifestError) as e:
        context.log.warning(f"published shard set {set_id} cannot be read ({e}); writing the new set whole")
        return None


@dg.asset(
    partitions_def=recipe_partitions,
    deps=[curated_subsets],
    group_name=group(MDS_SHARDS),
    kinds={"mosaicml", "python"},
    code_version=SHARDS_CODE_VERSION,
    owners=["team:data"],
    tags={"stage": "shards"},
)
def mds_shards(context: dg.AssetExecutionContext, config: ShardConfig, storage: StorageResource,
               project: ProjectConfigResource) -> dg.MaterializeResult:
    """The recipe's current curated subset written as an immutable MosaicML MDS shard set.

    Exact stored q92 JPEG bytes in ``image`` (no re-encode), captions in string columns
    named by caption key, ``original_width``/``original_height`` and metadata, following
    PRX's MDS conventions. Written under ``<data root>/mds/<recipe>/<shard set id>/`` and
    published atomically with a ``manifest.json`` recording recipe, Lance version,
    captioner ids, code version, sample and shard counts and bytes. The data version is
    the shard set id. Text latents are not stored unless ``precomputed_latents`` is set.
    """
    recipe = project.recipes().get(context.partition_key)
    root = storage.root()
    sid = _subset_of(context)
    subset_manifest = read_subset_manifest(root, recipe.name, sid)
    subset_table = read_subset_table(root, recipe.name, sid)
    ids = subset_table.column("image_id")  # Arrow: a subset's ids are never one Python list
    lab = open_pinned(subset_manifest, root.storage_options(), cache_bytes=LAB_CACHE_BYTES)
    models = project.models()
    if config.precomputed_latents and models.text_encoder is None:
        raise dg.Failure(f"precomputed_latents needs a text_encoder in {models.path}; add "
                         "text_encoder: {model: ...} or turn precomputed_latents off")
    settings = ShardSettings(size_limit=config.size_limit_mb * 1024 * 1024, compression=config.compression,
                             hashes=tuple(config.hashes), workers=config.workers, by_bucket=config.by_bucket,
                             text_tower=models.text_encoder if config.precomputed_latents else None)
    previous = _published(context, root)
    manifest = write_shard_set(root, lab, recipe, subset_manifest, ids, models.captioner_ids(),
                               settings, lineage={"dagster_run_id": context.run.run_id}, previous=previous,
                               compact_above=config.compact_above, digests=subset_table)
    context.log.info(f"{recipe.name}: {manifest.samples} samples in {manifest.shards} shards at {manifest.uri}")
    version = manifest.shard_set_id
    if previous_data_version(context) == version:
        context.log.info("shard set already published; reusing it")
    return dg.MaterializeResult(
        data_version=dg.DataVersion(version),
        metadata={
            "dagster/row_count": dg.MetadataValue.int(manifest.samples),
            "shard_set_id": version,
            "uri": dg.MetadataValue.path(manifest.uri),
            "manifest": dg.MetadataValue.path(layout.manifest_of(manifest.uri)),
            "shards": manifest.shards,
            "bytes": manifest.bytes,
            "lance_version": manifest.lance_version,
            "subset_id": manifest.subset_id,
            "captioner_ids": dg.MetadataValue.json(list(manifest.captioner_ids)),
            "caption_columns": dg.MetadataValue.json(manifest.caption_plan),
            "columns": dg.MetadataValue.json(manifest.columns),
            "text_latents": dg.MetadataValue.json(manifest.text_latents or {}),
            "layout": manifest.layout,
            "bytes_written": manifest.bytes_written,
            "skipped": manifest.skipped,
            "streams": dg.MetadataValue.json([{"uri": s["uri"], "samples": s["samples"], "role": s["role"],
                                               "sidecar_columns": [c for side in s.get("sidecars", [])
                                                                   for c in side["columns"]]}
                                              for s in manifest.physical_streams()]),
            "sidecar_columns": dg.MetadataValue.json(manifest.extra.get("sidecar_columns", [])),
            "previous_shard_set_id": str(manifest.extra.get("previous_shard_set_id", "")),
            **shard_set_pictures(manifest),
            FINGERPRINT_KEY: dg.MetadataValue.text(shards_fingerprint_of(sid, recipe)),
        },
    )
