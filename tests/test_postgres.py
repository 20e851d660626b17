"""The production instance: deploy/dagster.yaml (PostgreSQL storage, queued runs, compute logs on S3).

A fresh database on the local server (127.0.0.1:5432) per run; the only switch from the
development instance is the dagster.yaml file in DAGSTER_HOME. ``dagster dev`` serves as
webserver + daemon over it; a backfill is launched through GraphQL, one partition fails,
and a failed-only re-backfill finishes the job.
"""

import shutil
import time
import uuid
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
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}

LAUNCH = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
RETRY = """mutation($p: ReexecutionParams!) { reexecutePartitionBackfill(reexecutionParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    import psycopg2

    name = f"prx_test_{uuid.uuid4().hex[:10]}"
    try:
        conn = psycopg2.connect(dbname="postgres", **PG)
    except psycopg2.OperationalError as e:
        pytest.fail(f"PostgreSQL at {PG['host']}:{PG['port']} is not reachable ({e}); start it or fix PG")
    conn.autocommit = True
    conn.cursor().execute(f"CREATE DATABASE {name}")
    yield name
    conn.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    conn.close()


def _sql(db: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg2

    with psycopg2.connect(dbname=db, **PG) as conn, conn.cursor() as cur:
        cur.execute(query)
        return cur.fetchall()


def _wait_backfill(backfill_id: str) -> Any:
    with dg.DagsterInstance.get() as instance:
        def done() -> Any:
            b = instance.get_backfill(backfill_id)
            return b if b is not None and b.status.value not in ("REQUESTED", "CANCELING", "FAILING") else None

        return wait_for(done, 420, f"backfill {backfill_id}", every=2)


def test_demo_pipeline_on_postgres_storage(database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           s3_env: dict[str, str], models_env: dict[str, str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")  # the one switch
    root = tmp_path / "data"
    env = {"DAGSTER_HOME": str(home), "PRX_DATA_ROOT": str(root), "PRX_CONFIG_DIR": str(REPO / "config"),
           "PRX_PG_HOST": PG["host"], "PRX_PG_PORT": str(PG["port"]), "PRX_PG_USER": PG["user"],
           "PRX_PG_PASSWORD": "unused-with-trust-auth", "PRX_PG_DB": database,
           "PRX_COMPUTE_LOG_BUCKET": s3_env["BUCKET"], "PRX_COMPUTE_LOG_PREFIX": "compute-logs"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    generate_demo_corpus(DataRoot(str(root)), n_photos=16, n_catalog=8, n_web=2)
    assert main(["discover"]) == 0
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        batches = instance.get_dynamic_partitions("raw_batches")
    assert len(batches) >= 3

    # One batch's manifest goes missing: its partition fails, the others succeed.
    broken = batches[0]
    source = broken.rsplit("-", 1)[0]
    manifest = root / "ingest" / "batches" / source / f"{int(broken.rsplit('-', 1)[1]):05d}.json"
    if not manifest.exists():  # naming is <seq>.json; find it whatever the padding
        manifest = next((root / "ingest" / "batches" / source).glob(f"*{int(broken.rsplit('-', 1)[1])}.json"))
    hidden = manifest.with_suffix(".hidden")
    manifest.rename(hidden)

    with dagster_dev(tmp_path, tmp_path / "dagster_dev.log") as port:
        first = graphql(port, LAUNCH, {"p": {"assetSelection": [{"path": ["raw_images"]}],
                                             "partitionNames": batches, "fromFailure": False}})
        first = first["launchPartitionBackfill"]
        assert first["__typename"] == "LaunchBackfillSuccess", first
        b1 = _wait_backfill(first["backfillId"])
        assert b1.status.value in ("COMPLETED_FAILED", "COMPLETED", "FAILED"), b1.status

        hidden.rename(manifest)  # fixed: re-run only what failed
        retry = graphql(port, RETRY, {"p": {"parentRunId": first["backfillId"], "strategy": "FROM_FAILURE"}})
        retry = retry["reexecutePartitionBackfill"]
        assert retry["__typename"] == "LaunchBackfillSuccess", retry
        b2 = _wait_backfill(retry["backfillId"])
        assert b2.status.value == "COMPLETED_SUCCESS", b2.status

        with dg.DagsterInstance.get() as instance:
            retry_runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": retry["backfillId"]}))
            assert [r.tags["dagster/partition"] for r in retry_runs] == [broken]  # the failed one only
            for b in batches:
                rec = instance.get_latest_data_version_record(dg.AssetKey("raw_images"), partition_key=b)
                assert rec is not None and rec.asset_materialization is not None, b

    # Everything is in PostgreSQL.
    runs = _sql(database, "SELECT status, count(*) FROM runs GROUP BY status")
    assert dict(runs).get("SUCCESS", 0) >= len(batches) and dict(runs).get("FAILURE", 0) >= 1
    mats = _sql(database, "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION' "
                          "AND asset_key LIKE '%raw_images%'")
    assert mats[0][0] >= len(batches)
    backfills = _sql(database, "SELECT key, status FROM bulk_actions ORDER BY id")
    assert [k for k, _ in backfills] == [first["backfillId"], retry["backfillId"]]

    # Step logs went to the object store.
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    deadline = time.time() + 60
    keys: list[str] = []
    while time.time() < deadline and not keys:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_env["BUCKET"], Prefix="compute-logs/")
                .get("Contents", [])]
        time.sleep(1)
    assert keys, "no compute logs uploaded"
