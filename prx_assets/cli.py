"""`prx-assets`: the command-line entry point.

Verbs:

- ``demo``       generate the demo corpus under the data root, then ``run`` everything
- ``models``     build the tiny offline models that models.yaml points at (if missing)
- ``discover``   find new files in every source and register ingest-batch partitions
- ``run``        materialize, in-process and in dependency order, every missing or stale
                 partition of the selected assets (all by default), with progress
- ``query``      filter, vector or full-text search the lab, at any version, with plans
- ``status``     sources, batches and which partitions are materialized
- ``rejects``    list rejected files with their reasons
- ``doctor``     find (``--repair``: fix) duplicate keys, orphan partitions, leaked folders
                 and Dagster runs that will not end on their own
- ``migrate``    bring a data root written by an earlier release up to this one

Runs are recorded in the Dagster instance at ``$DAGSTER_HOME`` (default
``./.dagster_home``), so the UI (``make dev``) shows them.
"""

import argparse
import contextlib
import itertools
import json
import os
import shutil
import socket
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.compute as pc

from prx_assets.core import layout
from prx_assets.core.config.project import data_root, load_sources
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.maintenance import lance_tables
from prx_assets.core.lab.schema import CAPTIONS_TABLE, IMAGES_TABLE, REJECTS_TABLE
from prx_assets.core.lab.sql import where_all, where_eq
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.core.processes import sigterm_kept
from prx_assets.defs.keys import CURATED_SUBSETS, LANCE_TABLE, MDS_SHARDS, RAW_IMAGES, TRAINING_RUN
from prx_assets.errors import PrxError
from prx_assets.infra.stuck_runs import HOST_TAG, PID_TAG
from prx_assets.resources.storage import ProjectConfigResource


def ensure_dagster_home(read_only: bool = False) -> Path:
    """Use ``$DAGSTER_HOME``, defaulting to ``./.dagster_home`` seeded with ``./dagster.yaml``
    (or, outside a checkout, the packaged copy of it). ``read_only``: an existing home is used as it
    is (nothing written)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        home = str(Path(".dagster_home").resolve())
        os.environ["DAGSTER_HOME"] = home
    path = Path(home)
    if read_only and (path / "dagster.yaml").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    project_yaml = Path("dagster.yaml")
    target = path / "dagster.yaml"
    with _home_lock(path):  # another `prx-assets` starting at the same moment reads it whole
        if project_yaml.is_file() and project_yaml.resolve() != target.resolve() and (
                not target.exists() or target.read_bytes() != project_yaml.read_bytes()):
            _write_atomic(target, project_yaml.read_bytes())
        elif not target.exists():
            import importlib.resources

            _write_atomic(target, (importlib.resources.files("prx_assets") / "defaults" / "dagster.yaml").read_bytes())
    return path


def _write_atomic(target: Path, data: bytes) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


@contextlib.contextmanager
def _home_lock(home: Path) -> Iterator[None]:
    """An exclusive lock on ``$DAGSTER_HOME`` (``flock``) while an instance is set up: two processes
    creating a new SQLite instance at once race on its schema (``UNIQUE constraint failed:
    alembic_version``). Held only during set-up, never during runs."""
    import fcntl

    with open(home / ".prx-instance.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _instance(read_only: bool = False) -> dg.DagsterInstance:
    """The Dagster instance at ``$DAGSTER_HOME`` (set up if new). ``read_only``: an existing instance
    is opened without writing to its folder (``run --dry-run``)."""
    home = ensure_dagster_home(read_only)
    if read_only and (home / "dagster.yaml").is_file():
        return dg.DagsterInstance.get()
    with _home_lock(home):
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # creates (or migrates) the storages' schemas under the lock
        instance.get_asset_keys(limit=1)
    return instance


def _root() -> DataRoot:
    return DataRoot(data_root())


def _models_config(check_paths: bool = True) -> Any:
    from prx_assets.core.config.project import config_dir
    from prx_assets.core.models.config import load_models

    path = config_dir() / "models.yaml"
    return load_models(path, check_paths=check_paths) if path.is_file() else None


def register_partitions(instance: dg.DagsterInstance, reports: list[dict[str, Any]]) -> list[str]:
    """Register discovered batches and configured captioner ids, recipes and mixtures as partitions."""
    from prx_assets.infra.partitions import missing_partitions

    fresh = missing_partitions(instance, ProjectConfigResource(), (k for r in reports for k in r["all_batches"]))
    for name, keys in fresh.items():
        try:
            instance.add_dynamic_partitions(name, keys)
        except Exception:  # another process (a second run, the sensor) registered some first: unique keys
            known = set(instance.get_dynamic_partitions(name))
            for key in keys:
                if key not in known:
                    try:
                        instance.add_dynamic_partitions(name, [key])
                    except Exception:
                        if key not in instance.get_dynamic_partitions(name):
                            raise
    return [k for keys in fresh.values() for k in keys]


def cmd_models(args: argparse.Namespace) -> int:
    """Build the tiny offline models referenced by models.yaml."""
    from prx_assets.core.demo.tiny_models import ensure_tiny_models

    models = _models_config(check_paths=False)
    if models is None:
        print("no models.yaml in the config folder")
        return 0
    paths = [c.model for c in models.captioners] + ([models.embedder.model] if models.embedder else []) + \
        ([models.text_encoder.model] if models.text_encoder else [])
    built = ensure_tiny_models(paths)
    for p in built:
        print(f"built {p}")
    if not built:
        print("all tiny models present (models that are not tiny-* folders are loaded by name)")
    models = _models_config()  # every local folder must exist now: its id is a digest of its files
    for c in models.captioners:
        print(f"captioner {c.captioner_id()}: {c.model}")
    if models.embedder:
        print(f"embedder {models.embedder.embedder_id()}: {models.embedder.model}")
    if models.text_encoder:
        print(f"text encoder {models.text_encoder.tower()}: {models.text_encoder.model}")
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    """Discover new files and register their batch partitions."""
    from prx_assets.defs.ingest import discover_batches

    instance = _instance()
    reports = discover_batches(_root(), load_sources(), only=args.source, full=args.full)
    new = register_partitions(instance, reports)
    for r in reports:
        changed = f", {r['changed_units']} changed (not re-batched)" if r["changed_units"] else ""
        print(f"{r['source']}: {r['new_units']} new units -> {len(r['new_batches'])} new batches "
              f"({r['batches']} total){changed}")
    print(f"registered {len(new)} new partitions")
    return 0


def selected_keys(defs: dg.Definitions, select: str | None) -> list[dg.AssetKey]:
    """Asset keys of a Dagster selection string (all by default), in dependency order."""
    from prx_assets.asset_selection import resolve

    graph = defs.resolve_asset_graph()
    order = list(graph.toposorted_asset_keys)
    if select:
        chosen = resolve(graph, select)
        order = [k for k in order if k in chosen]
    return order


def plan_cache_dir(instance: dg.DagsterInstance) -> Path:
    """Where planning keeps the fingerprints it has read (per instance: under its root folder)."""
    return Path(instance.root_directory) / "prx_plan_cache"


def partition_keys(pdef: dg.PartitionsDefinition, instance: dg.DagsterInstance,
                   pending: dict[str, list[str]] | None = None) -> list[str]:
    """Keys of ``pdef``, counting ``pending`` dynamic keys (per partitions name) as registered: a dry
    run registers nothing, yet plans the batches discovery would add (and their captioner rows)."""
    if not pending:
        return list(pdef.get_partition_keys(dynamic_partitions_store=instance))
    if isinstance(pdef, dg.DynamicPartitionsDefinition) and pdef.name:
        known = list(instance.get_dynamic_partitions(pdef.name))
        have = set(known)
        return known + [k for k in pending.get(pdef.name, []) if k not in have]
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        dims = [(d.name, partition_keys(d.partitions_def, instance, pending)) for d in pdef.partitions_defs]
        names = [n for n, _ in dims]
        return [str(dg.MultiPartitionKey(dict(zip(names, combo, strict=True))))
                for combo in itertools.product(*(keys for _, keys in dims))]
    return list(pdef.get_partition_keys(dynamic_partitions_store=instance))


def plan_run(defs: dg.Definitions, instance: dg.DagsterInstance, select: str | None,
             keys: list[dg.AssetKey] | None = None, skipped: dict[str, str] | None = None,
             orphans: dict[str, dict[str, str]] | None = None,
             held: dict[str, str] | None = None, pending: dict[str, list[str]] | None = None,
             read_only: bool = False) -> list[tuple[dg.AssetKey, str | None]]:
    """Missing or stale (asset, partition) pairs of the selection (or ``keys``), in dependency order.

    Partitions that nothing backs any more (see ``orphan_partitions``) are left out; when
    ``skipped`` is given it receives ``{"asset[partition]": why}`` for each. ``orphans`` (from
    ``orphan_partitions``) spares listing them again when a run plans asset by asset. Partitions
    that read a parent partition whose blocking check failed are left out too (see
    :mod:`prx_assets.infra.quarantine`), with ``held`` receiving why. ``pending``: dynamic partition
    keys not registered yet that count as if they were (a dry run registers nothing);
    ``read_only``: the fingerprint cache under the instance is read, not written.
    """
    from prx_assets.defs.fingerprints import fingerprint_for
    from prx_assets.infra.partitions import is_orphan, orphan_partitions
    from prx_assets.infra.quarantine import held_back
    from prx_assets.infra.staleness import FingerprintContext, recorded_fingerprints

    order = keys if keys is not None else selected_keys(defs, select)
    root = _root()
    if orphans is None:
        orphans = orphan_partitions(instance, ProjectConfigResource(), root)
    ctx = FingerprintContext(root=root, sources=load_sources(), instance=instance,
                             models=_models_config(), bulk=True)
    plan: list[tuple[dg.AssetKey, str | None]] = []
    for key in order:
        asset_def = defs.resolve_assets_def(key)
        pdef = asset_def.partitions_def
        if pdef is None:
            partitions: list[str | None] = [None]
        else:
            partitions = list(partition_keys(pdef, instance, pending))
        recorded = recorded_fingerprints(instance, key, cache_dir=plan_cache_dir(instance), save=not read_only)
        fp_fn = fingerprint_for(key)
        todo: list[str | None] = []
        for pk in partitions:
            why = is_orphan(orphans, pdef, pk)
            if why:
                if skipped is not None:
                    skipped[f"{key.to_user_string()}[{pk}]"] = why
                continue
            if pk not in recorded or (fp_fn is not None and recorded[pk] != fp_fn(ctx, pk)):
                todo.append(pk)
        blocked = held_back(defs, instance, key, todo) if todo else {}
        for pk in todo:
            if pk in blocked:
                if held is not None:
                    held[f"{key.to_user_string()}[{pk}]" if pk else key.to_user_string()] = blocked[pk]
            else:
                plan.append((key, pk))
    return plan


def _result_line(result: dg.ExecuteInProcessResult) -> str:
    parts = []
    for mat in result.get_asset_materialization_events():
        md = mat.materialization.metadata
        if "dagster/row_count" in md:
            parts.append(f"{md['dagster/row_count'].value} rows")
        if "rejected" in md:
            parts.append(f"{md['rejected'].value} rejected")
        if "computed" in md:
            parts.append(f"{md['computed'].value} computed, {md['reused_same_content'].value} reused")
        if "lance_version" in md:
            parts.append(f"lance v{md['lance_version'].value}")
        if "mixture_version" in md and "loss_last" not in md:
            epoch = md.get("epoch_size")
            parts.append(f"version {md['mixture_version'].value}"
                         + (f", epoch {epoch.value} samples" if epoch is not None else ""))
        if "loss_last" in md:
            parts.append(f"{md['steps'].value} steps on {md['job_mode'].value} job {md['job_id'].value}, loss "
                         f"{md['loss_first'].value:.3f} -> {md['loss_last'].value:.3f}")
    for ev in result.get_asset_check_evaluations():
        verdict = "passed" if ev.passed else ("FAILED" if ev.severity == dg.AssetCheckSeverity.ERROR
                                              else "warning")
        parts.append(f"check {ev.check_name}: {verdict}")
    return ", ".join(parts)


def _failure_lines(result: dg.ExecuteInProcessResult) -> list[str]:
    lines = [f"check {ev.check_name} failed: {ev.description or ''}"
             for ev in result.get_asset_check_evaluations() if not ev.passed]
    for ev in result.all_events:
        if ev.is_step_failure and ev.step_failure_data is not None and ev.step_failure_data.error:
            err = ev.step_failure_data.error
            while err.cause is not None and "DagsterExecutionStepExecutionError" in err.cls_name:
                err = err.cause
            if "AssetCheckFailed" not in err.cls_name:
                lines.append(f"{err.cls_name}: {err.message.strip()}")
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    """Materialize missing or stale partitions in dependency order."""
    from prx_assets.core.ingest.early import settle, take_found
    from prx_assets.core.ingest.readahead import READAHEAD
    from prx_assets.core.stages.ingest import expect_batches
    from prx_assets.definitions import defs
    from prx_assets.defs.ingest import discover_batches, ingest_resources
    from prx_assets.defs.keys import RAW_IMAGES
    from prx_assets.infra.partitions import orphan_partitions
    from prx_assets.infra.quarantine import failures_not_holding_back, reads_failed

    if args.dry_run:
        return _dry_run(defs, args.select)
    keys = selected_keys(defs, args.select)  # a bad --select fails here, before anything is written
    found = take_found()  # the console script discovered before importing this (and read ahead)
    reports = found.reports if found is not None else discover_batches(_root(), load_sources())
    ingest_here = ingest_resources(defs, keys)
    settle(found, ingest_here.to_json() if ingest_here is not None else None)
    if ingest_here is not None:  # batches this discovery created: never ingested, so planned below
        expect_batches(ingest_here, [k for r in reports for k in r["new_batches"]])
        READAHEAD.start()  # the workers decode their first images while the instance opens and plans
    instance = _instance()
    _stuck_runs(instance, repair=True)
    register_partitions(instance, reports)
    skipped: dict[str, str] = {}
    held: dict[str, str] = {}
    orphans = orphan_partitions(instance, ProjectConfigResource(), _root())
    plan = plan_run(defs, instance, args.select, skipped=skipped, orphans=orphans, held=held)
    _report_skipped(skipped)
    _report_held(held)
    if ingest_here is not None:
        expect_batches(ingest_here, [pk for key, pk in plan if key == RAW_IMAGES and pk is not None])
    if not plan:
        print("everything is up to date")
        return 0
    print(f"{len(plan)} partitions to materialize")
    job = defs.resolve_implicit_global_asset_job_def()
    level = "INFO" if args.verbose else "CRITICAL"
    failed = done = skipped_here = 0
    total = len(plan)
    failed_here: dict[dg.AssetKey, set[str | None]] = {}  # failed or skipped in this run, per asset
    for key in selected_keys(defs, args.select):
        first = [pk for k, pk in plan if k == key]
        # Once something has run, re-plan each later asset just before it runs (its upstream may
        # have changed in this run); until then the first plan holds.
        later_held: dict[str, str] = {}
        todo = plan_run(defs, instance, None, keys=[key], orphans=orphans, held=later_held) if done else \
            [(key, pk) for pk in first]
        _report_held({k: v for k, v in later_held.items() if k not in held})
        held.update(later_held)
        total += max(0, len(todo) - len(first))
        if todo and defs.resolve_assets_def(key).partitions_def is None:
            for line in failures_not_holding_back(defs, instance, key):
                print(f"  note: {key.to_user_string()} reads every batch, including {line}")
        for _, pk in todo:
            done += 1
            why = reads_failed(defs, key, pk, failed_here)
            if why is not None:  # not run: recorded as skipped, never as "ok, 0 rows"
                print(f"[{done}/{total}] {key.to_user_string()}{' ' + pk if pk else ''}: skipped ({why})", flush=True)
                skipped_here += 1
            elif _execute(job, instance, key, pk, level, f"[{done}/{total}]"):
                failed += 1
            else:
                continue
            failed_here.setdefault(key, set()).add(pk)
        if key == RAW_IMAGES:
            READAHEAD.clear()
    if failed or skipped_here:
        print(f"{failed} of {done} partitions failed" + (f", {skipped_here} skipped because a partition they read "
                                                        "failed in this run" if skipped_here else ""))
        return 1
    return 0


def _dry_run(defs: dg.Definitions, select: str | None) -> int:
    """``run --dry-run``: what ``run`` would materialize, writing nothing (no manifest, partition,
    run, cache or repair): the batches discovery would create count as registered."""
    from prx_assets.defs.ingest import discover_batches
    from prx_assets.infra.partitions import missing_partitions, orphan_partitions

    selected_keys(defs, select)
    reports = discover_batches(_root(), load_sources(), dry_run=True)
    instance = _instance(read_only=True)
    _stuck_runs(instance, repair=False)
    pending = missing_partitions(instance, ProjectConfigResource(), (k for r in reports for k in r["all_batches"]))
    skipped: dict[str, str] = {}
    held: dict[str, str] = {}
    orphans = orphan_partitions(instance, ProjectConfigResource(), _root())
    plan = plan_run(defs, instance, select, skipped=skipped, orphans=orphans, held=held, pending=pending,
                    read_only=True)
    _report_skipped(skipped)
    _report_held(held)
    new = [k for keys in pending.values() for k in keys]
    if new:
        print(f"would register {len(new)} new partitions: {', '.join(new[:8])}{' ...' if len(new) > 8 else ''}")
    if not plan:
        print("everything is up to date")
        return 0
    print(f"{len(plan)} partitions to materialize (what reads them is planned again once they ran)")
    for key, pk in plan:
        print(f"  {key.to_user_string()} {pk or ''}")
    return 0


def _stuck_runs(instance: dg.DagsterInstance, repair: bool) -> None:
    """Say which runs will not end on their own; with ``repair``, end those with no live process
    (nothing is running them: marked failed). Runs whose processes are still alive are only named:
    stopping processes is ``prx-assets doctor --repair``'s to do."""
    from prx_assets.infra.stuck_runs import end_run, stuck_runs

    for stuck in stuck_runs(instance):
        if repair and not stuck.evidence.alive():
            print(f"run {stuck.run_id} ({stuck.evidence.job}): {stuck.why}; {end_run(instance, stuck)}")
        else:
            print(f"note: run {stuck.run_id} ({stuck.evidence.job}) looks stuck: {stuck.why}; "
                  "`prx-assets doctor --repair` ends it")


def _report_skipped(skipped: dict[str, str]) -> None:
    if not skipped:
        return
    print(f"skipping {len(skipped)} partitions that nothing backs any more "
          "(`prx-assets partitions --prune` removes them):")
    for name, why in list(skipped.items())[:10]:
        print(f"  {name}: {why}")
    if len(skipped) > 10:
        print(f"  ... and {len(skipped) - 10} more")


def _report_held(held: dict[str, str]) -> None:
    if not held:
        return
    print(f"holding back {len(held)} partitions: a partition they read failed its blocking check:")
    for name, why in list(held.items())[:10]:
        print(f"  {name}: {why}")
    if len(held) > 10:
        print(f"  ... and {len(held) - 10} more")


def cmd_doctor(args: argparse.Namespace) -> int:
    """Find (``--repair``: fix) duplicates, orphan partitions, leaked folders, stale leases and stuck
    runs; with ``--verify`` also scrub the lab and every shard set against their digests."""
    from prx_assets.infra.doctor import doctor

    instance, root = _instance(), _root()
    findings = doctor(instance, root, repair=args.repair, older_than_hours=args.older_than_hours,
                      quiet_minutes=args.quiet_minutes)
    for f in findings:
        print(f.line())
    left = [f for f in findings if not f.repaired]
    if args.verify:
        left += _verify(instance, root, args.repair)
    if not findings and not left:
        print("nothing to repair: no duplicate keys, orphan partitions, leaked folders, stale leases, stuck runs or "
              "stale kept state" + (", and every stored image and shard matches its digest" if args.verify else ""))
    elif left:
        print(f"{len(left)} problems found; `prx-assets doctor --repair{' --verify' if args.verify else ''}` fixes "
              "what can be fixed")
    return 1 if left else 0


def _verify(instance: dg.DagsterInstance, root: DataRoot, repair: bool) -> list[Any]:
    """``doctor --verify``: the scrubs of :mod:`prx_assets.infra.verify`, then (repairing) the batches
    and shard sets taken out of use materialized again, in-process. Returns what is left unrepaired."""
    from prx_assets.definitions import defs
    from prx_assets.infra.staleness import latest_data_version
    from prx_assets.infra.verify import verify

    recipes = instance.get_dynamic_partitions("recipes")
    current = {r: v for r in recipes if (v := latest_data_version(instance, MDS_SHARDS, r))}
    subsets = {r: v for r in recipes if (v := latest_data_version(instance, CURATED_SUBSETS, r))}
    found = verify(root, current, subsets, repair)
    left = []
    for kind, where, detail, repaired in found.lines:
        print(f"{'repaired' if repaired else 'found'}: {kind} {where}: {detail}")
        if not repaired:
            left.append(where)
    job = defs.resolve_implicit_global_asset_job_def()
    again = [(RAW_IMAGES, b) for b in sorted(found.batches)] + \
        ([(LANCE_TABLE, None)] if found.batches else []) + \
        [(CURATED_SUBSETS, r) for r in sorted(found.subsets)] + \
        [(MDS_SHARDS, r) for r in sorted(found.recipes)]
    for n, (key, pk) in enumerate(again, 1):
        if _execute(job, instance, key, pk, "CRITICAL", f"[repair {n}/{len(again)}]"):
            left.append(f"{key.to_user_string()}[{pk}]")
    if found.batches:
        print("the lab's rows were written again: `prx-assets run` brings what reads them up to date")
    return left


def cmd_partitions(args: argparse.Namespace) -> int:
    """List registered dynamic partitions and the orphans among them; ``--prune`` removes orphans."""
    from prx_assets.infra.partitions import orphan_partitions

    instance = _instance()
    orphans = orphan_partitions(instance, ProjectConfigResource(), _root())
    for name in ("raw_batches", "captioners", "recipes", "mixtures"):
        keys = instance.get_dynamic_partitions(name)
        bad = orphans.get(name, {})
        print(f"{name}: {len(keys)} registered, {len(bad)} orphaned")
        for key, why in bad.items():
            print(f"  {key}: {why}")
            if args.prune:
                instance.delete_dynamic_partition(name, key)
    total = sum(len(v) for v in orphans.values())
    if args.prune:
        print(f"removed {total} orphaned partitions")
    elif total:
        print("run `prx-assets partitions --prune` to remove them (their materialization history stays)")
    return 0


def _execute(job: Any, instance: dg.DagsterInstance, key: dg.AssetKey, pk: str | None, level: str,
             prefix: str) -> int:
    """Materialize one partition in-process; print one line; return 1 on failure."""
    started = time.perf_counter()
    with sigterm_kept():  # a background `prx-assets run` stays stoppable, and so do the jobs it starts
        result = job.execute_in_process(
            instance=instance, partition_key=pk, asset_selection=[key], raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": level}}}},
            tags={"prx/launched_by": "prx-assets run", HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())})
    took = time.perf_counter() - started
    status = "ok" if result.success else "FAILED"
    label = f"{key.to_user_string()} {pk}" if pk else key.to_user_string()
    print(f"{prefix} {label}: {status} "
          f"({took:.1f}s) {_result_line(result)}", flush=True)
    if result.success:
        return 0
    for line in _failure_lines(result):
        print(f"    {line}")
    return 1


def _counts(ds: Any, column: str, total: str | None = None) -> tuple[int, dict[str, int], int]:
    """Rows, rows per value of ``column`` and the sum of ``total`` over a Lance table, from one scan a
    batch at a time (Arrow value counts per batch: memory bounded by the batch, not the table)."""
    rows, by_value, summed = 0, Counter[str](), 0
    for batch in ds.scanner(columns=[column, *([total] if total else [])], batch_size=65_536).to_batches():
        rows += batch.num_rows
        for c in pc.value_counts(batch.column(0)).to_pylist():
            by_value[c["values"]] += int(c["counts"])
        if total:
            summed += int(pc.sum(batch.column(1)).as_py() or 0)
    return rows, dict(sorted(by_value.items())), summed


def table_summary(root: DataRoot) -> dict[str, Any]:
    """Rows per source, rejects per reason, and versions of the Lance tables."""
    out: dict[str, Any] = {"data_root": root.uri}
    images = open_table(table_uri(root, IMAGES_TABLE), root.storage_options())
    if images is not None:
        rows, by_source, jpeg_bytes = _counts(images, "source", "jpeg_bytes")
        out["images"] = {"rows": rows, "by_source": by_source, "jpeg_bytes": jpeg_bytes,
                         "lance_version": images.version, "uri": images.uri}
    captions = open_table(table_uri(root, CAPTIONS_TABLE), root.storage_options())
    if captions is not None:
        rows, by_captioner, _ = _counts(captions, "captioner_id")
        out["captions"] = {"rows": rows, "lance_version": captions.version, "by_captioner": by_captioner}
    for name in (n for n in lance_tables(root) if n.startswith("embeddings_")):
        ds = open_table(table_uri(root, name), root.storage_options())
        if ds is not None:
            out.setdefault("embeddings", {})[name] = {
                "rows": ds.count_rows(), "dim": ds.schema.field("embedding").type.list_size}
    rejects = open_table(table_uri(root, REJECTS_TABLE), root.storage_options())
    if rejects is not None:
        rows, by_reason, _ = _counts(rejects, "reason")
        out["rejects"] = {"rows": rows, "by_reason": by_reason}
    return out


def asset_status(instance: dg.DagsterInstance) -> list[dict[str, Any]]:
    """Per asset, in dependency order: registered partitions and how many are materialized."""
    from prx_assets.definitions import defs

    out = []
    for key in selected_keys(defs, None):
        pdef = defs.resolve_assets_def(key).partitions_def
        if pdef is None:
            done = instance.get_latest_materialization_event(key) is not None
            out.append({"asset": key.to_user_string(), "partitions": 1, "materialized": int(done)})
            continue
        keys = set(pdef.get_partition_keys(dynamic_partitions_store=instance))
        done_keys = set(instance.get_materialized_partitions(key)) & keys
        out.append({"asset": key.to_user_string(), "partitions": len(keys), "materialized": len(done_keys)})
    return out


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The table summary as short human lines."""
    lines = [f"data root: {summary['data_root']}"]
    if "images" in summary:
        im = summary["images"]
        by_source = ", ".join(f"{k} {v}" for k, v in im["by_source"].items())
        lines.append(f"images: {im['rows']} rows ({by_source}), {im['jpeg_bytes'] / 1e6:.1f} MB of JPEG, "
                     f"Lance v{im['lance_version']}")
    if "captions" in summary:
        c = summary["captions"]
        lines.append(f"captions: {c['rows']} rows from {len(c['by_captioner'])} captioners "
                     f"({', '.join(c['by_captioner'])})")
    for name, e in summary.get("embeddings", {}).items():
        lines.append(f"{name}: {e['rows']} vectors of dim {e['dim']}")
    if "rejects" in summary:
        r = summary["rejects"]
        lines.append(f"rejects: {r['rows']} ({', '.join(f'{k} {v}' for k, v in r['by_reason'].items())}); "
                     "`prx-assets rejects` lists them")
    return lines


def cmd_status(args: argparse.Namespace) -> int:
    """Print sources, batches, every asset's materialized partitions and the tables."""
    from prx_assets.core.ingest.batches import load_manifests

    instance = _instance()
    root = _root()
    materialized = set(instance.get_materialized_partitions(RAW_IMAGES))
    sources = []
    for src in load_sources().sources:
        manifests = load_manifests(root, src.name)
        sources.append({"source": src.name, "kind": src.kind, "location": src.location,
                        "batches": len(manifests), "ingested": sum(1 for m in manifests if m.key in materialized),
                        "items": sum(m.weight for m in manifests)})
    assets = asset_status(instance)
    summary = table_summary(root)
    if args.json:
        print(json.dumps({"sources": sources, "assets": assets, "tables": summary}, indent=1))
        return 0
    print("sources:")
    for s in sources:
        print(f"  {s['source']} ({s['kind']} {s['location']}): {s['batches']} batches, {s['ingested']} ingested, "
              f"{s['items']} items")
    print("assets (materialized / registered partitions):")
    width = max(len(a["asset"]) for a in assets)
    for a in assets:
        state = "up to date" if a["partitions"] and a["materialized"] == a["partitions"] else \
            ("nothing yet" if not a["materialized"] else "partly")
        print(f"  {a['asset'].ljust(width)}  {a['materialized']:>5} / {a['partitions']:<5} {state}")
    print("tables:")
    for line in summary_lines(summary):
        print(f"  {line}")
    print("`prx-assets run --dry-run` lists what is missing or stale")
    return 0


def cmd_rejects(args: argparse.Namespace) -> int:
    """List rejected files."""
    from prx_assets.core.ingest.images import RejectReason

    root = _root()
    if args.source:
        known = [s.name for s in load_sources().sources]
        if args.source not in known:
            raise PrxError(f"unknown source {args.source!r}; sources.yaml has: {', '.join(known)}")
    if args.reason:
        reasons = [r.value for r in RejectReason]
        if args.reason not in reasons:
            raise PrxError(f"unknown reason {args.reason!r}; reasons are: {', '.join(reasons)}")
    ds = open_table(table_uri(root, REJECTS_TABLE), root.storage_options())
    if ds is None:
        print("no rejects table yet")
        return 0
    where = where_all(where_eq("source", args.source) if args.source else None,
                      where_eq("reason", args.reason) if args.reason else None)
    rows = ds.to_table(columns=["source", "batch", "reason", "uri", "message"],
                       filter=where).to_pylist()
    for r in rows[: args.limit]:
        print(json.dumps(r) if args.json else
              f"{r['reason']:<20} {r['batch']:<18} {r['uri']}\n{'':<20} {r['message']}")
    print(f"{len(rows)} rejects", file=sys.stderr)
    return 0


def _cell(v: Any) -> Any:
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    if isinstance(v, list) and len(v) > 4:
        return [round(x, 4) if isinstance(x, float) else x for x in v[:4]] + ["..."]
    if isinstance(v, float):
        return round(v, 4)
    return v


def cmd_query(args: argparse.Namespace) -> int:
    """Query the lab and print rows as a table or JSON lines."""
    from prx_assets.core.lab.query import open_lab, query, versions

    ds = open_lab(_root(), version=args.version, tag=args.tag)
    if args.versions:
        vs = versions(ds)
        if args.json:
            for v in vs:
                print(json.dumps(v))
        else:
            print_table([{"version": v["version"], "timestamp": v["timestamp"], "tags": ", ".join(v["tags"])}
                         for v in vs])
        return 0
    cols = [c.strip() for c in args.columns.split(",")] if args.columns else None
    res = query(ds, where=args.where, columns=cols, limit=args.limit, near=args.near, k=args.k,
                text=args.text, explain=args.explain)
    if args.explain:
        print(res.plan)
        print(json.dumps(res.stats))
    rows = [{k: _cell(v) for k, v in r.items()} for r in res.table.to_pylist()]
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
    else:
        print_table(rows)
    print(f"{len(rows)} rows (version {ds.version})", file=sys.stderr)
    return 0


#: Widest a table cell gets; longer values are cut in the middle with an ellipsis (`--json` shows them whole).
CELL_WIDTH = 60


def _fit(value: Any, width: int = CELL_WIDTH) -> str:
    text = str(value)
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep // 2] + "\u2026" + text[len(text) - (keep - keep // 2):]


def print_table(rows: list[dict[str, Any]]) -> None:
    """Rows as aligned columns; long cells are shortened with an ellipsis in the middle."""
    if not rows:
        return
    names = list(rows[0])
    cells = [[_fit(r[n]) for n in names] for r in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def _print_training(instance: dg.DagsterInstance) -> None:
    """Where the latest training runs ran (SLURM or local subprocess) and what they reported."""
    from prx_assets.infra.staleness import latest_materialization

    key = TRAINING_RUN
    for pk in instance.get_dynamic_partitions("mixtures"):
        mat = latest_materialization(instance, key, pk)
        if mat is None:
            continue
        md = {k: v.value for k, v in mat.metadata.items()}
        where = "on the local SLURM cluster" if md.get("job_mode") == "slurm" else \
            "as a local subprocess (SLURM not up; `make slurm-up` starts it)"
        print(f"training_run[{pk}] ran {where}: job {md.get('job_id')}, {md.get('steps')} steps, loss "
              f"{md.get('loss_first')} -> {md.get('loss_last')}, {md.get('samples_per_second')} samples/s, "
              f"text latents {md.get('mode')}; checkpoint {md.get('checkpoint')}")


def cmd_demo(args: argparse.Namespace) -> int:
    """Generate the demo corpus (if absent) and run the whole graph."""
    from prx_assets.core.config.project import ensure_config_dir
    from prx_assets.core.demo.corpus import generate_demo_corpus

    folder, created = ensure_config_dir()
    if created:
        print(f"no config folder here: wrote the demo config to {folder} (edit it to add your sources)")
    root = _root()
    marker = layout.DEMO_MARKER
    if args.regenerate or not root.exists(marker):
        print(f"generating the demo corpus under {root.join(layout.DEMO_DIR)} ...", flush=True)
        sizes = {"n_photos": 20, "n_catalog": 10, "n_web": 8} if args.small else {}
        summary = generate_demo_corpus(root, **sizes)
        root.write_bytes(marker, json.dumps(summary.to_dict(), indent=1).encode())
        print(f"  wrote {dict(summary.files)}; {len(summary.broken)} deliberately broken inputs")
    else:
        print(f"demo corpus already present under {root.join(layout.DEMO_DIR)}")
    cmd_models(args)
    rc = cmd_run(argparse.Namespace(select=None, dry_run=False, verbose=args.verbose))
    print("\nsummary:")
    for line in summary_lines(table_summary(root)):
        print(f"  {line}")
    for line in _tiny_model_notes():
        print(f"  {line}")
    _print_training(_instance())
    ui = "`make dev`" if Path("Makefile").is_file() else "`dagster dev -m prx_assets.definitions` (from this folder)"
    print(f"\nDagster instance: {os.environ['DAGSTER_HOME']} -- open the UI with {ui}")
    hint = path_hint()
    if hint:
        print(hint)
    return rc


def _tiny_model_notes() -> list[str]:
    """What the demo's tiny random models mean for its outputs (nothing when models.yaml names real ones)."""
    from prx_assets.core.demo.tiny_models import is_tiny

    models = _models_config()
    if models is None:
        return []
    notes = []
    tiny = [c.name for c in models.captioners if is_tiny(c.model)]
    if tiny:
        notes.append(f"captions of {', '.join(tiny)} come from the tiny random captioner the demo builds: noise, "
                     "not words, so the caption_quality check warns on every partition by design; set "
                     "PRX_CAPTIONER_MODEL=Qwen/Qwen3-VL-8B-Instruct (on a GPU) for real captions")
    if models.embedder is not None and is_tiny(models.embedder.model):
        notes.append("embeddings come from a tiny random SigLIP: dedup and --near search run for real on "
                     "vectors that carry no meaning")
    return notes


def cmd_optout(args: argparse.Namespace) -> int:
    """Record an opt-out request; report which listed images the lab and the current subsets hold."""
    import pyarrow as pa

    from prx_assets.core.curate.optout import new_request, read_lines, record
    from prx_assets.core.curate.subsets import read_subset_table
    from prx_assets.core.lab.sql import chunks, where_in
    from prx_assets.infra.staleness import latest_data_version

    if not args.ids and not args.uris:
        raise PrxError("pass --ids FILE (lab image ids) or --uris FILE (source URIs), one per line")
    ids = read_lines(args.ids, "ids") if args.ids else ()
    uris = read_lines(args.uris, "uris") if args.uris else ()
    request = new_request(ids, uris, args.reason or "")
    root = _root()
    fresh = record(root, request)
    print(f"{'recorded' if fresh else 'already recorded'} {request.request_id}: {len(ids)} image ids, "
          f"{len(uris)} URIs{', reason: ' + request.reason if request.reason else ''}")
    images = open_table(table_uri(root, IMAGES_TABLE), root.storage_options())
    found: set[str] = set()
    if images is not None:
        for column, values in (("image_id", ids), ("uri", uris)):
            for part in chunks(values, 512):
                found |= set(images.to_table(columns=["image_id"], filter=where_in(column, part))
                             .column("image_id").to_pylist())
    missing = len(ids) + len(uris) - len(found)
    print(f"  {len(found)} of the listed images are in the lab"
          + (f"; {missing} are not (nothing to remove for them)" if missing > 0 else ""))
    instance = _instance()
    wanted = pa.array(sorted(found), pa.string())
    for recipe in sorted(instance.get_dynamic_partitions("recipes")):
        sid = latest_data_version(instance, CURATED_SUBSETS, recipe)
        if not sid:
            continue
        try:
            subset_ids = read_subset_table(root, recipe, sid).column("image_id")  # Arrow, not a list of a subset
        except (OSError, PrxError):
            continue
        n = int(pc.sum(pc.is_in(subset_ids, value_set=wanted)).as_py() or 0)
        print(f"  recipe {recipe}: {n} of them in its current subset"
              + (" -> the next `prx-assets run` republishes its shard set with a skip list" if n else ""))
    if args.erase:
        _erase(root, request, args.retention_hours)
    return 0


def _erase(root: DataRoot, request: Any, retention_hours: float) -> None:
    """Carry out an opt-out request as an erasure and print where the images were and what went."""
    from datetime import timedelta

    from prx_assets.core.curate.erase import erase

    if retention_hours < 0:
        raise PrxError(f"--retention-hours {retention_hours} must be >= 0 (0 removes every older version now)")
    rep = erase(root, request, timedelta(hours=retention_hours))
    print(f"erased {len(rep['image_ids'])} images in {rep['seconds']} s (report: {root.join(layout.erasure(request.request_id))})")
    for t in rep["lab"]:
        kept = f"; older versions keep them until {t['bytes_kept_until']}" if t["bytes_kept_until"] else ""
        print(f"  lab {t['table']}: {t['rows_deleted']} rows deleted, {t['fragments_rewritten']} fragments rewritten, "
              f"{t['versions_removed']} old versions removed, tags moved to the purged version: "
              f"{', '.join(t['tags_moved']) or 'none'}{kept}")
    for st in (st for st in rep["streams"] if st["shards_rewritten"]):
        print(f"  stream {st['stream']}: {st['samples_blanked']} samples blanked, "
              f"{len(st['shards_rewritten'])} of {st['shards_total']} shards rewritten")
    for w in rep["withdrawn_sets"]:
        print(f"  withdrawn shard set {w['recipe']}/{w['shard_set_id']} ({w['samples']} erased samples)")
    for m in rep["mixture_specs"]:
        runs = ", ".join(str(r["run_id"]) for r in m["training_runs"]) or "none recorded"
        print(f"  mixture {m['mixture']} {m['version']} names a withdrawn set (refused by the loader); "
              f"training runs on it: {runs} (checkpoints under {m['training_folder']} may have learnt from them)")
    for i, uri in sorted(rep["sources"].items()):
        print(f"  source file of {i}: {uri} (not ours to delete: remove it at the source)")
    print("  next: `prx-assets run` publishes the subsets and shard sets without them")


def path_hint() -> str | None:
    """How to reach ``prx-assets`` when this interpreter's bin folder is not on PATH (else ``None``)."""
    bindir = Path(sys.executable).parent
    found = shutil.which("prx-assets")
    if found and Path(found).parent.resolve() == bindir.resolve():
        return None
    return (f"prx-assets lives in {bindir}: run `source {bindir}/activate` (or call {bindir}/prx-assets) "
            "to use `prx-assets status`, `query`, `lineage`, ...")


def cmd_migrate(args: argparse.Namespace) -> int:
    """Bring a data root written by an earlier release up to this one (idempotent)."""
    from prx_assets.core.ingest.batches import relativize_manifests

    root = _root()
    total = 0
    for src in load_sources().sources:
        n = relativize_manifests(root, src)
        total += n
        print(f"{src.name}: {n} batch manifests rewritten with keys relative to {src.location}" if n else
              f"{src.name}: batch manifests already keyed relative to the source")
    from prx_assets.core.lab.scrub import fill_digests

    images = open_table(table_uri(root, IMAGES_TABLE), root.storage_options())
    filled = fill_digests(images) if images is not None else 0
    if filled:
        print(f"images: recorded the stored bytes' sha256 of {filled} rows written before digests existed "
              "(publishing and `prx-assets doctor --verify` check them)")
    print("image ids now hash each file's path relative to its source, so a source can be re-pointed at a new "
          "mount or prefix; the next `prx-assets run` re-ingests every batch written before once (decoding only: "
          "captions and embeddings are reused by content) and gives its images their new ids, and the subsets, "
          "shard sets and mixtures downstream get new versions once" if total or args.verbose else
          "nothing to migrate")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    """Print the chain from a training run or shard set back to the source files."""
    from prx_assets.core.lineage import render
    from prx_assets.lineage_report import lineage_for

    lineage = lineage_for(_instance(), _root(), args.target)
    print(json.dumps(lineage, indent=1, default=str) if args.json else render(lineage))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    p = argparse.ArgumentParser(prog="prx-assets", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    d = sub.add_parser("demo", help="generate the demo corpus and run the whole graph")
    d.add_argument("--regenerate", action="store_true", help="rewrite the demo corpus")
    d.add_argument("--small", action="store_true",
                   help="a 38-image corpus instead of 316, for a quick look (about a minute on 2 cores)")
    d.add_argument("-v", "--verbose", action="store_true", help="show Dagster run logs")
    d.set_defaults(fn=cmd_demo)
    m = sub.add_parser("models", help="build the tiny offline models models.yaml points at")
    m.set_defaults(fn=cmd_models)
    s = sub.add_parser("discover", help="find new files and register ingest-batch partitions")
    s.add_argument("--source", help="only this source")
    s.add_argument("--full", action="store_true",
                   help="list every file again and report changed ones (the default lists only what changed)")
    s.set_defaults(fn=cmd_discover)
    r = sub.add_parser("run", help="materialize missing or stale partitions in dependency order")
    r.add_argument("--select", help="Dagster asset selection, e.g. 'raw_images' or 'raw_images+'")
    r.add_argument("--dry-run", action="store_true", help="only list what would run")
    r.add_argument("-v", "--verbose", action="store_true", help="show Dagster run logs")
    r.set_defaults(fn=cmd_run)
    _add_query(sub)
    st = sub.add_parser("status", help="sources, batches, every asset's partitions and the tables")
    st.add_argument("--json", action="store_true", help="one JSON document instead of text")
    st.set_defaults(fn=cmd_status)
    _add_doctor(sub)
    pa_ = sub.add_parser("partitions", help="registered dynamic partitions and orphans (keys nothing backs)")
    pa_.add_argument("--prune", action="store_true", help="remove orphaned partitions")
    pa_.set_defaults(fn=cmd_partitions)
    rj = sub.add_parser("rejects", help="list rejected files with reasons")
    rj.add_argument("--source")
    rj.add_argument("--reason")
    rj.add_argument("--limit", type=int, default=50)
    rj.add_argument("--json", action="store_true", help="JSON lines")
    rj.set_defaults(fn=cmd_rejects)
    _add_optout(sub)
    mg = sub.add_parser("migrate", help="bring a data root written by an earlier release up to this one "
                                        "(batch manifests keyed relative to their source); idempotent")
    mg.add_argument("-v", "--verbose", action="store_true", help="say what the upgrade changes even if nothing "
                                                                 "was rewritten")
    mg.set_defaults(fn=cmd_migrate)
    li = sub.add_parser("lineage", help="training run or shard set -> mixture, shard sets, subsets, Lance "
                                        "version, captioners, code versions, sources")
    li.add_argument("target", help="a training run's Dagster run id, training_run[<mixture>], a mixture name, "
                                   "a shard set id, or a shard set folder/URI")
    li.add_argument("--json", action="store_true", help="JSON instead of a tree")
    li.set_defaults(fn=cmd_lineage)
    return p


def _add_query(sub: Any) -> None:
    """``prx-assets query``."""
    q = sub.add_parser("query", help="query the lab (filters, --near, --text, --version/--tag, --explain)")
    q.add_argument("--where", help="SQL predicate, e.g. \"width >= 1024 AND source = 'photos'\"")
    q.add_argument("--columns", help="comma-separated columns (default: image_id, source, width, height, "
                                     "aspect_bucket, uri)")
    q.add_argument("--limit", type=int, default=20)
    q.add_argument("--near", metavar="IMAGE_ID", help="nearest images by embedding")
    q.add_argument("-k", type=int, default=10, help="neighbours for --near")
    q.add_argument("--text", help="full-text query over a caption column")
    q.add_argument("--version", type=int, help="read this Lance version")
    q.add_argument("--tag", help="read the version with this tag (e.g. published)")
    q.add_argument("--explain", action="store_true", help="print the plan and rows/bytes read")
    q.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    q.add_argument("--versions", action="store_true", help="list versions and tags (a table; --json for JSON)")
    q.set_defaults(fn=cmd_query)


def _add_doctor(sub: Any) -> None:
    """``prx-assets doctor``."""
    dr = sub.add_parser("doctor", help="find (--repair: fix) duplicate keys, orphan partitions, leaked "
                                       "staging/cache folders and Dagster runs that will not end on their own")
    dr.add_argument("--repair", action="store_true", help="fix what is found (a stuck run: its processes are "
                                                          "stopped and it is marked CANCELED or FAILURE)")
    dr.add_argument("--verify", action="store_true",
                    help="also hash every stored image and every shard file against its recorded digest (reads "
                         "all of them); with --repair, corrupt rows are ingested again and corrupt shard sets "
                         "quarantined and published again")
    dr.add_argument("--quiet-minutes", type=float, default=10.0,
                    help="a CANCELING run, or one whose steps all finished, with no event this long is stuck "
                         "(default 10)")
    dr.add_argument("--older-than-hours", type=float, default=6.0,
                    help="staging and cache folders untouched this long count as leaked (default 6)")
    dr.set_defaults(fn=cmd_doctor)


def _add_optout(sub: Any) -> None:
    """``prx-assets optout``."""
    oo = sub.add_parser("optout", help="record an opt-out request (image ids or source URIs); the next run "
                                         "removes those images from every subset and shard set")
    oo.add_argument("--ids", help="file with one lab image id per line")
    oo.add_argument("--uris", help="file with one source URI per line")
    oo.add_argument("--reason", help="why (kept with the request, shown in lineage)")
    oo.add_argument("--erase", action="store_true",
                    help="also erase the images' bytes: lab rows and old versions, the shards that hold them "
                         "(blanked), shard sets and mixture specs that still yield them (withdrawn)")
    oo.add_argument("--retention-hours", type=float, default=0.0,
                    help="with --erase: keep lab versions this recent (default 0: remove every older version now)")
    oo.set_defaults(fn=cmd_optout)


def quiet_known_warnings() -> None:
    """Hide warnings about Dagster features this project uses knowingly, for the command's own output.

    Set when the command starts (not at import): a library importing prx_assets keeps its own filters.
    """
    import logging
    import warnings

    # Libraries that log progress chatter at WARNING (MDS writers' "Directory ... exists", index temp
    # folders, transformers' processor notices); `-v` shows Dagster's own logs, errors always show.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("streaming", "root"):
        logging.getLogger(None if name == "root" else name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", message="Asset job .* materializes assets with varying BackfillPolicies")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``prx-assets`` console script."""
    args = build_parser().parse_args(argv)
    quiet_known_warnings()
    try:
        rc = int(args.fn(args))
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return rc
    except PrxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`prx-assets query | head`): stop quietly, like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
