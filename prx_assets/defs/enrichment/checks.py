"""The stage's asset checks."""

import dagster as dg

from prx_assets.core.enrich.caption_quality import assess
from prx_assets.core.lab.schema import CAPTIONS_TABLE
from prx_assets.core.lab.sql import where_all, where_eq
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.defs.enrichment.assets import recaptions, split_recaption_key
from prx_assets.infra.partitions import recaption_partitions
from prx_assets.resources.models import CaptionerResource
from prx_assets.resources.storage import StorageResource


@dg.asset_check(asset=recaptions, partitions_def=recaption_partitions, blocking=False)
def caption_quality(context: dg.AssetCheckExecutionContext, storage: StorageResource,
                    captioner: CaptionerResource) -> dg.AssetCheckResult:
    """Flags empty, too short, truncated (hit max tokens) and degenerate (repetition loop)
    captions of the partition; reports a caption-length histogram and examples. Warns when
    the flagged share exceeds ``max_flagged_fraction``."""
    batch, captioner_id = split_recaption_key(context.partition_key)
    root = storage.root()
    ds = open_table(table_uri(root, CAPTIONS_TABLE), root.storage_options())
    rows = [] if ds is None else ds.to_table(
        columns=["caption", "hit_max_tokens"],
        filter=where_all(where_eq("batch", batch), where_eq("captioner_id", captioner_id))).to_pylist()
    rep = assess([(r["caption"], r["hit_max_tokens"]) for r in rows], min_words=captioner.min_words)
    md = rep.to_metadata()
    hist = "\n".join(["| words | captions |", "|---|---|"] +
                     [f"| {k} | {v} |" for k, v in md["length_histogram_words"].items()])
    examples = "\n".join(f"- **{flag}**: `{ex!r}`" for flag, exs in md["examples"].items() for ex in exs)
    passed = rep.flagged_fraction <= captioner.max_flagged_fraction
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=None if passed else (
            f"{rep.flagged} of {rep.total} captions flagged ({rep.flagged_fraction:.0%}) "
            f"> {captioner.max_flagged_fraction:.0%}: {dict(md['counts'])}"),
        metadata={
            "captions": rep.total,
            "flagged": rep.flagged,
            "flagged_fraction": md["flagged_fraction"],
            "flag_counts": dg.MetadataValue.json(md["counts"]),
            "mean_words": md["mean_words"],
            "length_histogram": dg.MetadataValue.md(hist),
            "examples": dg.MetadataValue.md(examples or "none flagged"),
        },
    )
