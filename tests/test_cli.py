"""The `prx-assets` command: run, staleness, status, rejects, and definitions validation."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from prx_assets.cli import main
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.corpus import generate_demo_corpus

REPO = Path(__file__).parents[1]


@pytest.fixture
def small_demo(tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch,
               models_env: dict[str, str]) -> Path:
    generate_demo_corpus(DataRoot(str(data_root)), n_photos=20, n_catalog=10, n_web=8)
    config = tmp_path / "config"
    shutil.copytree(REPO / "config", config)
    monkeypatch.setenv("PRX_CONFIG_DIR", str(config))
    monkeypatch.chdir(tmp_path)
    return config


def test_run_materializes_everything_then_nothing_then_only_stale(
        small_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "partitions to materialize" in out and "raw_images photos-00001" in out

    assert main(["run"]) == 0
    out = capsys.readouterr().out
    n = int(out.split(" partitions to materialize")[0].split()[-1])
    assert f"[{n}/{n}] " in out and "FAILED" not in out
    ran = [line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("[")]
    # 3 sources, one batch each at this size; 2 captioners; one embedder.
    assert ran.count("raw_images") == 3 and ran.count("recaptions") == 6
    assert ran.count("image_embeddings") == 3
    assert ran[-7:] == ["lance_table", "curated_subsets", "curated_subsets", "mds_shards", "mds_shards",
                        "training_mixture", "training_run"]
    assert ran.index("recaptions") > max(i for i, a in enumerate(ran) if a == "raw_images")
    assert "check jpeg_q92_cycles: passed" in out

    assert main(["run"]) == 0
    assert "everything is up to date" in capsys.readouterr().out

    # Changing one source's normalization settings makes only its partitions stale.
    sources = small_demo / "sources.yaml"
    sources.write_text(sources.read_text().replace(
        "    batch_size: 1           # tar shards per batch",
        "    batch_size: 1\n    ingest: {jpeg_quality: 90}"))
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    ran = [line for line in out.splitlines() if line.startswith("[")]
    # The webshards partitions and, in the same run, everything downstream of them.
    assert [line.split()[1].rstrip(":") for line in ran] == ["raw_images", "image_embeddings", "recaptions",
                                                 "recaptions", "lance_table", "curated_subsets",
                                                 "curated_subsets", "mds_shards", "mds_shards",
                                                 "training_mixture", "training_run"]
    assert all("webshards-" in line for line in ran[:4])
    # Captions depend on the original content (sha256), which did not change: none recomputed.
    assert all("0 computed" in line for line in ran if "recaptions" in line)

    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs()
        assert runs and all(r.tags.get("prx/launched_by") == "prx-assets run" for r in runs)


def test_status_and_rejects(small_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--select", "raw_images"]) == 0
    capsys.readouterr()
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "photos (folder" in out and "rejects: " in out and "{" not in out  # text, not JSON
    assert "raw_images" in out and "recaptions" in out and "training_run" in out  # downstream state too
    assert main(["status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {a["asset"] for a in doc["assets"]} >= {"raw_images", "mds_shards", "training_run"}
    assert doc["tables"]["rejects"]["by_reason"]
    assert main(["rejects", "--reason", "decompression_bomb"]) == 0
    captured = capsys.readouterr()
    assert "pixel_bomb.png" in captured.out and "1 rejects" in captured.err


def test_config_errors_exit_2_with_the_message(tmp_path: Path, data_root: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "sources.yaml").write_text("sources:\n  - {name: x, kind: ftp, path: /x}\n")
    monkeypatch.setenv("PRX_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["discover"]) == 2
    assert "unknown source kind 'ftp'" in capsys.readouterr().err


def test_dagster_definitions_validate(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "dagster"
    res = subprocess.run([str(exe), "definitions", "validate", "-m", "prx_assets.definitions"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_help_lists_the_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for verb in ("demo", "discover", "run", "status", "rejects"):
        assert verb in out


def test_curated_subsets_are_pinned_tagged_and_reproducible(small_demo: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import lance

    from prx_assets.core.config.project import data_root
    from prx_assets.core.curate.recipes import load_recipes
    from prx_assets.core.curate.selection import select
    from prx_assets.core.curate.subsets import read_subset, subset_id
    from prx_assets.core.models.config import load_models

    assert main(["run"]) == 0
    capsys.readouterr()
    root = DataRoot(data_root())
    recipes = load_recipes(small_demo / "recipes.yaml")
    with dg.DagsterInstance.get() as instance:
        assert sorted(instance.get_dynamic_partitions("recipes")) == ["demo_all", "demo_square_ish"]
        rec = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("curated_subsets"), asset_partitions=["demo_all"]),
            limit=1).records[0].asset_materialization
    md = rec.metadata
    sid = md["subset_id"].value
    version = md["lance_version"].value
    assert rec.tags["dagster/data_version"] == sid
    manifest, ids = read_subset(root, "demo_all", sid)
    assert manifest.lance_version == version and len(ids) == md["dagster/row_count"].value > 0
    assert manifest.dropped["min_resolution"] >= 0 and "dedup_exact" in manifest.dropped
    assert "data:image/jpeg;base64," in md["contact_sheet"].value  # thumbnails of selected images
    assert all("data:image/png;base64," in md[k].value for k in ("aspect_bucket_histogram", "dropped_by_rule_chart"))
    ds = lance.dataset(manifest.lance_uri)
    assert ds.tags.list()[manifest.lance_tag]["version"] == version
    again = select(lance.dataset(manifest.lance_uri, version=version), recipes.get("demo_all"),
                   known_captioner_ids=load_models(small_demo / "models.yaml").captioner_ids())
    assert again.image_ids == ids and subset_id(again) == sid  # the id is the content's hash: reproducible
    capped = read_subset(root, "demo_square_ish", instance_subset_id(small_demo, "demo_square_ish"))[1]
    assert 0 < len(capped) <= 60


def instance_subset_id(config: Path, recipe: str) -> str:
    with dg.DagsterInstance.get() as instance:
        rec = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("curated_subsets"), asset_partitions=[recipe]),
            limit=1).records[0].asset_materialization
    return rec.metadata["subset_id"].value


def test_mds_shard_sets_read_back_exactly(small_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import lance

    from prx_assets.core.config.project import data_root
    from prx_assets.core.publish.shards import open_stream
    from prx_assets.loader import release_shared_memory

    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "mds_shards demo_all: ok" in out and "check mds_readback: passed" in out
    root = DataRoot(data_root())
    with dg.DagsterInstance.get() as instance:
        rec = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("mds_shards"), asset_partitions=["demo_square_ish"]),
            limit=1).records[0].asset_materialization
    set_id = rec.tags["dagster/data_version"]
    assert "data:image/jpeg;base64," in rec.metadata["contact_sheet"].value  # read back from the shards
    manifest = json.loads(root.read_bytes(f"mds/demo_square_ish/{set_id}/manifest.json"))
    assert manifest["samples"] == rec.metadata["dagster/row_count"].value > 0
    assert manifest["caption_plan"]["mode"] == "mix" and set(manifest["caption_plan"]["weights"]) == {
        "caption_detailed", "caption_short"}
    assert manifest["lance_version"] and manifest["recipe"] == "demo_square_ish"
    assert not [p for p in root.list("mds") if ".staging-" in p]
    sds = open_stream(manifest["uri"])
    lab = lance.dataset(manifest["lance_uri"], version=manifest["lance_version"])
    sources = {k: v[0] for k, v in manifest["caption_plan"]["columns"].items()}
    ids = []
    for i in range(len(sds)):
        s = sds[i]
        ids.append(s["image_id"])
        row = lab.to_table(columns=["jpeg", "orig_width", *sources.values()],
                           filter=f"image_id = '{s['image_id']}'").to_pylist()[0]
        assert s["image"] == row["jpeg"] and s["original_width"] == row["orig_width"]
        assert all(s[mds_col] == row[lab_col] for mds_col, lab_col in sources.items())
    release_shared_memory(sds)
    subset_ids = json.loads(root.read_bytes(f"curated/demo_square_ish/{manifest['subset_id']}/subset.json"))
    assert sorted(ids) == sorted(set(ids)) and len(ids) == subset_ids["selected"]
    assert main(["run"]) == 0
    assert "everything is up to date" in capsys.readouterr().out


def test_first_hour_cli_fixes(small_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown filters are errors, tables shorten long cells visibly, versions print as a table."""
    assert main(["run", "--select", "raw_images"]) == 0
    capsys.readouterr()
    assert main(["rejects", "--source", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown source 'nosuch'" in err and "photos" in err
    assert main(["rejects", "--reason", "nosuch"]) == 2
    assert "unknown reason 'nosuch'" in capsys.readouterr().err
    assert main(["lineage", "training_run[nope]"]) == 2
    err = capsys.readouterr().err
    assert "unknown mixture 'nope'" in err and "demo_mix" in err

    assert main(["query", "--columns", "image_id,uri", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    long_uris = [line for line in out.splitlines()[1:] if "\u2026" in line]
    assert long_uris, out  # demo URIs are longer than a cell: cut with an ellipsis, not silently
    assert main(["query", "--versions"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["version", "timestamp", "tags"] and "{" not in out
    assert main(["query", "--versions", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["version"] >= 1


def test_a_closed_pipe_ends_quietly(small_demo: Path) -> None:
    """`prx-assets query | head -1` must not end in a BrokenPipeError traceback."""
    assert main(["run", "--select", "raw_images"]) == 0
    exe = Path(sys.executable).parent / "prx-assets"
    # The reader is gone before the first write: every write meets a closed pipe (like `| head -0`).
    proc = subprocess.Popen([str(exe), "query", "--columns", "image_id,uri"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def _ingest_by_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: Path, readahead: int,
                   name: str) -> tuple[list[dict], dict[str, tuple[str, int, float]]]:
    """``prx-assets run --select raw_images`` on ``folder`` (3 batches, 2 worker processes) in a fresh
    data root and instance, through the console script's entry point: the stored rows, and each
    partition's data version, images read ahead and seconds since its read-ahead began."""
    import lance

    from prx_assets import entry
    from prx_assets.core.ingest import early
    from prx_assets.core.ingest.readahead import READAHEAD
    from prx_assets.core.ingest.worker import shutdown_pool

    begun = early.begin

    def begin(read_ahead: bool = True) -> object:  # what was read ahead before the CLI's imports and cmd_run
        found = begun(read_ahead)
        early_keys.append(READAHEAD.live_key)
        return found

    early_keys: list[str | None] = []
    monkeypatch.setattr(early, "begin", begin)

    config = tmp_path / name / "config"
    shutil.copytree(REPO / "config", config)
    (config / "sources.yaml").write_text(
        f"ingest:\n  workers: 2\n  processes: 2\n  readahead: {readahead}\nsources:\n"
        f"  - name: pics\n    kind: folder\n    path: {folder}\n    batch_size: 6\n")
    monkeypatch.setenv("PRX_CONFIG_DIR", str(config))
    monkeypatch.setenv("PRX_DATA_ROOT", str(tmp_path / name / "data"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / name / "home"))
    try:
        assert entry.main(["run", "--select", "raw_images"]) == 0
    finally:
        shutdown_pool()
    # The first batch went to the workers from discovery, before the CLI was even imported.
    assert early_keys == (["pics-00001"] if readahead else [None])
    rows = lance.dataset(str(tmp_path / name / "data" / "lance" / "images.lance")).to_table(
        columns=["image_id", "batch", "sha256", "jpeg", "phash", "q92_psnr_db"]).to_pylist()
    with dg.DagsterInstance.get() as instance:
        recs = instance.fetch_materializations(dg.AssetKey("raw_images"), limit=100).records
        versions = {}
        for r in recs:
            md = r.asset_materialization.metadata
            versions[r.partition_key] = (r.asset_materialization.tags["dagster/data_version"],
                                         md["read_ahead_images"].value, md["read_ahead_seconds"].value)
    return sorted(rows, key=lambda r: r["image_id"]), versions


def test_run_reads_the_next_batch_ahead_and_stores_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str],
                                                            models_env: dict[str, str]) -> None:
    """While one batch commits and is checked (and while the command starts up), the worker
    processes decode the next batch's first images: the rows and data versions are those of a run
    without read-ahead, and each partition records how many of its images were ready."""
    from tests.helpers import write_folder_corpus

    folder = tmp_path / "pics"
    write_folder_corpus(folder, n=18, broken=False)
    ahead_rows, ahead = _ingest_by_cli(tmp_path, monkeypatch, folder, 4, "ahead")
    assert "3 partitions to materialize" in capsys.readouterr().out
    plain_rows, plain = _ingest_by_cli(tmp_path, monkeypatch, folder, 0, "plain")
    assert len(ahead_rows) == 18 and ahead_rows == plain_rows
    assert {k: v[0] for k, v in ahead.items()} == {k: v[0] for k, v in plain.items()}
    assert all(n == 0 and s == 0 for _, n, s in plain.values())
    assert sorted(ahead) == ["pics-00001", "pics-00002", "pics-00003"]
    # The first batch is read ahead from discovery on (before the CLI's imports), each later one once the batch before it has
    # handed its last image to the workers, and each run took its read-ahead over (how many images
    # were ready by then depends on the machine's speed).
    assert all(s > 0 and 0 <= n <= 4 for _, n, s in ahead.values()), ahead
    # Nothing left to do: nothing read ahead, nothing run.
    monkeypatch.setenv("PRX_CONFIG_DIR", str(tmp_path / "ahead" / "config"))
    monkeypatch.setenv("PRX_DATA_ROOT", str(tmp_path / "ahead" / "data"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "ahead" / "home"))
    assert main(["run", "--select", "raw_images"]) == 0
    assert "everything is up to date" in capsys.readouterr().out
    from prx_assets.core.ingest.readahead import READAHEAD
    assert READAHEAD.live_key is None


def test_what_reads_a_partition_that_failed_in_the_run_is_skipped_not_recorded(
        small_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A batch whose ingest fails: its embeddings and captions in the same run are skipped and
    said so (never recorded as "ok, 0 rows"); the other batches go on; the run exits 1."""
    from prx_assets.core.config.project import data_root

    assert main(["discover"]) == 0
    capsys.readouterr()
    manifest = Path(data_root()) / "ingest" / "batches" / "photos" / "00001.json"
    good = manifest.read_bytes()
    manifest.write_bytes(b"{ not json")  # its ingest fails (the batch itself is still registered)
    try:
        assert main(["run", "--select", "raw_images image_embeddings recaptions"]) == 1
    finally:
        manifest.write_bytes(good)
    out = capsys.readouterr().out
    lines = {line.split("] ", 1)[1].split(":")[0]: line for line in out.splitlines() if line.startswith("[")}
    assert "FAILED" in lines["raw_images photos-00001"]
    skipped = [k for k, line in lines.items() if "skipped (raw_images[photos-00001] failed in this run)" in line]
    assert sorted(k.split("|")[0] + ("|" + k.split("|")[1].split("-")[0] if "|" in k else "") for k in skipped) == \
        ["image_embeddings photos-00001", "recaptions photos-00001|detailed", "recaptions photos-00001|short"]
    assert all(" ok " in line for k, line in lines.items() if "photos-00001" not in k)
    assert "3 skipped because a partition they read failed in this run" in out
    with dg.DagsterInstance.get() as instance:
        for asset in ("image_embeddings", "recaptions"):
            done = instance.get_materialized_partitions(dg.AssetKey(asset))
            assert not [p for p in done if p.startswith("photos-00001")], (asset, done)
