"""Partitions whose blocking check failed are not consumed downstream by ``prx-assets run``.

In a Dagster run, a failed blocking check stops the checked asset's downstream steps. A run of
``prx-assets run`` materializes one partition per in-process run, so the same rule is applied
when planning: a partition of an asset is skipped while a parent partition it reads has, as the
latest evaluation of a blocking check on its latest materialization, a failure. Fixing the
parent (new files, new settings) and re-materializing it re-runs the check; once it passes,
the downstream partition is planned again.

A partition reads, of a parent with the same partitions, the same key; of a multi-partitioned
child, the key of the dimension the parent is partitioned by; of a parent it depends on
through ``AllPartitionMapping`` (a mixture over every recipe's shard set), every key. An
unpartitioned child of a partitioned parent (the lab sync over every batch) is not held back
by one batch: such failures are reported when planning instead.

Only the latest check state per partition is read (an indexed query per check, for the
partitions being planned), never the event history.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from prx_assets.compat.dagster_checks import latest_failures


def blocking_checks(defs: dg.Definitions, key: dg.AssetKey) -> list[dg.AssetCheckKey]:
    """The blocking checks defined on asset ``key``."""
    graph = defs.resolve_asset_graph()
    return sorted((ck for ck in graph.get_check_keys_for_assets({key}) if graph.get_check_spec(ck).blocking),
                  key=lambda ck: ck.name)


def failed_partitions(instance: dg.DagsterInstance, check_key: dg.AssetCheckKey,
                      partitions: Sequence[str] | None) -> dict[str | None, str]:
    """``{partition: why}`` of the partitions (all when ``None``) whose latest evaluation of
    ``check_key``, on their latest materialization, failed."""
    if partitions is not None and not partitions:
        return {}
    out: dict[str | None, str] = {}
    for state in latest_failures(instance, check_key, partitions):
        # Like a Dagster run, only an ERROR-severity failure blocks (a WARN one is a warning).
        evaluation = state.evaluation
        if evaluation is not None and evaluation.severity != dg.AssetCheckSeverity.ERROR:
            continue
        where = f"[{state.partition}]" if state.partition else ""
        detail = f": {evaluation.description}" if evaluation is not None and evaluation.description else ""
        out[state.partition] = (f"{check_key.asset_key.to_user_string()}{where} failed its blocking check "
                                 f"{check_key.name}{detail}")
    return out


def parent_partitions(child: dg.PartitionsDefinition | None, parent: dg.PartitionsDefinition | None,
                      partition: str | None, all_partitions: bool) -> list[str | None] | None:
    """The parent partitions a child partition reads: ``[None]`` for an unpartitioned parent, ``None``
    for every partition, ``[]`` when the child is not held back by single parent partitions."""
    if parent is None:
        return [None]
    if child is None or partition is None:
        return []
    if all_partitions:
        return None
    if child == parent:
        return [partition]
    if isinstance(child, dg.MultiPartitionsDefinition):
        keys = child.get_partition_key_from_str(partition).keys_by_dimension
        for dim in child.partitions_defs:
            if dim.partitions_def == parent:
                return [keys[dim.name]]
    return []


def held_back(defs: dg.Definitions, instance: dg.DagsterInstance, key: dg.AssetKey,
              partitions: Sequence[str | None]) -> dict[str | None, str]:
    """``{partition: why}`` of the given partitions of ``key`` that read a parent partition whose
    blocking check failed (see the module docs)."""
    graph = defs.resolve_asset_graph()
    node = graph.get(key)
    out: dict[str | None, str] = {}
    for parent_key in sorted(node.parent_keys, key=lambda k: k.to_user_string()):
        checks = blocking_checks(defs, parent_key)
        if not checks:
            continue
        parent_def = graph.get(parent_key).partitions_def
        every = isinstance(defs.resolve_assets_def(key).get_partition_mapping_for_dep(parent_key),
                           dg.AllPartitionMapping)
        wanted: dict[str | None, list[str | None] | None] = {
            pk: parent_partitions(node.partitions_def, parent_def, pk, every) for pk in partitions}
        if all(v == [] for v in wanted.values()):
            continue
        needs_all = any(v is None for v in wanted.values())
        names = None if needs_all else sorted({p for v in wanted.values() if v for p in v if p is not None})
        failed: dict[str | None, str] = {}
        for ck in checks:
            for part, why in failed_partitions(instance, ck, names if parent_def is not None else None).items():
                failed.setdefault(part, why)
        if not failed:
            continue
        for pk, parents in wanted.items():
            hit = list(failed.values()) if parents is None else [failed[p] for p in parents if p in failed]
            if hit and pk not in out:
                more = f" (and {len(hit) - 1} more)" if len(hit) > 1 else ""
                out[pk] = f"{hit[0]}{more}; fix it and re-materialize it (the check runs again), then re-run"
    return out


def failures_not_holding_back(defs: dg.Definitions, instance: dg.DagsterInstance,
                              key: dg.AssetKey) -> list[str]:
    """Failed blocking checks of ``key``'s partitioned parents that do not hold an unpartitioned
    ``key`` back (reported when planning)."""
    graph = defs.resolve_asset_graph()
    if graph.get(key).partitions_def is not None:
        return []
    out = []
    for parent_key in graph.get(key).parent_keys:
        if graph.get(parent_key).partitions_def is None:
            continue
        for ck in blocking_checks(defs, parent_key):
            out += list(failed_partitions(instance, ck, None).values())
    return sorted(out)


def reads_failed(defs: dg.Definitions, key: dg.AssetKey, partition: str | None,
                 failed: dict[dg.AssetKey, set[str | None]]) -> str | None:
    """Why partition ``partition`` of ``key`` must not run: a parent partition it reads (by the same
    rule as :func:`held_back`) failed earlier in this run (``failed``: per asset, the partitions
    that failed or were skipped). ``None`` when none did."""
    graph = defs.resolve_asset_graph()
    node = graph.get(key)
    for parent_key in sorted(node.parent_keys & set(failed), key=lambda k: k.to_user_string()):
        every = isinstance(defs.resolve_assets_def(key).get_partition_mapping_for_dep(parent_key),
                           dg.AllPartitionMapping)
        parents = parent_partitions(node.partitions_def, graph.get(parent_key).partitions_def, partition, every)
        hit = sorted(failed[parent_key], key=str) if parents is None else [p for p in parents or [] if p in failed[parent_key]]
        if hit:
            where = f"[{hit[0]}]" if hit[0] is not None else ""
            return f"{parent_key.to_user_string()}{where} failed in this run"
    return None
