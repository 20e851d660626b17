"""A `prx-assets run` started in the background stays stoppable by SIGTERM, and so do the processes it
starts after its in-process runs (Dagster maps SIGTERM to SIGINT's handler, which such a process
inherits as ignored)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator

import dagster as dg
import pytest

from prx_assets.cli import _execute
from prx_assets.core.processes import sigterm_kept


@dg.asset
def _trivial() -> int:
    return 1


@pytest.fixture
def sigint_ignored() -> Iterator[None]:
    """SIGINT as a shell without job control hands it to a background command (`cmd &`, nohup, cron)."""
    before_int, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before_int)
        signal.signal(signal.SIGTERM, before_term)


def _child_stops_on_sigterm() -> int:
    """Start a child now, SIGTERM it, return its exit status (-SIGTERM when the signal killed it)."""
    proc = subprocess.Popen(["sleep", "60"])
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_in_process_run_leaves_sigterm_as_it_found_it(sigint_ignored: None) -> None:
    with dg.DagsterInstance.ephemeral() as instance, sigterm_kept():
        assert dg.materialize([_trivial], instance=instance).success
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert _child_stops_on_sigterm() == -signal.SIGTERM


def test_prx_assets_run_executes_each_partition_keeping_sigterm(sigint_ignored: None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = dg.Definitions(assets=[_trivial]).resolve_implicit_global_asset_job_def()
    with dg.DagsterInstance.ephemeral() as instance:
        for _ in range(2):
            assert _execute(job, instance, _trivial.key, None, "WARNING", "[1/1]") == 0
    assert "_trivial: ok" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert _child_stops_on_sigterm() == -signal.SIGTERM

