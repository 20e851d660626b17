"""Faults in real processes: `prx-assets run` killed with SIGKILL at ten points, and runs started
on one data root at once. The next run repairs and finishes the work; the result equals a
clean run's; nothing is duplicated, half-published, left STARTED or leaked.

(kill -9 during training is in tests/test_training.py: the next run adopts the job.)
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import lance
import numpy as np
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.faults import CRASH_POINTS
from prx_assets.infra.doctor import check_duplicates
from tests.helpers import write_folder_corpus

REPO = Path(__file__).parents[1]
SELECT = "*training_mixture"  # everything but the training job (its faults: test_training.py)
CLI = str(Path(sys.executable).parent / "prx-assets")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, str]) -> dict[str, Any]:
    """A small project: one folder source of 9 images and 3 broken files (3 batches), one captioner,
    the embedder, one recipe, one mixture."""
    base = tmp_path_factory.mktemp("faults")
    folder = base / "photos"
    write_folder_corpus(folder, n=9, broken=True)
    config = base / "config"
    config.mkdir()
    (config / "sources.yaml").write_text(textwrap.dedent(f"""
        sources:
          - {{name: photos, kind: folder, path: {folder}, batch_size: 4}}
    """))
    models = (REPO / "config" / "models.yaml").read_text()
    (config / "models.yaml").write_text(models[:models.index("  - name: short")] .replace(
        "max_new_tokens: 48", "max_new_tokens: 8") + models[models.index("embedder:"):])
    (config / "recipes.yaml").write_text(textwrap.dedent("""
        recipes:
          - {name: all, min_side: 32, captions: [detailed], dedup: {exact: true, phash_distance: 2}}
    """))
    (config / "mixtures.yaml").write_text("mixtures:\n  - name: mix\n    streams: [{recipe: all, proportion: 1.0}]\n")
    env = {**os.environ, "PRX_CONFIG_DIR": str(config), "PRX_CAPTIONER_MODEL": tiny_models["vl"],
           "PRX_EMBEDDER_MODEL": tiny_models["siglip"], "PRX_TEXT_ENCODER_MODEL": tiny_models["text"],
           "PRX_LEASE_TTL_SECONDS": "20"}
    env.pop("PRX_CRASH_AT", None)
    reference = _root(base, "reference", env)
    assert _run(reference).returncode == 0
    return {"base": base, "env": env, "reference": reference}


def _root(base: Path, name: str, env: dict[str, str]) -> dict[str, Any]:
    """A data root with its own Dagster instance and temporary folder."""
    where = base / name
    for sub in ("data", "home", "tmp"):
        (where / sub).mkdir(parents=True)
    return {"dir": where, "data": where / "data", "home": where / "home", "tmp": where / "tmp",
            "env": {**env, "PRX_DATA_ROOT": str(where / "data"), "DAGSTER_HOME": str(where / "home"),
                    "TMPDIR": str(where / "tmp")}}


def _start(root: dict[str, Any], crash: str | None = None) -> subprocess.Popen[str]:
    env = dict(root["env"])
    if crash:
        env["PRX_CRASH_AT"] = crash
    return subprocess.Popen([CLI, "run", "--select", SELECT], cwd=root["dir"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _run(root: dict[str, Any], crash: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = _start(root, crash)
    out, _ = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def _table(root: dict[str, Any], name: str, columns: list[str]) -> list[dict[str, Any]]:
    path = root["data"] / "lance" / f"{name}.lance"
    return lance.dataset(str(path)).to_table(columns=columns).to_pylist() if path.exists() else []


def state(root: dict[str, Any]) -> dict[str, Any]:
    """What a consumer reads: rows by key, subsets, published shard sets, mixture specs."""
    data = root["data"]
    images = {r["image_id"]: (r["sha256"], r["stored_format"], r["jpeg_bytes"])
              for r in _table(root, "images", ["image_id", "sha256", "stored_format", "jpeg_bytes"])}
    rejects = {r["image_id"]: r["reason"] for r in _table(root, "rejects", ["image_id", "reason"])}
    captions = sorted((r["captioner_id"], r["image_id"]) for r in _table(root, "captions", ["captioner_id", "image_id"]))
    emb_name = next((p.name[:-len(".lance")] for p in (data / "lance").glob("embeddings_*.lance")), None)
    embeddings = {r["image_id"]: np.asarray(r["embedding"], dtype=np.float32)
                  for r in (_table(root, emb_name, ["image_id", "embedding"]) if emb_name else [])}
    specs = sorted((data / "mixtures").glob("*/*.json"))
    published = []  # what the mixture streams: per stream, the shard set's and its subset's sizes
    for spec in specs:
        for stream in json.loads(spec.read_text())["streams"]:
            manifest = json.loads((data / "mds" / stream["recipe"] / stream["shard_set_id"] / "manifest.json")
                                  .read_text())
            subset = json.loads((data / "curated" / stream["recipe"] / manifest["subset_id"] / "subset.json")
                                .read_text())
            published.append((stream["recipe"], manifest["samples"], subset["selected"], stream["samples"]))
    return {"images": images, "rejects": rejects, "captions": captions, "embeddings": embeddings,
            "published": sorted(published), "specs": len(specs)}


def assert_same_as_reference(got: dict[str, Any], ref: dict[str, Any]) -> None:
    for key in ("images", "rejects", "captions"):
        assert got[key] == ref[key], key
    assert got["embeddings"].keys() == ref["embeddings"].keys()
    for k, v in ref["embeddings"].items():
        assert np.allclose(got["embeddings"][k], v, atol=1e-3), k
    # Subset and shard-set ids are content digests that include caption text; a random tiny
    # captioner may break a near tie differently when batches differ, so compare what they hold.
    assert got["published"] == ref["published"] and got["specs"] == ref["specs"] == 1


def assert_clean(root: dict[str, Any]) -> None:
    """No duplicate key, no STARTED run, no lease, staging folder or read-back cache left behind."""
    data = DataRoot(str(root["data"]))
    assert check_duplicates(data, repair=False) == []
    assert not list((root["data"] / "leases").rglob("*.json")) if (root["data"] / "leases").exists() else True
    assert not list((root["data"] / "mds").glob("*/.staging-*"))
    assert not [p for p in root["tmp"].iterdir() if p.name.startswith(("prx-mds-", "prx-partition-"))]
    for folder in (root["data"] / "mds").glob("*/*"):  # every visible shard set is whole
        assert (folder / "manifest.json").is_file(), folder
    with _instance(root) as instance:
        started = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        assert not started, [r.run_id for r in started]


@contextlib.contextmanager
def _instance(root: dict[str, Any]) -> Iterator[dg.DagsterInstance]:
    """The Dagster instance of a root's ``DAGSTER_HOME`` (this process's own is restored after)."""
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(root["home"])
    try:
        with dg.DagsterInstance.get() as instance:
            yield instance
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old


def test_killed_at_every_point_the_next_run_finishes_as_a_clean_run(project: dict[str, Any]) -> None:
    root = _root(project["base"], "killed", project["env"])
    for point in CRASH_POINTS:
        res = _run(root, crash=point)
        assert res.returncode == -9, f"{point} was not reached (rc {res.returncode}):\n{res.stdout[-3000:]}"
        assert check_duplicates(DataRoot(str(root["data"])), repair=False) == [], point
        for folder in (root["data"] / "mds").glob("*/[!.]*"):  # never a half-published shard set
            assert (folder / "manifest.json").is_file(), (point, folder)
    final = _run(root)
    assert final.returncode == 0, final.stdout[-3000:]
    # the killed run's STARTED record: its processes are gone, so the next run ends it
    assert "every process that ran it is gone" in final.stdout and "marked FAILURE" in final.stdout
    again = _run(root)
    assert again.returncode == 0 and "everything is up to date" in again.stdout, again.stdout[-2000:]
    assert_same_as_reference(state(root), state(project["reference"]))
    assert_clean(root)
    doctor = subprocess.run([CLI, "doctor"], cwd=root["dir"], env=root["env"], text=True, capture_output=True,
                            check=False)
    assert doctor.returncode == 0 and "nothing to repair" in doctor.stdout, doctor.stdout + doctor.stderr


BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""


def test_cli_runs_and_a_ui_backfill_at_once_equal_a_single_run(project: dict[str, Any]) -> None:
    """Two `prx-assets run` started together, two more while they work, and a backfill launched
    through the webserver's GraphQL API over the same partitions: all finish, and the result is
    a single run's (no duplicate key; every later run exits 0 with nothing to do)."""
    from tests.helpers import dagster_dev, graphql, wait_for

    root = _root(project["base"], "concurrent", project["env"])
    discover = subprocess.run([CLI, "discover"], cwd=root["dir"], env=root["env"], text=True, capture_output=True,
                              check=False)
    assert discover.returncode == 0, discover.stdout + discover.stderr
    with dagster_dev(root["dir"], root["dir"] / "dagster_dev.log", env=root["env"]) as port:
        got = graphql(port, BACKFILL, {"p": {"assetSelection": [{"path": ["raw_images"]}, {"path": ["image_embeddings"]},
                                                                 {"path": ["recaptions"]}],
                                             "allPartitions": True, "fromFailure": False}})
        assert got["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", got
        backfill_id = got["launchPartitionBackfill"]["backfillId"]
        procs = [_start(root), _start(root)]  # two at once, beside the backfill
        time.sleep(8)
        procs += [_start(root), _start(root)]  # two more while they work
        outs = [p.communicate(timeout=900)[0] for p in procs]
        for p, out in zip(procs, outs, strict=True):
            assert p.returncode == 0, out[-3000:]
        ran = [line.split(":")[0].split("] ", 1)[1] for o in outs for line in o.splitlines() if line.startswith("[")]
        assert max(ran.count(r) for r in ran) >= 2  # they overlapped: a partition was run by two processes
        with _instance(root) as instance:
            def done() -> Any:
                b = instance.get_backfill(backfill_id)
                return b if b.status.value not in ("REQUESTED", "CANCELING", "FAILING") else None

            final = wait_for(done, 600, f"backfill {backfill_id}", every=2)
            runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            assert final.status.value == "COMPLETED_SUCCESS" and runs, final.status
            assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), [r.status for r in runs]
    # The backfill ran image_embeddings as one run over all batches (its backfill policy): Dagster
    # gives such a run one data version for every partition, so the lab may look stale once; its
    # re-sync changes nothing, and then nothing is left to do.
    for _ in range(2):
        again = _run(root)
        assert again.returncode == 0, again.stdout[-2000:]
        if "everything is up to date" in again.stdout:
            break
        assert all(line.split()[1] in ("lance_table", "lance_table:") for line in again.stdout.splitlines()
                   if line.startswith("[")), again.stdout
    assert "everything is up to date" in again.stdout, again.stdout[-2000:]
    assert_same_as_reference(state(root), state(project["reference"]))
    assert_clean(root)
    shutil.rmtree(root["dir"], ignore_errors=True)
