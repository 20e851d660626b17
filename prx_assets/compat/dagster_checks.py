"""Dagster: the latest state of a partitioned asset check, per partition.

``prx-assets run`` holds a partition back while a parent partition's blocking check failed
(:mod:`prx_assets.infra.quarantine`). Dagster 1.13 answers "latest execution per partition" only
through its event-log storage, whose status enum and partition filter live in ``dagster._core``
(the public ``EventRecordsFilter`` reads the whole history instead); partitioned checks are
still being made public (dagster-io/dagster#17005, open).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import dagster as dg

from prx_assets.compat import guard

CHECKED = ">=1.13,<1.14"
UPSTREAM = "dagster-io/dagster#17005"


@dataclass(frozen=True)
class CheckState:
    """A failed latest evaluation of a check on one partition's latest materialization."""

    partition: str | None
    evaluation: dg.AssetCheckEvaluation | None


def latest_failures(instance: dg.DagsterInstance, check_key: dg.AssetCheckKey,
                    partitions: Sequence[str] | None) -> Iterator[CheckState]:
    """The partitions (all when ``None``) whose latest evaluation of ``check_key``, on their latest
    materialization, failed, with that evaluation (one indexed query, one more per failure)."""
    guard("dagster", CHECKED, "the latest check state per partition", UPSTREAM)
    from dagster._core.event_api import PartitionKeyFilter
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    storage = instance.event_log_storage
    infos = storage.get_asset_check_partition_info(
        [check_key], partition_keys=list(partitions) if partitions is not None else None)
    for info in infos:
        if info.latest_execution_status != AssetCheckExecutionRecordStatus.FAILED or not info.is_current:
            continue
        latest = storage.get_asset_check_execution_history(
            check_key, limit=1, partition_filter=PartitionKeyFilter(key=info.partition_key))
        yield CheckState(info.partition_key, latest[0].evaluation if latest else None)
