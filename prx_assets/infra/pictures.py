"""Metadata pictures for the UI: contact sheets (thumbnails + captions) and histograms.

Built from a small sample read from the lab, so they cost milliseconds; a failure to draw
never fails a materialization (the entry then says why).
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import lance
import pyarrow as pa

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.schema import CAPTIONS_TABLE, IMAGES_TABLE
from prx_assets.core.lab.sql import literal, where_in
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.core.manifests import ShardSetManifest
from prx_assets.core.visuals import bar_chart, contact_sheet, line_chart, md_image

SHEET_SIZE = 12


def _safe(fn: Any, *args: Any, **kwargs: Any) -> dg.MetadataValue:
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        return dg.MetadataValue.text(f"could not draw: {type(e).__name__}: {e}")


def _sheet(rows: Sequence[Mapping[str, Any]], caption_key: str, title: str) -> dg.MetadataValue:
    if not rows:
        return dg.MetadataValue.md(f"*{title}: no images*")
    items = [(r["jpeg"], f"{r['image_id'][:10]} {r['width']}x{r['height']}: {r.get(caption_key) or ''}")
             for r in rows]
    return dg.MetadataValue.md(f"**{title}**\n\n" + md_image(contact_sheet(items), title))


def chart(counts: Mapping[str, float], title: str) -> dg.MetadataValue:
    """A bar chart of ``counts`` as an inline image."""
    return _safe(lambda: dg.MetadataValue.md(md_image(bar_chart(counts, title), title)))


def curve(values: Sequence[float], title: str, y_label: str, threshold: float | None = None,
          x_label: str = "cycles") -> dg.MetadataValue:
    """A line chart as an inline image."""
    return _safe(lambda: dg.MetadataValue.md(md_image(
        line_chart(values, title, y_label=y_label, x_label=x_label, threshold=threshold), title)))


def resolution_bins(sizes: Sequence[tuple[int, int]]) -> dict[str, int]:
    """Counts of images per megapixel range, in order."""
    edges = [(0.0, 0.25, "<0.25 MP"), (0.25, 0.5, "0.25-0.5 MP"), (0.5, 1.0, "0.5-1 MP"), (1.0, 2.0, "1-2 MP"),
             (2.0, 4.0, "2-4 MP"), (4.0, 1e9, ">4 MP")]
    counts = Counter()
    for w, h in sizes:
        mp = w * h / 1e6
        counts[next(label for lo, hi, label in edges if lo <= mp < hi)] += 1
    return {label: counts[label] for _, _, label in edges if counts[label]}


def by_aspect(counts: Mapping[str, int]) -> dict[str, int]:
    """Bucket counts ordered from tallest to widest (``9:16`` ... ``16:9``), not as text."""
    def ratio(label: str) -> tuple[float, str]:
        try:
            w, h = label.split(":")
            return float(w) / float(h), label
        except ValueError:  # not a ratio label: after the ratios, by name
            return float("inf"), label
    return {k: counts[k] for k in sorted(counts, key=ratio)}


def batch_pictures(root: DataRoot, batch: str, rejects: Mapping[str, int]) -> dict[str, dg.MetadataValue]:
    """raw_images: a contact sheet of the batch, aspect-bucket, resolution and reject-reason charts."""
    def build() -> dict[str, dg.MetadataValue]:
        ds = open_table(table_uri(root, IMAGES_TABLE), root.storage_options())
        if ds is None:
            return {}
        meta = ds.to_table(columns=["width", "height", "aspect_bucket"], filter=f"batch = {literal(batch)}")
        sample = ds.to_table(columns=["image_id", "jpeg", "width", "height", "original_caption"],
                             filter=f"batch = {literal(batch)}", limit=SHEET_SIZE).to_pylist()
        sizes = list(zip(meta.column("width").to_pylist(), meta.column("height").to_pylist(), strict=True))
        out = {
            "contact_sheet": _sheet(sample, "original_caption", f"{batch}: {len(sample)} of {meta.num_rows} images"),
            "aspect_bucket_histogram": chart(by_aspect(Counter(meta.column("aspect_bucket").to_pylist())),
                                             "images per aspect bucket"),
            "resolution_histogram": chart(resolution_bins(sizes), "images per resolution"),
        }
        if rejects:
            out["reject_reason_histogram"] = chart(dict(sorted(rejects.items())), "rejects per reason")
        return out

    try:
        return build()
    except Exception as e:
        return {"contact_sheet": dg.MetadataValue.text(f"could not draw: {type(e).__name__}: {e}")}


def caption_pictures(root: DataRoot, batch: str, captioner_id: str) -> dict[str, dg.MetadataValue]:
    """recaptions: a contact sheet with this captioner's captions and a caption-length chart."""
    try:
        caps = open_table(table_uri(root, CAPTIONS_TABLE), root.storage_options())
        images = open_table(table_uri(root, IMAGES_TABLE), root.storage_options())
        if caps is None or images is None:
            return {}
        rows = caps.to_table(columns=["image_id", "caption"],
                             filter=f"batch = {literal(batch)} AND captioner_id = {literal(captioner_id)}").to_pylist()
        words = Counter(_length_bin(len(r["caption"].split())) for r in rows)
        first = {r["image_id"]: r["caption"] for r in rows[:SHEET_SIZE]}
        sample = images.to_table(columns=["image_id", "jpeg", "width", "height"],
                                 filter=where_in("image_id", list(first))).to_pylist()
        for r in sample:
            r["caption"] = first[r["image_id"]]
        return {"contact_sheet": _sheet(sample, "caption", f"{captioner_id} on {batch}"),
                "caption_length_histogram": chart({k: words[k] for k in _LENGTH_BINS if words[k]},
                                                  "captions per length (words)")}
    except Exception as e:
        return {"contact_sheet": dg.MetadataValue.text(f"could not draw: {type(e).__name__}: {e}")}


_LENGTH_BINS = ["0", "1-4", "5-9", "10-19", "20-39", "40-79", "80+"]


def _length_bin(n: int) -> str:
    for label, hi in (("0", 0), ("1-4", 4), ("5-9", 9), ("10-19", 19), ("20-39", 39), ("40-79", 79)):
        if n <= hi:
            return label
    return "80+"


def subset_pictures(lab: lance.LanceDataset, ids: Sequence[str] | pa.ChunkedArray, caption_column: str | None,
                    buckets: Mapping[str, int], dropped: Mapping[str, int]) -> dict[str, dg.MetadataValue]:
    """curated_subsets: a contact sheet of selected images, bucket and dropped-by-rule charts."""
    try:
        step = max(1, len(ids) // SHEET_SIZE)
        pick = [str(ids[i]) for i in range(0, len(ids), step)][:SHEET_SIZE]  # a list or an Arrow column
        cols = ["image_id", "jpeg", "width", "height"] + ([caption_column] if caption_column else [])
        sample = lab.to_table(columns=cols, filter=where_in("image_id", pick)
                              ).to_pylist()
        return {"contact_sheet": _sheet(sample, caption_column or "", f"{len(sample)} of {len(ids)} selected images"),
                "aspect_bucket_histogram": chart(by_aspect(buckets), "selected images per aspect bucket"),
                "dropped_by_rule_chart": chart(dict(dropped), "images dropped per rule")}
    except Exception as e:
        return {"contact_sheet": dg.MetadataValue.text(f"could not draw: {type(e).__name__}: {e}")}


def shard_set_pictures(manifest: ShardSetManifest) -> dict[str, dg.MetadataValue]:
    """mds_shards: a contact sheet read back from the published MDS set (what the trainer will see)."""
    import shutil
    import tempfile

    from prx_assets.core.publish.shards import open_shard_set

    cache = tempfile.mkdtemp(prefix="prx-mds-sheet-") if "://" in manifest.uri else None
    try:
        with open_shard_set(manifest, cache=cache) as sds:
            n = sds.live_samples
            step = max(1, int(sds.num_samples) // SHEET_SIZE)
            picks = [i for i in range(0, int(sds.num_samples), step) if not sds.is_skipped(i)][:SHEET_SIZE]
            caption_key = next(iter(manifest.caption_plan.get("columns") or {}), "")
            rows = []
            for i in picks:
                s = sds[i]
                rows.append({"jpeg": s["image"], "image_id": s["image_id"], "width": s["width"],
                             "height": s["height"], "caption": s.get(caption_key, "") if caption_key else ""})
        return {"contact_sheet": _sheet(rows, "caption", f"{len(rows)} of {n} samples read back from the shards")}
    except Exception as e:
        return {"contact_sheet": dg.MetadataValue.text(f"could not draw: {type(e).__name__}: {e}")}
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
