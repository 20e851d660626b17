"""The stage's jobs and sensors."""

import json

import dagster as dg

from prx_assets.defs.ingest.assets import discover_batches, raw_images
from prx_assets.infra.partitions import missing_partitions, raw_batches
from prx_assets.resources.s3 import PrxS3Resource as S3Resource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

ingest_job = dg.define_asset_job(
    "ingest_job", selection=dg.AssetSelection.assets(raw_images),
    description="Ingest raw_images partitions (with the JPEG q92 check).")


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
