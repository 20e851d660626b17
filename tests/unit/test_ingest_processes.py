"""Ingest in worker processes: the same rows, rejects and q92 curves as in threads, and a worker
process that dies costs its file, not the run."""

import dataclasses
from pathlib import Path

import lance
import pytest

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.bad_inputs import write_bad_inputs
from prx_assets.core.ingest.batches import discover, load_manifests
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.ingest.worker import shutdown_pool
from tests.helpers import write_folder_corpus

COLUMNS = ["image_id", "sha256", "jpeg", "phash", "width", "height", "stored_format", "q92_psnr_db"]


def _ingest(folder: Path, root: Path, processes: int,
            warned: list[dict] | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    cfg = SourceConfig(name="f", kind="folder", location=str(folder), batch_size=1000,
                       ingest=IngestSettings(workers=2, processes=processes, q92_sample_share=0.5))
    data_root = DataRoot(str(root))
    discover(cfg, reader_for(cfg), data_root)
    curves: list[dict] = []
    for m in load_manifests(data_root, "f"):
        res = ingest_batch(m, reader_for(cfg), data_root, cfg.ingest)
        assert res.processes == processes
        curves += res.q92_curves
        if warned is not None:
            warned += res.warning_examples
    rows = lance.dataset(str(root / "lance" / "images.lance")).to_table(columns=COLUMNS).to_pylist()
    rejects = lance.dataset(str(root / "lance" / "rejects.lance")).to_table(
        columns=["uri", "reason", "message"]).to_pylist()
    key = sorted
    return key(rows, key=lambda r: r["image_id"]), key(rejects, key=lambda r: r["uri"]), \
        key(curves, key=lambda c: c["label"])


def test_processes_ingest_exactly_what_threads_do(tmp_path: Path) -> None:
    write_bad_inputs(tmp_path / "bad", big_side=1200)  # every kind of bad file, small
    folder = tmp_path / "bad" / "folder"
    write_folder_corpus(folder / "good", n=12)
    warned_threads: list[dict] = []
    warned_processes: list[dict] = []
    try:
        in_threads = _ingest(folder, tmp_path / "a", processes=1, warned=warned_threads)
        in_processes = _ingest(folder, tmp_path / "b", processes=2, warned=warned_processes)
    finally:
        shutdown_pool()
    assert in_threads[0] and in_threads[1] and in_threads[2]
    assert in_processes == in_threads
    # images travel to the worker processes in chunks: each file's decoder warnings stay its own
    assert warned_threads
    def by_file(warned: list[dict]) -> list[tuple[str, str]]:
        return sorted((Path(w["uri"]).name, w["warnings"]) for w in warned)
    assert by_file(warned_processes) == by_file(warned_threads)


def test_a_worker_process_that_dies_costs_its_file_not_the_run(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "files"
    written = write_folder_corpus(folder, n=8, broken=False)
    victim = sorted(written)[3].name
    monkeypatch.setenv("PRX_CRASH_AT", f"ingest.worker:{victim}")
    try:
        rows, rejects, _ = _ingest(folder, tmp_path / "root", processes=2)
    finally:
        shutdown_pool()
    assert len(rows) == 7
    (rej,) = rejects
    assert rej["uri"].endswith(victim) and rej["reason"] == "corrupt" and "died on this file" in rej["message"]


def test_default_uses_processes_only_for_large_partitions() -> None:
    import os

    s = IngestSettings()
    cpus = os.cpu_count() or 1
    assert s.effective_processes(10) == 1
    assert s.effective_processes(500) == (cpus if cpus > 1 else 1)
    assert dataclasses.replace(s, processes=1).effective_processes(500) == 1


def test_where_worker_processes_cannot_run_threads_do_the_same_work(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes that cannot start, or that die whatever they run (a script without a main guard),
    never turn into rejects: the threads decode instead, once warned."""
    from prx_assets.core.ingest import worker

    class NoStart:
        def submit(self, *a: object, **k: object) -> None:
            raise RuntimeError("can't start new process")

    folder = tmp_path / "files"
    write_folder_corpus(folder, n=6, broken=False)
    monkeypatch.setattr(worker, "_UNAVAILABLE", [])
    monkeypatch.setattr(worker, "_pool", lambda size: NoStart())
    rows, rejects, _ = _ingest(folder, tmp_path / "a", processes=2)
    assert len(rows) == 6 and not rejects and "RuntimeError" in worker._UNAVAILABLE[0]

    monkeypatch.undo()
    monkeypatch.setattr(worker, "_UNAVAILABLE", [])
    monkeypatch.setattr(worker, "_healthy", lambda: False)  # every process dies, whatever it runs
    victim = sorted(p.name for p in folder.rglob("*.*"))[0]
    monkeypatch.setenv("PRX_CRASH_AT", f"ingest.worker:{victim}")
    try:
        rows, rejects, _ = _ingest(folder, tmp_path / "b", processes=2)
    finally:
        shutdown_pool()
    assert len(rows) == 6 and not rejects and "die before doing any work" in worker._UNAVAILABLE[0]
