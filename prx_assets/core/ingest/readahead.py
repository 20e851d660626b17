"""Read-ahead across ingest batches that one process runs one after another.

A process that ingests several batches in a row (``prx-assets run``) leaves its worker processes
idle between two of them: while it commits a batch to Lance,
runs its check and does Dagster's bookkeeping for the end of one run and the start of the next,
and, before the first, while it starts up (imports, the Dagster instance, planning). Measured on
``python -m bench peer``'s corpus (2 cores, 4 batches of 500), that was 0.8 s a batch and 2.4 s at
start-up, a third of the whole command.

The caller says which batches come next (:meth:`ReadAhead.expect`). When a batch's last item has
been handed to the workers (its last chunks are still being decoded), the next batch's first items
are read and queued behind them, and their outcomes held, up to ``readahead`` images of its
source's ingest settings, until that batch's run takes them (:meth:`ReadAhead.take`) and goes on
from there. The run checks they came from the same inputs (data root, source configuration,
manifest); if not, or if reading ahead failed, it drops them and starts afresh, so a run's rows are
the same with or without read-ahead. Nothing is written ahead: a batch read ahead that never runs
costs the CPU of at most ``readahead`` images. One batch at most is read ahead at a time.

Only with worker processes: their decoder warnings travel with each outcome, while warnings raised
in this process's threads are routed to their image only inside a run (:func:`.decoder_warnings.routed`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from prx_assets.core.config.project import SourceConfig
from prx_assets.core.ingest.batches import BatchManifest
from prx_assets.core.ingest.pipeline import Outcome, outcome_stream
from prx_assets.core.ingest.sources import SourceReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchInputs:
    """What decides a batch's outcomes: the settings of the resources it is read with (data root,
    config folder, object store; as :meth:`~prx_assets.core.stages.settings.StageResources.to_json`), its
    source's configuration (ingest settings included) and its manifest. The reader is not compared."""

    resources: str
    source: SourceConfig
    manifest: BatchManifest
    reader: SourceReader = field(compare=False, repr=False)

    @property
    def key(self) -> str:
        """The batch's partition key."""
        return self.manifest.key

    def readahead(self) -> int:
        """How many images of this batch may be read ahead (0: none)."""
        s = self.source.ingest
        return s.readahead if s.effective_processes(self.manifest.weight) > 1 else 0


#: The most stored bytes a read-ahead holds, whatever ``readahead`` says: 256 images of 1 Mpx hold
#: about 64 MB, of 24 Mpx about 1 GB.
MAX_BYTES = 256 << 20


class Ahead:
    """One batch being read ahead: a thread pulls its outcome stream into a buffer until the
    buffer holds ``limit`` outcomes or ``max_bytes`` of stored images, the stream ends, or the
    batch's run takes it over."""

    def __init__(self, inputs: BatchInputs, limit: int, on_drained: Callable[[], None],
                 max_bytes: int = MAX_BYTES) -> None:
        self.inputs = inputs
        self.buffer: list[Outcome] = []
        self.bytes = 0
        self.error: BaseException | None = None
        self.drained = False
        self.began = time.perf_counter()
        self.taken, self.taken_after = 0, 0.0
        self._stream = outcome_stream(inputs.manifest, inputs.reader, inputs.source.ingest, on_drained)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(limit, max_bytes), daemon=True,
                                        name=f"prx-readahead-{inputs.key}")
        self._thread.start()

    def _fill(self, limit: int, max_bytes: int) -> None:
        try:
            while len(self.buffer) < limit and self.bytes < max_bytes and not self._halt.is_set():
                try:
                    row, rej = next(self._stream)
                except StopIteration:
                    return
                self.buffer.append((row, rej))
                self.bytes += row["jpeg_bytes"] if row is not None else 0
        except BaseException as e:  # the run reads the batch afresh and meets the error itself
            self.error = e

    def halt(self) -> None:
        """Stop pulling (after the outcome being waited for) and wait for the thread; records how
        many outcomes were ready (:attr:`taken`) and how long after the read-ahead began
        (:attr:`taken_after`, seconds)."""
        self._halt.set()
        self._thread.join()
        self.taken, self.taken_after = len(self.buffer), time.perf_counter() - self.began

    def outcomes(self) -> Iterator[Outcome]:
        """The buffered outcomes, then the rest of the batch's (after :meth:`halt`)."""
        buffer, self.buffer = self.buffer, []
        yield from buffer
        yield from self._stream

    def close(self) -> None:
        """Stop and drop what was read (the worker tasks in flight finish and are discarded)."""
        self.halt()
        self.buffer = []
        try:
            self._stream.close()  # type: ignore[attr-defined]
        except Exception as e:  # a reader failing to close its files loses nothing here
            log.debug("closing the read-ahead of %s: %s", self.inputs.key, e)


class ReadAhead:
    """The batches this process will ingest next, in order, and the one being read ahead.

    Its lock is never held while waiting on a read-ahead thread (which calls :meth:`after` when
    its batch drains)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[str] = []
        self._resolve: Callable[[str], BatchInputs] | None = None
        self._live: Ahead | None = None

    def expect(self, keys: Sequence[str], resolve: Callable[[str], BatchInputs]) -> None:
        """The batches this process will ingest next, in that order; ``resolve(key)`` gives a
        batch's inputs. A batch being read ahead that is not among them is dropped."""
        with self._lock:
            self._queue = list(keys)
            self._resolve = resolve
            dropped = self._pop_live() if self._live is not None and self._live.inputs.key not in keys else None
        if dropped is not None:
            dropped.close()

    def start(self) -> None:
        """Read the first expected batch ahead now (unless one is already), e.g. before start-up
        work that leaves the workers idle."""
        with self._lock:
            if self._live is None and self._queue:
                self._begin(self._queue[0])

    def after(self, key: str) -> None:
        """``key``'s last item went to the workers: read the next expected batch ahead."""
        with self._lock:
            if self._live is not None:
                if self._live.inputs.key == key:  # drained while read ahead: the next waits for its run
                    self._live.drained = True
                return
            rest = [k for k in self._queue if k != key]
            if rest:
                self._begin(rest[0])

    def take(self, inputs: BatchInputs) -> Ahead | None:
        """The read-ahead of this batch, halted, for its run to go on from; ``None`` when there is
        none, it failed, or it was read from other inputs (then it is dropped)."""
        with self._lock:
            self._queue = [k for k in self._queue if k != inputs.key]
            if self._live is None or self._live.inputs.key != inputs.key:
                return None
            ahead = self._pop_live()
        ahead.halt()
        if ahead.error is not None or ahead.inputs != inputs:
            log.info("dropping the read-ahead of %s: %s", inputs.key,
                     f"it failed ({type(ahead.error).__name__}: {ahead.error})" if ahead.error is not None
                     else "its inputs differ from the run's")
            ahead.close()
            return None
        if ahead.drained:  # its last item is already with the workers: queue the next batch behind it
            self.start()
        return ahead

    def rebind(self, provisional: str, resources: str | None) -> None:
        """The batches expected with resource settings ``provisional`` (made before the runs'
        resources were known, see :mod:`.early`) were read with what ``resources`` holds: what is
        read ahead now counts as read with those, and so does what is read ahead next; ``None``: they
        were not, and are dropped, with what was expected. A read-ahead made with other settings is
        left as it is."""
        with self._lock:
            live, resolve = self._live, self._resolve
            if live is None or live.inputs.resources != provisional or resolve is None:
                return
            if resources is not None:
                live.inputs = replace(live.inputs, resources=resources)
                self._resolve = lambda key: replace(resolve(key), resources=resources)
                return
        self.clear()

    def clear(self) -> None:
        """Expect nothing more and drop any read-ahead."""
        with self._lock:
            self._queue = []
            dropped = self._pop_live()
        if dropped is not None:
            dropped.close()

    @property
    def live_key(self) -> str | None:
        """The batch being read ahead, if any."""
        with self._lock:
            return self._live.inputs.key if self._live is not None else None

    def _pop_live(self) -> Ahead | None:
        live, self._live = self._live, None
        return live

    def _begin(self, key: str) -> None:
        if self._resolve is None:
            return
        try:  # called from inside another batch's run: whatever fails here must not fail that run
            inputs = self._resolve(key)
            limit = inputs.readahead()
            if limit > 0:
                self._live = Ahead(inputs, limit, lambda: self.after(key))
        except Exception as e:  # its own run resolves it again and reports the problem there
            log.info("not reading %s ahead: %s: %s", key, type(e).__name__, e)


#: The process's read-ahead (batches run one at a time per process).
READAHEAD = ReadAhead()
