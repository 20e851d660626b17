"""Training phases: which phase of a mixture each optimizer step reads, and its batches.

A phased mixture spec lists phases in training order, each with its streams, weights,
resolution and step count (:class:`~prx_assets.core.manifests.MixturePhase`). Step ``k`` (the
``k``-th optimizer step, counted from 0) belongs to the phase whose window holds it; every rank
counts the same steps, so every rank switches at the same step, and a run resumed at step
``k`` starts in the phase that holds ``k``, at the position in that phase's stream that the
checkpoint recorded. A spec without phases is one phase over the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prx_assets.core.manifests import MixtureSpec


@dataclass(frozen=True)
class Window:
    """Steps ``first <= k < stop`` of a run read phase ``name`` (``None``: a spec without phases)."""

    name: str | None
    first: int
    stop: int
    resolution: int


def schedule(spec: MixtureSpec, steps: int, resolution: int) -> list[Window]:
    """The run's phase windows: a phased spec's phases in order, cut at ``steps`` (the run's
    budget); a phase without its own resolution trains at ``resolution``.

    >>> from prx_assets.core.manifests import MixturePhase
    >>> p = [MixturePhase(name=n, steps=s, epoch_size=8, streams=(), expected_samples_per_stream={}, resolution=r)
    ...      for n, s, r in (("low", 3, 16), ("high", 2, None))]
    >>> spec = MixtureSpec(name="m", epoch_size=8, streams=(), expected_samples_per_stream={}, phases=tuple(p))
    >>> [(w.name, w.first, w.stop, w.resolution) for w in schedule(spec, 4, 32)]
    [('low', 0, 3, 16), ('high', 3, 4, 32)]
    """
    if not spec.phases:
        return [Window(None, 0, steps, resolution)]
    out, first = [], 0
    for p in spec.phases:
        if first >= steps:
            break
        out.append(Window(p.name, first, min(first + p.steps, steps), p.resolution or resolution))
        first += p.steps
    return out


def window_at(windows: list[Window], step: int) -> Window | None:
    """The window that holds step ``step`` (``None`` once every phase is done)."""
    return next((w for w in windows if w.first <= step < w.stop), None)


@dataclass
class Position:
    """Where a run is in its current phase's stream: the phase and the samples every rank took from it."""

    phase: str | None = None
    samples: int = 0  # per rank, the fewest any rank took (each rank's loader yields its share)
    state: dict[str, Any] | None = None  # the dataset's state_dict at that position


def phase_batches(windows: list[Window], start: int, open_phase: Callable[[Window, Position | None], Any],
                  batches_of: Callable[[Any], Iterator[list[dict[str, Any]]]],
                  resume: Position | None = None) -> Iterator[tuple[Window, Any, list[dict[str, Any]]]]:
    """``(window, dataset, batch)`` for every step from ``start``: each phase's dataset is opened
    (``open_phase(window, position to resume at or None)``) when its first step comes, read for
    exactly its steps, and closed before the next phase opens."""
    for window in windows:
        if window.stop <= start:
            continue
        at = resume if resume is not None and resume.phase == window.name and start > window.first else None
        dataset = open_phase(window, at)
        try:
            source = batches_of(dataset)
            for _ in range(window.stop - max(start, window.first)):
                yield window, dataset, next(source)
            if hasattr(source, "close"):  # a generator: ends its DataLoader (and its workers) now
                source.close()
        finally:
            close = getattr(dataset, "close", None)
            if close is not None:
                close()
