"""Decoder warnings (Pillow's "Possibly corrupt EXIF data", "Tag data larger than file", ...)
are recorded per file instead of being printed.

Real corpora make decoders warn on every few files; printed, they drown a run's output and
say nothing about which file. :func:`routed` is entered once per ingest batch (in the thread
that starts the workers); inside it, each worker wraps one file in :func:`collect` and gets
that file's warnings as strings. Warnings raised elsewhere while routing is on are shown as usual.

>>> import warnings
>>> with routed(), collect() as got:
...     warnings.warn("Possibly corrupt EXIF data", UserWarning)
>>> got
['UserWarning: Possibly corrupt EXIF data']
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator

_sink = threading.local()


@contextlib.contextmanager
def routed() -> Iterator[None]:
    """Route warnings raised in threads inside :func:`collect` to their lists (and never dedupe Pillow's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("always", module=r"PIL(\..*)?$")
        shown = warnings.showwarning

        def route(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
            sink = getattr(_sink, "messages", None)
            if sink is None:
                shown(message, category, filename, lineno, file, line)  # type: ignore[arg-type]
            else:
                sink.append(f"{category.__name__}: {message}")

        warnings.showwarning = route
        yield


@contextlib.contextmanager
def collect() -> Iterator[list[str]]:
    """Collect the warnings this thread raises inside the block (needs :func:`routed` around it)."""
    previous = getattr(_sink, "messages", None)
    _sink.messages = out = []
    try:
        yield out
    finally:
        _sink.messages = previous


def record(messages: list[str]) -> None:
    """Add warnings collected elsewhere (a worker process) to this thread's :func:`collect` list."""
    sink = getattr(_sink, "messages", None)
    if sink is not None:
        sink.extend(messages)
