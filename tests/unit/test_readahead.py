"""Read-ahead across batches: a batch whose first images were decoded ahead, while the batch
before it finished, is stored exactly as without; read-ahead from other inputs, or one that
failed, is dropped; one batch at most is read ahead at a time."""

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import lance
import pytest

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.bad_inputs import write_bad_inputs
from prx_assets.core.ingest.batches import discover, load_manifest, load_manifests
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readahead import BatchInputs, ReadAhead
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.ingest.worker import shutdown_pool, worker_pools
from prx_assets.errors import ConfigError
from tests.helpers import write_folder_corpus


@pytest.fixture(autouse=True)
def pools() -> Iterator[None]:
    """Read-ahead threads use the worker processes of the block that owns them (``prx-assets run``'s)."""
    with worker_pools():
        yield


COLUMNS = ["image_id", "batch", "sha256", "jpeg", "phash", "width", "height", "stored_format", "q92_psnr_db"]


def _source(folder: Path, **ingest: object) -> SourceConfig:
    settings = IngestSettings(workers=2, processes=2, q92_sample_share=0.5, readahead=4)
    return SourceConfig(name="f", kind="folder", location=str(folder), batch_size=9,
                        ingest=dataclasses.replace(settings, **ingest))


def _inputs(cfg: SourceConfig, root: DataRoot, key: str) -> BatchInputs:
    return BatchInputs(resources=json.dumps({"root": root.uri}), source=cfg, manifest=load_manifest(root, key),
                       reader=reader_for(cfg))


def _tables(root: Path) -> tuple[list[dict], list[dict]]:
    rows = lance.dataset(str(root / "lance" / "images.lance")).to_table(columns=COLUMNS).to_pylist()
    rejects = lance.dataset(str(root / "lance" / "rejects.lance")).to_table(
        columns=["uri", "batch", "reason", "message"]).to_pylist()
    return sorted(rows, key=lambda r: r["image_id"]), sorted(rejects, key=lambda r: r["uri"])


def _summary(res: object) -> tuple:
    return (res.rows, res.rejects, res.q92_curves, sorted((w["uri"], w["warnings"]) for w in res.warning_examples),
            res.stored_formats, res.buckets)


def _wait_for(ra: ReadAhead, key: str) -> None:
    deadline = time.monotonic() + 60
    while ra.live_key != key or not ra._live.buffer:
        assert time.monotonic() < deadline, f"{key} was never read ahead"
        time.sleep(0.02)


def test_batches_read_ahead_are_stored_exactly_as_without(tmp_path: Path) -> None:
    write_bad_inputs(tmp_path / "bad", big_side=1200)  # rejects and decoder warnings among the images
    folder = tmp_path / "bad" / "folder"
    write_folder_corpus(folder / "good", n=12)
    cfg = _source(folder)
    plain_root, ahead_root = DataRoot(str(tmp_path / "plain")), DataRoot(str(tmp_path / "ahead"))
    discover(cfg, reader_for(cfg), plain_root)
    discover(cfg, reader_for(cfg), ahead_root)
    keys = [m.key for m in load_manifests(plain_root, "f")]
    assert len(keys) >= 3
    try:
        plain = [_summary(ingest_batch(load_manifest(plain_root, k), reader_for(cfg), plain_root, cfg.ingest))
                 for k in keys]
        ra = ReadAhead()
        ra.expect(keys, lambda k: _inputs(cfg, ahead_root, k))
        ra.start()
        ahead_results = []
        for key in keys:
            _wait_for(ra, key)  # the first from start(), each later one from after() of the one before
            ahead = ra.take(_inputs(cfg, ahead_root, key))
            assert ahead is not None and ahead.taken >= 1
            res = ingest_batch(load_manifest(ahead_root, key), reader_for(cfg), ahead_root, cfg.ingest,
                               outcomes=ahead.outcomes(), on_drained=lambda k=key: ra.after(k))
            if key != keys[-1]:
                assert ra.live_key == keys[keys.index(key) + 1]  # queued behind this batch's last items
            ahead_results.append(_summary(res))
        assert ra.live_key is None
    finally:
        shutdown_pool()
    assert ahead_results == plain
    assert _tables(tmp_path / "ahead") == _tables(tmp_path / "plain")
    assert _tables(tmp_path / "plain")[0] and _tables(tmp_path / "plain")[1]


def test_read_ahead_from_other_inputs_or_failed_is_dropped(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    write_folder_corpus(folder, n=20, broken=False)
    cfg = _source(folder)
    root = DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    first, second = (m.key for m in load_manifests(root, "f")[:2])
    ra = ReadAhead()
    try:
        ra.expect([first, second], lambda k: _inputs(cfg, root, k))
        ra.start()
        _wait_for(ra, first)
        other = _source(folder, jpeg_quality=90)  # the run's settings changed since: stored bytes differ
        assert ra.take(_inputs(other, root, first)) is None
        assert ra.live_key is None
        assert ra.take(_inputs(cfg, root, second)) is None  # never read ahead: nothing to take

        class Broken:
            def read_unit(self, unit: object) -> object:
                raise ConfigError("the source's folder is gone")

        ra.expect([first], lambda k: dataclasses.replace(_inputs(cfg, root, k), reader=Broken()))
        ra.start()
        deadline = time.monotonic() + 30
        while ra._live.error is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert ra.take(_inputs(cfg, root, first)) is None  # its run reads the batch afresh and meets the error

        ra.expect([first, second], lambda k: _inputs(cfg, root, k))
        ra.start()
        _wait_for(ra, first)
        ra.expect([second], lambda k: _inputs(cfg, root, k))  # no longer planned: dropped
        assert ra.live_key is None
        ra.start()
        _wait_for(ra, second)
        ra.clear()
        assert ra.live_key is None
    finally:
        shutdown_pool()


@pytest.mark.parametrize("ingest", [{"readahead": 0}, {"processes": 1}])
def test_nothing_is_read_ahead_when_turned_off_or_without_worker_processes(tmp_path: Path,
                                                                           ingest: dict) -> None:
    folder = tmp_path / "files"
    write_folder_corpus(folder, n=4, broken=False)
    cfg = _source(folder, **ingest)
    root = DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    key = load_manifests(root, "f")[0].key
    ra = ReadAhead()
    ra.expect([key], lambda k: _inputs(cfg, root, k))
    ra.start()
    assert ra.live_key is None and ra.take(_inputs(cfg, root, key)) is None


@pytest.mark.parametrize(("argv", "first"), [(["run"], ["server", "discovery"]),
                                             (["run", "--select", "raw_images"], ["server", "discovery"]),
                                             (["run", "--select=*training_mixture"], ["server", "discovery"]),
                                             (["run", "--select", "lance_table"], ["server", "discovery only"]),
                                             (["demo", "--small"], ["server"]), (["run", "--dry-run"], []),
                                             (["run", "--help"], []), (["status"], [])])
def test_the_console_script_starts_the_worker_server_first_only_for_a_run(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], first: list[str]) -> None:
    """Before the CLI's imports: the workers' server for ``run`` and ``demo``, and for ``run`` the
    discovery that reads the first new batch ahead (:mod:`prx_assets.core.ingest.early`), unless
    the selection names assets, none of them ``raw_images``."""
    import prx_assets.cli
    import prx_assets.core.ingest.early as early
    import prx_assets.core.ingest.worker as worker
    from prx_assets.entry import main

    calls: list[str] = []
    monkeypatch.setattr(worker, "start_server", lambda: calls.append("server"))
    monkeypatch.setattr(early, "begin", lambda read_ahead: calls.append("discovery" if read_ahead else "discovery only"))
    monkeypatch.setattr(prx_assets.cli, "main", lambda args: calls.append(f"cli {' '.join(args)}") or 0)
    assert main(argv) == 0
    assert calls == [*first, f"cli {' '.join(argv)}"]


def test_the_console_script_freezes_the_collector_before_exiting_and_only_then(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console script's own call (no arguments given: ``sys.argv``'s) freezes the collector's
    objects once the command is done, so the interpreter's exit does not collect over them; a call
    with arguments (a caller that goes on) does not."""
    import gc
    import sys

    import prx_assets.cli
    from prx_assets.entry import main

    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(prx_assets.cli, "main", lambda args: calls.append(f"cli {' '.join(args)}") or 3)
    monkeypatch.setattr(sys, "argv", ["prx-assets", "status"])
    assert main() == 3
    assert calls == ["cli status", "freeze"]
    calls.clear()
    assert main(["status"]) == 3
    assert calls == ["cli status"]


def test_the_worker_server_started_first_is_the_one_the_pool_forks_from(tmp_path: Path) -> None:
    from multiprocessing import forkserver

    from prx_assets.core.ingest.worker import start_server

    start_server()
    pid = forkserver._forkserver._forkserver_pid
    assert pid is not None
    folder = tmp_path / "files"
    write_folder_corpus(folder, n=3, broken=False)
    cfg = _source(folder)
    root = DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    try:
        res = ingest_batch(load_manifests(root, "f")[0], reader_for(cfg), root, cfg.ingest)
    finally:
        shutdown_pool()
    assert res.rows == 3 and res.processes == 2
    assert forkserver._forkserver._forkserver_pid == pid


def test_a_read_ahead_holds_at_most_its_bytes(tmp_path: Path) -> None:
    from prx_assets.core.ingest.readahead import Ahead

    folder = tmp_path / "files"
    write_folder_corpus(folder, n=6, broken=False)
    cfg = _source(folder, readahead=100)
    root = DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    key = load_manifests(root, "f")[0].key
    try:
        ahead = Ahead(_inputs(cfg, root, key), limit=100, on_drained=lambda: None, max_bytes=1)
        ahead._thread.join(60)
        assert len(ahead.buffer) == 1 and ahead.bytes > 1
        rest = list(ahead.outcomes())
        assert len(rest) == 6
    finally:
        shutdown_pool()


def test_a_batch_that_cannot_be_resolved_is_not_read_ahead_and_fails_nothing() -> None:
    def missing(key: str) -> BatchInputs:
        raise FileNotFoundError(f"no manifest for {key}")

    ra = ReadAhead()
    ra.expect(["f-00001", "f-00002"], missing)
    ra.start()
    ra.after("f-00001")  # from inside the batch before it: must not raise into that run
    assert ra.live_key is None
