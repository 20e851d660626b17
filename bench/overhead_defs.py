"""Definitions for ``bench/dagster_overhead.py``: one small partitioned asset per backfill policy.

Each asset does the same small piece of work per partition (hash 256 KiB), so differences
between them are Dagster's per-run overhead (run process start, event writes, daemon hops).
"""

import hashlib
import warnings

import dagster as dg

warnings.filterwarnings("ignore", category=dg.BetaWarning)

PARTITIONS = dg.StaticPartitionsDefinition([f"b{i:03d}" for i in range(50)])


def _work(keys: list[str]) -> dict[str, str]:
    return {k: hashlib.sha256(k.encode() * 32768).hexdigest()[:8] for k in keys}


def _asset(name: str, policy: dg.BackfillPolicy) -> dg.AssetsDefinition:
    @dg.asset(name=name, partitions_def=PARTITIONS, backfill_policy=policy, group_name="bench")
    def _a(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"partitions_in_run": len(_work(list(context.partition_keys)))})

    return _a


defs = dg.Definitions(assets=[
    _asset("one_per_run", dg.BackfillPolicy.multi_run(max_partitions_per_run=1)),
    _asset("ten_per_run", dg.BackfillPolicy.multi_run(max_partitions_per_run=10)),
    _asset("single_run", dg.BackfillPolicy.single_run()),
])
