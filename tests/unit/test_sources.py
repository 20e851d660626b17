"""The four source kinds, local and on a real S3 API (moto server)."""

import io
import json
import tarfile
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prx_assets.core.config.project import SourceConfig
from prx_assets.core.ingest.readers import reader_for
from prx_assets.errors import ConfigError
from tests.helpers import encode, photo, write_folder_corpus


def src(kind: str, location: str, **kw: object) -> SourceConfig:
    return SourceConfig(name="s", kind=kind, location=location, batch_size=10, **kw)


def test_folder_lists_recursively_filters_and_reads_sidecars(tmp_path: Path) -> None:
    files = write_folder_corpus(tmp_path / "f", n=4)
    (tmp_path / "f" / ".hidden.jpg").write_bytes(b"x")
    (tmp_path / "f" / "notes.md").write_text("not listed")
    (tmp_path / "f" / "img_0_000.txt").write_text("a caption\n")
    r = reader_for(src("folder", str(tmp_path / "f"), caption_field="txt", license="cc0"))
    units = r.list_units()
    assert sorted(u.key for u in units) == sorted(
        str(p.relative_to(tmp_path / "f")) for p in files)
    first = next(r.read_unit(next(u for u in units if u.key == "img_0_000.jpg")))
    assert first.caption == "a caption" and first.license == "cc0"
    assert first.read() == (tmp_path / "f" / "img_0_000.jpg").read_bytes()
    flat = reader_for(src("folder", str(tmp_path / "f"), recursive=False)).list_units()
    assert all("/" not in u.key for u in flat) and len(flat) < len(units)


def parquet_file(path: Path, n: int, struct: bool = False, row_group: int = 3) -> None:
    imgs = [encode(photo(120, 100, seed=i), "PNG") for i in range(n)]
    col = pa.array([{"bytes": b, "path": f"{i}.png"} for i, b in enumerate(imgs)]) if struct else \
        pa.array(imgs, pa.binary())
    t = pa.table({"img": col, "text": [f"caption {i}" for i in range(n)],
                  "lic": ["cc-by"] * n, "url": [f"u{i}" for i in range(n)]})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path, row_group_size=row_group)


@pytest.mark.parametrize("struct", [False, True], ids=["binary", "hf_struct"])
def test_parquet_row_groups_columns_and_read_uri(tmp_path: Path, struct: bool) -> None:
    parquet_file(tmp_path / "p" / "a.parquet", 7, struct=struct)
    r = reader_for(src("parquet", str(tmp_path / "p"), image_column="img", caption_field="text",
                       license_field="lic", carry=("url",)))
    units = r.list_units()
    assert [u.weight for u in units] == [3, 3, 1]
    items = [it for u in units for it in r.read_unit(u)]
    assert [it.uri.rsplit("#", 1)[1] for it in items] == [f"row={i}" for i in range(7)]
    assert items[4].caption == "caption 4" and items[4].license == "cc-by"
    assert items[4].extra == {"url": "u4"}
    assert r.read_uri(items[4].uri) == items[4].data
    assert r.list_units({units[0].key.split("#")[0]: units[0].stamp}) == []  # known file: not opened
    with pytest.raises(ConfigError, match=r"no column 'image'.*set image_column"):
        reader_for(src("parquet", str(tmp_path / "p"))).list_units()


def wds_tar(path: Path, n: int, missing_image_at: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for k in range(n):
            members = {"txt": f"cap {k}".encode(), "json": json.dumps({"license": "cc0", "url": f"w{k}"}).encode()}
            if k != missing_image_at:
                members["jpg"] = encode(photo(100, 90, seed=k), "JPEG")
            for ext, data in members.items():
                info = tarfile.TarInfo(f"shard/s{k:04d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_webdataset_groups_samples_and_flags_missing_images(tmp_path: Path) -> None:
    wds_tar(tmp_path / "w" / "000.tar", 4, missing_image_at=2)
    r = reader_for(src("webdataset", str(tmp_path / "w"), caption_field="txt", license_field="license",
                       carry=("url",)))
    units = r.list_units()
    assert len(units) == 1
    items = list(r.read_unit(units[0]))
    assert [it.uri.rsplit("#", 1)[1] for it in items] == [f"shard/s{k:04d}" for k in range(4)]
    assert items[2].error is not None and items[2].error[0] == "no_image_member"
    assert items[1].caption == "cap 1" and items[1].license == "cc0" and items[1].extra == {"url": "w1"}
    assert r.read_uri(items[3].uri) == items[3].data


def test_corrupt_tar_is_an_item_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "bad.tar").write_bytes(b"\x00not a tar" * 100)
    r = reader_for(src("webdataset", str(tmp_path / "w")))
    items = list(r.read_unit(r.list_units()[0]))
    assert len(items) == 1 and items[0].error is not None and items[0].error[0] == "unreadable_unit"


def test_s3_prefix_parquet_and_webdataset_on_moto(tmp_path: Path, s3_env: dict[str, str]) -> None:
    bucket = s3_env["BUCKET"]
    s3 = boto3.client("s3")
    files = write_folder_corpus(tmp_path / "f", n=3, broken=False)
    for p in files:
        s3.put_object(Bucket=bucket, Key=f"drop/{p.relative_to(tmp_path / 'f')}", Body=p.read_bytes())
    s3.put_object(Bucket=bucket, Key="drop/readme.md", Body=b"skip me")
    r = reader_for(src("s3", f"s3://{bucket}/drop/"))
    units = r.list_units()
    assert sorted(u.key for u in units) == sorted(p.relative_to(tmp_path / "f").as_posix() for p in files)
    item = next(r.read_unit(units[0]))
    assert item.key == units[0].key and item.uri == f"s3://{bucket}/drop/{units[0].key}"
    assert item.read() == s3.get_object(Bucket=bucket, Key=f"drop/{units[0].key}")["Body"].read()

    parquet_file(tmp_path / "a.parquet", 4)
    s3.put_object(Bucket=bucket, Key="pq/a.parquet", Body=(tmp_path / "a.parquet").read_bytes())
    pr = reader_for(src("parquet", f"s3://{bucket}/pq", image_column="img"))
    items = [it for u in pr.list_units() for it in pr.read_unit(u)]
    assert len(items) == 4 and items[0].data and items[0].key == "a.parquet#row=0"

    wds_tar(tmp_path / "s.tar", 3)
    s3.put_object(Bucket=bucket, Key="wds/000.tar", Body=(tmp_path / "s.tar").read_bytes())
    wr = reader_for(src("webdataset", f"s3://{bucket}/wds"))
    items = [it for u in wr.list_units() for it in wr.read_unit(u)]
    assert len(items) == 3 and all(it.data for it in items) and items[0].key.startswith("000.tar#")

    # The same objects under another prefix (a bucket copied elsewhere): the same keys, so the same ids.
    for obj in s3.list_objects_v2(Bucket=bucket)["Contents"]:
        s3.copy_object(Bucket=bucket, Key=f"copy/{obj['Key']}", CopySource={"Bucket": bucket, "Key": obj["Key"]})
    for kind, sub, extra in (("s3", "drop/", {}), ("parquet", "pq", {"image_column": "img"}), ("webdataset", "wds", {})):
        a, b = (reader_for(src(kind, f"s3://{bucket}/{pre}{sub}", **extra)) for pre in ("", "copy/"))
        keys_a = [(it.key, it.read()) for u in a.list_units() for it in a.read_unit(u)]
        assert keys_a == [(it.key, it.read()) for u in b.list_units() for it in b.read_unit(u)]


def test_s3_listing_error_names_the_uri(s3_env: dict[str, str]) -> None:
    from prx_assets.errors import SourceError

    with pytest.raises(SourceError, match=r"cannot list s3://no-such-bucket-xyz/p/"):
        reader_for(src("s3", "s3://no-such-bucket-xyz/p/")).list_units()
