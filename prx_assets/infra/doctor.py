"""``prx-assets doctor``: find (and with ``repair``, fix) what crashes and concurrent runs leave.

- duplicate keys in the images, captions and embeddings tables (reported with examples; a
  duplicate is never silently dropped: ``repair`` keeps the most recently written row of each
  key, see :func:`repair_duplicates`);
- orphan partitions (batch keys without a manifest; captioners, recipes, mixtures gone from
  the config): ``repair`` removes the keys, their history stays;
- staging folders of shard sets that were never published, and MDS read-back caches in the
  temporary folder, older than ``older_than``: ``repair`` deletes them;
- Dagster runs of any launcher that will not end on their own (their processes gone, CANCELING
  or finished-but-open with no event for ``quiet_minutes``, NOT_STARTED since; see
  :mod:`prx_assets.infra.stuck_runs`): ``repair`` ends their processes and marks them CANCELED or
  FAILURE;
- stale writer leases (see :mod:`prx_assets.core.leases`: the holder's process is gone or it
  stopped beating): ``repair`` frees them (a later writer would take them over anyway);
- kept curation state no configured recipe reads (a recipe removed, a dedup rule dropped, caption
  columns or an embedding column no recipe reads; see :mod:`prx_assets.core.curate.kept_state`):
  ``repair`` deletes it (a cache: the next cut that wants it computes it again).

Key columns are read one id range at a time (memory bounded by the range, not the table).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import lance
import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.kept_state import delete_stale, stale_kept
from prx_assets.core.lab.changes import id_ranges
from prx_assets.core.lab.maintenance import lance_tables
from prx_assets.core.lab.query import QueryError, open_lab
from prx_assets.core.lab.sql import literal
from prx_assets.core.lab.sync import embedding_column
from prx_assets.core.lab.table import open_table
from prx_assets.core.leases import list_leases, remove_generation
from prx_assets.core.scratch import dead_owner, release
from prx_assets.errors import ConfigError
from prx_assets.infra.partitions import orphan_partitions
from prx_assets.infra.stuck_runs import HOST_TAG, PID_TAG, QUIET_MINUTES, end_run, stuck_runs
from prx_assets.resources.storage import ProjectConfigResource

__all__ = ["HOST_TAG", "PID_TAG", "Finding", "doctor"]
#: Key rows read per id range when looking for duplicates.
KEY_ROWS_PER_RANGE = 2_000_000


@dataclass
class Finding:
    """One problem: its kind, where it is, what was seen, and whether ``repair`` fixed it."""

    kind: str
    where: str
    detail: str
    repaired: bool = False

    def line(self) -> str:
        """One line for the console."""
        return f"{'repaired' if self.repaired else 'found'}: {self.kind} {self.where}: {self.detail}"


def table_keys(name: str) -> list[str] | None:
    """The merge key of a lab table (``None`` for tables without one)."""
    if name in ("images", "rejects"):
        return ["image_id"]
    if name == "captions":
        return ["captioner_id", "image_id"]
    if name.startswith("embeddings_"):
        return ["embedder_id", "image_id"]
    return None


def duplicate_keys(ds: lance.LanceDataset, keys: list[str]) -> Iterator[pa.Table]:
    """Tables of ``keys`` + ``count`` for every key held by more than one row, an id range at a time."""
    for rng in id_ranges(ds.count_rows(), KEY_ROWS_PER_RANGE):
        t = ds.to_table(columns=keys, filter=rng)
        if t.num_rows == 0:
            continue
        counts = t.group_by(keys).aggregate([([], "count_all")]).rename_columns([*keys, "count"])
        dups = counts.filter(pc.greater(counts.column("count"), 1))
        if dups.num_rows:
            yield dups


def repair_duplicates(ds: lance.LanceDataset, keys: list[str], dups: pa.Table) -> int:
    """Keep, for each duplicated key, the row written last (highest ``_row_last_updated_at_version``
    where the table tracks it, then highest row id); delete the others by row id in one commit.
    Returns the rows deleted."""
    ids = sorted(set(dups.column("image_id").to_pylist()))
    versioned = bool(getattr(ds, "has_stable_row_ids", False))
    cols = [*keys, "_row_last_updated_at_version"] if versioned else list(keys)
    rows = ds.to_table(columns=cols, filter=f"image_id IN ({', '.join(literal(i) for i in ids)})", with_row_id=True)
    order = [(k, "ascending") for k in keys] + \
        ([("_row_last_updated_at_version", "descending")] if versioned else []) + [("_rowid", "descending")]
    rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    seen: set[tuple[object, ...]] = set()
    drop: list[int] = []
    key_cols = [rows.column(k).to_pylist() for k in keys]
    for i, rowid in enumerate(rows.column("_rowid").to_pylist()):
        key = tuple(col[i] for col in key_cols)
        if key in seen:
            drop.append(rowid)
        else:
            seen.add(key)
    if drop:
        ds.delete(f"_rowid IN ({', '.join(str(r) for r in drop)})")
    return len(drop)


def check_duplicates(root: DataRoot, repair: bool) -> list[Finding]:
    """Duplicate merge keys in every keyed table."""
    out = []
    for name in lance_tables(root):
        keys = table_keys(name)
        ds = open_table(root.join(layout.table(name)), root.storage_options()) if keys else None
        if ds is None or keys is None or any(k not in ds.schema.names for k in keys):
            continue
        for dups in duplicate_keys(ds, keys):
            extra = int(pc.sum(dups.column("count")).as_py()) - dups.num_rows
            example = dups.slice(0, 3).to_pylist()
            f = Finding("duplicate_keys", name, f"{dups.num_rows} keys held by {extra} extra rows, e.g. {example}")
            if repair:
                removed = repair_duplicates(ds, keys, dups)
                f.detail += f"; removed {removed} older rows"
                f.repaired = True
            out.append(f)
    return out


def check_orphans(instance: dg.DagsterInstance, root: DataRoot, repair: bool,
                  project: ProjectConfigResource | None = None) -> list[Finding]:
    """Registered partitions nothing backs any more."""
    out = []
    for name, keys in orphan_partitions(instance, project or ProjectConfigResource(), root).items():
        for key, why in keys.items():
            if repair:
                instance.delete_dynamic_partition(name, key)
            out.append(Finding("orphan_partition", f"{name}[{key}]", why, repaired=repair))
    return out


def check_leaked_folders(root: DataRoot, older_than_hours: float, repair: bool) -> list[Finding]:
    """Unpublished staging folders under the data root (local) and read-back caches in the temp folder."""
    candidates: list[Path] = []
    if not root.remote:
        mds = Path(root.join(layout.MDS_DIR))
        if mds.is_dir():
            candidates += [p for p in mds.glob("*/.staging-*") if p.is_dir()]
    tmp = Path(tempfile.gettempdir())
    candidates += [p for p in tmp.glob("prx-mds-*") if p.is_dir()]
    out = []
    for p in sorted(candidates):
        why = dead_owner(p, older_than_hours)  # its writer is gone (this host), or it is old
        if why is None:
            continue
        if repair:
            shutil.rmtree(p, ignore_errors=True)
            release(p)
        out.append(Finding("leaked_folder", str(p), why, repaired=repair))
    return out


def check_stuck_runs(instance: dg.DagsterInstance, repair: bool,
                     quiet_minutes: float = QUIET_MINUTES) -> list[Finding]:
    """Runs of any launcher that will not end on their own (see :mod:`prx_assets.infra.stuck_runs`);
    ``repair`` ends their processes and marks them CANCELED or FAILURE."""
    out = []
    for stuck in stuck_runs(instance, quiet_minutes):
        f = Finding("stuck_run", f"{stuck.run_id} ({stuck.evidence.job})", stuck.why)
        if repair:
            f.detail += f"; {end_run(instance, stuck)}"
            f.repaired = True
        out.append(f)
    return out


def check_leases(root: DataRoot, repair: bool) -> list[Finding]:
    """Writer leases whose holder is gone (dead process on this host, or no heartbeat within the ttl)."""
    out = []
    for holder in list_leases(root):
        why = holder.stale()
        if why is None:
            continue
        if repair:
            remove_generation(root, holder.name, holder.generation)
        out.append(Finding("stale_lease", holder.name, f"{holder.describe()}: {why}", repaired=repair))
    return out


def check_kept_state(root: DataRoot, repair: bool, project: ProjectConfigResource | None = None) -> list[Finding]:
    """Kept curation state (digests, search codes, pHash and embedding-dedup pairs) that no
    configured recipe reads; one finding per folder and kind."""
    project = project or ProjectConfigResource()
    models = project.models()
    column = embedding_column(models.embedder.embedder_id()) if models.embedder else None
    try:
        lab = open_lab(root)
    except QueryError:
        lab = None  # no lab yet: only the recipes' own folders are judged
    out = []
    for stale in stale_kept(root, project.recipes().recipes, models.captioner_ids(), column, lab):
        f = Finding("stale_kept_state", stale.folder, f"{len(stale.files)} files: {stale.why}")
        if repair:
            delete_stale(root, stale)
            f.repaired = True
        out.append(f)
    return out


def doctor(instance: dg.DagsterInstance, root: DataRoot, repair: bool = False,
           older_than_hours: float = 6.0, quiet_minutes: float = QUIET_MINUTES) -> list[Finding]:
    """Every check above, in order; with ``repair`` each finding is fixed as it is found. Partitions
    and kept state are named by model ids, which follow the models' files: when models.yaml names
    a folder that is not there, those two are not judged (nothing is deleted) and a finding says why."""
    project = ProjectConfigResource()
    try:
        project.models()
        unreadable = None
    except ConfigError as e:
        unreadable = Finding("models_unreadable", "models.yaml", f"partitions and kept state not judged: {e}")
    return [*check_stuck_runs(instance, repair, quiet_minutes), *check_leases(root, repair),
            *(check_orphans(instance, root, repair, project) if unreadable is None else []),
            *check_leaked_folders(root, older_than_hours, repair),
            *(check_kept_state(root, repair, project) if unreadable is None else [unreadable]),
            *check_duplicates(root, repair)]
