"""The stage's jobs and sensors."""

import json

import dagster as dg

from prx_assets.defs.keys import MDS_SHARDS
from prx_assets.defs.mixture import training_mixture
from prx_assets.defs.training.assets import training_run
from prx_assets.infra.partitions import mixture_partitions
from prx_assets.resources.storage import ProjectConfigResource


def _latest_storage_id(instance: dg.DagsterInstance, key: dg.AssetKey) -> int | None:
    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1, ascending=False).records
    return recs[0].storage_id if recs else None


def _new_versions(instance: dg.DagsterInstance, key: dg.AssetKey,
                  after: int | None) -> tuple[list[tuple[str, str]], int | None]:
    """``(partition, data version)`` of materializations after storage id ``after``, and the new cursor."""
    res = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, after_storage_id=after),
                                          limit=200, ascending=True)
    found = [(r.asset_materialization.partition, r.asset_materialization.tags.get("dagster/data_version", ""))
             for r in res.records if r.asset_materialization is not None and r.asset_materialization.partition]
    return found, (res.records[-1].storage_id if res.records else after)


WATCHED = {"shards": MDS_SHARDS, "mixture": training_mixture.key}


@dg.sensor(
    asset_selection=[training_mixture, training_run],
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="New shard set -> re-resolve the mixtures that use it; new mixture version -> one training run.",
)
def training_sensor(context: dg.SensorEvaluationContext, project: ProjectConfigResource) -> dg.SensorResult:
    """Watches ``mds_shards`` and ``training_mixture`` materializations (cursor = storage ids).

    The first tick only records where history ends: turning the sensor on launches nothing
    for shard sets and mixtures that already exist.

    - A new shard set of recipe R requests ``training_mixture`` for every mixture with a
      stream on R (run key ``mixture:<name>:<shard set id>``).
    - A new ``training_mixture`` materialization requests ``training_run`` for that mixture
      with run key ``train:<mixture>:<mixture version>``: one mixture version launches exactly
      one training run, however often the mixture is re-materialized.
    """
    if not context.cursor:  # first tick: start from now, never launch training for history
        start = {name: _latest_storage_id(context.instance, key) for name, key in WATCHED.items()}
        return dg.SensorResult(cursor=json.dumps(start), skip_reason=dg.SkipReason(
            f"initialised at storage ids {start}; new shard sets and mixture versions from now on launch runs"))
    cursor = json.loads(context.cursor)
    requests: list[dg.RunRequest] = []
    new_sets, cursor["shards"] = _new_versions(context.instance, WATCHED["shards"], cursor.get("shards"))
    if new_sets:
        known = set(context.instance.get_dynamic_partitions(mixture_partitions.name or "mixtures"))
        mixtures = project.mixtures().values()
        for recipe, set_id in new_sets:
            for mixture in sorted(m.name for m in mixtures if any(s.recipe == recipe for s in m.streams)):
                if mixture in known:
                    requests.append(dg.RunRequest(run_key=f"mixture:{mixture}:{set_id}", partition_key=mixture,
                                                  asset_selection=[training_mixture.key],
                                                  tags={"prx/shard_set": set_id}))
    new_mixtures, cursor["mixture"] = _new_versions(context.instance, WATCHED["mixture"], cursor.get("mixture"))
    for mixture, version in new_mixtures:
        requests.append(dg.RunRequest(run_key=f"train:{mixture}:{version}", partition_key=mixture,
                                      asset_selection=[training_run.key],
                                      tags={"prx/mixture_version": version, "prx/stage": "train"}))
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor),
                           skip_reason=None if requests else dg.SkipReason("no new shard set or mixture version"))
