"""The Dagster UI in a real browser: Debian's chromium driven by Playwright against ``dagster dev``.

One module-scoped project (a small demo corpus with every ingest batch materialized) and one
``dagster dev`` serve all tests. Screenshots land in ``test-artifacts/ui/``.
"""

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from prx_assets.cli import main
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.corpus import generate_demo_corpus
from tests.helpers import dagster_dev, graphql, wait_for

REPO = Path(__file__).parents[1]
SHOTS = REPO / "test-artifacts" / "ui"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium, installed from Debian's packages if missing (never a downloaded browser)."""
    if not CHROMIUM.exists():
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.fail("the browser tests need Debian's chromium: run `apt-get install -y chromium` as root")
        out = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
                             capture_output=True, text=True, check=False,
                             env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if out.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
            out = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
                                 capture_output=True, text=True, check=False,
                                 env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if out.returncode != 0:
            pytest.fail(f"apt-get install chromium failed: {out.stderr[-1500:]}")
    return CHROMIUM


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, str], chromium: Path) -> Iterator[dict]:
    """A materialized small project served by ``dagster dev``; yields port, base folder and a browser page."""
    from playwright.sync_api import sync_playwright

    base = tmp_path_factory.mktemp("ui")
    mp = pytest.MonkeyPatch()
    root = base / "data"
    root.mkdir()
    config = base / "config"
    shutil.copytree(REPO / "config", config)
    env = {"PRX_DATA_ROOT": str(root), "PRX_CONFIG_DIR": str(config), "DAGSTER_HOME": str(base / "home"),
           "PRX_CAPTIONER_MODEL": tiny_models["vl"], "PRX_EMBEDDER_MODEL": tiny_models["siglip"],
           "PRX_TEXT_ENCODER_MODEL": tiny_models["text"]}
    for k, v in env.items():
        mp.setenv(k, v)
    (base / "home").mkdir()
    mp.chdir(base)
    generate_demo_corpus(DataRoot(str(root)), n_photos=16, n_catalog=8, n_web=2)
    assert main(["run", "--select", "raw_images"]) == 0
    SHOTS.mkdir(parents=True, exist_ok=True)
    with dagster_dev(base, base / "dagster_dev.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
        page.set_default_timeout(60_000)
        yield {"port": port, "base": base, "env": env, "page": page}
        browser.close()
    mp.undo()


@pytest.fixture(autouse=True)
def _ui_env(ui: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in ui["env"].items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(ui["base"])


def _open(ui: dict, path: str) -> Any:
    page = ui["page"]
    page.goto(f"http://127.0.0.1:{ui['port']}{path}")
    skip = page.get_by_role("button", name="Skip")  # the first-visit community dialog
    try:
        skip.wait_for(timeout=4000)
        skip.click()
    except Exception:
        pass
    return page


def _graph(page: Any) -> tuple[set[str], int]:
    """Asset names shown as graph nodes and the number of edges drawn."""
    page.locator("path[stroke='var(--color-lineage-edge)']").first.wait_for(state="attached")
    page.wait_for_timeout(1000)
    edges = page.locator("path[stroke='var(--color-lineage-edge)']").count()
    names = page.locator("[class*=AssetNode_assetName]").all_inner_texts()
    return {n.strip() for n in names}, edges


def _expected_edges(keys: set[str]) -> int:
    from prx_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    return sum(1 for k in graph.get_all_asset_keys() if k.to_user_string() in keys
               for p in graph.get(k).parent_keys if p.to_user_string() in keys)


def test_asset_graph_shows_every_asset_and_its_edges(ui: dict) -> None:
    from prx_assets.definitions import defs

    page = _open(ui, "/assets/training_run?view=lineage&lineageScope=upstream&lineageDepth=20")
    shown, edges = _graph(page)
    page.screenshot(path=str(SHOTS / "asset_graph.png"))
    every = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert every <= shown, every - shown
    assert edges == _expected_edges(every) == 9


def test_lineage_of_mds_shards_shows_its_upstreams(ui: dict) -> None:
    page = _open(ui, "/assets/mds_shards?view=lineage&lineageScope=upstream&lineageDepth=20")
    shown, edges = _graph(page)
    page.screenshot(path=str(SHOTS / "mds_shards_lineage.png"))
    upstream = {"raw_images", "recaptions", "image_embeddings", "lance_table", "curated_subsets", "mds_shards"}
    assert upstream <= shown and not {"training_mixture", "training_run"} & shown
    assert edges == _expected_edges(upstream)


def _materialize_dialog(page: Any) -> Any:
    page.get_by_role("button", name="Materialize…").first.click()
    dialog = page.locator(".dagster-dialog")
    dialog.wait_for()
    return dialog


def test_materialize_a_partition_from_the_ui_and_see_its_thumbnails(ui: dict) -> None:
    with dg.DagsterInstance.get() as instance:
        before = {r.run_id for r in instance.get_runs()}
    page = _open(ui, "/assets/raw_images?view=partitions")
    dialog = _materialize_dialog(page)
    dialog.get_by_text("Select a partition or create one").click()
    page.keyboard.type("photos-00001")
    page.locator(".dagster-popover").get_by_text("photos-00001", exact=True).first.click()
    page.keyboard.press("Escape")
    page.screenshot(path=str(SHOTS / "materialize_dialog.png"))
    dialog.get_by_role("button", name="Launch 1 run").click()

    with dg.DagsterInstance.get() as instance:
        def finished() -> list[dg.DagsterRun]:
            return [r for r in instance.get_runs() if r.run_id not in before and r.is_finished]

        run = wait_for(finished, 240, "the run launched from the UI to finish")[0]
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags.get("dagster/partition") == "photos-00001"
        mat = instance.get_latest_data_version_record(dg.AssetKey("raw_images"), partition_key="photos-00001")
        assert mat.asset_materialization is not None
        assert "contact_sheet" in mat.asset_materialization.metadata

    page = _open(ui, "/assets/raw_images?view=partitions&partition=photos-00001")
    row = page.get_by_text("contact_sheet", exact=True).first.locator("xpath=ancestor::tr[1]")
    row.scroll_into_view_if_needed()
    row.get_by_text("[Show Markdown]").click()
    img = page.locator(".dagster-dialog img[src^='data:image/jpeg']").first
    img.wait_for()
    assert img.evaluate("i => i.complete && i.naturalWidth") > 100  # decoded, not a broken image
    page.screenshot(path=str(SHOTS / "contact_sheet.png"))
    page.keyboard.press("Escape")


def test_backfill_over_several_partitions_from_the_ui_completes(ui: dict) -> None:
    with dg.DagsterInstance.get() as instance:
        batches = instance.get_dynamic_partitions("raw_batches")
    assert len(batches) >= 3
    page = _open(ui, "/assets/image_embeddings?view=partitions")
    dialog = _materialize_dialog(page)
    dialog.get_by_role("button", name="All", exact=True).click()
    page.screenshot(path=str(SHOTS / "backfill_dialog.png"))
    dialog.get_by_role("button", name=re.compile(r"^Launch")).click()

    with dg.DagsterInstance.get() as instance:
        backfill = wait_for(lambda: instance.get_backfills(), 60, "the backfill to be created")[0]

        def done() -> Any:
            b = instance.get_backfill(backfill.backfill_id)
            return b if b.status.value not in ("REQUESTED", "CANCELING", "FAILING") else None

        final = wait_for(done, 420, f"backfill {backfill.backfill_id} to complete", every=2)
        assert final.status.value == "COMPLETED_SUCCESS", final.status
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill.backfill_id}))
        assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        assert len(runs) < len(batches)  # the backfill policy batches partitions into runs
        for b in batches:
            rec = instance.get_latest_data_version_record(dg.AssetKey("image_embeddings"), partition_key=b)
            assert rec is not None, b
        # Each batch keeps its own fingerprint, so `prx-assets run` sees them up to date.
        from prx_assets.infra.staleness import recorded_fingerprints

        fps = recorded_fingerprints(instance, dg.AssetKey("image_embeddings"))
        assert all(fps.get(b) for b in batches) and len({fps[b] for b in batches}) == len(batches)
    page = _open(ui, f"/runs/b/{backfill.backfill_id}")
    page.wait_for_timeout(2000)
    page.screenshot(path=str(SHOTS / "backfill.png"))



ADD_PARTITION = """
mutation($repo: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $repo, partitionsDefName: $name, partitionKey: $key) {
    __typename
    ... on AddDynamicPartitionSuccess { partitionKey }
    ... on PythonError { message }
  }
}"""


def test_a_bogus_partition_added_in_the_ui_is_skipped_and_pruned(ui: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """The Materialize dialog's "Add a partition" registers any key; nothing backs ``photos-00099``."""
    repo = {"repositoryLocationName": "prx_assets.definitions", "repositoryName": "__repository__"}
    got = graphql(ui["port"], ADD_PARTITION, {"repo": repo, "name": "raw_batches", "key": "photos-00099"})
    assert got["addDynamicPartition"]["__typename"] == "AddDynamicPartitionSuccess", got
    with dg.DagsterInstance.get() as instance:
        assert "photos-00099" in instance.get_dynamic_partitions("raw_batches")
    capsys.readouterr()
    assert main(["run", "--select", "raw_images", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "raw_images[photos-00099]: no batch manifest ingest/batches/photos/00099.json" in out
    assert "photos-00099" not in out.split("skipping")[1].split("\n", 3)[-1]  # not planned
    assert main(["partitions"]) == 0
    assert "raw_batches:" in capsys.readouterr().out
    assert main(["partitions", "--prune"]) == 0
    assert "removed 1 orphaned partitions" in capsys.readouterr().out
    with dg.DagsterInstance.get() as instance:
        assert "photos-00099" not in instance.get_dynamic_partitions("raw_batches")
    assert main(["run", "--select", "raw_images", "--dry-run"]) == 0
    assert "skipping" not in capsys.readouterr().out


BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
STALE = """query($keys: [AssetKeyInput!], $parts: [String!]) { assetNodes(assetKeys: $keys) {
  assetKey { path } staleStatusByPartition(partitions: $parts) } }"""


def test_relaunching_an_unchanged_partition_from_the_ui_changes_nothing(
        ui: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Identity follows content: the same files re-ingested give no new Lance version or data version,
    and Dagster's stale status agrees with `prx-assets run --dry-run`."""
    import lance

    with dg.DagsterInstance.get() as instance:
        batch = sorted(instance.get_dynamic_partitions("raw_batches"))[0]
        before = instance.get_latest_data_version_record(dg.AssetKey("raw_images"), partition_key=batch)
    images = lance.dataset(str(ui["base"] / "data" / "lance" / "images.lance"))
    got = graphql(ui["port"], BACKFILL, {"p": {"assetSelection": [{"path": ["raw_images"]}],
                                               "partitionNames": [batch], "fromFailure": False}})
    assert got["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", got
    with dg.DagsterInstance.get() as instance:
        backfill_id = got["launchPartitionBackfill"]["backfillId"]

        def done() -> Any:
            b = instance.get_backfill(backfill_id)
            return b if b.status.value not in ("REQUESTED", "CANCELING", "FAILING") else None

        assert wait_for(done, 300, f"backfill {backfill_id}", every=2).status.value == "COMPLETED_SUCCESS"
        after = instance.get_latest_data_version_record(dg.AssetKey("raw_images"), partition_key=batch)
        batches = sorted(instance.get_dynamic_partitions("raw_batches"))
    assert after.storage_id > before.storage_id  # it did run ...
    assert after.asset_materialization.tags["dagster/data_version"] == \
        before.asset_materialization.tags["dagster/data_version"]  # ... and changed nothing
    assert lance.dataset(images.uri).version == images.version  # no new Lance version either

    # Dagster's view and the CLI's agree: image_embeddings (materialized for every batch earlier) is fresh.
    nodes = graphql(ui["port"], STALE, {"keys": [{"path": ["image_embeddings"]}], "parts": batches})["assetNodes"]
    assert nodes[0]["staleStatusByPartition"] == ["FRESH"] * len(batches), nodes
    capsys.readouterr()
    assert main(["run", "--select", "image_embeddings", "--dry-run"]) == 0
    assert "everything is up to date" in capsys.readouterr().out
