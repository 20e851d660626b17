"""Kept curation state no configured recipe reads (core/curate/kept_state.py): listed folder by
folder with a reason, deleted by the doctor's repair, and never what a configured recipe reads; a
cut after the deletion selects the same subset (it is a cache)."""

from dataclasses import replace
from pathlib import Path

import lance
import pytest

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.kept_state import delete_stale, stale_kept
from prx_assets.core.curate.recipes import Dedup, Recipe
from prx_assets.infra.doctor import check_kept_state
from prx_assets.resources.storage import ProjectConfigResource
from tests.unit.test_kept_digests import CAPTION, NO_CAPTIONS, RECIPE, _cut, _lab, _same

EMB = "emb__siglip_1"


def _touch(root: DataRoot, rel: str) -> str:
    root.write_bytes(rel, b"kept")
    return rel


def _stale(root: DataRoot, recipes: list[Recipe], lab: lance.LanceDataset | None,
           column: str | None = EMB) -> dict[str, tuple[list[str], str]]:
    return {s.folder + ":" + s.why.split(":")[0]: (s.files, s.why)
            for s in stale_kept(root, recipes, ["c-1"], column, lab)}


def test_stale_kept_state_is_listed_and_deleted(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path / "data"))
    uri = str(tmp_path / "lab.lance")
    _lab(uri, 0, 1_200)
    ds = lance.dataset(uri)
    first = _cut(ds, root)
    gone = replace(RECIPE, name="gone")
    _cut(ds, root, gone)
    _cut(ds, root, NO_CAPTIONS)  # digests of no caption columns: the "_none" folder
    model = _touch(root, layout.search_model("gone", "abc", 20))  # search models are never judged
    gone_pairs = _touch(root, layout.search_pairs("gone", 1, "k", "m", 0.9))
    old_codes = _touch(root, layout.search_codes("emb__old_1", "k", "f"))
    codes = _touch(root, layout.search_codes(EMB, "k", "f"))
    searching = replace(RECIPE, dedup=Dedup(exact=True, phash_distance=2, embedding_threshold=0.95))
    r_pairs = _touch(root, layout.search_pairs("r", 1, "k", "m", 0.9))

    # every configured: nothing stale but the codes of a column no embedder writes
    everything = [searching, replace(searching, name="gone"), NO_CAPTIONS]
    assert list(_stale(root, everything, ds)) == [f"{layout.search_codes_dir('emb__old_1')}:search codes of an "
                                                  "embedding column no recipe's embedding dedup reads (the "
                                                  f"embedder's column is '{EMB}')"]

    stale = _stale(root, [RECIPE], ds)  # "gone" and "plain" removed, no recipe with embedding dedup
    assert set(stale) == {
        "curated/gone/_search:kept pHash pairs", "curated/gone/_search:kept embedding-dedup pairs",
        "curated/r/_search:kept embedding-dedup pairs",
        f"{layout.kept_digests_dir('_none')}:content digests of caption columns no recipe reads",
        f"{layout.search_codes_dir('emb__old_1')}:search codes of an embedding column no recipe's embedding dedup reads "
        f"(the embedder's column is '{EMB}')",
        f"{layout.search_codes_dir(EMB)}:search codes of an embedding column no recipe's embedding dedup reads "
        f"(the embedder's column is '{EMB}')"}
    assert stale["curated/gone/_search:kept pHash pairs"] == (
        [layout.phash_pairs("gone", 1, 2)], "kept pHash pairs: the recipe is not in recipes.yaml")
    assert stale["curated/gone/_search:kept embedding-dedup pairs"][0] == [gone_pairs]
    assert stale["curated/r/_search:kept embedding-dedup pairs"] == (
        [r_pairs], "kept embedding-dedup pairs: the recipe has no embedding dedup")
    assert len(stale[f"{layout.kept_digests_dir('_none')}:content digests of caption columns no recipe reads"][0]) == 3
    assert layout.phash_pairs("r", 1, 2) not in {f for files, _ in stale.values() for f in files}

    # without a lab only the recipes' own folders are judged; a recipe the lab cannot serve stops the digests' check
    assert {k.split(":")[0] for k in _stale(root, [RECIPE], None)} == {"curated/gone/_search", "curated/r/_search"}
    unknown = Recipe(name="later", captions=("c-9",))
    waiting = _stale(root, [RECIPE, unknown], ds)
    assert not any(k.startswith(layout.KEPT_DIGESTS_DIR) for k in waiting)
    assert any(k.startswith(layout.search_codes_dir("emb__old_1")) for k in waiting)  # codes are still judged
    # no embedder: no codes are read, no pairs either
    assert "curated/r/_search:kept embedding-dedup pairs" in _stale(root, [searching], ds, column=None)

    # another distance, then no pHash dedup: the recipe's kept pairs are stale
    moved = _stale(root, [replace(RECIPE, dedup=Dedup(exact=True, phash_distance=3))], ds)
    assert moved["curated/r/_search:kept pHash pairs"][1] == \
        "kept pHash pairs: another distance or layout than the recipe's (phash-v1-d3.npz)"
    assert _stale(root, [replace(RECIPE, dedup=Dedup())], ds)["curated/r/_search:kept pHash pairs"][1] == \
        "kept pHash pairs: the recipe has no pHash dedup"

    for s in stale_kept(root, [RECIPE], ["c-1"], EMB, ds):
        delete_stale(root, s)
    assert stale_kept(root, [RECIPE], ["c-1"], EMB, ds) == []
    left = set(root.list(layout.CURATED_DIR))
    assert model in left and layout.phash_pairs("r", 1, 2) in left
    assert not {gone_pairs, old_codes, codes, r_pairs, layout.phash_pairs("gone", 1, 2)} & left
    assert len(root.list(layout.kept_digests_dir(CAPTION))) == 3  # the configured recipe's digests stay
    again = _cut(ds, root)
    _same(again, first)
    assert again.work["digests"]["computed"] == 0 and again.work["phash_pairs"]["hashes_new"] == 0


def test_doctor_repairs_stale_kept_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The doctor reads the configured recipes and embedder; a removed recipe's pHash pairs are found,
    then deleted by the repair, and found no more."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "recipes.yaml").write_text("recipes:\n  - name: kept\n    dedup: {exact: true, phash_distance: 4}\n")
    (config / "models.yaml").write_text("captioners: []\n")
    project = ProjectConfigResource(config_dir=str(config))
    root = DataRoot(str(tmp_path / "data"))
    keep = _touch(root, layout.phash_pairs("kept", 1, 4))
    stale = _touch(root, layout.phash_pairs("removed", 1, 4))
    found = check_kept_state(root, repair=False, project=project)
    assert [(f.kind, f.where, f.detail, f.repaired) for f in found] == [
        ("stale_kept_state", "curated/removed/_search", "1 files: kept pHash pairs: the recipe is not in recipes.yaml",
         False)]
    assert [f.repaired for f in check_kept_state(root, repair=True, project=project)] == [True]
    assert root.list(layout.CURATED_DIR) == [keep] and stale not in root.list(layout.CURATED_DIR)
    assert check_kept_state(root, repair=False, project=project) == []


def test_stale_kept_state_on_an_s3_data_root(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """The same listing and deletion on the moto S3 endpoint (folders by ``/``-delimited listings)."""
    root = DataRoot(f"s3://{s3_env['BUCKET']}/data")
    uri = root.join("lance/lab.lance")
    _lab(uri, 0, 600, storage_options=root.storage_options())
    ds = lance.dataset(uri, storage_options=root.storage_options())
    _cut(ds, root)
    _cut(ds, root, replace(RECIPE, name="gone"))
    codes = _touch(root, layout.search_codes("emb__old_1", "k", "f"))
    stale = stale_kept(root, [RECIPE], ["c-1"], EMB, ds)
    assert sorted((s.folder, len(s.files)) for s in stale) == [
        (layout.search_codes_dir("emb__old_1"), 1), ("curated/gone/_search", 1)]
    for s in stale:
        delete_stale(root, s)
    assert stale_kept(root, [RECIPE], ["c-1"], EMB, ds) == []
    left = root.list(layout.CURATED_DIR)
    assert codes not in left and layout.phash_pairs("r", 1, 2) in left
