"""The Python standard library: whether this process is a ``multiprocessing`` child still
importing its parent's main module (``BaseProcess._inheriting``; no public flag says it, and
``multiprocessing`` itself reads it to refuse an unguarded main script)."""

from __future__ import annotations

import multiprocessing as mp


def inheriting() -> bool:
    """Whether this process is a spawned child that has not finished starting."""
    return bool(getattr(mp.current_process(), "_inheriting", False))
