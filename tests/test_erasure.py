"""Erasure: `prx-assets optout --erase` leaves no byte of the images in the data root, withdraws what
would still yield them, lists the training runs that read them, and ingest never stores them again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import lance
import pytest

from prx_assets.cli import main
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.subsets import read_subset
from prx_assets.core.demo.corpus import generate_demo_corpus
from prx_assets.core.publish.shards import open_shard_set, read_shard_set_manifest
from prx_assets.errors import WithdrawnError
from prx_assets.loader import PrxStreamingDataset, release_shared_memory
from tests.test_identity import _project


def _latest(instance: dg.DagsterInstance, asset: str, partition: str) -> str:
    rec = instance.get_latest_data_version_record(dg.AssetKey(asset), partition_key=partition)
    return rec.asset_materialization.tags["dagster/data_version"]


def _holding(root: Path, needles: list[bytes]) -> list[str]:
    """Files under ``root`` that contain any of ``needles``."""
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            data = Path(dirpath, name).read_bytes()
            out += [os.path.join(dirpath, name) for n in needles if n in data]
    return out


def test_erase_leaves_no_byte_withdraws_old_sets_and_ingest_refuses_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models_env: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    corpus = DataRoot(str(tmp_path / "corpus"))
    generate_demo_corpus(corpus, n_photos=20, n_catalog=10, n_web=8)
    root = _project(tmp_path / "p", monkeypatch, corpus=Path(corpus.join("demo")))
    assert main(["run"]) == 0
    with dg.DagsterInstance.get() as instance:
        subset = _latest(instance, "curated_subsets", "demo_all")
        old_set = _latest(instance, "mds_shards", "demo_all")
        old_spec = _latest(instance, "training_mixture", "demo_mix")
    data = DataRoot(str(root))
    _, ids = read_subset(data, "demo_all", subset)
    images = lance.dataset(str(root / "lance" / "images.lance"))
    in_folder = images.to_table(columns=["image_id"], filter="source = 'photos'").column("image_id").to_pylist()
    gone = sorted(set(ids) & set(in_folder))[:2]  # files of the folder source: their source bytes are files too
    rows = images.to_table(columns=["image_id", "uri", "jpeg", "batch"],
                           filter=f"image_id IN ('{gone[0]}', '{gone[1]}')").to_pylist()
    stored = [r["jpeg"] for r in rows]
    sources = [Path(r["uri"]).read_bytes() for r in rows]
    assert len(stored) == 2 and all(_holding(root, stored[:1])), "the stored bytes are in the lab and the shards"
    capsys.readouterr()

    ids_file = tmp_path / "erase.txt"
    ids_file.write_text("\n".join(gone) + "\n")
    assert main(["optout", "--ids", str(ids_file), "--reason", "legal request 12", "--erase"]) == 0
    out = capsys.readouterr().out
    assert "erased 2 images" in out and f"withdrawn shard set demo_all/{old_set}" in out, out
    assert "lab images: 2 rows deleted" in out and "lab captions:" in out
    assert "names a withdrawn set" in out and "training runs on it: " in out and "none recorded" not in out
    assert all(r["uri"] in out for r in rows), "the report names each image's source file"
    report = json.loads((root / "erased").glob("optout-*.json").__next__().read_text())
    assert report["status"] == "erased" and sorted(report["image_ids"]) == gone
    rewritten = [os.path.realpath(os.path.join(s["stream"], f)) for s in report["streams"] for f in s["shards_rewritten"]]
    assert rewritten and len(rewritten) == len(set(rewritten)), "each shard file holding one is rewritten once"
    assert all(len(s["shards_rewritten"]) <= s["shards_total"] for s in report["streams"])

    # No byte of the stored images anywhere under the data root (lab versions, shards, staging).
    assert _holding(root, stored + sources) == []
    # Blanked shards keep their streams whole: every shard hash and every stored digest still checks out.
    assert main(["doctor", "--verify"]) == 0, capsys.readouterr().out
    # What still names them is refused: the old shard set and the mixture spec that read it.
    with pytest.raises(WithdrawnError, match="withdrawn by erasure"):
        PrxStreamingDataset(shard_sets=[str(root / "mds" / "demo_all" / old_set)], batch_size=2)
    with pytest.raises(WithdrawnError):
        PrxStreamingDataset(spec=str(root / "mixtures" / "demo_mix" / f"{old_spec}.json"), batch_size=2)

    # The next run publishes the subsets and sets without them; the new set reads every other image.
    assert main(["run"]) == 0
    with dg.DagsterInstance.get() as instance:
        new_set = _latest(instance, "mds_shards", "demo_all")
        new_spec = _latest(instance, "training_mixture", "demo_mix")
        batch = rows[0]["batch"]
    assert new_set != old_set and new_spec != old_spec
    with open_shard_set(read_shard_set_manifest(data, "demo_all", new_set)) as sds:
        yielded = [s["image_id"] for s in sds]
    assert sorted(yielded) == sorted(set(ids) - set(gone))
    ds = PrxStreamingDataset(spec=str(root / "mixtures" / "demo_mix" / f"{new_spec}.json"), batch_size=2)
    release_shared_memory(ds)

    # Ingest run again on their batch (a UI re-materialization) records them as erased, never stores them.
    subprocess.run([sys.executable, "-m", "dagster", "asset", "materialize", "-m", "prx_assets.definitions",
                    "--select", "raw_images", "--partition", batch], check=True, capture_output=True, timeout=300)
    lab = lance.dataset(str(root / "lance" / "images.lance"))
    assert lab.count_rows(filter=f"image_id IN ('{gone[0]}', '{gone[1]}')") == 0
    rejects = lance.dataset(str(root / "lance" / "rejects.lance")).to_table(
        filter=f"image_id = '{rows[0]['image_id']}'").to_pylist()
    assert [r["reason"] for r in rejects] == ["erased"]
    assert _holding(root, stored) == []
