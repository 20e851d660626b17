"""The verdict of the ``jpeg_q92_cycles`` check, without Dagster: which rows it judges, what
content-aware storage did to the partition, the cycle experiment re-read from the source where
ingest measured none, tile estimates confirmed on whole images, and errors against warnings.

The check in :mod:`prx_assets.defs.ingest` reads the partition's rows and ingest's sample, calls
these, and turns the result into an ``AssetCheckResult``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from prx_assets.core.config.project import IngestSettings
from prx_assets.core.ingest.images import SOURCE_MAX_GROWTH, prepare_rgb
from prx_assets.core.ingest.jpeg_quality import (
    CONFIRM_MAX_PIXELS,
    QualityReport,
    check_curve,
    cycle_curve,
    is_tiled,
    pick_sample,
)
from prx_assets.core.ingest.sources import SourceReader


def jpeg_by_choice(rows: list[dict[str, Any]], s: IngestSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(chosen, bounded)``: the JPEG-stored rows the experiment judges, and those stored as JPEG
    only because lossless bytes would break the size bound. With content-aware storage, a JPEG
    whose first-generation PSNR (``q92_psnr_db``) is below the bound was not chosen: the
    bound sent it to lossless and :data:`~prx_assets.core.ingest.images.SOURCE_MAX_GROWTH` sent it back."""
    chosen: list[dict[str, Any]] = []
    bounded: list[dict[str, Any]] = []
    for r in rows:
        if (r.get("stored_format") or "jpeg") == "jpeg":
            psnr = r.get("q92_psnr_db")
            below = s.lossless_fallback != "off" and psnr is not None and psnr < s.q92_min_psnr_db
            (bounded if below else chosen).append(r)
    return chosen, bounded


def storage_summary(rows: list[dict[str, Any]], s: IngestSettings) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """What content-aware storage did to a partition: the rows stored as the configured JPEG by choice
    (what the cycle experiment judges), the numbers to report (lossless share, first-generation PSNR
    quantiles) and the warnings (too much stored losslessly, JPEGs kept only by the size bound)."""
    jpeg_rows, bounded = jpeg_by_choice(rows, s)
    share = 1.0 - (len(jpeg_rows) + len(bounded)) / len(rows)
    psnrs = np.asarray([r["q92_psnr_db"] for r in rows if r.get("q92_psnr_db") is not None], dtype=np.float64)
    summary: dict[str, Any] = {"lossless_share": round(share, 4), "lossless_images": len(rows) - len(jpeg_rows),
                               "size_bound_jpeg_images": len(bounded)}
    if len(psnrs):
        q = np.quantile(psnrs, [0.0, 0.05, 0.5, 0.95])
        summary.update({"first_generation_psnr_min_db": round(float(q[0]), 2),
                        "first_generation_psnr_p05_db": round(float(q[1]), 2),
                        "first_generation_psnr_p50_db": round(float(q[2]), 2),
                        "first_generation_psnr_p95_db": round(float(q[3]), 2),
                        "below_bound_share": round(float(np.mean(psnrs < s.q92_min_psnr_db)), 4)})
    warnings = [f"{share:.1%} of the partition is stored losslessly (above fallback_warn_share "
                f"{s.fallback_warn_share}): its content is mostly line art, text or palettes, or jpeg_quality "
                "is too low for it"] if share > s.fallback_warn_share else []
    if bounded:
        warnings.append(f"{len(bounded)} images below the bound are stored as JPEG because their lossless bytes "
                        f"would exceed {SOURCE_MAX_GROWTH}x the source's (lossless_oversize: the best JPEG that fits, "
                        "else the configured quality; ingest metadata lossless_reasons counts each)")
    return jpeg_rows, summary, warnings


def q92_verdict(report: QualityReport, content_aware: bool) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` of the cycle experiment. Without content-aware storage any cycle below
    the bound is an error (as the experiment defines it). With it, the stored bytes are the first
    generation and never re-encoded (shards carry them as is), and each image whose first
    generation would miss the bound is already stored losslessly: only a first cycle below the
    bound is an error; a later one is generational loss of this content, a warning."""
    if not content_aware or not report.curves:
        return report.failures, []
    curve = report.mean_curve
    if curve[0] < report.min_psnr_db:
        return report.failures, []
    later = next((i for i, v in enumerate(curve, 1) if v < report.min_psnr_db), None)
    if later is None:
        return [], []
    return [], [f"generational loss: mean PSNR {curve[later - 1]:.2f} dB after cycle {later} of {report.cycles} "
                f"is below the bound {report.min_psnr_db} dB (first generation {curve[0]:.2f} dB); the stored "
                "first-generation bytes are never re-encoded"]


def reread_sample(rows: list[dict[str, Any]], n_rows: int, reader: SourceReader,
                  settings: IngestSettings) -> QualityReport:
    """The experiment on a sample re-read from the source (partitions without an ingest-time
    sample): ``q92_sample`` images at most, one decoded at a time, measured on the same tiles."""
    report = QualityReport(quality=settings.jpeg_quality, cycles=settings.q92_cycles,
                           min_psnr_db=settings.q92_min_psnr_db)
    for row in pick_sample(rows, settings.q92_sample, seed=n_rows):
        rgb = prepare_rgb(reader.read_uri(row["uri"]), settings).rgb
        report.curves.append(check_curve(rgb, settings, row["uri"].rsplit("/", 1)[-1]))
    return report


def confirm_whole(report: QualityReport, rows: list[dict[str, Any]], reader: SourceReader,
                  settings: IngestSettings) -> tuple[QualityReport, int, dict[str, str]]:
    """The sample's tile estimates measured again whole, re-read from the source, one image at a
    time: the report, how many images were re-measured, and why any was not (its label's file is
    not exactly one of ``rows``, or it is gone, changed since ingest (``sha256``) or undecodable;
    those keep their tile estimate, as do images over :data:`CONFIRM_MAX_PIXELS`)."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_label.setdefault(row["uri"].rsplit("/", 1)[-1], []).append(row)
    out = QualityReport(quality=report.quality, cycles=report.cycles, min_psnr_db=report.min_psnr_db)
    done, kept = 0, {}
    for c in report.curves:
        if not is_tiled(c):
            out.curves.append(c)
            continue
        found = by_label.get(c.label, [])
        why = (f"{c.width * c.height:,} pixels, over {CONFIRM_MAX_PIXELS:,}" if c.width * c.height > CONFIRM_MAX_PIXELS
               else f"{len(found)} files of the partition have this name" if len(found) != 1 else None)
        rgb = None
        if why is None:
            row = found[0]
            try:
                data = reader.read_uri(row["uri"])
                if row.get("sha256") and hashlib.sha256(data).hexdigest() != row["sha256"]:
                    why = f"{row['uri']} changed since ingest (sha256)"
                else:
                    rgb = prepare_rgb(data, settings).rgb
            except Exception as e:  # gone or unreadable now: the tile estimate stands, and says why
                why = f"{row['uri']}: {type(e).__name__}: {e}"
        if rgb is None:
            kept[c.label] = str(why)
            out.curves.append(c)
            continue
        out.curves.append(cycle_curve(rgb, settings.jpeg_quality, settings.q92_cycles, settings.jpeg_subsampling,
                                      c.label, max_pixels=0, png_reference=settings.q92_png_reference))
        done += 1
    return out, done, kept
