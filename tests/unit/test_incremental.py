"""Incremental shard sets: deltas and skip lists instead of rewrites; the loader never yields a skipped sample."""

import hashlib
from pathlib import Path

import lance
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.lab.table import table_uri
from prx_assets.core.manifests import ShardSetManifest, SubsetManifest
from prx_assets.core.publish.shards import ShardSettings, open_shard_set, verify_shard_set, write_shard_set
from tests.unit.test_lab import build


@pytest.fixture
def lab(tmp_path: Path) -> tuple[DataRoot, lance.LanceDataset, list[str]]:
    root = DataRoot(str(tmp_path / "root"))
    build(root, tmp_path / "photos", n=24, batch_size=100)
    ds = lance.dataset(table_uri(root, "images"))
    return root, ds, sorted(ds.to_table(columns=["image_id"]).column(0).to_pylist())


def _subset(ds: lance.LanceDataset, ids: list[str], tag: str) -> SubsetManifest:
    return SubsetManifest(subset_id=f"sub-{tag}", recipe="r", recipe_hash="h", lance_uri=ds.uri,
                          lance_version=ds.version, ids="", selected=len(ids))


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _epoch(manifest: ShardSetManifest, workers: int = 2) -> list[str]:
    """Every image id one epoch yields through DataLoader workers (spawned, as the trainer does)."""
    import torch

    with open_shard_set(manifest, shuffle=True, shuffle_seed=3, batch_size=4) as ds:
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                             multiprocessing_context="spawn" if workers else None)
        return [s["image_id"] for s in loader]


def test_small_change_publishes_a_delta_and_a_skip_list(lab) -> None:
    root, ds, ids = lab
    recipe = Recipe(name="r")
    settings = ShardSettings(workers=2, size_limit=1 << 16)
    base = write_shard_set(root, ds, recipe, _subset(ds, ids[:20], "a"), ids[:20], [], settings)
    assert base.layout == "full" and len(base.streams) == 1 and base.samples == 20
    base_dir = Path(base.uri)
    before = _files(base_dir)
    assert "samples.parquet" in before

    new_ids = ids[2:22]  # 2 removed, 2 added: 20% of the set, the default compaction bound
    delta = write_shard_set(root, ds, recipe, _subset(ds, new_ids, "b"), new_ids, [], settings, previous=base)
    assert delta.layout == "delta" and delta.samples == 20 and delta.skipped == 2
    assert [s["role"] for s in delta.streams] == ["base", "delta"] and delta.streams[0]["uri"] == base.uri
    assert delta.extra["added"] == 2 and delta.extra["removed"] == 2
    assert _files(base_dir) == before  # no existing shard (or any file of the base set) changed
    assert delta.bytes_written < base.bytes_written / 4  # wrote the new samples, not the set
    got = _epoch(delta)
    assert sorted(got) == new_ids  # removed samples are never yielded; nothing twice
    assert verify_shard_set(delta, ds).passed

    # One more removal passes the compaction rule: the set is written whole again.
    fewer = new_ids[1:]
    compacted = write_shard_set(root, ds, recipe, _subset(ds, fewer, "c"), fewer, [], settings, previous=delta)
    assert compacted.layout == "full" and compacted.skipped == 0 and len(compacted.streams) == 1
    assert sorted(_epoch(compacted, workers=0)) == fewer
    assert _files(base_dir) == before


def test_changed_content_is_a_removal_plus_an_addition(lab) -> None:
    """A sample whose caption changes is skipped in its old stream and written again in the delta."""
    from tests.unit.test_lab import add_captions

    root, ds, ids = lab
    rows = ds.to_table(columns=["image_id", "sha256", "batch"]).to_pylist()
    add_captions(root, rows, "c-1", "a photo")
    from prx_assets.core.lab.sync import sync_lab

    sync_lab(root, captioner_ids=["c-1"])
    ds = lance.dataset(table_uri(root, "images"))
    recipe = Recipe(name="r", captions=("c-1",))
    settings = ShardSettings(workers=1)
    sub = SubsetManifest(subset_id="s1", recipe="r", recipe_hash="h", lance_uri=ds.uri, lance_version=ds.version,
                         ids="", selected=len(ids), caption_columns=("caption__c_1",))
    base = write_shard_set(root, ds, recipe, sub, ids, ["c-1"], settings)
    one = [r for r in rows if r["image_id"] == ids[5]]
    add_captions(root, one, "c-1", "a different caption")
    sync_lab(root, captioner_ids=["c-1"])
    ds2 = lance.dataset(table_uri(root, "images"))
    sub2 = SubsetManifest(subset_id="s2", recipe="r", recipe_hash="h", lance_uri=ds2.uri,
                          lance_version=ds2.version, ids="", selected=len(ids), caption_columns=("caption__c_1",))
    delta = write_shard_set(root, ds2, recipe, sub2, ids, ["c-1"], settings, previous=base)
    assert delta.layout == "delta" and delta.skipped == 1 and delta.extra["added"] == 1
    with open_shard_set(delta) as sds:
        captions = {sds[i]["image_id"]: sds[i]["caption"] for i in sds.live_indices()}
    assert len(captions) == len(ids) and captions[ids[5]].startswith("a different caption")


def _objects(root: DataRoot, prefix: str) -> dict[str, str]:
    """Every object under ``prefix`` of the root's bucket with its ETag (S3) or generation (GCS)."""
    from prx_assets.core.config.stores import split_object_uri, store_for

    _, bucket, key = split_object_uri(root.join(prefix))
    return {o.key: o.stamp for o in store_for(root.uri, root.settings).list(bucket, key)}


def _kill_when(script: str, marker: Path) -> None:
    """Run ``script`` in a child and ``kill -9`` it once it has written ``marker``."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, "the writer died before reaching the kill point"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _published(uri: str, tmp_path: Path) -> tuple[DataRoot, lance.LanceDataset, list[str], ShardSetManifest,
                                                  dict[str, str]]:
    """A 10-image lab on the object store at ``uri``, a base set of 9 published from it, and the
    objects under ``mds/`` with their stamps."""
    root = DataRoot(uri)
    build(root, tmp_path / "photos", n=10, batch_size=100)
    ds = lance.dataset(table_uri(root, "images"), storage_options=root.storage_options())
    ids = sorted(ds.to_table(columns=["image_id"]).column(0).to_pylist())
    base = write_shard_set(root, ds, Recipe(name="r"), _subset(ds, ids[:9], "a"), ids[:9], [], ShardSettings(workers=1))
    return root, ds, ids, base, _objects(root, "mds/")


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_delta_on_an_object_store_data_root(scheme: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The same publication order on an object store: shards and sidecars, then indexes, then the manifest."""
    env = request.getfixturevalue("s3_env" if scheme == "s3" else "gcs_env")
    root, ds, ids, base, before = _published(f"{scheme}://{env['BUCKET']}/prx", tmp_path)
    recipe, settings = Recipe(name="r"), ShardSettings(workers=1)
    new_ids = ids[1:10]
    delta = write_shard_set(root, ds, recipe, _subset(ds, new_ids, "b"), new_ids, [], settings,
                            previous=base, compact_above=0.5)
    assert delta.layout == "delta" and delta.uri.startswith(f"{scheme}://")
    after = _objects(root, "mds/")
    assert {k: after[k] for k in before} == before  # nothing published before was rewritten
    with open_shard_set(delta, cache=str(tmp_path / "cache"), batch_size=4) as sds:
        assert sorted(s["image_id"] for s in sds) == new_ids


def test_a_delta_killed_mid_publish_on_gcs_is_never_half_visible(gcs_env: dict[str, str], tmp_path: Path) -> None:
    """kill -9 mid-publish on gs://: the manifest goes last, so no new set is visible, nothing of the
    base changes, and a re-run publishes."""

    root, ds, ids, base, before = _published(f"gs://{gcs_env['BUCKET']}/prx", tmp_path)
    recipe, settings = Recipe(name="r"), ShardSettings(workers=1)
    (tmp_path / "base.json").write_bytes(base.to_json())
    marker = tmp_path / "uploading"
    script = f"""
import time
import lance
import prx_assets.core.publish.shards as shards
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.manifests import ShardSetManifest, SubsetManifest

root = DataRoot({root.uri!r})
real = root.write_bytes
def stalled(rel, data):  # the first object of the delta is uploaded, then the writer hangs
    real(rel, data)
    open({str(marker)!r}, "w").write(rel)
    time.sleep(120)
root.write_bytes = stalled
ds = lance.dataset({ds.uri!r}, storage_options=root.storage_options())
ids = {ids[1:10]!r}
sub = SubsetManifest(subset_id="sub-b", recipe="r", recipe_hash="h", lance_uri=ds.uri, lance_version=ds.version,
                     ids="", selected=len(ids))
base = ShardSetManifest.from_json(open({str(tmp_path / 'base.json')!r}, "rb").read())
shards.write_shard_set(root, ds, Recipe(name="r"), sub, ids, [], shards.ShardSettings(workers=1), previous=base,
                       compact_above=0.5)
"""
    _kill_when(script, marker)
    after = _objects(root, "mds/")
    assert {k: after[k] for k in before} == before  # the base is untouched
    manifests = [k for k in after if k.endswith("/manifest.json")]
    assert manifests == [k for k in before if k.endswith("/manifest.json")]  # no new set is visible
    assert len(after) > len(before)  # (the delta's first object did land)
    new_ids = ids[1:10]
    delta = write_shard_set(root, ds, recipe, _subset(ds, new_ids, "b"), new_ids, [], settings, previous=base,
                            compact_above=0.5)
    with open_shard_set(delta, cache=str(tmp_path / "cache"), batch_size=4) as sds:
        assert delta.layout == "delta" and sorted(s["image_id"] for s in sds) == new_ids


def test_a_delta_killed_mid_publish_is_never_half_visible(lab, tmp_path: Path) -> None:
    """kill -9 while the delta is being written: no new set is visible, the base is untouched, a re-run publishes."""

    root, ds, ids = lab
    recipe, settings = Recipe(name="r"), ShardSettings(workers=1)
    base = write_shard_set(root, ds, recipe, _subset(ds, ids[:20], "a"), ids[:20], [], settings)
    before = _files(Path(base.uri))
    (tmp_path / "base.json").write_bytes(base.to_json())
    marker = tmp_path / "written"
    script = f"""
import time
import lance
import prx_assets.core.publish.shards as shards
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.manifests import ShardSetManifest, SubsetManifest

real = shards._write_part
def stalled(*args, **kwargs):
    out = real(*args, **kwargs)
    open({str(marker)!r}, "w").write("delta shards written")
    time.sleep(120)
    return out
shards._write_part = stalled
ds = lance.dataset({ds.uri!r})
ids = {ids[2:22]!r}
sub = SubsetManifest(subset_id="sub-b", recipe="r", recipe_hash="h", lance_uri=ds.uri, lance_version=ds.version,
                     ids="", selected=len(ids))
base = ShardSetManifest.from_json(open({str(tmp_path / 'base.json')!r}, "rb").read())
shards.write_shard_set(DataRoot({root.uri!r}), ds, Recipe(name="r"), sub, ids, [], shards.ShardSettings(workers=1),
                       previous=base)
"""
    _kill_when(script, marker)
    recipe_dir = Path(base.uri).parent
    assert sorted(p.name for p in recipe_dir.iterdir() if not p.name.startswith(".")) == [Path(base.uri).name]
    assert _files(Path(base.uri)) == before
    new_ids = ids[2:22]
    delta = write_shard_set(root, ds, recipe, _subset(ds, new_ids, "b"), new_ids, [], settings, previous=base)
    with open_shard_set(delta) as sds:
        assert delta.layout == "delta" and sorted(s["image_id"] for s in sds) == new_ids


def test_a_tampered_skip_list_is_refused(lab) -> None:
    root, ds, ids = lab
    recipe, settings = Recipe(name="r"), ShardSettings(workers=1)
    base = write_shard_set(root, ds, recipe, _subset(ds, ids[:20], "a"), ids[:20], [], settings)
    delta = write_shard_set(root, ds, recipe, _subset(ds, ids[1:20], "b"), ids[1:20], [], settings, previous=base)
    assert delta.skip_uri and delta.skip_sha256
    Path(delta.skip_uri).write_bytes(Path(delta.skip_uri).read_bytes() + b"\0")
    with pytest.raises(ValueError, match="does not match the sha256"):
        open_shard_set(delta)


def test_reading_sets_back_does_not_leak_file_descriptors(lab) -> None:
    """mosaicml-streaming keeps every shared-memory block open until exit; the read-back check and
    pictures release theirs, so a long-running process can check thousands of sets."""
    import contextlib
    import os

    root, ds, ids = lab
    m = write_shard_set(root, ds, Recipe(name="r"), _subset(ds, ids[:10], "a"), ids[:10], [], ShardSettings())
    def shared_memory_fds() -> int:
        # Only shared-memory blocks: other fds of this process (threads of earlier tests, a
        # server's sockets) come and go whatever this test does.
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                n += os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/shm/")
        return n

    verify_shard_set(m, ds)
    before = shared_memory_fds()
    for _ in range(5):
        assert verify_shard_set(m, ds).passed
    assert shared_memory_fds() <= before


@pytest.mark.parametrize("by_bucket", [False, True])
def test_arrow_ids_write_the_same_files_as_a_list(lab, tmp_path: Path, by_bucket: bool) -> None:
    """mds_shards hands the subset's ids over as Arrow (never one Python list of a whole subset): the
    shards, indexes and sample maps are byte for byte those a list of the same ids writes."""
    import pyarrow as pa

    root, ds, ids = lab
    settings = ShardSettings(workers=2, size_limit=1 << 16, by_bucket=by_bucket)
    as_list = write_shard_set(root, ds, Recipe(name="r"), _subset(ds, ids, "l"), ids, [], settings)
    other = DataRoot(str(tmp_path / "other"))
    chunked = pa.chunked_array([pa.array(ids[:5]), pa.array(ids[5:])])
    as_arrow = write_shard_set(other, ds, Recipe(name="r"), _subset(ds, ids, "l"), chunked, [], settings)
    files = {k: v for k, v in _files(Path(as_list.uri)).items() if k != "manifest.json"}
    assert files == {k: v for k, v in _files(Path(as_arrow.uri)).items() if k != "manifest.json"}
    assert as_arrow.samples == len(ids) and (by_bucket is False or as_arrow.bucket_streams)
