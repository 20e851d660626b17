"""Writer leases: one holder per partition, waiting, takeover of dead or silent holders, local, S3 and GCS."""

import json
import subprocess
import threading
import time
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.enrich.enrichment import Decoding, enrich_batch
from prx_assets.core.lab.schema import CAPTIONS_SCHEMA, CAPTIONS_TABLE
from prx_assets.core.lab.table import table_uri
from prx_assets.core.leases import Lease, LeaseBusy, LeaseLost, list_leases, read_holder
from prx_assets.infra.doctor import check_leases
from tests.unit.test_enrichment import PAYLOAD, batch  # noqa: F401 (fixture)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _plant(root: DataRoot, name: str, gen: int, **doc: object) -> None:
    base = {"owner": "someone", "host": "elsewhere", "pid": 1, "acquired_at": time.time(), "ttl": 60.0}
    root.write_bytes(f"leases/{name}/{gen:010d}.json", json.dumps({**base, **doc}).encode())


@pytest.fixture(params=["local", "s3", "gs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> DataRoot:
    if request.param == "local":
        return DataRoot(str(tmp_path / "root"))
    env = request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")
    return DataRoot(f"{request.param}://{env['BUCKET']}/root")


def test_release_leaves_nothing_and_second_writer_waits(root: DataRoot) -> None:
    first = Lease(root, "images/b-1", ttl=5).acquire()
    assert read_holder(root, "images/b-1").generation == first.generation == 1
    got: list[Lease] = []
    waiting: list[str] = []
    second = Lease(root, "images/b-1", ttl=5, wait=30, on_wait=lambda h: waiting.append(h.owner))
    t = threading.Thread(target=lambda: got.append(second.acquire()))
    t.start()
    time.sleep(1.0)
    assert not got and waiting == [first.owner]  # held by a live writer: the second waits
    first.release()
    t.join(timeout=20)
    assert got and second.waited >= 0.5 and second.took_over is None
    second.release()
    assert read_holder(root, "images/b-1") is None
    assert root.list("leases") == []


def test_busy_names_the_holder(root: DataRoot) -> None:
    with Lease(root, "lab", owner="run abc", ttl=5), \
            pytest.raises(LeaseBusy, match=r"'lab' .*held by run abc.*doctor --repair"):
        Lease(root, "lab", ttl=5, wait=0.3).acquire()


def test_dead_process_on_this_host_is_taken_over_at_once(root: DataRoot) -> None:
    import socket

    _plant(root, "lab", 1, host=socket.gethostname(), pid=_dead_pid(), ttl=3600)
    with Lease(root, "lab", wait=5) as lease:
        assert lease.generation == 2 and "is gone" in (lease.took_over or "")
        assert [h.generation for h in list_leases(root)] == [2]  # the dead generation is removed


def test_silent_holder_elsewhere_is_taken_over_after_ttl(root: DataRoot) -> None:
    _plant(root, "lab", 4, acquired_at=time.time() - 100, ttl=60)
    with Lease(root, "lab", wait=5) as lease:
        assert lease.generation == 5 and "no heartbeat for 100 s" in (lease.took_over or "")
    _plant(root, "lab", 1, acquired_at=time.time(), ttl=60)  # a live holder elsewhere is respected
    with pytest.raises(LeaseBusy):
        Lease(root, "lab", wait=0.2).acquire()


def test_heartbeat_keeps_a_long_writer_and_a_taken_over_writer_stops(root: DataRoot) -> None:
    lease = Lease(root, "captions/k/b", ttl=0.8).acquire()
    time.sleep(1.6)  # twice the ttl: the heartbeat kept it fresh
    assert read_holder(root, "captions/k/b").stale() is None
    lease.check()
    _plant(root, "captions/k/b", 2)  # another writer took over (as if this one had stalled)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            lease.check()
        except LeaseLost as e:
            assert "taken over" in str(e) and "re-run" in str(e)
            break
        time.sleep(0.1)
    else:
        pytest.fail("the lease was never marked lost")
    lease.release()  # a lost lease leaves the new holder's files alone
    assert read_holder(root, "captions/k/b").generation == 2


def test_racing_writers_one_generation_one_winner(root: DataRoot) -> None:
    held: list[int] = []
    lock = threading.Lock()
    inside = [0]
    barrier = threading.Barrier(4)

    def writer() -> None:
        barrier.wait()
        with Lease(root, "raw_images/b-9", ttl=5, wait=60):
            with lock:
                inside[0] += 1
                held.append(inside[0])
            time.sleep(0.2)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert held == [1, 1, 1, 1]  # never two inside at once


def test_doctor_frees_stale_leases_only(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path))
    _plant(root, "lab", 3, acquired_at=time.time() - 1000, ttl=60)
    with Lease(root, "raw_images/b-1", ttl=30):
        found = check_leases(root, repair=False)
        assert [(f.kind, f.where, f.repaired) for f in found] == [("stale_lease", "lab", False)]
        assert "no heartbeat" in found[0].detail
        assert [f.repaired for f in check_leases(root, repair=True)] == [True]
        assert [h.name for h in list_leases(root)] == ["raw_images/b-1"]


def test_two_enrichments_of_one_batch_at_once_write_no_duplicate(batch) -> None:  # noqa: F811
    root, key, _ = batch
    calls: list[int] = []

    def factory():
        calls.append(1)

        def compute(images):
            time.sleep(0.3)  # long enough for both writers to be inside at once without the lease
            return [{"caption": "a photo", "tokens": 2, "seconds": 0.0, "hit_max_tokens": False, "model": "m"}
                    for _ in images]
        return compute

    results = []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        results.append(enrich_batch(root, key, CAPTIONS_TABLE, CAPTIONS_SCHEMA, "captioner_id", "c-1", PAYLOAD,
                                    factory, decoding=Decoding(count=2), commit_every=2))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    t = lance.dataset(table_uri(root, CAPTIONS_TABLE)).to_table(columns=["captioner_id", "image_id"])
    keys = t.group_by(["captioner_id", "image_id"]).aggregate([([], "count_all")])
    assert t.num_rows == 5 and pa.compute.max(keys.column("count_all")).as_py() == 1
    assert sorted(r.written for r in results) == [0, 5] and calls == [1]  # the second found it done
    assert max(r.lease_wait_seconds for r in results) > 0


def test_a_lease_folder_removed_by_a_release_mid_write_or_mid_listing_is_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer releasing the last generation removes the empty lease folder; another taking the lease
    at that moment may find it gone between making it and writing, or while listing it."""
    import shutil

    root = DataRoot(str(tmp_path))
    real = Path.write_bytes
    removed: list[Path] = []

    def write_after_removal(self: Path, data: bytes) -> int:
        if not removed:  # the folder vanishes once, right after it was made
            removed.append(self.parent)
            shutil.rmtree(self.parent)
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_after_removal)
    assert root.write_new("leases/t/p/0000000001.json", b"{}")
    root.write_bytes("leases/t/p/0000000001.beat", b"{}")
    assert removed and sorted(root.list("leases/t/p")) == ["leases/t/p/0000000001.beat", "leases/t/p/0000000001.json"]
    monkeypatch.setattr(Path, "write_bytes", real)

    real_rglob = Path.rglob

    def rglob_after_removal(self: Path, pattern: str) -> object:
        shutil.rmtree(self)
        return real_rglob(self, pattern)

    monkeypatch.setattr(Path, "rglob", rglob_after_removal)
    assert root.list("leases/t/p") == []
