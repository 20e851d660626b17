"""raw_images: ingest batches, the JPEG q92 check, and the discovery sensor."""


import json
import time
from typing import Any

import dagster as dg

from prx_assets.core.config.project import IngestSettings, SourcesConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import discover_sources, parse_batch_key
from prx_assets.core.ingest.jpeg_quality import (
    CycleCurve,
    QualityReport,
    needs_confirmation,
)
from prx_assets.core.ingest.pipeline import IngestResult
from prx_assets.core.ingest.q92_check import confirm_whole, q92_verdict, reread_sample, storage_summary
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.schema import IMAGES_TABLE
from prx_assets.core.lab.sql import where_eq
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.core.stages.settings import StageResources
from prx_assets.defs.partitions import missing_partitions, raw_batches
from prx_assets.defs.remote import run_stage, stage_resources
from prx_assets.defs.staleness import (
    FINGERPRINT_KEY,
    FingerprintContext,
    digest,
    previous_data_version,
    register_fingerprint,
)
from prx_assets.defs.visual_metadata import batch_pictures, curve
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


register_fingerprint("raw_images", raw_images_fingerprint)


def _md_table(headers: list[str], rows: list[list[Any]]) -> str:
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
        "reject_examples": dg.MetadataValue.md(_md_table(
            ["uri", "reason", "message"],
            [[e["uri"], e["reason"], e["message"]] for e in result.reject_examples]) if
            result.reject_examples else "no rejects"),
        "decoder_warnings": dg.MetadataValue.int(result.decoder_warnings),
        "decoder_warning_examples": dg.MetadataValue.md(_md_table(
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
RAW_IMAGES = dg.AssetKey("raw_images")


@dg.asset(
    partitions_def=raw_batches,
    group_name="ingest",
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




def ingest_sample(instance: dg.DagsterInstance, key: str, settings: IngestSettings) -> list[CycleCurve] | None:
    """The q92 curves ingest measured on partition ``key``'s sample, from its latest materialization
    (one record); ``None`` when it has none measured at the current check settings (a partition
    ingested before the check ran at ingest, or since its settings changed)."""
    res = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=raw_images.key, asset_partitions=[key]), limit=1)
    mat = res.records[0].asset_materialization if res.records else None
    entry = mat.metadata.get(Q92_SAMPLE_KEY) if mat is not None else None
    doc = entry.value if entry is not None else None
    if not isinstance(doc, dict) or doc.get("settings") != settings.q92_check_settings():
        return None
    return [CycleCurve.from_json(c) for c in doc.get("curves", [])]


@dg.asset_check(asset=raw_images, partitions_def=raw_batches, blocking=True)
def jpeg_q92_cycles(context: dg.AssetCheckExecutionContext, storage: StorageResource,
                    project: ProjectConfigResource, s3: S3Resource) -> dg.AssetCheckResult:
    """Judge the JPEG quality experiment on a sample of the partition's JPEG-stored images.

    Ingest runs the experiment as it goes, on the pixels it has just decoded: a sample that
    scales with the partition (``q92_sample_share`` of its images, at least ``q92_sample``),
    chosen by a hash of the image id, each image measured on MCU-aligned tiles
    (``q92_tile_pixels``) through ``q92_cycles`` decode/encode cycles at the configured quality,
    with PSNR against the original after each. This check reads those curves from the
    partition's materialization (a partition ingested without them is sampled again from the
    source) and fails (ERROR, blocking) when the sample's mean PSNR falls below
    ``q92_min_psnr_db`` after any cycle. When that curve is a tile estimate within
    ``q92_confirm_db`` of the bound, the sampled images are re-read and measured whole first
    (:func:`confirm_whole`), and the verdict is theirs. With content-aware storage on (``lossless_fallback``),
    images whose JPEG would lose more than that are stored losslessly at ingest, so content
    alone does not fail the check: it reports the share stored losslessly and the partition's
    first-generation PSNR distribution, and warns (WARN, not blocking) when that share is above
    ``fallback_warn_share``. Its metadata says what the experiment cost at ingest.
    """
    started = time.perf_counter()
    key = context.partition_key
    source_name, _ = parse_batch_key(key)
    cfg = project.sources().get(source_name)
    s = cfg.ingest
    root = storage.root()
    ds = open_table(table_uri(root, IMAGES_TABLE), root.storage_options())
    cols = ["image_id", "uri", "width", "height", "sha256"]
    if ds is not None:
        cols += [c for c in ("stored_format", "q92_psnr_db") if c in ds.schema.names]
    rows = [] if ds is None else ds.to_table(columns=cols, filter=where_eq("batch", key)).to_pylist()
    if not rows:
        return dg.AssetCheckResult(passed=True, metadata={"sampled": 0, "note": "no images in partition"})
    jpeg_rows, summary, warnings = storage_summary(rows, s)
    storage_md: dict[str, Any] = {**summary, "fallback_warn_share": dg.MetadataValue.text(str(s.fallback_warn_share))}
    if not jpeg_rows:
        return dg.AssetCheckResult(passed=not warnings, severity=dg.AssetCheckSeverity.WARN,
                                   description="; ".join(warnings) or None,
                                   metadata={"sampled": 0, **storage_md,
                                             "note": "no image is stored as the configured JPEG by choice: "
                                                     "nothing to cycle"})
    curves = ingest_sample(context.instance, key, s)
    if curves:
        report = QualityReport(quality=s.jpeg_quality, cycles=s.q92_cycles, min_psnr_db=s.q92_min_psnr_db,
                               curves=curves)
        measured = "at ingest, on the decoded pixels"
    else:  # ingested before the check ran at ingest, or its sample drew no JPEG-stored image
        report = reread_sample(jpeg_rows, len(rows), reader_for(cfg, s3_client=s3.get_client), s)
        measured = "re-read from the source"
    confirm_md: dict[str, Any] = {"confirmed_whole": 0}
    if needs_confirmation(report, s.q92_confirm_db):  # near the bound: judge on whole images, not tiles
        tiled_min = min(report.mean_curve)
        report, done, kept = confirm_whole(report, jpeg_rows, reader_for(cfg, s3_client=s3.get_client), s)
        measured += (f"; {done} of {len(report.curves)} measured again whole from the source (the tile "
                     f"estimate, {tiled_min:.2f} dB at its lowest, came within q92_confirm_db "
                     f"{s.q92_confirm_db} dB of the bound)")
        confirm_md = {"confirmed_whole": done, "tile_estimate_min_db": round(tiled_min, 3)}
        if kept:
            confirm_md["kept_tile_estimate"] = dg.MetadataValue.json(dict(list(kept.items())[:20]))
    errors, generational = q92_verdict(report, s.lossless_fallback != "off")
    warnings += generational
    return dg.AssetCheckResult(
        passed=not errors and not warnings,
        severity=dg.AssetCheckSeverity.WARN if warnings and not errors else dg.AssetCheckSeverity.ERROR,
        description="; ".join(errors + warnings) or None,
        metadata={**_q92_metadata(report, s, len(jpeg_rows), measured, time.perf_counter() - started),
                  **confirm_md, **storage_md})


def _q92_metadata(report: QualityReport, s: IngestSettings, judged: int, measured: str,
                  seconds: float) -> dict[str, Any]:
    """The check's metadata about the experiment: settings, sample, curve (table and chart), per image."""
    meta = report.to_metadata()
    curve_rows = [[i + 1, v] for i, v in enumerate(meta["mean_psnr_curve_db"])]
    extra = {"jpeg_to_png_size_ratio": meta["jpeg_to_png_size_ratio"]} if "jpeg_to_png_size_ratio" in meta else {}
    return {
        # Settings are text, not numbers: the UI's Plots tab charts numeric entries over partitions.
        "quality": dg.MetadataValue.text(str(s.jpeg_quality)),
        "cycles": dg.MetadataValue.text(str(s.q92_cycles)),
        "sampled": len(report.curves),
        "sample_share": round(len(report.curves) / judged, 4),
        "measured": dg.MetadataValue.text(measured),
        "measured_pixels": sum(c.measured_pixels for c in report.curves),
        "cycles_encoded": sum(c.cycles_run for c in report.curves),
        "check_seconds": round(seconds, 3),
        "first_cycle_psnr_db": meta["first_cycle_psnr_db"],
        "max_drop_db": meta["max_drop_db"],
        "last_cycle_psnr_db": meta["mean_psnr_curve_db"][-1],
        **extra,
        "psnr_curve": dg.MetadataValue.md(_md_table(["cycle", "mean PSNR (dB)"], curve_rows)),
        "psnr_curve_chart": curve(meta["mean_psnr_curve_db"], f"mean PSNR after each q{s.jpeg_quality} cycle",
                                  "dB", threshold=s.q92_min_psnr_db),
        "per_image": dg.MetadataValue.json(meta["images"]),
        "min_psnr_db_bound": dg.MetadataValue.text(f"{s.q92_min_psnr_db} dB"),
    }


ingest_job = dg.define_asset_job(
    "ingest_job", selection=dg.AssetSelection.assets(raw_images),
    description="Ingest raw_images partitions (with the JPEG q92 check).")


def discover_batches(root: DataRoot, sources: SourcesConfig, s3_client: Any = None,
                     only: str | None = None, full: bool = False, dry_run: bool = False) -> list[dict[str, Any]]:
    """Run discovery for every source (or one) and return their summaries with batch lists
    (``full``: list every file again and report changed ones; ``dry_run``: write nothing); see
    :func:`~prx_assets.core.ingest.batches.discover_sources`."""
    return discover_sources(root, sources, s3_client=s3_client, only=only, full=full, dry_run=dry_run)


@dg.sensor(job=ingest_job, minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED)
def raw_batch_sensor(context: dg.SensorEvaluationContext, storage: StorageResource,
                     project: ProjectConfigResource, s3: S3Resource) -> dg.SensorResult:
    """Discover new files in every source, add batch partitions, and launch their ingest.

    New files are grouped into new immutable batches (old batches are never touched);
    each new partition gets one run (run key ``raw_images:<partition>``). Captioners added
    to models.yaml and recipes added to recipes.yaml are registered as partitions. The cursor records the
    batch count per source.
    """
    reports = discover_batches(storage.root(), project.sources(), s3_client=s3.get_client)
    fresh = missing_partitions(context.instance, project, (k for r in reports for k in r["all_batches"]))
    new_keys = fresh.get(raw_batches.name or "", [])
    requests = [dg.AddDynamicPartitionsRequest(partitions_def_name=name, partition_keys=keys)
                for name, keys in fresh.items()]
    cursor = json.dumps({r["source"]: r["batches"] for r in reports}, sort_keys=True)
    if not new_keys:
        return dg.SensorResult(skip_reason="no new files in any source", cursor=cursor,
                               dynamic_partitions_requests=requests)
    return dg.SensorResult(
        run_requests=[dg.RunRequest(partition_key=k, run_key=f"raw_images:{k}") for k in new_keys],
        dynamic_partitions_requests=requests,
        cursor=cursor,
    )
