"""The Pipes message file is read line by line, never a line cut by a write still in progress; a job
that completed without reporting its result fails its step."""

import json
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from prx_assets.resources.pipes_slurm import LineFileMessageReader, tail_lines


class _Handler:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def handle_message(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def report_pipes_framework_exception(self, origin: str, exc_info: Any) -> None:
        self.errors.append(f"{origin}: {exc_info[1]}")


def test_a_line_written_in_two_parts_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    first = json.dumps({"method": "report_asset_materialization", "params": {"metadata": {"x": "y" * 3000}}})
    path.write_text("")
    stop = threading.Event()
    handler = _Handler()
    reader = LineFileMessageReader(str(path), cleanup_file=False)
    thread = threading.Thread(target=reader.read_until, args=(handler, stop), daemon=True)
    thread.start()
    with open(path, "a", encoding="utf-8") as f:
        f.write(first[:1700])  # what Dagster's tail_file would hand to json.loads on its own
        f.flush()
        time.sleep(0.2)  # the reader polls several times while the line is incomplete
        f.write(first[1700:] + "\n")
        f.write('{"method": "closed"}')  # the last line, without its newline when the session closes
        f.flush()
    time.sleep(0.1)
    stop.set()
    thread.join(5)
    assert handler.errors == []
    assert handler.messages == [json.loads(first), {"method": "closed"}]


def test_tail_lines_reads_what_was_written_before_the_stop(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    path.write_text("a\nb\npartial")
    assert list(tail_lines(str(path), lambda: True)) == ["a\n", "b\n", "partial"]


def test_lines_written_just_before_the_stop_come_out_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "messages.jsonl"
    path.write_text("")
    calls = []

    def should_stop() -> bool:  # the first time it is asked, the job writes its last lines
        if not calls:
            path.write_text('{"a": 1}\n{"b": 2}\n{"c": 3}')
        calls.append(1)
        return True

    assert [json.loads(line) for line in tail_lines(str(path), should_stop)] == [{"a": 1}, {"b": 2}, {"c": 3}]


class _Completed:
    """A completed invocation as Dagster builds it: with ``implicit_materialization`` (Dagster's
    default) a job that reported nothing still yields an empty materialization."""

    def __init__(self, results: list[dg.MaterializeResult]) -> None:
        self.results = results
        self.metadata = {"job_id": "42", "log": "/jobs/j/job.log", "messages": "/jobs/j/pipes_messages.jsonl"}

    def get_materialize_result(self, implicit_materialization: bool = True) -> dg.MaterializeResult:
        from dagster._core.pipes.client import materialize_result_from_pipes_results

        implicit = [dg.MaterializeResult()] if implicit_materialization and not self.results else []
        return materialize_result_from_pipes_results([*self.results, *implicit])


def test_a_job_that_reported_no_result_fails_the_step_naming_the_job() -> None:
    from prx_assets.resources.pipes_slurm import reported_result

    assert _Completed([]).get_materialize_result().data_version is None  # what the step recorded before
    with pytest.raises(dg.Failure) as err:
        reported_result(_Completed([]), "training_run[mix]")  # type: ignore[arg-type]
    text = err.value.description or ""
    assert "training_run[mix]: job 42 completed but its result never arrived" in text
    assert "/jobs/j/pipes_messages.jsonl" in text and "/jobs/j/job.log" in text
    done = dg.MaterializeResult(metadata={"loss_last": 0.5}, data_version=dg.DataVersion("v1"))
    assert reported_result(_Completed([done]), "training_run[mix]").data_version == dg.DataVersion("v1")  # type: ignore[arg-type]
