"""raw_images through Dagster: materialize partitions, the q92 check, the discovery sensor."""

import json
from pathlib import Path

import dagster as dg
import lance
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.definitions import defs
from prx_assets.defs.ingest import ingest_job, jpeg_q92_cycles, raw_batch_sensor, raw_images
from prx_assets.infra.partitions import raw_batches
from prx_assets.infra.staleness import FINGERPRINT_KEY
from prx_assets.resources.storage import ProjectConfigResource, StorageResource
from tests.helpers import write_folder_corpus, write_sources_yaml


@pytest.fixture
def folder_source(tmp_path: Path, data_root: Path) -> dict:
    folder = tmp_path / "incoming"
    write_folder_corpus(folder, n=5)
    cfg = write_sources_yaml(tmp_path / "config", f"""
sources:
  - name: photos
    kind: folder
    path: {folder}
    batch_size: 4
""")
    resources = {
        "storage": StorageResource(data_root=str(data_root)),
        "project": ProjectConfigResource(config_dir=str(cfg.parent)),
        "s3": defs.resources["s3"],
        "slurm": defs.resources["slurm"],
    }
    return {"folder": folder, "resources": resources, "root": data_root, "config": cfg}


def run_sensor(instance: dg.DagsterInstance, resources: dict, cursor: str | None = None) -> dg.SensorResult:
    ctx = dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor)
    return raw_batch_sensor(ctx)


def materialize(instance: dg.DagsterInstance, resources: dict, key: str,
                **kw: object) -> dg.ExecuteInProcessResult:
    return dg.materialize([raw_images, jpeg_q92_cycles], instance=instance, resources=resources,
                          partition_key=key, **kw)


def test_sensor_adds_partitions_and_requests_one_run_each(folder_source: dict) -> None:
    with dg.instance_for_test() as instance:
        result = run_sensor(instance, folder_source["resources"])
        assert [r.partition_key for r in result.run_requests] == ["photos-00001", "photos-00002"]
        assert [r.run_key for r in result.run_requests] == ["raw_images:photos-00001", "raw_images:photos-00002"]
        assert json.loads(result.cursor) == {"photos": 2}
        for req in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        again = run_sensor(instance, folder_source["resources"], cursor=result.cursor)
        assert again.run_requests == [] and again.skip_reason

        write_folder_corpus(folder_source["folder"], n=2, seed=9, broken=False)
        third = run_sensor(instance, folder_source["resources"], cursor=again.cursor)
        assert [r.partition_key for r in third.run_requests] == ["photos-00003"]


def test_materialize_partition_metadata_version_and_check(folder_source: dict) -> None:
    with dg.instance_for_test() as instance:
        result = run_sensor(instance, folder_source["resources"])
        instance.add_dynamic_partitions("raw_batches", [r.partition_key for r in result.run_requests])
        res = materialize(instance, folder_source["resources"], "photos-00001")
        assert res.success
        mat = res.asset_materializations_for_node("raw_images")[0]
        md = mat.metadata
        assert md["dagster/row_count"].value == 4  # units sorted by path: 4 good files first
        assert md["rejected"].value == 0
        assert md[FINGERPRINT_KEY].value
        assert md["lance_uri"].value.endswith("images.lance")
        version = int(mat.tags["dagster/data_version"])
        assert version == md["lance_version"].value
        (check,) = res.get_asset_check_evaluations()
        assert check.passed and check.partition == "photos-00001"
        assert check.metadata["quality"].value == "92"
        assert check.metadata["sampled"].value == 4  # a partition of 4: below q92_sample, all of it
        assert check.metadata["measured"].value == "at ingest, on the decoded pixels"
        assert check.metadata["confirmed_whole"].value == 0  # measured whole already: nothing to confirm
        assert len(md["q92_cycle_sample"].value["curves"]) == 4 and md["q92_check_seconds"].value > 0
        assert 0 < md["q92_check_share"].value < 1
        assert "data:image/png;base64," in check.metadata["psnr_curve_chart"].value
        assert "data:image/jpeg;base64," in md["contact_sheet"].value
        assert all("data:image/png;base64," in md[k].value
                   for k in ("aspect_bucket_histogram", "resolution_histogram"))

        second = materialize(instance, folder_source["resources"], "photos-00002")
        md2 = second.asset_materializations_for_node("raw_images")[0].metadata
        assert md2["dagster/row_count"].value == 1
        assert md2["rejects_by_reason"].value == {"empty": 1, "not_image": 1, "too_small": 1}
        assert "zero.jpg" in md2["reject_examples"].value

        # Re-materializing without changes: same rows, the data version does not move.
        res2 = materialize(instance, folder_source["resources"], "photos-00001")
        mat2 = res2.asset_materializations_for_node("raw_images")[0]
        assert mat2.tags["dagster/data_version"] == str(version)
        assert mat2.metadata["rows_inserted_updated_deleted"].value == "0/0/0"
        ds = lance.dataset(str(folder_source["root"] / "lance" / "images.lance"))
        assert ds.count_rows() == 5


def test_new_batch_does_not_reprocess_old_ones(folder_source: dict) -> None:
    with dg.instance_for_test() as instance:
        for req in run_sensor(instance, folder_source["resources"]).dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        materialize(instance, folder_source["resources"], "photos-00001")
        materialize(instance, folder_source["resources"], "photos-00002")
        ds = lance.dataset(str(folder_source["root"] / "lance" / "images.lance"))
        frags_before = {f.fragment_id for f in ds.get_fragments()}
        write_folder_corpus(folder_source["folder"], n=3, seed=5, broken=False)
        third = run_sensor(instance, folder_source["resources"])
        (req,) = third.run_requests
        instance.add_dynamic_partitions("raw_batches", [req.partition_key])
        res = materialize(instance, folder_source["resources"], req.partition_key)
        mat = res.asset_materializations_for_node("raw_images")[0]
        assert mat.metadata["rows_inserted_updated_deleted"].value == "3/0/0"
        ds = lance.dataset(str(folder_source["root"] / "lance" / "images.lance"))
        assert frags_before <= {f.fragment_id for f in ds.get_fragments()}
        assert ds.count_rows() == 5 + 3


def test_q92_check_fails_when_quality_is_absurdly_low(folder_source: dict) -> None:
    cfg: Path = folder_source["config"]
    cfg.write_text(cfg.read_text().replace(
        "batch_size: 4", "batch_size: 4\n    ingest: {jpeg_quality: 3, lossless_fallback: 'off'}"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("raw_batches", ["photos-00001"])
        run_sensor(instance, folder_source["resources"])
        res = materialize(instance, folder_source["resources"], "photos-00001", raise_on_error=False)
        (check,) = res.get_asset_check_evaluations()
        assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
        assert "quality 3" in (check.description or "")
        assert not res.success  # the check is blocking


def test_content_aware_storage_keeps_the_bound_without_blocking(folder_source: dict) -> None:
    """With lossless fallback on (the default), an image whose JPEG would lose more than the bound
    is stored losslessly unless that makes it over 1.5x its source's bytes (then the best JPEG of
    a higher quality that fits, the reason recorded): at quality 3 that is every image, so the check warns instead of blocking and
    has no image stored at the configured quality to judge."""
    cfg: Path = folder_source["config"]
    cfg.write_text(cfg.read_text().replace("batch_size: 4", "batch_size: 4\n    ingest: {jpeg_quality: 3}"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("raw_batches", ["photos-00001"])
        run_sensor(instance, folder_source["resources"])
        res = materialize(instance, folder_source["resources"], "photos-00001", raise_on_error=False)
        assert res.success
        (check,) = res.get_asset_check_evaluations()
        assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
        md = res.asset_materializations_for_node("raw_images")[0].metadata
        reasons = md["lossless_reasons"].value
        bounded = sum(v for k, v in reasons.items() if k.startswith("lossless_oversize_q"))
        assert bounded + reasons.get("psnr", 0) == 4, f"each stored losslessly or as the best JPEG that fits: {reasons}"
        assert md["q92_psnr_db"].value["p95"] < 37
        assert check.metadata["size_bound_jpeg_images"].value == bounded
        assert check.metadata["lossless_share"].value == reasons.get("psnr", 0) / 4
        assert check.metadata["sampled"].value == 0, "no image is stored at quality 3 by choice"
        assert "stored losslessly" in check.description
        t = lance.dataset(str(folder_source["root"] / "lance" / "images.lance")).to_table(
            columns=["jpeg", "stored_format", "orig_bytes"]).to_pylist()
        assert sum(r["stored_format"] == "webp" for r in t) == reasons.get("psnr", 0)
        assert all(r["jpeg"][8:12] == b"WEBP" for r in t if r["stored_format"] == "webp")
        assert all(len(r["jpeg"]) <= 1.5 * r["orig_bytes"] for r in t if r["stored_format"] == "jpeg")


def test_bad_partition_key_fails_with_a_fix(folder_source: dict) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("raw_batches", ["photos-00042"])
        res = materialize(instance, folder_source["resources"], "photos-00042", raise_on_error=False)
        assert not res.success
        errors = [e.step_failure_data.error for e in res.all_events if e.is_step_failure]
        text = str(errors[0].cause or errors[0]) if errors else ""
        assert "no batch manifest for partition 'photos-00042'" in text or any(
            "no batch manifest" in (e.message or "") for e in errors)


def test_definitions_are_consistent() -> None:
    job = defs.resolve_job_def("ingest_job")
    assert job.partitions_def == raw_batches
    assert ingest_job.name == "ingest_job"
    spec = defs.resolve_assets_def("raw_images").specs_by_key[dg.AssetKey("raw_images")]
    assert spec.group_name == "ingest" and spec.code_version and spec.description
    assert {"lance", "python"} <= set(spec.kinds)
    assert defs.resolve_sensor_def("raw_batch_sensor")


def test_s3_source_through_s3resource_onto_an_s3_data_root(tmp_path: Path, s3_env: dict[str, str]) -> None:
    import boto3

    from prx_assets.resources.s3 import PrxS3Resource as S3Resource

    bucket = s3_env["BUCKET"]
    client = boto3.client("s3")
    for p in write_folder_corpus(tmp_path / "local", n=3):
        client.put_object(Bucket=bucket, Key=f"incoming/{p.name}", Body=p.read_bytes())
    cfg = write_sources_yaml(tmp_path / "config", f"""
sources:
  - {{name: pub, kind: s3, uri: "s3://{bucket}/incoming", batch_size: 100}}
""")
    resources = {
        "storage": StorageResource(data_root=f"s3://{bucket}/lab"),
        "project": ProjectConfigResource(config_dir=str(cfg.parent)),
        # the endpoint is configured on the resource, not only through the environment
        "s3": S3Resource(endpoint_url=s3_env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1"),
        "slurm": defs.resources["slurm"],
    }
    with dg.instance_for_test() as instance:
        (req,) = run_sensor(instance, resources).run_requests
        instance.add_dynamic_partitions("raw_batches", [req.partition_key])
        res = materialize(instance, resources, req.partition_key)
        md = res.asset_materializations_for_node("raw_images")[0].metadata
        assert md["dagster/row_count"].value == 3 and md["rejected"].value == 3
        assert md["lance_uri"].value == f"s3://{bucket}/lab/lance/images.lance"
        (check,) = res.get_asset_check_evaluations()
        assert check.passed


def test_mixed_deployments_gcs_sources_on_an_s3_root_and_s3_sources_on_a_gcs_root(
        tmp_path: Path, s3_env: dict[str, str], gcs_env: dict[str, str]) -> None:
    """One project, both clouds: a gs:// source ingested onto an s3:// data root, and an s3:// source
    onto a gs:// data root, each through the same resources and settings."""
    files = write_folder_corpus(tmp_path / "local", n=3)
    s3_bucket, gs_bucket = s3_env["BUCKET"], gcs_env["BUCKET"]
    for store in (DataRoot(f"s3://{s3_bucket}/incoming"), DataRoot(f"gs://{gs_bucket}/incoming")):
        for p in files:
            store.write_bytes(p.name, p.read_bytes())
    cfg = write_sources_yaml(tmp_path / "config", f"""
sources:
  - {{name: fromgs, kind: gcs, uri: "gs://{gs_bucket}/incoming", batch_size: 100}}
  - {{name: froms3, kind: s3, uri: "s3://{s3_bucket}/incoming", batch_size: 100}}
""")
    for root, source in ((f"s3://{s3_bucket}/lab", "fromgs"), (f"gs://{gs_bucket}/lab", "froms3")):
        resources = {"storage": StorageResource(data_root=root),
                     "project": ProjectConfigResource(config_dir=str(cfg.parent)),
                     "s3": defs.resources["s3"], "slurm": defs.resources["slurm"]}
        with dg.instance_for_test() as instance:
            reqs = [r for r in run_sensor(instance, resources).run_requests if r.partition_key.startswith(source)]
            instance.add_dynamic_partitions("raw_batches", [r.partition_key for r in reqs])
            res = materialize(instance, resources, reqs[0].partition_key)
            md = res.asset_materializations_for_node("raw_images")[0].metadata
            assert md["dagster/row_count"].value == 3 and md["rejected"].value == 3, (root, source)
            assert md["lance_uri"].value == f"{root}/lance/images.lance"
            (check,) = res.get_asset_check_evaluations()
            assert check.passed
            ds = lance.dataset(f"{root}/lance/images.lance", storage_options=DataRoot(root).storage_options())
            uris = ds.to_table(columns=["uri"]).column(0).to_pylist()
            assert all(u.startswith("gs://" if source == "fromgs" else "s3://") for u in uris)


def test_mixed_photos_and_synthetic_content_ingest_without_a_failed_partition(tmp_path: Path,
                                                                               data_root: Path) -> None:
    """Line art, text renders, palettes and 1-bit scans beside photos: no partition fails for its
    content; the fallback share and the PSNR distribution are in the metadata."""
    import numpy as np

    from prx_assets.core.demo.synthetic import mixed_corpus

    folder = tmp_path / "mixed"
    folder.mkdir()
    for name, data in mixed_corpus(np.random.default_rng(2), photos=6, per_kind=2).items():
        (folder / name).write_bytes(data)
    cfg = write_sources_yaml(tmp_path / "config", f"""
sources:
  - name: mixed
    kind: folder
    path: {folder}
    batch_size: 7
    ingest: {{fallback_warn_share: 0.9}}
""")
    resources = {"storage": StorageResource(data_root=str(data_root)),
                 "project": ProjectConfigResource(config_dir=str(cfg.parent)),
                 "s3": defs.resources["s3"], "slurm": defs.resources["slurm"]}
    with dg.instance_for_test() as instance:
        for req in run_sensor(instance, resources).dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        shares = []
        for key in ("mixed-00001", "mixed-00002"):
            res = materialize(instance, resources, key)
            assert res.success
            (check,) = res.get_asset_check_evaluations()
            # never an ERROR for content; a warning names generational loss of the noisy photos
            assert check.passed or (check.severity == dg.AssetCheckSeverity.WARN
                                    and "generational loss" in check.description), check.description
            assert {"lossless_share", "first_generation_psnr_p05_db", "below_bound_share"} <= set(check.metadata)
            md = res.asset_materializations_for_node("raw_images")[0].metadata
            shares.append(md["lossless_share"].value)
            assert check.metadata["lossless_share"].value == md["lossless_share"].value
            assert set(md["q92_psnr_db"].value) == {"min", "p05", "p50", "p95"}
        assert sum(shares) > 0


def test_q92_verdict_blocks_only_a_first_generation_below_the_bound() -> None:
    from prx_assets.core.ingest.jpeg_quality import CycleCurve, QualityReport
    from prx_assets.core.ingest.q92_check import q92_verdict

    def report(*curve: float) -> QualityReport:
        rep = QualityReport(quality=92, cycles=len(curve), min_psnr_db=37.0)
        rep.curves.append(CycleCurve("x", 8, 8, tuple(curve), 1, 1))
        return rep

    assert q92_verdict(report(40, 39, 38), True) == ([], [])
    errors, warnings = q92_verdict(report(40, 38, 36.5), True)
    assert errors == [] and "generational loss: mean PSNR 36.50 dB after cycle 3" in warnings[0]
    assert q92_verdict(report(36, 35), True)[0] and not q92_verdict(report(36, 35), True)[1]
    assert q92_verdict(report(40, 38, 36.5), False) == (report(40, 38, 36.5).failures, [])  # off: as before


def test_q92_check_samples_again_from_the_source_when_ingest_measured_other_settings(folder_source: dict) -> None:
    """A partition whose materialization holds no curve at the current check settings (ingested
    before the check ran at ingest, or since changed) is sampled again from the source, and the
    sample measured then agrees with the one ingest measured."""
    import dataclasses

    from prx_assets.core.config.project import load_sources
    from prx_assets.core.ingest.q92_check import reread_sample
    from prx_assets.core.ingest.readers import reader_for
    from prx_assets.defs.ingest import ingest_sample

    with dg.instance_for_test() as instance:
        found = run_sensor(instance, folder_source["resources"])
        instance.add_dynamic_partitions("raw_batches", [r.partition_key for r in found.run_requests])
        assert materialize(instance, folder_source["resources"], "photos-00001").success
        cfg = load_sources(folder_source["config"]).get("photos")
        at_ingest = ingest_sample(instance, "photos-00001", cfg.ingest)
        assert at_ingest is not None and len(at_ingest) == 4
        other = dataclasses.replace(cfg.ingest, q92_png_reference=True)
        assert ingest_sample(instance, "photos-00001", other) is None
        rows = lance.dataset(str(folder_source["root"] / "lance" / "images.lance")).to_table(
            filter="batch = 'photos-00001'").to_pylist()
        again = reread_sample(rows, len(rows), reader_for(cfg, s3_client=folder_source["resources"]["s3"].get_client), other)
        assert sorted(c.label for c in again.curves) == sorted(c.label for c in at_ingest)
        by_label = {c.label: c for c in at_ingest}
        for c in again.curves:  # same pixels, same tiles: the same curve, plus the PNG sizes asked for
            assert c.psnr_db == pytest.approx(by_label[c.label].psnr_db, abs=1e-4)  # stored to 4 places
            assert c.png_bytes > 0 == by_label[c.label].png_bytes


def test_a_tile_estimate_near_the_bound_is_measured_again_whole(folder_source: dict) -> None:
    """When the sample was measured on tiles and its mean curve comes within q92_confirm_db of the
    bound, the check judges on the same images measured whole, re-read from the source; an image
    whose file changed since ingest keeps its tile estimate, and the metadata says why."""
    from prx_assets.core.config.project import load_sources
    from prx_assets.core.ingest.images import prepare_rgb
    from prx_assets.core.ingest.jpeg_quality import QualityReport, cycle_curve
    from prx_assets.core.ingest.q92_check import confirm_whole
    from prx_assets.core.ingest.readers import reader_for
    from prx_assets.defs.ingest import ingest_sample
    from tests.helpers import encode, photo

    cfg_path: Path = folder_source["config"]
    cfg_path.write_text(cfg_path.read_text().replace(  # one 128-pixel tile per image; a margin every curve is within
        "batch_size: 4", "batch_size: 4\n    ingest: {q92_tile_pixels: 16384, q92_confirm_db: 100}"))
    with dg.instance_for_test() as instance:
        found = run_sensor(instance, folder_source["resources"])
        instance.add_dynamic_partitions("raw_batches", [r.partition_key for r in found.run_requests])
        res = materialize(instance, folder_source["resources"], "photos-00001")
        assert res.success
        (check,) = res.get_asset_check_evaluations()
        md = check.metadata
        cfg = load_sources(cfg_path).get("photos")
        tiled = ingest_sample(instance, "photos-00001", cfg.ingest)
        assert tiled and all(c.measured_pixels < c.width * c.height for c in tiled)
        assert md["confirmed_whole"].value == len(tiled) == md["sampled"].value
        assert "measured again whole from the source" in md["measured"].value
        assert all(i["measured_pixels"] == int(i["size"].split("x")[0]) * int(i["size"].split("x")[1])
                   for i in md["per_image"].value)
        rows = lance.dataset(str(folder_source["root"] / "lance" / "images.lance")).to_table(
            filter="batch = 'photos-00001' AND stored_format = 'jpeg'").to_pylist()
        whole = [cycle_curve(prepare_rgb(Path(r["uri"]).read_bytes(), cfg.ingest).rgb, 92, 10, max_pixels=0,
                             png_reference=False) for r in rows]
        assert md["last_cycle_psnr_db"].value == pytest.approx(
            sum(c.psnr_db[-1] for c in whole) / len(whole), abs=1e-3)
        assert md["tile_estimate_min_db"].value != pytest.approx(md["last_cycle_psnr_db"].value, abs=1e-3)

        # a sampled file rewritten since ingest: its tile estimate stands, with the reason
        changed = Path(rows[0]["uri"])
        changed.write_bytes(encode(photo(240, 180, seed=77), "JPEG"))
        report = QualityReport(quality=92, cycles=10, min_psnr_db=37.0, curves=list(tiled))  # as ingest measured it
        again, done, kept = confirm_whole(report, rows, reader_for(cfg, s3_client=folder_source["resources"]["s3"].get_client),
                                          cfg.ingest)
        assert done == len(tiled) - 1 and list(kept) == [changed.name]
        assert "changed since ingest" in kept[changed.name]
        assert next(c for c in again.curves if c.label == changed.name) in tiled
