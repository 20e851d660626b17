"""One bad file never takes down a source: links, special files, corrupt Parquet files and bad
rows become reject rows with a reason, and everything else in the source is ingested."""

import os
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import discover, load_manifests
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from tests.helpers import encode, photo, write_folder_corpus


def _ingest_all(cfg: SourceConfig, root: DataRoot) -> tuple[int, dict[str, int], list[dict]]:
    discover(cfg, reader_for(cfg), root)
    rows, reasons = 0, {}
    for m in load_manifests(root, cfg.name):
        res = ingest_batch(m, reader_for(cfg), root, cfg.ingest)
        rows += res.rows
        for k, v in res.rejects.items():
            reasons[k] = reasons.get(k, 0) + v
    rejects = lance.dataset(root.join("lance/rejects.lance")).to_table().to_pylist()
    return rows, reasons, [r for r in rejects if r["source"] == cfg.name]


def test_links_and_special_files_are_recorded_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=4, broken=False)
    outside = tmp_path / "secret.jpg"
    outside.write_bytes(encode(photo(200, 150, seed=7), "JPEG"))
    (folder / "out.jpg").symlink_to(outside)  # leads out of the source
    (folder / "in.jpg").symlink_to(folder / "img_0_000.jpg")  # stays inside: ingested
    (folder / "dangling.jpg").symlink_to(tmp_path / "nothing.jpg")
    (folder / "loop.jpg").symlink_to(folder / "loop.jpg")
    os.mkfifo(folder / "pipe.jpg")
    cfg = SourceConfig(name="photos", kind="folder", location=str(folder), batch_size=100,
                       ingest=IngestSettings(workers=1))
    rows, reasons, rejects = _ingest_all(cfg, DataRoot(str(tmp_path / "root")))
    assert rows == 5  # four files and the link inside the folder
    assert reasons == {"outside_source": 1, "read_error": 2, "not_a_file": 1}
    by_name = {Path(r["uri"]).name: r for r in rejects}
    assert by_name["out.jpg"]["reason"] == "outside_source" and "follow_links" in by_name["out.jpg"]["message"]
    assert by_name["pipe.jpg"]["reason"] == "not_a_file"
    assert by_name["out.jpg"]["orig_bytes"] == 0  # nothing of the outside file was read

    followed = SourceConfig(name="linked", kind="folder", location=str(folder), batch_size=100,
                            ingest=IngestSettings(workers=1), follow_links=True)
    rows, reasons, _ = _ingest_all(followed, DataRoot(str(tmp_path / "root2")))
    assert rows == 6 and "outside_source" not in reasons


def test_every_file_is_accounted_whatever_its_name_and_under_directory_links(tmp_path: Path) -> None:
    """A name that is not valid UTF-8 is ingested under a reversible percent-escaped key (and does
    not stop discovery for the other files); a directory link leading out of the folder gives one
    reject per file under it (or, with follow_links, their rows); one inside is not read twice."""
    from prx_assets.core.ingest.folder import key_of_name, path_of_key

    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=3, broken=False)
    odd = os.fsdecode(b"bad_utf8_\xff\xfe.jpg")
    (folder / odd).write_bytes(encode(photo(200, 150, seed=3), "JPEG"))
    (folder / os.fsdecode(b"dir_\xe9")).mkdir()
    (folder / os.fsdecode(b"dir_\xe9") / "x%41.jpg").write_bytes(encode(photo(180, 150, seed=4), "JPEG"))
    outside = tmp_path / "elsewhere"
    write_folder_corpus(outside, n=3, broken=False, seed=5)
    (folder / "linked").symlink_to(outside, target_is_directory=True)
    (folder / "inner").symlink_to(folder / "sub", target_is_directory=True)  # inside: listed where it is
    assert key_of_name(odd) == "bad_utf8_%FF%FE.jpg" and path_of_key(folder, key_of_name(odd)) == folder / odd
    for full in (False, True):
        cfg = SourceConfig(name="photos", kind="folder", location=str(folder), batch_size=100,
                           ingest=IngestSettings(workers=1))
        root = DataRoot(str(tmp_path / f"root{full}"))
        if full:
            assert len(reader_for(cfg).list_units()) == 3 + 2 + 3
        rows, reasons, rejects = _ingest_all(cfg, root)
        assert rows == 5 and reasons == {"outside_source": 3}, (rows, reasons)
        assert len(rejects) == 3 and all(r["uri"].startswith(f"{folder}/linked/") for r in rejects)
        uris = lance.dataset(root.join("lance/images.lance")).to_table(columns=["uri"]).column(0).to_pylist()
        assert f"{folder}/bad_utf8_%FF%FE.jpg" in uris and f"{folder}/dir_%E9/x%2541.jpg" in uris
        assert not any("/inner/" in u for u in uris)

    followed = SourceConfig(name="linked", kind="folder", location=str(folder), batch_size=100,
                            ingest=IngestSettings(workers=1), follow_links=True)
    rows, reasons, _ = _ingest_all(followed, DataRoot(str(tmp_path / "root3")))
    assert rows == 8 and not reasons


def test_corrupt_parquet_files_and_bad_rows_are_rejects(tmp_path: Path) -> None:
    folder = tmp_path / "pq"
    folder.mkdir()
    imgs = [encode(photo(120, 100, seed=i), "PNG") for i in range(8)]
    good = pa.table({"image": pa.array(imgs, pa.binary())})
    pq.write_table(good, folder / "a.parquet", row_group_size=4)
    (folder / "empty.parquet").write_bytes(b"")
    (folder / "garbage.parquet").write_bytes(b"PAR1 this is not parquet" * 20)
    pq.write_table(good.slice(0, 3), folder / "b.parquet")
    pq.write_table(pa.table({"image": ["a path, not bytes", "another"]}), folder / "c.parquet")  # strings
    cfg = SourceConfig(name="pq", kind="parquet", location=str(folder), batch_size=100,
                       ingest=IngestSettings(workers=1))
    rows, reasons, rejects = _ingest_all(cfg, DataRoot(str(tmp_path / "root")))
    assert rows == 11  # a.parquet and b.parquet whole
    assert reasons == {"unreadable_unit": 2, "bad_row": 2}
    assert {Path(r["uri"].split("#")[0]).name for r in rejects} == {"empty.parquet", "garbage.parquet", "c.parquet"}
    assert all(r["message"] for r in rejects)


def test_every_bad_input_is_accounted_for_and_other_sources_are_unaffected(tmp_path: Path) -> None:
    """36 bad, hostile or merely hard inputs over a folder, a Parquet and a WebDataset source, next
    to a good source: each becomes a row or a reject with the expected reason; nothing is lost."""
    import lance

    from prx_assets.core.demo.bad_inputs import outcome_name, write_bad_inputs
    from prx_assets.core.ingest.batches import load_manifests
    from prx_assets.core.ingest.pipeline import ingest_batch

    items = write_bad_inputs(tmp_path / "bad", big_side=1200)
    assert len(items) == 36
    good = tmp_path / "good"
    write_folder_corpus(good, n=5, broken=False)
    root = DataRoot(str(tmp_path / "root"))
    dirs = {"folder": tmp_path / "bad" / "folder", "table": tmp_path / "bad" / "table",
            "shards": tmp_path / "bad" / "shards", "good": good}
    kinds = {"folder": "folder", "table": "parquet", "shards": "webdataset", "good": "folder"}
    for name, where in dirs.items():
        cfg = SourceConfig(name=name, kind=kinds[name], location=str(where), batch_size=100,
                           ingest=IngestSettings(workers=2))
        discover(cfg, reader_for(cfg), root)
        for m in load_manifests(root, name):
            ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    got: dict[tuple[str, str], str] = {}
    images = lance.dataset(root.join("lance/images.lance")).to_table(columns=["source", "uri"]).to_pylist()
    rejects = lance.dataset(root.join("lance/rejects.lance")).to_table(
        columns=["source", "uri", "reason", "message"]).to_pylist()
    for r in images:
        got[(r["source"], outcome_name(str(dirs[r["source"]]), r["uri"]))] = "row"
    for r in rejects:
        assert r["message"], r  # every reject says why
        got[(r["source"], outcome_name(str(dirs[r["source"]]), r["uri"]))] = r["reason"]
    expected = {(i.source, i.name): i.expect for i in items}
    assert {k: v for k, v in got.items() if k[0] != "good"} == expected
    assert sum(1 for k, v in got.items() if k[0] == "good" and v == "row") == 5  # the good source: all in
