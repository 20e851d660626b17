"""Dagster runs that will never end on their own, from any launcher (the UI, the daemon, a sensor, a
backfill, ``dagster asset materialize``, ``prx-assets run``), and how to end them.

A run is judged from what the instance recorded: its status, its events (every event carries the
pid of the process that wrote it: the run worker and each step process) and when it last heard
from the run. A run is stuck when

- its processes are all gone (killed, the machine rebooted) while it still says STARTING, STARTED
  or CANCELING;
- it has been CANCELING for ``quiet`` with no event (a termination that nothing carried out);
- every step it started has finished and nothing has been heard for ``quiet``, yet it never ended
  (a step process that does not exit after its step: the symptom of a worker pool left for the
  interpreter's exit);
- it has been NOT_STARTED for ``quiet``: created by a launcher that died before starting it.

Processes are looked at only where they can be: on this host (the run's ``prx/host`` tag, or no tag
and the instance's launcher is Dagster's default one, which runs every run in a subprocess of a
code server on this host). Elsewhere only the event silence counts. Repair ends the run's live
processes and their children (SIGTERM, then SIGKILL), then marks it CANCELED (it was being
canceled) or FAILURE, saying why.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

import dagster as dg

from prx_assets.core.processes import end_processes, pid_alive

#: Tags ``prx-assets run`` puts on its in-process runs, so its process can be recognized.
HOST_TAG, PID_TAG = "prx/host", "prx/pid"
#: Minutes without an event after which a CANCELING run, a finished-but-open run or a NOT_STARTED
#: run counts as stuck (``prx-assets doctor --quiet-minutes``).
QUIET_MINUTES = 10.0
OPEN_STATUSES = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                 dg.DagsterRunStatus.CANCELING]
#: Events written by the run worker itself (the process that executes the run).
_RUN_WORKER = {"PIPELINE_START", "RUN_START", "PIPELINE_SUCCESS", "RUN_SUCCESS"}
_STEP_DONE = {"STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED", "STEP_UP_FOR_RETRY"}


@dataclass
class RunEvidence:
    """What the instance holds about one open run."""

    run_id: str
    status: dg.DagsterRunStatus
    job: str
    local: bool
    pids: set[int] = field(default_factory=set)
    last_event: float = 0.0
    steps_started: int = 0
    steps_done: int = 0

    def alive(self) -> list[int]:
        """The run's recorded processes that still exist (on this host; ``[]`` elsewhere)."""
        me = os.getpid()
        return sorted(p for p in self.pids if self.local and p != me and pid_alive(p))


@dataclass
class StuckRun:
    """A run that will not end by itself, and why that is thought."""

    evidence: RunEvidence
    why: str

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.evidence.run_id


def _is_local(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    host = run.tags.get(HOST_TAG)
    if host is not None:
        return host == socket.gethostname()
    return isinstance(instance.run_launcher, dg.DefaultRunLauncher)


def gather(instance: dg.DagsterInstance, record: dg.RunRecord) -> RunEvidence:
    """The evidence of one run: pids, last event, steps started and finished (events read in pages)."""
    run = record.dagster_run
    ev = RunEvidence(run_id=run.run_id, status=run.status, job=run.job_name, local=_is_local(instance, run),
                     last_event=record.update_timestamp.timestamp())
    tagged = run.tags.get(PID_TAG, "")
    if tagged.isdigit():
        ev.pids.add(int(tagged))
    cursor = None
    while True:
        conn = instance.get_records_for_run(run.run_id, cursor=cursor, limit=1000)
        for rec in conn.records:
            entry = rec.event_log_entry
            ev.last_event = max(ev.last_event, entry.timestamp)
            event = entry.dagster_event
            if event is None:
                continue
            if event.pid is not None and (event.step_key or event.event_type_value in _RUN_WORKER):
                ev.pids.add(event.pid)  # not the launcher's or the terminator's (the webserver, the daemon)
            if event.event_type_value == "STEP_START":
                ev.steps_started += 1
            elif event.event_type_value in _STEP_DONE:
                ev.steps_done += 1
        cursor = conn.cursor
        if not conn.has_more:
            return ev


def judge(ev: RunEvidence, quiet_s: float, now: float) -> str | None:
    """Why ``ev``'s run is stuck, or ``None`` when nothing says so."""
    silent = now - ev.last_event
    mins = f"{silent / 60:.0f} min"
    alive = ev.alive()
    alive_text = f"; its processes {', '.join(map(str, alive))} are still alive" if alive else ""
    if ev.status == dg.DagsterRunStatus.NOT_STARTED:
        return f"NOT_STARTED for {mins}: the process that created it never started it" if silent >= quiet_s else None
    if ev.local and ev.pids and not alive:
        return (f"{ev.status.value} but every process that ran it is gone "
                f"(pids {', '.join(map(str, sorted(ev.pids)))} on {socket.gethostname()})")
    if silent < quiet_s:
        return None
    if ev.status == dg.DagsterRunStatus.CANCELING:
        return f"CANCELING for {mins} with no event: the termination was never carried out{alive_text}"
    if ev.steps_started and ev.steps_done >= ev.steps_started:
        return (f"every step finished {mins} ago but the run never ended (a process that does not exit "
                f"after its step){alive_text}")
    if ev.status == dg.DagsterRunStatus.STARTING and not ev.pids:
        return f"STARTING for {mins} and no process of it ever reported"
    return None


def stuck_runs(instance: dg.DagsterInstance, quiet_minutes: float = QUIET_MINUTES) -> list[StuckRun]:
    """Every open run of the instance that will not end on its own (see the module's docstring)."""
    now = time.time()
    out = []
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=OPEN_STATUSES)):
        ev = gather(instance, record)
        why = judge(ev, quiet_minutes * 60, now)
        if why is not None:
            out.append(StuckRun(ev, why))
    return out


def end_run(instance: dg.DagsterInstance, stuck: StuckRun) -> str:
    """End a stuck run: stop its live processes and their children, then mark it CANCELED (it was
    being canceled) or FAILURE. Returns what was done."""
    ev = stuck.evidence
    ended = end_processes(ev.alive())
    run = instance.get_run_by_id(ev.run_id)
    if run is None or run.is_finished:
        return "already ended"
    note = f"ended by prx-assets doctor: {stuck.why}" + (f"; stopped processes {', '.join(map(str, ended))}"
                                                            if ended else "")
    if run.status == dg.DagsterRunStatus.CANCELING:
        instance.report_run_canceled(run, note)
        return "marked CANCELED" + (f", stopped {len(ended)} processes" if ended else "")
    instance.report_run_failed(run, note)
    return "marked FAILURE" + (f", stopped {len(ended)} processes" if ended else "")
