"""A partition whose blocking check failed is held back from its downstream partitions when planning
(as a Dagster run stops the checked asset's downstream steps), until it is fixed and passes."""

from pathlib import Path

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from prx_assets.definitions import defs
from prx_assets.infra.quarantine import failures_not_holding_back, held_back

RAW, SHARDS = dg.AssetKey("raw_images"), dg.AssetKey("mds_shards")


def _materialize(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str
                 ) -> AssetCheckEvaluationTargetMaterializationData:
    instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))
    rec = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                          limit=1).records[0]
    return AssetCheckEvaluationTargetMaterializationData(storage_id=rec.storage_id, run_id=rec.run_id,
                                                         timestamp=rec.timestamp)


def _check(instance: dg.DagsterInstance, key: dg.AssetKey, name: str, partition: str, passed: bool,
           severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR) -> None:
    target = _materialize(instance, key, partition)
    instance.report_runless_asset_event(dg.AssetCheckEvaluation(
        asset_key=key, check_name=name, passed=passed, partition=partition, target_materialization_data=target,
        severity=severity, description=None if passed else "mean PSNR 30 dB"))


def test_failed_blocking_check_holds_back_its_downstream_partitions(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        _check(instance, RAW, "jpeg_q92_cycles", "s-00001", passed=False)
        _check(instance, RAW, "jpeg_q92_cycles", "s-00002", passed=True)
        # a warning (WARN severity) does not block, as in a Dagster run
        _check(instance, RAW, "jpeg_q92_cycles", "s-00003", passed=False, severity=dg.AssetCheckSeverity.WARN)
        assert held_back(defs, instance, dg.AssetKey("image_embeddings"), ["s-00003"]) == {}
        held = held_back(defs, instance, dg.AssetKey("recaptions"), ["s-00001|c-1", "s-00002|c-1"])
        assert list(held) == ["s-00001|c-1"]
        assert "raw_images[s-00001] failed its blocking check jpeg_q92_cycles: mean PSNR 30 dB" in held["s-00001|c-1"]
        assert list(held_back(defs, instance, dg.AssetKey("image_embeddings"), ["s-00001", "s-00002"])) == \
            ["s-00001"]
        # the lab reads every batch: one bad batch does not stop it, it is reported instead
        assert held_back(defs, instance, dg.AssetKey("lance_table"), [None]) == {}
        assert failures_not_holding_back(defs, instance, dg.AssetKey("lance_table")) == \
            ["raw_images[s-00001] failed its blocking check jpeg_q92_cycles: mean PSNR 30 dB"]

        _materialize(instance, RAW, "s-00001")  # re-materialized: the old failure is not the latest state
        assert held_back(defs, instance, dg.AssetKey("image_embeddings"), ["s-00001"]) == {}


def test_a_shard_set_failing_read_back_holds_back_every_mixture(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        _check(instance, SHARDS, "mds_readback", "demo_all", passed=True)
        assert held_back(defs, instance, dg.AssetKey("training_mixture"), ["demo_mix"]) == {}
        _check(instance, SHARDS, "mds_readback", "demo_wide", passed=False)
        held = held_back(defs, instance, dg.AssetKey("training_mixture"), ["demo_mix"])
        assert "mds_shards[demo_wide] failed its blocking check mds_readback" in held["demo_mix"]
        # the trainer's own input is the mixture: it is held back through the mixture, not directly
        assert held_back(defs, instance, dg.AssetKey("training_run"), ["demo_mix"]) == {}
