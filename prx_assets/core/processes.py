"""Whether a process recorded by host and pid (a lease holder, a scratch folder's owner, a run's
process) is still there."""

from __future__ import annotations

import os
import socket


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
