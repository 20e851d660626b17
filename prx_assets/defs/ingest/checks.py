"""The stage's asset checks."""

import time
from typing import Any

import dagster as dg

from prx_assets.core.config.project import IngestSettings
from prx_assets.core.ingest.batches import parse_batch_key
from prx_assets.core.ingest.jpeg_quality import (
    CycleCurve,
    QualityReport,
    needs_confirmation,
)
from prx_assets.core.ingest.q92_check import confirm_whole, q92_verdict, reread_sample, storage_summary
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.schema import IMAGES_TABLE
from prx_assets.core.lab.sql import where_eq
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.defs.ingest.assets import Q92_SAMPLE_KEY, md_table, raw_images
from prx_assets.infra.partitions import raw_batches
from prx_assets.infra.pictures import curve
from prx_assets.resources.s3 import PrxS3Resource as S3Resource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource


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
        "psnr_curve": dg.MetadataValue.md(md_table(["cycle", "mean PSNR (dB)"], curve_rows)),
        "psnr_curve_chart": curve(meta["mean_psnr_curve_db"], f"mean PSNR after each q{s.jpeg_quality} cycle",
                                  "dB", threshold=s.q92_min_psnr_db),
        "per_image": dg.MetadataValue.json(meta["images"]),
        "min_psnr_db_bound": dg.MetadataValue.text(f"{s.q92_min_psnr_db} dB"),
    }
