"""Dagster overhead: one small partition run in-process (what `prx-assets run` pays per partition),
and on this deployment shape launch-to-done latency of one small partition
through GraphQL, and a 50-partition backfill under three backfill policies, side by side.

Starts ``dagster dev`` (webserver + daemon, the project's dagster.yaml: queued runs, at most 4
at once) on a temporary instance with ``bench/overhead_defs.py``; every asset does the same
tiny work per partition, so the times are Dagster's (run process start, event-log writes,
daemon ticks).
"""

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from prx_assets.devserver import dagster_dev, graphql

REPO = Path(__file__).parents[1]
LOCATION = "bench.overhead_defs"
LAUNCH_RUN = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
RUN_STATUS = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""
LAUNCH_BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { status numCancelable } } }"""
ROUNDS = int(os.environ.get("PRX_BENCH_ROUNDS", "3"))


def one_partition(port: int, asset: str, partition: str) -> float:
    """Seconds from launchRun to SUCCESS for one partition."""
    params = {"selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                           "jobName": "__ASSET_JOB", "assetSelection": [{"path": [asset]}]},
              "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}}
    t0 = time.perf_counter()
    out = graphql(port, LAUNCH_RUN, {"p": params})["launchRun"]
    if out["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(out)
    run_id = out["run"]["runId"]
    while True:
        status = graphql(port, RUN_STATUS, {"id": run_id})["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            if status != "SUCCESS":
                raise RuntimeError(f"run {run_id} {status}")
            return time.perf_counter() - t0
        time.sleep(0.1)


def backfill(port: int, asset: str) -> float:
    """Seconds from launchPartitionBackfill to COMPLETED_SUCCESS over all 50 partitions."""
    from bench.overhead_defs import PARTITIONS

    t0 = time.perf_counter()
    out = graphql(port, LAUNCH_BACKFILL, {"p": {"assetSelection": [{"path": [asset]}],
                                             "partitionNames": PARTITIONS.get_partition_keys()}})
    out = out["launchPartitionBackfill"]
    if out["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(out)
    while True:
        status = graphql(port, BACKFILL_STATUS, {"id": out["backfillId"]})["partitionBackfillOrError"]["status"]
        if status not in ("REQUESTED", "CANCELING", "FAILING"):
            if status != "COMPLETED_SUCCESS":
                raise RuntimeError(f"backfill {out['backfillId']} {status}")
            return time.perf_counter() - t0
        time.sleep(0.25)


def in_process_floor(runs: int = 10, warm: int = 2) -> list[float]:
    """Seconds per in-process run of one ``one_per_run`` partition on a fresh SQLite instance (what
    ``prx-assets run`` pays per partition before its asset does any work), after ``warm`` runs."""
    import dagster as dg

    from bench.overhead_defs import defs

    job = defs.resolve_implicit_global_asset_job_def()
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    with tempfile.TemporaryDirectory(prefix="prx-bench-floor-") as home:
        instance = dg.DagsterInstance.from_config(home)
        times = []
        for i in range(warm + runs):
            t = time.perf_counter()
            result = job.execute_in_process(instance=instance, partition_key=f"b{i:03d}", run_config=quiet,
                                            asset_selection=[dg.AssetKey("one_per_run")])
            times.append(time.perf_counter() - t)
            if not result.success:
                raise RuntimeError(f"the in-process run of b{i:03d} failed")
    return times[warm:]


def run() -> dict[str, Any]:
    """Measure the in-process floor, then start dagster dev, measure, stop it."""
    floor = in_process_floor()
    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-dagster-"))
    home = tmp / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    try:
        with dagster_dev(REPO, tmp / "dagster_dev.log", env={"DAGSTER_HOME": str(home)}, module=LOCATION) as port:
            one_partition(port, "one_per_run", "b000")  # warm the code server
            single = [one_partition(port, "one_per_run", f"b{i + 1:03d}") for i in range(ROUNDS)]
            results = {name: backfill(port, name) for name in ("one_per_run", "ten_per_run", "single_run")}
            return {"in_process_run_seconds": [round(x, 3) for x in floor],
                    "one_partition_seconds": [round(x, 2) for x in single],
                    "backfill_50_seconds": {k: round(v, 2) for k, v in results.items()},
                    "runs": {"one_per_run": 50, "ten_per_run": 5, "single_run": 1},
                    "speedup_vs_one_per_run": {k: round(results["one_per_run"] / v, 2) for k, v in results.items()}}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """A small text table."""
    import statistics

    b = r["backfill_50_seconds"]
    return "\n".join([
        "Dagster overhead",
        f"  one small partition run in-process (as `prx-assets run` does), SQLite instance: median "
        f"{statistics.median(r['in_process_run_seconds']):.3f}s, spread {min(r['in_process_run_seconds']):.3f}-"
        f"{max(r['in_process_run_seconds']):.3f}s",
        "  dagster dev: webserver + daemon, queued runs, max 4 at once:",
        f"  one small partition, launchRun -> SUCCESS: median {statistics.median(r['one_partition_seconds']):.2f}s "
        f"{r['one_partition_seconds']}",
        "  backfill of 50 small partitions:",
        *[f"    {k:<12} {r['runs'][k]:>3} runs  {v:7.2f}s  ({r['speedup_vs_one_per_run'][k]:.2f}x vs one per run)"
          for k, v in b.items()],
    ])


if __name__ == "__main__":
    print(format_table(run()))
