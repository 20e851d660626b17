"""Nothing corrupt is published or trained on: flipped bytes in a shard file and in a Lance data
file are found by `prx-assets doctor --verify`, refused by publishing, and repaired."""

import shutil
from pathlib import Path

import lance
import pytest

from prx_assets.cli import main
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.corpus import generate_demo_corpus

REPO = Path(__file__).parents[1]


@pytest.fixture
def demo(tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch, models_env: dict[str, str],
         capsys: pytest.CaptureFixture[str]) -> Path:
    generate_demo_corpus(DataRoot(str(data_root)), n_photos=20, n_catalog=10, n_web=8)
    shutil.copytree(REPO / "config", tmp_path / "config")
    monkeypatch.setenv("PRX_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--select", "raw_images recaptions image_embeddings lance_table curated_subsets mds_shards"]) == 0
    capsys.readouterr()
    return data_root


def _flip(path: Path, offset: int, n: int = 256) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_shard_is_found_quarantined_and_published_again(demo: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--verify"]) == 0
    assert "every stored image and shard matches its digest" in capsys.readouterr().out
    (set_dir,) = [p for p in (demo / "mds" / "demo_all").iterdir() if not p.name.startswith(".")]
    shard = next(set_dir.rglob("*.mds"))
    _flip(shard, shard.stat().st_size // 2)
    assert main(["doctor", "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"found: corrupt_shard_set mds/demo_all/{set_dir.name}" in out and "xxh64 mismatch" in out
    assert main(["doctor", "--verify", "--repair"]) == 0
    out = capsys.readouterr().out
    assert "repaired: corrupt_shard_set" in out and "published again" in out and "mds_shards demo_all: ok" in out
    assert (demo / "mds" / "demo_all" / ".quarantine" / set_dir.name / "QUARANTINED.json").is_file()
    assert (set_dir / "manifest.json").is_file()  # the same set id, written whole again
    assert main(["doctor", "--verify"]) == 0


def test_a_flipped_lance_data_file_is_found_refused_by_publish_and_repaired(
        demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = demo / "lance" / "images.lance"
    row = lance.dataset(str(uri)).to_table(columns=["image_id", "batch", "jpeg"], limit=1).to_pylist()[0]
    hit = None
    for f in sorted((uri / "data").glob("*.lance")):
        at = f.read_bytes().find(row["jpeg"][:256])
        if at >= 0:
            hit = (f, at + len(row["jpeg"]) // 2)
    assert hit is not None
    _flip(*hit)
    assert main(["doctor", "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"found: corrupt_images images[{row['batch']}]" in out and row["image_id"] in out

    # A recipe added now would publish from the corrupt lab: publishing refuses the bytes.
    recipes = Path("config") / "recipes.yaml"
    recipes.write_text(recipes.read_text() + "  - name: late\n    captions: [short]\n")
    assert main(["run", "--select", "curated_subsets mds_shards"]) == 1
    out = capsys.readouterr().out
    assert "mds_shards late: FAILED" in out and "do not match the digest recorded at ingest" in out

    assert main(["doctor", "--verify", "--repair"]) == 0
    out = capsys.readouterr().out
    assert f"repaired: corrupt_images images[{row['batch']}]" in out and f"raw_images {row['batch']}: ok" in out
    assert main(["doctor", "--verify"]) == 0
    capsys.readouterr()
    assert main(["run", "--select", "raw_images recaptions image_embeddings lance_table curated_subsets mds_shards"]) == 0
    assert "mds_shards late: ok" in capsys.readouterr().out
