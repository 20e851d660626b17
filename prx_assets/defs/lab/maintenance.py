"""Lance table maintenance: compaction, index optimization and old-version cleanup (job, sensor, schedule)."""

from datetime import timedelta

import dagster as dg
from pydantic import Field

from prx_assets.core.lab.maintenance import lance_tables, maintain, table_health
from prx_assets.defs.lab.assets import LAB_POOL
from prx_assets.infra.staleness import (
    digest,
)
from prx_assets.resources.storage import StorageResource


class MaintenanceConfig(dg.Config):
    """What lance_maintenance keeps."""

    keep_days: float = Field(default=7.0, description="Untagged versions older than this are removed.")
    target_rows_per_fragment: int = Field(default=1024 * 1024, description="Compaction target.")


@dg.op(pool=LAB_POOL)
def compact_and_clean(context: dg.OpExecutionContext, config: MaintenanceConfig,
                      storage: StorageResource) -> list[dict]:
    """Compact small fragments, optimize indexes and clean up old untagged versions of every table."""
    reports = maintain(storage.root(), config.target_rows_per_fragment, timedelta(days=config.keep_days))
    rows = [r.to_dict() for r in reports]
    for r in rows:
        context.log.info(f"{r['table']}: fragments {r['fragments_before']} -> {r['fragments_after']}, "
                         f"{r['versions_removed']} versions and {r['bytes_removed']} bytes removed")
        if r["encodings_applied"]:
            context.log.info(f"{r['table']}: column encodings set {r['encodings_applied']} (new writes follow them)")
    context.add_output_metadata({
        "tables": dg.MetadataValue.json(rows),
        "fragments_removed": sum(r["fragments_removed"] for r in rows),
        "bytes_removed": sum(r["bytes_removed"] for r in rows),
    })
    return rows


@dg.job(description="Compact, optimize indexes and clean up old versions of the Lance tables.")
def lance_maintenance() -> None:
    """Maintenance job (scheduled nightly; the schedule is off by default)."""
    compact_and_clean()


@dg.sensor(job=lance_maintenance, minimum_interval_seconds=600, default_status=dg.DefaultSensorStatus.STOPPED)
def lance_maintenance_sensor(context: dg.SensorEvaluationContext, storage: StorageResource) -> dg.SensorResult:
    """Keep every Lance table within bounds: request lance_maintenance when one has more than
    ``MAX_FRAGMENTS`` fragments to compact (small or with many deletions), more than ``MAX_UNINDEXED_SHARE`` of its rows outside an index or an
    index of more than ``MAX_SEGMENTS`` segments (lab syncs fold new rows as delta segments; reads
    manifests only; one request per table version)."""
    root = storage.root()
    reasons = [why for h in (table_health(root, n) for n in lance_tables(root))
               if h is not None and (why := h.needs_maintenance()) is not None]
    if not reasons:
        return dg.SensorResult(skip_reason="every table within bounds")
    key = digest(*sorted(reasons))
    context.log.info("; ".join(reasons))
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"maintenance:{key}",
                                                       tags={"prx/maintenance_reasons": "; ".join(reasons)[:1000]})])


lance_maintenance_schedule = dg.ScheduleDefinition(
    job=lance_maintenance, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Nightly Lance maintenance (turn on in Automation).")
