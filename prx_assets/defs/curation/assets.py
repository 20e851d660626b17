"""curated_subsets: one partition per recipe, ids pinned to a Lance version."""

import dagster as dg
from pydantic import Field

from prx_assets.core.curate.kept_digests import kept_digests
from prx_assets.core.curate.optout import load_requests, registry_version
from prx_assets.core.curate.phash_pairs import phash_pairs_kept
from prx_assets.core.curate.search_codes import search_codes
from prx_assets.core.curate.search_models import search_models
from prx_assets.core.curate.search_pairs import search_pairs
from prx_assets.core.curate.selection import select
from prx_assets.core.curate.subsets import write_subset
from prx_assets.core.lab.query import open_lab
from prx_assets.core.lab.sync import PUBLISHED_TAG, embedding_column
from prx_assets.defs.keys import CURATED_SUBSETS, group
from prx_assets.defs.lab import lance_table
from prx_assets.infra.partitions import recipe_partitions
from prx_assets.infra.pictures import subset_pictures
from prx_assets.infra.staleness import (
    FINGERPRINT_KEY,
    FingerprintContext,
    digest,
    latest_data_version,
)
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

#: curation-2: embedding dedup above the exact method's size files rows with a kept model (see
#: core/curate/search_models.py), so near-threshold decisions may differ once from curation-1's.
#: curation-3: the products that decide a row's int8 code and cells sum in float64 in same-shaped
#: calls (``multi_index.row_products``): curation-2's float32 256-row blocks still depended on the
#: rows beside them on some CPUs (an AMD EPYC), so a few near-threshold decisions may differ once.
#: Kept search models stay valid (their files are not retrained).
CURATION_CODE_VERSION = "curation-3"


def curated_fingerprint_of(recipe_hash: str, lab_data_version: str, optouts: str) -> str:
    """The one formula: code version + recipe hash + the lab's data version (its content, not its
    Lance version: a lab sync that changed nothing keeps its data version) + the opt-out requests."""
    return digest(CURATION_CODE_VERSION, recipe_hash, lab_data_version, optouts)


def curated_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """The fingerprint a run now would record: of the recipe and the lab's current data version."""
    recipe = ctx.config().recipes().get(partition_key or "")
    return curated_fingerprint_of(recipe.recipe_hash(), ctx.data_version(lance_table.key, None),
                                  registry_version(load_requests(ctx.root)))




class CurationConfig(dg.Config):
    """Which lab version a subset is cut from."""

    lance_version: int | None = Field(
        default=None, description="Lance version to read; default: the version tagged 'published'.")


@dg.asset(
    partitions_def=recipe_partitions,
    deps=[lance_table],
    group_name=group(CURATED_SUBSETS),
    kinds={"lance", "python"},
    code_version=CURATION_CODE_VERSION,
    owners=["team:data"],
    tags={"stage": "curate"},
)
def curated_subsets(context: dg.AssetExecutionContext, config: CurationConfig, storage: StorageResource,
                    project: ProjectConfigResource) -> dg.MaterializeResult:
    """The image ids a recipe selects from the lab, pinned to one Lance version.

    Non-destructive: the lab is only read. The recipe's predicate, resolution and bucket
    rules are pushed down to Lance; opt-out lists, caption availability, exact/perceptual/
    embedding dedup and the seeded cap follow, each with a drop count. The version is
    tagged so cleanup keeps it. The data version is the subset id, a hash of the subset's
    content (ids, original hashes, caption texts): a re-cut that selects the same content
    keeps its id and writes nothing, so nothing downstream runs again.
    """
    recipe = project.recipes().get(context.partition_key)
    models = project.models()
    root = storage.root()
    ds = open_lab(root, version=config.lance_version,
                  tag=None if config.lance_version is not None else PUBLISHED_TAG)
    emb_col = embedding_column(models.embedder.embedder_id()) if models.embedder else None
    optouts = load_requests(root)
    subset = select(ds, recipe, known_captioner_ids=models.captioner_ids(), embedding_column=emb_col,
                    optouts=optouts, search_models=search_models(root, recipe, emb_col) if emb_col else None,
                    search_codes=search_codes(root, emb_col) if emb_col else None,
                    search_pairs=search_pairs(root, recipe.name) if emb_col else None,
                    digests=kept_digests(root), phash_pairs=phash_pairs_kept(root, recipe.name))
    stored = write_subset(root, ds, recipe, subset)
    context.log.info(f"{recipe.name}: {subset.count} of {subset.total} images at Lance version "
                     f"{subset.version}; dropped {subset.dropped}")
    lab_version = latest_data_version(context.instance, lance_table.key, None) if config.lance_version is None \
        else f"lance-v{config.lance_version}"
    fp = curated_fingerprint_of(recipe.recipe_hash(), lab_version, registry_version(optouts))
    if stored.reused:
        context.log.info(f"subset {stored.subset_id} already written (same content): reused as it is")
    return dg.MaterializeResult(
        data_version=dg.DataVersion(stored.subset_id),
        metadata={
            "dagster/row_count": dg.MetadataValue.int(subset.count),
            "subset_id": stored.subset_id,
            "subset_uri": dg.MetadataValue.path(stored.uri),
            "lance_version": stored.manifest.lance_version,
            "lance_tag": stored.tag,
            "reused": stored.reused,
            "recipe_hash": recipe.recipe_hash(),
            "dropped_by_rule": dg.MetadataValue.json(subset.dropped),
            "optout_requests": dg.MetadataValue.json(subset.optout_dropped),
            "aspect_buckets": dg.MetadataValue.json(subset.buckets),
            "caption_columns": dg.MetadataValue.json(subset.caption_columns),
            **({"search_model": dg.MetadataValue.json(subset.lineage["search_model"])}
               if "search_model" in subset.lineage else {}),
            **({"search_codes": dg.MetadataValue.json(subset.work["search_codes"])}
               if "search_codes" in subset.work else {}),
            **({"search_pairs": dg.MetadataValue.json(subset.work["search_pairs"])}
               if "search_pairs" in subset.work else {}),
            **({"digests": dg.MetadataValue.json(subset.work["digests"])} if "digests" in subset.work else {}),
            **({"phash_pairs": dg.MetadataValue.json(subset.work["phash_pairs"])}
               if "phash_pairs" in subset.work else {}),
            **({"cut_seconds": dg.MetadataValue.json(subset.work["seconds"])} if "seconds" in subset.work else {}),
            **subset_pictures(ds, subset.selected.column("image_id"), subset.caption_columns[0] if subset.caption_columns else None,
                              subset.buckets, subset.dropped),
            "candidates": subset.total,
            FINGERPRINT_KEY: dg.MetadataValue.text(fp),
        },
    )
