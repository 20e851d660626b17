"""Named crash points for fault-injection tests (``tests/test_faults.py``).

``crash_point("shards.before_publish")`` does nothing unless the environment variable
``PRX_CRASH_AT`` names that point, in which case the process kills itself with ``SIGKILL``
right there: no ``finally``, no ``atexit``, no flushing, exactly what a node failure or an
OOM kill leaves behind. The tests kill a real ``prx-assets run`` at each point and check that
the next run repairs and completes the work as if nothing had happened.
"""

from __future__ import annotations

import os
import signal

#: Environment variable naming the crash point to die at.
CRASH_ENV = "PRX_CRASH_AT"
#: Every crash point, in the order one ``prx-assets run`` reaches them (training's own are in the trainer).
CRASH_POINTS = ("discover.before_index", "ingest.before_commit", "ingest.between_commits",
                "enrich.embeddings.after_commit", "enrich.captions.after_commit", "lab.after_column",
                "lab.before_indexes", "curate.before_manifest", "shards.before_publish", "shards.after_publish",
                "mixture.before_spec")


def crash_point(name: str, armed: str | None = None) -> None:
    """Die here with SIGKILL when ``PRX_CRASH_AT`` (or ``armed``, the value the parent of a pool
    process read from it) equals ``name`` (a no-op otherwise)."""
    if (armed if armed is not None else os.environ.get(CRASH_ENV)) == name:
        os.kill(os.getpid(), signal.SIGKILL)
