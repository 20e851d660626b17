"""The stage's asset checks."""

import dagster as dg

from prx_assets.core.lab.sql import open_pinned
from prx_assets.core.publish.integrity import check_shard_set
from prx_assets.core.publish.shards import (
    read_shard_set_manifest,
    verify_shard_set,
)
from prx_assets.defs.keys import MDS_SHARDS
from prx_assets.defs.shards.assets import mds_shards
from prx_assets.infra.partitions import recipe_partitions
from prx_assets.infra.staleness import (
    latest_data_version,
)
from prx_assets.resources.storage import StorageResource


@dg.asset_check(asset=mds_shards, partitions_def=recipe_partitions, blocking=True)
def mds_readback(context: dg.AssetCheckExecutionContext, storage: StorageResource) -> dg.AssetCheckResult:
    """Hashes every shard file of every stream the set reads (its own and the base streams a delta
    reuses) against MDS's recorded hashes, then reads the set back with StreamingDataset: sample
    count and a sample of images byte-identical to the pinned Lance version."""
    set_id = latest_data_version(context.instance, MDS_SHARDS, context.partition_key)
    if not set_id:
        return dg.AssetCheckResult(passed=False, description="mds_shards has no materialization")
    root = storage.root()
    manifest = read_shard_set_manifest(root, context.partition_key, set_id)
    checks = check_shard_set(manifest)  # every shard of every stream it reads, reused base streams included
    corrupt = [c for check in checks for c in check.corrupt]
    lab = open_pinned(manifest, root.storage_options())
    v = verify_shard_set(manifest, lab) if not corrupt else None
    problems = [f"{len(corrupt)} corrupt shard files: {', '.join(corrupt[:3])}; run `prx-assets doctor --verify`"] \
        if corrupt else ([] if v is None or v.passed else
                         [f"{v.samples}/{v.expected} samples, mismatched {v.mismatched[:5]}"])
    return dg.AssetCheckResult(
        passed=not problems,
        description="; ".join(problems) or None,
        metadata={"streams": len(checks), "shards_hashed": sum(c.shards for c in checks),
                  "bytes_hashed": sum(c.bytes for c in checks), "corrupt_shards": dg.MetadataValue.json(corrupt),
                  "samples": v.samples if v else 0, "expected": manifest.samples,
                  "checked_images": v.checked if v else 0,
                  "mismatched": dg.MetadataValue.json(v.mismatched if v else [])},
    )
