"""Writer leases on the data root: one holder at a time per table partition, local or on S3.

A lease is a folder ``leases/<name>/`` of numbered generations. Taking it creates
``<gen>.json`` (owner, host, pid, time) with a create-if-absent write (an ``O_EXCL`` link on a
local or shared filesystem, ``If-None-Match: *`` on S3), so of two writers racing for one
generation exactly one wins. The holder rewrites ``<gen>.beat`` every ``ttl / 4`` seconds and
deletes its files when done (an empty folder is a free lease).

A generation is **stale** when its holder has not beaten for ``ttl`` seconds, or when it was
taken on this host by a process that no longer exists (a ``kill -9`` is noticed at once). The
next writer then takes generation ``gen + 1`` and removes the older files. The old holder's
heartbeat sees its generation gone or superseded and marks the lease lost; ``Lease.check``
raises before such a holder commits anything more. (A lease cannot fence a commit already in
flight; the writes it guards are idempotent merges, so the worst case is repeated work.)

Settings: ``PRX_LEASE_TTL_SECONDS`` (default 120) and ``PRX_LEASE_WAIT_SECONDS`` (how long a
writer waits for a held lease before failing with the holder's name; default 6 hours).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.processes import gone_here
from prx_assets.errors import StorageError

log = logging.getLogger(__name__)

#: The lease of writers of the lab's shared state: lab syncs and table maintenance.
LAB_LEASE = "lab"
#: A generation file's name: ``<gen>.json`` (the claim), ``<gen>.beat`` (the heartbeat).
_GEN = re.compile(r"^(\d{10})\.(json|beat)$")


class LeaseBusy(StorageError):
    """The lease stayed held by a live writer for longer than the wait allowed."""


class LeaseLost(StorageError):
    """This writer's lease was taken over (it stopped beating for longer than the ttl)."""


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StorageError(f"{name}={raw!r} is not a number of seconds; set it to e.g. {default:g}") from None
    if value <= 0:
        raise StorageError(f"{name}={raw!r} must be positive; set it to e.g. {default:g}")
    return value


def default_ttl() -> float:
    """Seconds without a heartbeat after which a lease is stale (``PRX_LEASE_TTL_SECONDS``, 120)."""
    return _env_seconds("PRX_LEASE_TTL_SECONDS", 120.0)


def default_wait() -> float:
    """Seconds a writer waits for a held lease (``PRX_LEASE_WAIT_SECONDS``, 6 hours)."""
    return _env_seconds("PRX_LEASE_WAIT_SECONDS", 6 * 3600.0)


def lease_owner() -> str:
    """Who is writing, for messages: the Dagster run or SLURM job when known, else the process."""
    parts = []
    if os.environ.get("DAGSTER_RUN_ID"):
        parts.append(f"run {os.environ['DAGSTER_RUN_ID']}")
    if os.environ.get("SLURM_JOB_ID"):
        parts.append(f"slurm job {os.environ['SLURM_JOB_ID']}")
    parts.append(f"pid {os.getpid()} on {socket.gethostname()}")
    return ", ".join(parts)


def lease_name(*parts: str) -> str:
    """A lease name from parts (table, key, partition); characters a path cannot hold become ``_``.

    >>> lease_name("captions", "qwen3vl-2b/ab12", "demo folder-00001")
    'captions/qwen3vl-2b_ab12/demo_folder-00001'
    """
    return "/".join(re.sub(r"[^A-Za-z0-9._-]", "_", p) or "_" for p in parts)


@dataclass(frozen=True)
class Holder:
    """The latest generation of a lease, as read from the data root."""

    name: str
    generation: int
    owner: str
    host: str
    pid: int
    acquired_at: float
    beat_at: float
    ttl: float

    def stale(self, now: float | None = None) -> str | None:
        """Why this holder no longer holds the lease, or ``None`` while it does."""
        now = time.time() if now is None else now
        if gone_here(self.host, self.pid):
            return f"its process {self.pid} on {self.host} is gone"
        if now - self.beat_at > self.ttl:
            return f"no heartbeat for {now - self.beat_at:.0f} s (ttl {self.ttl:.0f} s)"
        return None

    def describe(self) -> str:
        """One line naming the holder."""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.acquired_at))
        return f"lease {self.name!r} (generation {self.generation}) held by {self.owner} since {since} UTC"


def _generations(root: DataRoot, name: str) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    base = layout.lease_dir(name) + "/"
    for rel in root.list(layout.lease_dir(name)):
        m = _GEN.match(rel[len(base):] if rel.startswith(base) else rel.rsplit("/", 1)[-1])
        if m:
            found.setdefault(int(m.group(1)), set()).add(m.group(2))
    return found


def _file(name: str, generation: int, kind: str) -> str:
    return f"{layout.lease_dir(name)}/{generation:010d}.{kind}"


def read_holder(root: DataRoot, name: str) -> Holder | None:
    """The latest generation of lease ``name``, or ``None`` when it is free."""
    gens = _generations(root, name)
    claimed = [g for g, kinds in gens.items() if "json" in kinds]
    if not claimed:
        return None
    gen = max(claimed)
    try:
        doc = json.loads(root.read_bytes(_file(name, gen, "json")))
    except FileNotFoundError:
        return None  # released between the listing and the read
    except ValueError:
        doc = {}
    beat = float(doc.get("acquired_at", 0.0))
    if "beat" in gens[gen]:
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            beat = max(beat, float(json.loads(root.read_bytes(_file(name, gen, "beat")))["at"]))
    return Holder(name=name, generation=gen, owner=str(doc.get("owner", "?")), host=str(doc.get("host", "")),
                  pid=int(doc.get("pid", -1)), acquired_at=float(doc.get("acquired_at", 0.0)), beat_at=beat,
                  ttl=float(doc.get("ttl", default_ttl())))


def list_leases(root: DataRoot) -> list[Holder]:
    """Every held (or stale) lease under the data root."""
    names = sorted({rel[len(layout.LEASES_DIR) + 1:].rsplit("/", 1)[0] for rel in root.list(layout.LEASES_DIR)})
    return [h for h in (read_holder(root, n) for n in names) if h is not None]


def remove_generation(root: DataRoot, name: str, generation: int) -> None:
    """Delete one generation's files (its heartbeat first, the claim last)."""
    root.delete(_file(name, generation, "beat"))
    root.delete(_file(name, generation, "json"))
    if not root.remote:  # leave no empty folders behind on a filesystem
        with contextlib.suppress(OSError):
            os.rmdir(root.join(layout.lease_dir(name)))


class Lease:
    """Exclusive right to write one table partition (see the module docs); a context manager.

    >>> import tempfile
    >>> root = DataRoot(tempfile.mkdtemp())
    >>> with Lease(root, "images/b-00001") as lease:
    ...     read_holder(root, "images/b-00001").generation == lease.generation
    True
    >>> read_holder(root, "images/b-00001") is None
    True
    """

    def __init__(self, root: DataRoot, name: str, owner: str | None = None, ttl: float | None = None,
                 wait: float | None = None, on_wait: Callable[[Holder], None] | None = None) -> None:
        self.root = root
        self.name = name
        self.owner = owner or lease_owner()
        self.ttl = default_ttl() if ttl is None else ttl
        self.wait = default_wait() if wait is None else wait
        self.on_wait = on_wait
        self.generation: int | None = None
        self.waited = 0.0
        self.took_over: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> Lease:
        """Take the lease, waiting while a live writer holds it; raise ``LeaseBusy`` after ``wait``."""
        started = time.monotonic()
        told = False
        while True:
            holder = read_holder(self.root, self.name)
            why = holder.stale() if holder is not None else None
            if holder is None or why is not None:
                gen = 1 if holder is None else holder.generation + 1
                doc = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                       "acquired_at": time.time(), "ttl": self.ttl}
                if self.root.write_new(_file(self.name, gen, "json"), json.dumps(doc).encode()):
                    self.generation = gen
                    if holder is not None:
                        self.took_over = f"{holder.describe()}: {why}"
                        log.warning("took over stale %s", self.took_over)
                        for old in _generations(self.root, self.name):
                            if old < gen:
                                remove_generation(self.root, self.name, old)
                    break
                continue  # another writer won this generation: look again
            if time.monotonic() - started > self.wait:
                raise LeaseBusy(f"{holder.describe()} for longer than {self.wait:.0f} s; if that writer is "
                                "dead, `prx-assets doctor --repair` frees it (or wait "
                                f"{holder.ttl:.0f} s after its last heartbeat), else raise PRX_LEASE_WAIT_SECONDS")
            if not told:
                told = True
                log.warning("waiting for %s", holder.describe())
                if self.on_wait is not None:
                    self.on_wait(holder)
            time.sleep(min(1.0, self.ttl / 8))
        self.waited = time.monotonic() - started
        self._beat()
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        assert self.generation is not None
        self.root.write_bytes(_file(self.name, self.generation, "beat"), json.dumps({"at": time.time()}).encode())

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                gens = _generations(self.root, self.name)
                mine = gens.get(self.generation or 0, set())
                if "json" not in mine or any(g > (self.generation or 0) for g in gens):
                    self._lost = (f"lease {self.name!r} generation {self.generation} was taken over or removed "
                                  f"(no heartbeat within {self.ttl:.0f} s?)")
                    log.error(self._lost)
                    return
                self._beat()
            except Exception as e:  # a storage hiccup: the next beat retries; the ttl covers three misses
                log.warning("lease %r heartbeat failed: %s", self.name, e)

    def check(self) -> None:
        """Raise ``LeaseLost`` if another writer has taken this lease over (call before committing)."""
        if self._lost is not None:
            raise LeaseLost(f"{self._lost}; this writer stops so that two never commit one partition; "
                            "re-run it (the work already committed is kept)")

    def release(self) -> None:
        """Give the lease back (its files are removed; a lost lease is left to its new holder)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.generation is not None and self._lost is None:
            remove_generation(self.root, self.name, self.generation)
        self.generation = None

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
