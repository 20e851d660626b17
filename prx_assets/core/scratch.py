"""Scratch folders that say who made them, so a crashed writer's leftovers are found and removed.

A shard set is written in a staging folder and published by a rename (or uploads); a read-back
check caches shards in a temporary folder. A process killed mid-way leaves such a folder
behind. Each one made here has an owner file beside it, ``<folder>.owner.json`` (host, pid; beside,
not inside, so that the folder can be renamed into place or uploaded as it is); ``reap``
removes those whose process is gone on this host (at once) or that are older than
``max_age_hours`` anywhere, and owner files whose folder is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from prx_assets.core.processes import gone_here

OWNER_SUFFIX = ".owner.json"


def owner_file(path: Path) -> Path:
    """The owner file of a scratch folder (beside it)."""
    return path.with_name(path.name + OWNER_SUFFIX)


def make_scratch(parent: str | os.PathLike[str] | None, prefix: str) -> Path:
    """A new folder ``<parent>/<prefix><random>`` (the temp folder when ``parent`` is None) with its
    owner file beside it."""
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    owner_file(path).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                            "created": time.time()}))
    return path


def release(path: Path) -> None:
    """Forget a scratch folder's owner (after it was published, renamed or removed)."""
    owner_file(path).unlink(missing_ok=True)


def dead_owner(path: Path, max_age_hours: float | None = None) -> str | None:
    """Why ``path`` is a leftover (its process is gone on this host, or it is older than
    ``max_age_hours``), or ``None`` while its owner may still be using it."""
    try:
        owner = json.loads(owner_file(path).read_text())
    except (OSError, ValueError):
        owner = None
    if owner is not None and gone_here(str(owner.get("host")), int(owner.get("pid", -1))):
        return f"its process {owner.get('pid')} on {owner.get('host')} is gone"
    if max_age_hours is not None:
        try:
            age = (time.time() - path.stat().st_mtime) / 3600
        except OSError:
            return None
        if age >= max_age_hours:
            return f"untouched for {age:.1f} h"
    return None


def reap(parent: str | os.PathLike[str] | None, pattern: str, max_age_hours: float | None = None) -> list[Path]:
    """Remove the folders matching ``pattern`` under ``parent`` (the temp folder when None) that
    ``dead_owner`` calls leftovers; return them."""
    base = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed = []
    if not base.is_dir():
        return removed
    for p in sorted(base.glob(pattern)):
        if p.name.endswith(OWNER_SUFFIX):
            folder = p.with_name(p.name[:-len(OWNER_SUFFIX)])
            if not folder.exists():  # the folder was published or removed; its owner file stayed
                p.unlink(missing_ok=True)
        elif p.is_dir() and dead_owner(p, max_age_hours) is not None:
            shutil.rmtree(p, ignore_errors=True)
            release(p)
            removed.append(p)
    return removed
