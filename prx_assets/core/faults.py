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


def crash_point(name: str, armed: str | None = None) -> None:
    """Die here with SIGKILL when ``PRX_CRASH_AT`` (or ``armed``, the value the parent of a pool
    process read from it) equals ``name`` (a no-op otherwise)."""
    if (armed if armed is not None else os.environ.get(CRASH_ENV)) == name:
        os.kill(os.getpid(), signal.SIGKILL)
