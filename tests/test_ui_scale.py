"""The UI path at real sizes: runs launched through the webserver's GraphQL (the calls the UI makes)
against ``dagster dev`` (webserver, daemon, code server), on ingest batches of 2,000 files decoded
by worker processes, finish; no process of a run survives it; Terminate cancels a running ingest.

Bounds stated here are for a 2-core machine: a run of one 2,000-file batch within 300 s, the
backfill of two batches and everything downstream within 1,200 s, the sensor's run within 300 s
of the drop, a terminated run CANCELED within 30 s.
"""

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import psutil
import pytest
from PIL import Image, ImageDraw

from prx_assets.infra.stuck_runs import gather
from tests.helpers import dagster_dev, graphql, wait_for

REPO = Path(__file__).parents[1]
BATCH = 2000
LOCATION = {"repositoryLocationName": "prx_assets.definitions", "repositoryName": "__repository__"}
ONE_RUN_S, BACKFILL_S, SENSOR_S, CANCEL_S = 300, 1200, 300, 30

LAUNCH_RUN = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on InvalidSubsetError { message } ... on RunConfigValidationInvalid { errors { message } } } }"""
BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
START_SENSOR = """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) {
  __typename ... on Sensor { sensorState { status } } ... on PythonError { message } } }"""
STOP_SENSOR = """mutation($id: String!) { stopSensor(id: $id) { __typename } }"""
SENSOR_STATE = """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
  ... on Sensor { sensorState { id status } } } }"""
TERMINATE = """mutation($id: String!) { terminateRun(runId: $id) {
  __typename ... on TerminateRunFailure { message } ... on PythonError { message } } }"""


def _scene(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    """A smooth picture (a gradient and a few shapes): JPEG-friendly, every one different."""
    x = np.linspace(0, 1, w)[None, :, None]
    y = np.linspace(0, 1, h)[:, None, None]
    base = rng.uniform(0, 255, 3) * x + rng.uniform(0, 255, 3) * (1 - y)
    im = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
        draw.ellipse((x0, y0, x0 + int(rng.integers(10, 60)), y0 + int(rng.integers(10, 60))),
                     fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    return im


def write_drop(folder: Path, n: int, seed: int, size: tuple[int, int] = (96, 72)) -> None:
    """``n`` distinct small JPEG and PNG files, written beside ``folder`` and moved in at once (a
    listing never sees half a drop)."""
    staging = folder.parent.parent / f".staging-{folder.name}"
    staging.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        im = _scene(rng, *size)
        if i % 5:
            im.save(staging / f"img_{i:05d}.jpg", "JPEG", quality=90)
        else:
            im.save(staging / f"img_{i:05d}.png", "PNG")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(folder)


def _config(base: Path, tiny_models: dict[str, str]) -> Path:
    """One folder source in batches of 2,000; one short captioner (2 new tokens, batches of 64, small
    inputs) so captioning 8,000 images stays within a minute on a CPU; one recipe and one mixture."""
    config = base / "config"
    config.mkdir()
    (config / "sources.yaml").write_text(
        f"ingest:\n  min_side: 64\nsources:\n  - name: drops\n    kind: folder\n    path: {base / 'drops'}\n"
        f"    batch_size: {BATCH}\n  - name: big\n    kind: folder\n    path: {base / 'big'}\n    batch_size: 400\n")
    (config / "models.yaml").write_text(
        f"captioners:\n  - {{name: short, model: {tiny_models['vl']}, prompt: Caption this image., "
        f"max_new_tokens: 2, batch_size: 64, max_pixels: 4096}}\nembedder: {{name: siglip, model: {tiny_models['siglip']}, "
        f"batch_size: 64}}\ntext_encoder: {{name: qwen3, model: {tiny_models['text']}, max_length: 16}}\n")
    (config / "recipes.yaml").write_text(
        "recipes:\n  - name: all\n    min_side: 64\n    captions: [short]\n    dedup: {exact: true}\n")
    (config / "mixtures.yaml").write_text("mixtures:\n  - name: mix\n    streams:\n      - {recipe: all, proportion: 1.0}\n")
    return config


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, str]) -> Iterator[dict[str, Any]]:
    """A project with the first drop discovered, served by ``dagster dev``."""
    base = tmp_path_factory.mktemp("ui_scale")
    (base / "big").mkdir()
    config = _config(base, tiny_models)
    env = {"PRX_DATA_ROOT": str(base / "data"), "PRX_CONFIG_DIR": str(config), "DAGSTER_HOME": str(base / "home")}
    (base / "home").mkdir()
    shutil.copy(REPO / "dagster.yaml", base / "home" / "dagster.yaml")
    write_drop(base / "drops" / "d1", BATCH, seed=1)
    _cli("discover", base=base, env=env)
    with dagster_dev(base, base / "dagster_dev.log", env=env) as port:
        yield {"base": base, "port": port, "env": env}


@pytest.fixture(autouse=True)
def _project_env(project: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in project["env"].items():
        monkeypatch.setenv(k, v)


def _cli(*args: str, base: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([str(Path(sys.executable).parent / "prx-assets"), *args], cwd=base, text=True,
                         capture_output=True, check=False, timeout=600, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _workers() -> set[int]:
    """Processes forked for multiprocessing pools on this machine (forkserver and its children)."""
    out = set()
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "multiprocessing.forkserver" in cmd or "multiprocessing.spawn" in cmd:
            out.add(p.pid)
    return out


def _ended(instance: dg.DagsterInstance, run_id: str, timeout: float) -> dg.DagsterRun:
    def done() -> dg.DagsterRun | None:
        run = instance.get_run_by_id(run_id)
        return run if run is not None and run.is_finished else None

    return wait_for(done, timeout, f"run {run_id} to end", every=1)


def _nothing_left(instance: dg.DagsterInstance, run_ids: list[str], before: set[int]) -> None:
    """No process that ran these runs is alive, and no pool process started since ``before`` is."""
    records = instance.get_run_records(dg.RunsFilter(run_ids=run_ids))
    pids = {p for r in records for p in gather(instance, r).pids}
    assert pids, "the runs recorded no process"

    def gone() -> bool:
        return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] \
            and not (_workers() - before)

    wait_for(gone, 20, f"the processes of runs {run_ids} ({sorted(pids)}) and their worker pools to exit")


def _failure(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    return "\n".join(str(e.user_message)[:500] for e in instance.all_logs(run.run_id)
                     if e.dagster_event is not None and e.dagster_event.is_failure)[-4000:]


def _launch_ingest(port: int, key: str) -> str:
    got = graphql(port, LAUNCH_RUN, {"p": {
        "selector": {**LOCATION, "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": ["raw_images"]}],
                     "assetCheckSelection": [{"assetKey": {"path": ["raw_images"]}, "name": "jpeg_q92_cycles"}]},
        "mode": "default", "executionMetadata": {"tags": [{"key": "dagster/partition", "value": key}]}}})
    assert got["launchRun"]["__typename"] == "LaunchRunSuccess", got
    return got["launchRun"]["run"]["runId"]


def test_real_sized_partitions_run_from_the_ui_a_backfill_and_a_sensor_to_the_end(project: dict[str, Any]) -> None:
    base, port = project["base"], project["port"]
    before = _workers()
    with dg.DagsterInstance.get() as instance:
        # 1. Materialize one 2,000-file partition, as the asset page's Materialize button does.
        (first,) = instance.get_dynamic_partitions("raw_batches")
        started = time.monotonic()
        run_id = _launch_ingest(port, first)
        run = _ended(instance, run_id, ONE_RUN_S)
        assert run.status == dg.DagsterRunStatus.SUCCESS, _failure(instance, run)
        mat = instance.fetch_materializations(dg.AssetKey("raw_images"), limit=1).records[0].asset_materialization
        assert mat.metadata["dagster/row_count"].value == BATCH and mat.metadata["worker_processes"].value >= 2
        print(f"one {BATCH}-file partition from the UI: {time.monotonic() - started:.0f} s")
        _nothing_left(instance, [run_id], before)

        # 2. Two more drops, then a backfill of their partitions and everything downstream.
        for i in (2, 3):
            write_drop(base / "drops" / f"d{i}", BATCH, seed=i)
        _cli("discover", base=base)
        batches = [k for k in instance.get_dynamic_partitions("raw_batches") if k != first]
        assert len(batches) == 2
        captioner = instance.get_dynamic_partitions("captioners")[0]
        per_batch = [{"assetKey": {"path": [a]}, "partitions": {"ranges": [{"start": k, "end": k} for k in keys]}}
                     for a, keys in (("raw_images", batches), ("image_embeddings", batches),
                                     ("recaptions", [f"{b}|{captioner}" for b in batches]))]
        whole = [{"assetKey": {"path": ["lance_table"]}, "partitions": None}]
        by_recipe = [{"assetKey": {"path": [a]}, "partitions": {"ranges": [{"start": k, "end": k}]}}
                     for a, k in (("curated_subsets", "all"), ("mds_shards", "all"), ("training_mixture", "mix"),
                                  ("training_run", "mix"))]
        started = time.monotonic()
        got = graphql(port, BACKFILL, {"p": {"partitionsByAssets": per_batch + whole + by_recipe,
                                             "fromFailure": False}})
        assert got["launchPartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", got
        backfill_id = got["launchPartitionBackfill"]["backfillId"]

        def backfill_done() -> Any:
            b = instance.get_backfill(backfill_id)
            return b if b.status.value not in ("REQUESTED", "CANCELING", "FAILING") else None

        final = wait_for(backfill_done, BACKFILL_S, f"backfill {backfill_id}", every=3)
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        failed = [r for r in runs if r.status != dg.DagsterRunStatus.SUCCESS]
        assert final.status.value == "COMPLETED_SUCCESS" and runs and not failed, \
            [(r.status, _failure(instance, r)) for r in failed]
        print(f"backfill of 2 x {BATCH} files and downstream: {time.monotonic() - started:.0f} s, {len(runs)} runs")
        done = {k.to_user_string() for r in runs for k in (r.asset_selection or [])}
        assert {"raw_images", "recaptions", "image_embeddings", "lance_table", "curated_subsets", "mds_shards",
                "training_mixture", "training_run"} <= done, done
        rows = instance.fetch_materializations(dg.AssetKey("curated_subsets"), limit=1).records[0]
        # the two captioned batches (the first was only ingested), less the few exact duplicates
        # that small random pictures happen to share
        assert rows.asset_materialization.metadata["dagster/row_count"].value >= 0.99 * 2 * BATCH
        _nothing_left(instance, [r.run_id for r in runs], before)

        # 3. A third drop lands; the new-batch sensor, switched on, ingests it by itself.
        write_drop(base / "drops" / "d4", BATCH, seed=4)
        sensor = {**LOCATION, "sensorName": "raw_batch_sensor"}
        started = time.monotonic()
        assert graphql(port, START_SENSOR, {"s": sensor})["startSensor"]["__typename"] == "Sensor"
        try:

            def sensor_run() -> list[dg.DagsterRun]:
                return [r for r in instance.get_runs(filters=dg.RunsFilter(tags={"dagster/sensor_name":
                                                                                 "raw_batch_sensor"}))
                        if r.is_finished]

            (run,) = wait_for(sensor_run, SENSOR_S, "the sensor's ingest run of the third drop", every=2)
            assert run.status == dg.DagsterRunStatus.SUCCESS, _failure(instance, run)
            assert run.tags["dagster/partition"] not in (first, *batches)
            print(f"sensor drop to ingested: {time.monotonic() - started:.0f} s")
            _nothing_left(instance, [run.run_id], before)
        finally:
            state = graphql(port, SENSOR_STATE, {"s": sensor})["sensorOrError"]["sensorState"]
            graphql(port, STOP_SENSOR, {"id": state["id"]})


def test_terminate_from_the_ui_cancels_a_running_ingest_and_its_workers(project: dict[str, Any]) -> None:
    base, port = project["base"], project["port"]
    rng = np.random.default_rng(9)
    big = _scene(rng, 3000, 2000)
    for i in range(400):  # heavy enough to be caught mid-batch: ~0.1 s of work an image
        big.save(base / "big" / f"b_{i:04d}.jpg", "JPEG", quality=95) if i == 0 else \
            shutil.copy(base / "big" / "b_0000.jpg", base / "big" / f"b_{i:04d}.jpg")
    _cli("discover", "--source", "big", base=base)
    before = _workers()
    with dg.DagsterInstance.get() as instance:
        (key,) = [k for k in instance.get_dynamic_partitions("raw_batches") if k.startswith("big-")]
        run_id = _launch_ingest(port, key)

        def ingesting() -> bool:
            kinds = [e.dagster_event.event_type_value for e in instance.all_logs(run_id) if e.dagster_event]
            return "STEP_START" in kinds and bool(_workers() - before)

        wait_for(ingesting, 120, "the ingest step and its worker processes to start", every=0.5)
        time.sleep(2)
        got = graphql(port, TERMINATE, {"id": run_id})
        assert got["terminateRun"]["__typename"] == "TerminateRunSuccess", got
        asked = time.monotonic()
        run = _ended(instance, run_id, CANCEL_S)
        assert run.status == dg.DagsterRunStatus.CANCELED, run.status
        print(f"terminate to CANCELED: {time.monotonic() - asked:.1f} s")
        _nothing_left(instance, [run_id], before)
