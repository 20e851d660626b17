"""recaptions and image_embeddings through Dagster, with the caption_quality check."""

from pathlib import Path

import dagster as dg
import lance
import pytest

from prx_assets.definitions import defs
from prx_assets.defs.enrichment import caption_quality, image_embeddings, recaptions
from prx_assets.defs.ingest import jpeg_q92_cycles, raw_batch_sensor, raw_images
from prx_assets.resources.models import CaptionerResource, EmbedderResource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource
from tests.helpers import write_folder_corpus, write_sources_yaml

ALL = [raw_images, jpeg_q92_cycles, recaptions, caption_quality, image_embeddings]


@pytest.fixture
def ingested_batch(tmp_path: Path, data_root: Path, tiny_models: dict[str, str]) -> dict:
    write_folder_corpus(tmp_path / "incoming", n=4, broken=False)
    cfg = write_sources_yaml(tmp_path / "config", f"""
sources:
  - {{name: photos, kind: folder, path: {tmp_path / "incoming"}, batch_size: 100}}
""")
    (cfg.parent / "models.yaml").write_text(f"""
captioners:
  - {{name: detailed, model: {tiny_models["vl"]}, max_new_tokens: 12, batch_size: 4}}
  - {{name: short, model: {tiny_models["vl"]}, prompt: "One sentence.", max_new_tokens: 6}}
embedder: {{model: {tiny_models["siglip"]}, batch_size: 8}}
""")
    resources = {
        "storage": StorageResource(data_root=str(data_root)),
        "project": ProjectConfigResource(config_dir=str(cfg.parent)),
        "s3": defs.resources["s3"],
        "slurm": defs.resources["slurm"],
        "captioner": CaptionerResource(device="cpu"),
        "embedder": EmbedderResource(device="cpu"),
    }
    return {"resources": resources, "root": data_root, "config": cfg.parent}


def test_recaptions_per_captioner_and_embeddings(ingested_batch: dict) -> None:
    r = ingested_batch["resources"]
    with dg.instance_for_test() as instance:
        result = raw_batch_sensor(dg.build_sensor_context(instance=instance, resources=r))
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        captioners = instance.get_dynamic_partitions("captioners")
        assert len(captioners) == 2 and all(c.startswith(("detailed-", "short-")) for c in captioners)
        assert dg.materialize(ALL, selection=["raw_images"], instance=instance, resources=r,
                              partition_key="photos-00001").success

        versions = {}
        for cid in captioners:
            key = dg.MultiPartitionKey({"batch": "photos-00001", "captioner": cid})
            res = dg.materialize(ALL, selection=["recaptions"], instance=instance, resources=r,
                                 partition_key=key)
            assert res.success
            md = res.asset_materializations_for_node("recaptions")[0].metadata
            assert md["computed"].value == 4 and md["captioner_id"].value == cid
            assert "data:image/jpeg;base64," in md["contact_sheet"].value  # thumbnails with these captions
            assert "data:image/png;base64," in md["caption_length_histogram"].value
            versions[cid] = res.asset_materializations_for_node("recaptions")[0].tags["dagster/data_version"]
            (check,) = res.get_asset_check_evaluations()
            assert check.check_name == "caption_quality" and check.metadata["captions"].value == 4
            assert check.severity == dg.AssetCheckSeverity.WARN

        t = lance.dataset(str(ingested_batch["root"] / "lance" / "captions.lance")).to_table()
        assert t.num_rows == 8 and set(t.column("captioner_id").to_pylist()) == set(captioners)

        # Re-running is a no-op: nothing computed, nothing written, data version unchanged.
        key = dg.MultiPartitionKey({"batch": "photos-00001", "captioner": captioners[0]})
        res = dg.materialize(ALL, selection=["recaptions"], instance=instance, resources=r, partition_key=key)
        mat = res.asset_materializations_for_node("recaptions")[0]
        assert mat.metadata["computed"].value == 0 and mat.metadata["dagster/row_count"].value == 0
        assert mat.tags["dagster/data_version"] == versions[captioners[0]]

        res = dg.materialize(ALL, selection=["image_embeddings"], instance=instance, resources=r,
                             partition_key="photos-00001")
        md = res.asset_materializations_for_node("image_embeddings")[0].metadata
        assert md["computed"].value == 4 and md["dim"].value == 32


def test_unknown_captioner_partition_names_the_configured_ids(ingested_batch: dict) -> None:
    r = ingested_batch["resources"]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("raw_batches", ["photos-00001"])
        instance.add_dynamic_partitions("captioners", ["gone-12345678"])
        key = dg.MultiPartitionKey({"batch": "photos-00001", "captioner": "gone-12345678"})
        res = dg.materialize(ALL, selection=["recaptions"], instance=instance, resources=r,
                             partition_key=key, raise_on_error=False)
        assert not res.success
        text = " ".join(str(e.step_failure_data.error) for e in res.all_events if e.is_step_failure)
        assert "no captioner with id 'gone-12345678'" in text and "detailed-" in text


def test_lance_table_and_maintenance_job(ingested_batch: dict) -> None:
    from prx_assets.defs.lab import lance_maintenance, lance_table

    r = ingested_batch["resources"]
    assets = [*ALL, lance_table]
    with dg.instance_for_test() as instance:
        result = raw_batch_sensor(dg.build_sensor_context(instance=instance, resources=r))
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        dg.materialize(assets, selection=["raw_images", "image_embeddings"], instance=instance, resources=r,
                       partition_key="photos-00001")
        for cid in instance.get_dynamic_partitions("captioners"):
            dg.materialize(assets, selection=["recaptions"], instance=instance, resources=r,
                           partition_key=dg.MultiPartitionKey({"batch": "photos-00001", "captioner": cid}))
        res = dg.materialize(assets, selection=["lance_table"], instance=instance, resources=r,
                             run_config={"ops": {"lance_table": {"config": {"vector_index_min_rows": 4}}}})
        assert res.success
        mat = res.asset_materializations_for_node("lance_table")[0]
        md = mat.metadata
        assert md["dagster/row_count"].value == 4
        assert len(md["columns_added"].value) == 3  # two caption columns and one embedding column
        assert mat.tags["dagster/data_version"] == str(md["lance_version"].value)
        assert md["tags"].value["published"] == md["lance_version"].value
        assert "IVF_PQ" in md["index_coverage"].value and "Inverted" in md["index_coverage"].value

        job = defs.resolve_job_def("lance_maintenance")
        out = job.execute_in_process(instance=instance, resources=r,
                                     run_config={"ops": {"compact_and_clean": {"config": {"keep_days": 0}}}})
        assert out.success and lance_maintenance.name == "lance_maintenance"
        tables = {t["table"]: t for t in out.output_for_node("compact_and_clean")}
        assert tables["images"]["fragments_after"] <= tables["images"]["fragments_before"]
        assert defs.resolve_schedule_def("lance_maintenance_schedule").default_status == \
            dg.DefaultScheduleStatus.STOPPED


def test_a_run_over_several_batches_is_one_job_with_one_model_load(tmp_path: Path, data_root: Path,
                                                                   tiny_models: dict[str, str]) -> None:
    """A ranged run of image_embeddings (a backfill with EMBED_PARTITIONS_PER_RUN) on the cluster is one job
    that works through its batches in one process: the embedder loads for the first batch only, and
    each batch still reports its own result, fingerprint and Lance version."""
    from prx_assets.resources.slurm import SlurmResource

    write_folder_corpus(tmp_path / "incoming", n=6, broken=False)
    cfg = write_sources_yaml(tmp_path / "config", f"""
sources:
  - {{name: photos, kind: folder, path: {tmp_path / "incoming"}, batch_size: 2}}
""")
    (cfg.parent / "models.yaml").write_text(f"""
captioners:
  - {{name: detailed, model: {tiny_models["vl"]}, max_new_tokens: 4}}
embedder: {{model: {tiny_models["siglip"]}, batch_size: 8}}
""")
    r = {"storage": StorageResource(data_root=str(data_root)), "project": ProjectConfigResource(config_dir=str(cfg.parent)),
         "s3": defs.resources["s3"], "captioner": CaptionerResource(device="cpu"),
         "embedder": EmbedderResource(device="cpu"),
         "slurm": SlurmResource(mode="local", stages=["image_embeddings"], shared_dir=str(tmp_path / "jobs"))}
    with dg.instance_for_test() as instance:
        result = raw_batch_sensor(dg.build_sensor_context(instance=instance, resources=r))
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        batches = instance.get_dynamic_partitions("raw_batches")
        assert len(batches) == 3
        for b in batches:
            assert dg.materialize(ALL, selection=["raw_images"], instance=instance, resources=r, partition_key=b).success
        res = dg.materialize(ALL, selection=["image_embeddings"], instance=instance, resources=r,
                             tags={"dagster/asset_partition_range_start": batches[0],
                                   "dagster/asset_partition_range_end": batches[-1]})
        assert res.success
        mats = res.asset_materializations_for_node("image_embeddings")
        assert sorted(m.partition for m in mats) == sorted(batches)
        md = mats[0].metadata
        assert md["partitions_in_run"].value == 3 and md["computed"].value == 6
        assert set(md["prx/fingerprints"].value) == set(batches)
        assert md["model_load_seconds"].value > 0
        logs = [e.user_message for e in instance.all_logs(res.run_id)]
        assert sum("loaded embedder" in m for m in logs) == 1  # reported by the job through Pipes
        assert all(any(f"running image_embeddings {b}" in m for m in logs) for b in batches)
    jobs = list((tmp_path / "jobs").glob("prx-image_embeddings-*"))
    assert len(jobs) == 1 and jobs[0].name.startswith(f"prx-image_embeddings-{batches[0]}-and-2")
