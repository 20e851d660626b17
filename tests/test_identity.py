"""Identity follows content: unchanged inputs create nothing new downstream, on any data root."""

import json
import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import lance
import pytest

from prx_assets.cli import main
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.corpus import generate_demo_corpus

REPO = Path(__file__).parents[1]


def _ids(instance: dg.DagsterInstance) -> dict[str, Any]:
    """Data versions of every content-addressed asset, and how many training runs there were."""
    out: dict[str, Any] = {}
    for key in ("curated_subsets", "mds_shards", "training_mixture"):
        for pk in sorted(instance.get_materialized_partitions(dg.AssetKey(key))):
            rec = instance.get_latest_data_version_record(dg.AssetKey(key), partition_key=pk)
            out[f"{key}[{pk}]"] = rec.asset_materialization.tags["dagster/data_version"]
    out["training_runs"] = len(instance.fetch_materializations(dg.AssetKey("training_run"), limit=100).records)
    return out


def _project(base: Path, monkeypatch: pytest.MonkeyPatch, corpus: Path | None = None) -> Path:
    """A project under ``base``: its own data root, instance and config; the demo corpus is generated
    into the data root, or the sources point at ``corpus`` (the same files, hence the same image ids)."""
    root = base / "data"
    root.mkdir(parents=True)
    shutil.copytree(REPO / "config", base / "config")
    if corpus is None:
        generate_demo_corpus(DataRoot(str(root)), n_photos=20, n_catalog=10, n_web=8)
    else:
        sources = base / "config" / "sources.yaml"
        sources.write_text(sources.read_text().replace("${PRX_DATA_ROOT}/demo", str(corpus)))
    (base / "home").mkdir()
    monkeypatch.setenv("PRX_DATA_ROOT", str(root))
    monkeypatch.setenv("PRX_CONFIG_DIR", str(base / "config"))
    monkeypatch.setenv("DAGSTER_HOME", str(base / "home"))
    monkeypatch.chdir(base)
    return root


def test_unchanged_inputs_create_nothing_new_and_ids_are_reproducible(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models_env: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    root = _project(tmp_path / "a", monkeypatch)
    assert main(["run"]) == 0
    capsys.readouterr()
    with dg.DagsterInstance.get() as instance:
        first = _ids(instance)
    assert first["training_runs"] == 1 and len(first) == 6
    images = lance.dataset(str(root / "lance" / "images.lance"))

    # Re-materialize every upstream partition with unchanged inputs, as a UI click would.
    from prx_assets.definitions import defs

    job = defs.resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.get() as instance:
        for batch in instance.get_dynamic_partitions("raw_batches"):
            res = job.execute_in_process(instance=instance, partition_key=batch,
                                         asset_selection=[dg.AssetKey("raw_images")])
            assert res.success
        assert job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("lance_table")]).success
        for recipe in instance.get_dynamic_partitions("recipes"):
            assert job.execute_in_process(instance=instance, partition_key=recipe,
                                          asset_selection=[dg.AssetKey("curated_subsets")]).success
    assert lance.dataset(images.uri).tags.list()  # still readable
    assert main(["run", "--dry-run"]) == 0
    assert "everything is up to date" in capsys.readouterr().out
    assert main(["run"]) == 0
    assert "everything is up to date" in capsys.readouterr().out
    with dg.DagsterInstance.get() as instance:
        assert _ids(instance) == first  # no new subset, shard set, mixture version or training run
    assert len(list((root / "mds" / "demo_all").iterdir())) == 1  # one shard set, not a second copy

    # The same inputs (the same files) on a fresh data root and a fresh instance give the same ids.
    _project(tmp_path / "b", monkeypatch, corpus=root / "demo")
    assert main(["run"]) == 0
    capsys.readouterr()
    with dg.DagsterInstance.get() as instance:
        assert _ids(instance) == first
    spec = json.loads(next((tmp_path / "b" / "data" / "mixtures" / "demo_mix").glob("*.json")).read_text())
    assert spec["streams"][0]["uri"].startswith(str(tmp_path / "b"))  # lineage differs, identity does not

    # Opt out two images (and one the lab never saw): the next run republishes demo_all as a delta
    # whose skip list hides them; no shard is rewritten and the loader never yields them.
    from prx_assets.core.curate.subsets import read_subset
    from prx_assets.core.publish.shards import open_shard_set, read_shard_set_manifest

    root_b = DataRoot(str(tmp_path / "b" / "data"))
    _, subset_ids = read_subset(root_b, "demo_all", first["curated_subsets[demo_all]"])
    gone = subset_ids[:2]
    ids_file = tmp_path / "optout.txt"
    ids_file.write_text("\n".join([*gone, "ffffffffffffffff"]) + "\n")
    base_dir = tmp_path / "b" / "data" / "mds" / "demo_all" / first["mds_shards[demo_all]"]
    before = {p: p.read_bytes() for p in base_dir.rglob("*") if p.is_file()}
    assert main(["optout", "--ids", str(ids_file), "--reason", "takedown 7"]) == 0
    out = capsys.readouterr().out
    assert "recorded optout-" in out and "2 of the listed images are in the lab; 1 are not" in out
    assert "recipe demo_all: 2 of them in its current subset" in out
    assert main(["run"]) == 0
    assert "mds_shards demo_all: ok" in capsys.readouterr().out
    with dg.DagsterInstance.get() as instance:
        mat = instance.get_latest_data_version_record(dg.AssetKey("mds_shards"), partition_key="demo_all")
        set_id = mat.asset_materialization.tags["dagster/data_version"]
        assert _ids(instance)["training_runs"] == 2  # new content: one new training run
    manifest = read_shard_set_manifest(root_b, "demo_all", set_id)
    assert manifest.layout == "delta" and manifest.skipped == 2 and manifest.samples == len(subset_ids) - 2
    assert {p: p.read_bytes() for p in base_dir.rglob("*") if p.is_file()} == before  # nothing rewritten
    with open_shard_set(manifest) as sds:
        yielded = [s["image_id"] for s in sds]
    assert sorted(yielded) == sorted(set(subset_ids) - set(gone))
    assert main(["lineage", set_id]) == 0
    text = capsys.readouterr().out
    assert "published as a delta of" in text and "opt-out optout-" in text and "2 images removed" in text

    # A captioner added to a recipe's caption mix: the published set gets the new caption column as
    # a sidecar beside its shards (no image byte rewritten) and the loader joins it.
    recipes = tmp_path / "b" / "config" / "recipes.yaml"
    original = recipes.read_text()
    assert "caption_mix: {detailed: 0.5, short: 0.5}" in original
    recipes.write_text(original.replace("caption_mix: {detailed: 0.5, short: 0.5}", "caption_mix: {short: 1.0}"))
    assert main(["run"]) == 0
    capsys.readouterr()
    with dg.DagsterInstance.get() as instance:
        narrow_id = instance.get_latest_data_version_record(
            dg.AssetKey("mds_shards"), partition_key="demo_square_ish").asset_materialization.tags["dagster/data_version"]
    narrow = read_shard_set_manifest(root_b, "demo_square_ish", narrow_id)
    assert "caption_detailed" not in narrow.columns
    narrow_files = {p: p.read_bytes() for p in Path(narrow.uri).rglob("*") if p.is_file()}
    recipes.write_text(original.replace("caption_mix: {detailed: 0.5, short: 0.5}",
                                        "caption_mix: {detailed: 0.3, short: 0.7}"))
    assert main(["run"]) == 0
    assert "mds_shards demo_square_ish: ok" in capsys.readouterr().out
    with dg.DagsterInstance.get() as instance:
        mat = instance.get_latest_data_version_record(dg.AssetKey("mds_shards"), partition_key="demo_square_ish")
        wide_id = mat.asset_materialization.tags["dagster/data_version"]
        assert mat.asset_materialization.metadata["sidecar_columns"].value == ["caption_detailed"]
    wide = read_shard_set_manifest(root_b, "demo_square_ish", wide_id)
    assert wide.layout == "delta" and wide.streams[0]["uri"] == narrow.uri
    assert [s["columns"] for s in wide.streams[0]["sidecars"]] == [["caption_detailed"]]
    assert {p: p.read_bytes() for p in Path(narrow.uri).rglob("*") if p.is_file()} == narrow_files
    with open_shard_set(wide) as sds:
        assert all(s["caption_detailed"] and s["caption_short"] for s in sds)
    assert main(["lineage", wide_id]) == 0
    assert "+ columns caption_detailed (sidecar" in capsys.readouterr().out

    # Back to the recipe as it was (A -> B -> A): the mixture returns to a version already trained,
    # and that training is reported, not run again.
    with dg.DagsterInstance.get() as instance:
        trained = _latest_training(instance)
    recipes.write_text(original)
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "training_run demo_mix: ok" in out
    with dg.DagsterInstance.get() as instance:
        again = _latest_training(instance)
        jobs = {_plain(m.metadata["job_id"]) for m in _trainings(instance)}
    assert again.metadata["reused_training"].value is True
    assert again.tags["dagster/data_version"] != trained.tags["dagster/data_version"]  # another version than B's
    assert _plain(again.metadata["job_id"]) in jobs and len(jobs) == 4  # no fifth job: A's was reported


def _trainings(instance: dg.DagsterInstance) -> list[Any]:
    recs = instance.fetch_materializations(dg.AssetKey("training_run"), limit=100).records
    return [r.asset_materialization for r in recs]


def _latest_training(instance: dg.DagsterInstance) -> Any:
    return _trainings(instance)[0]


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def test_a_moved_source_and_a_copied_config_and_model_folder_change_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_models: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ids follow content, not places: models.yaml names its models relative to itself, so the
    config folder and the model folder copied elsewhere plan nothing; the three sources (folder,
    Parquet, WebDataset) moved to another path and re-pointed in sources.yaml ingest nothing again
    and keep every image id."""
    for var in ("PRX_CAPTIONER_MODEL", "PRX_EMBEDDER_MODEL", "PRX_TEXT_ENCODER_MODEL"):
        monkeypatch.delenv(var, raising=False)  # models.yaml's own relative paths: ../.models/...
    generate_demo_corpus(DataRoot(str(tmp_path / "first")), n_photos=20, n_catalog=10, n_web=8)
    root = _project(tmp_path / "a", monkeypatch, corpus=tmp_path / "first" / "demo")
    for key, folder in (("vl", "tiny-qwen3-vl"), ("siglip", "tiny-siglip"), ("text", "tiny-qwen3-text")):
        shutil.copytree(tiny_models[key], tmp_path / "a" / ".models" / folder)
    upstream = "raw_images recaptions image_embeddings lance_table"
    assert main(["run", "--select", upstream]) == 0
    assert "FAILED" not in capsys.readouterr().out
    ids = sorted(lance.dataset(str(root / "lance" / "images.lance")).to_table(columns=["image_id"]).column(0)
                 .to_pylist())

    elsewhere = tmp_path / "copied" / "deeper"
    shutil.copytree(tmp_path / "a" / "config", elsewhere / "config")
    shutil.copytree(tmp_path / "a" / ".models", elsewhere / ".models")
    monkeypatch.setenv("PRX_CONFIG_DIR", str(elsewhere / "config"))
    assert main(["run", "--dry-run", "--select", upstream]) == 0
    assert "everything is up to date" in capsys.readouterr().out

    shutil.move(tmp_path / "first" / "demo", tmp_path / "moved")
    sources = elsewhere / "config" / "sources.yaml"
    sources.write_text(sources.read_text().replace(str(tmp_path / "first" / "demo"), str(tmp_path / "moved")))
    assert main(["run", "--dry-run", "--select", upstream]) == 0
    assert "everything is up to date" in capsys.readouterr().out
    assert main(["run", "--select", upstream]) == 0
    out = capsys.readouterr().out
    assert "everything is up to date" in out, out
    after = lance.dataset(str(root / "lance" / "images.lance")).to_table(columns=["image_id"]).column(0).to_pylist()
    assert sorted(after) == ids
