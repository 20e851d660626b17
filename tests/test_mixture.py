"""Shard sets and mixtures end to end: epoch composition, atomic publish, config errors."""

import json
import shutil
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from prx_assets.cli import main
from prx_assets.core.config.project import data_root
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.corpus import generate_demo_corpus
from prx_assets.core.manifests import MixtureSpec
from prx_assets.core.publish.mixture import load_mixtures, streaming_kwargs
from prx_assets.core.publish.streaming_shm import streaming_registration
from prx_assets.errors import ConfigError

REPO = Path(__file__).parents[1]


@pytest.fixture
def two_recipe_config(tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch, models_env: dict) -> Path:
    generate_demo_corpus(DataRoot(str(data_root)), n_photos=40, n_catalog=20, n_web=4)
    config = tmp_path / "config"
    shutil.copytree(REPO / "config", config)
    (config / "recipes.yaml").write_text("""
recipes:
  - {name: photos_only, where: "source = 'photos'", captions: [short], dedup: {exact: true}}
  - {name: catalog_only, where: "source = 'catalog'", captions: [detailed, short], dedup: {exact: true}}
""")
    (config / "mixtures.yaml").write_text("""
mixtures:
  - name: mix
    epoch_size: 400
    streams:
      - {recipe: photos_only, proportion: 0.75}
      - {recipe: catalog_only, proportion: 0.25}
""")
    monkeypatch.setenv("PRX_CONFIG_DIR", str(config))
    monkeypatch.chdir(tmp_path)
    return config


def test_mixture_epoch_composition_matches_proportions(two_recipe_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from streaming import StreamingDataset

    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "training_mixture mix: ok" in out and "FAILED" not in out
    with dg.DagsterInstance.get() as instance:
        rec = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("training_mixture"), asset_partitions=["mix"]),
            limit=1).records[0].asset_materialization
    spec = json.loads(Path(rec.metadata["spec_uri"].value).read_text())
    assert spec["expected_samples_per_stream"] == {"photos_only": 300, "catalog_only": 100}
    assert rec.tags["dagster/data_version"] == spec["mixture_version"]
    with streaming_registration():  # other tests open datasets on this node at the same time
        ds = StreamingDataset(**streaming_kwargs(MixtureSpec.from_dict(spec)), shuffle=True, shuffle_seed=7,
                              batch_size=8)
    counts = Counter(s["source"] for s in ds)
    assert sum(counts.values()) == 400
    assert abs(counts["photos"] - 300) <= 20 and abs(counts["catalog"] - 100) <= 20

    # A new captioner setting would change shard sets; an unchanged run is a no-op.
    assert main(["run"]) == 0
    assert "everything is up to date" in capsys.readouterr().out


def test_shard_publish_is_atomic_and_a_rerun_succeeds(two_recipe_config: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import prx_assets.core.publish.shards as shards

    real = shards._write_part
    calls = {"n": 0}

    def dying(*args: object, **kwargs: object) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("writer killed midway")
        return real(*args, **kwargs)

    monkeypatch.setattr(shards, "_write_part", dying)
    assert main(["run"]) == 1
    out = capsys.readouterr().out
    assert "writer killed midway" in out
    root = DataRoot(data_root())
    published = [p for p in root.list("mds") if p.endswith("/index.json") and ".staging-" not in p]
    # Exactly the recipe whose writer did not die is visible; nothing half-written is.
    assert len({p.split("/")[1] for p in published}) == 1
    assert not [p for p in root.list("mds") if ".staging-" in p]
    monkeypatch.setattr(shards, "_write_part", real)
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "mds_readback: passed" in out and "training_mixture mix: ok" in out


def test_mixture_naming_an_unknown_recipe_fails_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "mixtures.yaml").write_text("mixtures:\n  - {name: m, streams: [{recipe: nope, proportion: 1}]}\n")
    with pytest.raises(ConfigError, match=r"mixture 'm': stream names unknown recipe 'nope'; known recipes: \['a'\]"):
        load_mixtures(tmp_path / "mixtures.yaml", known_recipes=["a"])


@pytest.mark.parametrize(("streams", "pattern"), [
    ("[demo_all]", r"mixtures.yaml: mixture 'm': streams\[0\]='demo_all': expected a mapping with a recipe and a "
                   r"weight, got str \(fix: write \{recipe: demo_all, proportion: 1\}\)"),
    ("demo_all", r"streams='demo_all': expected a list of streams, got str"),
    ("[{recipe: a, proportion: lots}]", r"streams\[0\].proportion='lots': expected a float or null, got str"),
    ("[{recipe: a, repeat: -1}]", r"streams\[0\].repeat=-1 must be > 0"),
])
def test_malformed_streams_name_the_file_entry_and_fix(tmp_path: Path, streams: str, pattern: str) -> None:
    (tmp_path / "mixtures.yaml").write_text(f"mixtures:\n  - {{name: m, streams: {streams}}}\n")
    with pytest.raises(ConfigError, match=pattern):
        load_mixtures(tmp_path / "mixtures.yaml", known_recipes=["a", "demo_all"])
