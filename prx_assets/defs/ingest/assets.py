"""raw_images: ingest batches, the JPEG q92 check, and the discovery sensor."""

from typing import Any

import dagster as dg

from prx_assets.core.config.project import IngestSettings, SourcesConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import discover_sources, parse_batch_key
from prx_assets.core.ingest.pipeline import IngestResult
from prx_assets.core.stages.settings import StageResources
from prx_assets.defs.keys import RAW_IMAGES, group
from prx_assets.infra.partitions import raw_batches
from prx_assets.infra.pictures import batch_pictures
from prx_assets.infra.remote import run_stage, stage_resources
from prx_assets.infra.staleness import (
    FINGERPRINT_KEY,
    FingerprintContext,
    digest,
    previous_data_version,
)
from prx_assets.resources.s3 import PrxS3Resource as S3Resource
from prx_assets.resources.slurm import SlurmResource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

#: Bump when the normalization code changes what is stored. ingest-2: image ids hash the key relative
#: to the source's location, not the absolute URI (the next run after upgrading re-ingests every batch
#: once; captions and embeddings are reused by content).
INGEST_CODE_VERSION = "ingest-2"


def raw_images_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """Code version + the source's normalization config + the batch manifest."""
    if partition_key is None:
        return ""
    source, _ = parse_batch_key(partition_key)
    manifest_hash = ctx.manifest_hash(partition_key)
    if ctx.sources is None:
        raise ValueError("raw_images fingerprints need the sources config")
    return digest(INGEST_CODE_VERSION, ctx.sources.get(source).fingerprint(), manifest_hash)




def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(lines)


#: Metadata key of the q92 experiment ingest ran on the partition's sample (read by the check).
Q92_SAMPLE_KEY = "q92_cycle_sample"


def ingest_metadata(result: IngestResult, fingerprint: str, settings: IngestSettings) -> dict[str, Any]:
    """Materialization metadata for one ingested batch (``settings``: its source's ingest settings)."""
    total = result.rows + result.rejected
    return {
        "dagster/row_count": dg.MetadataValue.int(result.rows),
        "rejected": dg.MetadataValue.int(result.rejected),
        "rejects_by_reason": dg.MetadataValue.json(result.rejects),
        "reject_examples": dg.MetadataValue.md(md_table(
            ["uri", "reason", "message"],
            [[e["uri"], e["reason"], e["message"]] for e in result.reject_examples]) if
            result.reject_examples else "no rejects"),
        "decoder_warnings": dg.MetadataValue.int(result.decoder_warnings),
        "decoder_warning_examples": dg.MetadataValue.md(md_table(
            ["uri", "warnings"], [[e["uri"], e["warnings"]] for e in result.warning_examples]) if
            result.warning_examples else "no decoder warnings"),
        "items_seen": dg.MetadataValue.int(total),
        "bytes_in": dg.MetadataValue.int(result.bytes_in),
        "bytes_out_jpeg": dg.MetadataValue.int(result.bytes_out),
        "jpeg_to_original_ratio": dg.MetadataValue.float(
            round(result.bytes_out / result.bytes_in, 4) if result.bytes_in else 0.0),
        "aspect_buckets": dg.MetadataValue.json(result.buckets),
        "original_formats": dg.MetadataValue.json(result.formats),
        "stored_formats": dg.MetadataValue.json(result.stored_formats),
        "lossless_share": dg.MetadataValue.float(round(result.lossless_share, 4)),
        "lossless_reasons": dg.MetadataValue.json(result.lossless_reasons),
        "q92_psnr_db": dg.MetadataValue.json(result.psnr_quantiles()),
        Q92_SAMPLE_KEY: dg.MetadataValue.json({"settings": settings.q92_check_settings(), "curves": result.q92_curves}),
        "q92_check_seconds": dg.MetadataValue.float(round(result.q92_seconds, 3)),
        "q92_check_share": dg.MetadataValue.float(
            round(result.q92_seconds / result.work_seconds, 4) if result.work_seconds else 0.0),
        "lance_uri": dg.MetadataValue.path(result.images_uri),
        "lance_version": dg.MetadataValue.int(result.images_version),
        "rejects_uri": dg.MetadataValue.path(result.rejects_uri),
        "rows_inserted_updated_deleted": dg.MetadataValue.text(
            f"{result.inserted}/{result.updated}/{result.deleted}"),
        "seconds": dg.MetadataValue.float(round(result.seconds, 3)),
        "worker_processes": dg.MetadataValue.int(result.processes),
        "images_per_second": dg.MetadataValue.float(
            round((total - result.read_ahead) / result.seconds, 2) if result.seconds else 0.0),
        "read_ahead_images": dg.MetadataValue.int(result.read_ahead),
        "read_ahead_seconds": dg.MetadataValue.float(round(result.read_ahead_seconds, 3)),
        FINGERPRINT_KEY: dg.MetadataValue.text(fingerprint),
    }


def ingest_resources(defs: dg.Definitions, keys: list[dg.AssetKey]) -> StageResources | None:
    """The settings ``raw_images`` runs with in this process, when ``keys`` include it and its
    stage runs in-process (not as SLURM jobs); else ``None``: nothing to read ahead here."""
    res = defs.resources
    slurm = res.get("slurm")
    if RAW_IMAGES not in keys or (isinstance(slurm, SlurmResource) and "raw_images" in slurm.stages):
        return None
    return stage_resources(storage=res["storage"], project=res["project"], s3=res.get("s3"))


@dg.asset(
    partitions_def=raw_batches,
    group_name=group(RAW_IMAGES),
    kinds={"lance", "python"},
    code_version=INGEST_CODE_VERSION,
    owners=["team:data"],
    tags={"stage": "ingest"},
)
def raw_images(context: dg.AssetExecutionContext, storage: StorageResource,
               project: ProjectConfigResource, s3: S3Resource, slurm: SlurmResource) -> dg.MaterializeResult:
    """Validated, normalized images of one ingest batch (partition ``<source>-<seq>``).

    Every file of the batch is decoded, EXIF-oriented, converted to RGB (alpha on
    white), optionally downscaled and re-encoded as JPEG quality 92; width/height,
    original format and size, sha256, a 64-bit perceptual hash and an aspect bucket are
    recorded. Rows go into the Lance ``images`` table; files that fail go into the
    ``rejects`` table with a reason code and never fail the run. Re-materializing
    replaces the partition's rows in one commit. The data version is the Lance version
    that last changed this partition.
    """
    key = context.partition_key
    result = run_stage(context, slurm, "raw_images", key, stage_resources(storage=storage, project=project, s3=s3))
    root = storage.root()
    sources = project.sources()
    settings = sources.get(parse_batch_key(key)[0]).ingest
    fingerprint = raw_images_fingerprint(FingerprintContext(root=root, sources=sources), key)
    changed = result.inserted + result.updated + result.deleted > 0
    version = str(result.images_version)
    if not changed:  # the version of the last change; a run racing with the one that made it finds its rows
        version = previous_data_version(context) or str(result.partition_version or version)
    return dg.MaterializeResult(metadata={**ingest_metadata(result, fingerprint, settings),
                                          **batch_pictures(root, key, result.rejects)},
                                data_version=dg.DataVersion(version))


def discover_batches(root: DataRoot, sources: SourcesConfig, s3_client: Any = None,
                     only: str | None = None, full: bool = False, dry_run: bool = False) -> list[dict[str, Any]]:
    """Run discovery for every source (or one) and return their summaries with batch lists
    (``full``: list every file again and report changed ones; ``dry_run``: write nothing); see
    :func:`~prx_assets.core.ingest.batches.discover_sources`."""
    return discover_sources(root, sources, s3_client=s3_client, only=only, full=full, dry_run=dry_run)
