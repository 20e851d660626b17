"""Whether a process recorded by host and pid (a lease holder, a scratch folder's owner, a run's
process) is still there; and keeping this process stoppable by SIGTERM across in-process runs."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gone_here(host: str, pid: int) -> bool:
    """Whether ``pid`` on ``host`` is known to be gone: the host is this one, the pid is not this
    process and no such process exists. Another host's processes are never known gone."""
    return host == socket.gethostname() and pid != os.getpid() and not pid_alive(pid)


@contextmanager
def sigterm_kept() -> Iterator[None]:
    """Restore SIGTERM's disposition, as it was on entry, when the block leaves.

    Dagster maps SIGTERM to whatever SIGINT's handler is when an in-process run starts and ends
    (``dagster._utils.interrupts.setup_interrupt_handlers``). A process started in the background
    by a shell without job control (``cmd &`` in a script, ``nohup``, cron) inherits SIGINT
    ignored, so after its first in-process run SIGTERM is ignored too: ``kill`` and ``scancel``
    no longer stop it, and every process it starts afterwards (a local job, a caption server)
    inherits the ignore across ``exec`` and outlives its own SIGTERM. Wrap each in-process run in
    this. Off the main thread (where Dagster changes no handler) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before is not None and signal.getsignal(signal.SIGTERM) is not before:
            signal.signal(signal.SIGTERM, before)
