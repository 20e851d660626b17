"""A corpus of bad and hostile inputs across a folder, Parquet and WebDataset source, each with
the outcome ingest must give it: a row (hard but valid input) or a reject with a named reason.

Used by the reliability tests (every input accounted for, other sources unaffected) and by
``python -m bench faults`` (peak memory of ingesting it with two workers).
"""

from __future__ import annotations

import io
import os
import struct
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from prx_assets.core.demo.corpus import make_scene, pixel_bomb_png


@dataclass(frozen=True)
class BadInput:
    """One input and what ingest must make of it: ``"row"`` or a reject reason."""

    source: str
    name: str
    expect: str


def _enc(im: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) if crc is None
                                                                  else crc)


def _jpeg_with_sof(width: int, height: int) -> bytes:
    """A JPEG whose frame header declares ``width x height`` (the rest is a small real image)."""
    data = bytearray(_enc(Image.new("RGB", (64, 64), (90, 120, 150)), "JPEG", quality=90))
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_bad_inputs(base: Path, seed: int = 0, big_side: int = 9500) -> list[BadInput]:
    """Write the corpus under ``base`` (``folder/``, ``table/``, ``shards/``, ``outside/``) and
    return every input with its expected outcome (36 of them)."""
    rng = np.random.default_rng(seed)
    folder, table, shards, outside = (base / n for n in ("folder", "table", "shards", "outside"))
    for d in (folder, table, shards, outside):
        d.mkdir(parents=True, exist_ok=True)
    photo = make_scene(rng, 480, 360).image.convert("RGB")
    good_jpeg = _enc(photo, "JPEG", quality=90)
    good_png = _enc(photo, "PNG", compress_level=1)
    out: list[BadInput] = []

    def put(name: str, data: bytes, expect: str) -> None:
        (folder / name).write_bytes(data)
        out.append(BadInput("folder", name, expect))

    put("empty.jpg", b"", "empty")
    put("text_named_like_a_photo.jpg", b"not an image\n" * 10, "not_image")
    put("truncated.jpg", good_jpeg[: len(good_jpeg) // 3], "truncated")
    put("truncated.png", good_png[: len(good_png) // 2], "truncated")
    put("garbage_after_soi.jpg", b"\xff\xd8\xff" + rng.bytes(4000), "corrupt")
    ihdr = struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0)
    put("bad_crc.png", b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr, crc=0) + _chunk(b"IEND", b""), "corrupt")
    put("pixel_bomb.png", pixel_bomb_png(), "decompression_bomb")
    put("huge_sof.jpg", _jpeg_with_sof(65000, 65000), "decompression_bomb")
    put("tiny.png", _enc(Image.new("RGB", (12, 12), "red"), "PNG"), "too_small")
    put("strip.jpg", _enc(make_scene(rng, 1500, 150).image, "JPEG", quality=90), "bad_aspect")
    put("zero_frames.gif", b"GIF89a" + struct.pack("<HH", 64, 64) + b"\x00\x00\x00;", "corrupt")
    put("bad_header.bmp", b"BM" + rng.bytes(60), "corrupt")
    put("corrupt.tif", b"II*\x00" + rng.bytes(200), "corrupt")
    put("corrupt.webp", b"RIFF\x10\x00\x00\x00WEBPVP8 " + rng.bytes(40), "corrupt")
    # Hard but valid: stored as rows.
    one_bit = Image.fromarray(rng.integers(0, 2, (big_side, big_side), dtype=np.uint8) * 255).convert("1")
    put("huge_1bit_a.png", _enc(one_bit, "PNG"), "row")
    put("huge_1bit_b.png", _enc(one_bit.transpose(Image.Transpose.ROTATE_90), "PNG"), "row")
    exif = Image.Exif()
    exif[0x0112] = 77  # an orientation that does not exist
    put("bad_orientation.jpg", _enc(photo, "JPEG", quality=90, exif=exif.tobytes()), "row")
    frames = [make_scene(rng, 160, 120).image.convert("P") for _ in range(3)]
    anim = io.BytesIO()
    frames[0].save(anim, "GIF", save_all=True, append_images=frames[1:], duration=100)
    put("animated.gif", anim.getvalue(), "row")
    put("cmyk.jpg", _enc(photo.convert("CMYK"), "JPEG", quality=90), "row")
    # Not files, or not in the source.
    (folder / "loop_a.jpg").symlink_to(folder / "loop_b.jpg")
    (folder / "loop_b.jpg").symlink_to(folder / "loop_a.jpg")
    out.append(BadInput("folder", "loop_a.jpg", "read_error"))
    out.append(BadInput("folder", "loop_b.jpg", "read_error"))
    (folder / "dangling.jpg").symlink_to(folder / "no_such_file.jpg")
    out.append(BadInput("folder", "dangling.jpg", "read_error"))
    os.mkfifo(folder / "fifo.jpg")
    out.append(BadInput("folder", "fifo.jpg", "not_a_file"))
    (outside / "secret.jpg").write_bytes(good_jpeg)
    (folder / "escape.jpg").symlink_to(outside / "secret.jpg")
    out.append(BadInput("folder", "escape.jpg", "outside_source"))

    out += _table_inputs(table, rng, good_jpeg, good_png)
    out += _shard_inputs(shards, rng, good_jpeg)
    return out


def _table_inputs(table: Path, rng: np.random.Generator, good_jpeg: bytes, good_png: bytes) -> list[BadInput]:
    """The Parquet source's bad inputs: unreadable files, mixed and mistyped image columns."""
    out: list[BadInput] = []
    import pyarrow as pa
    import pyarrow.parquet as pq

    def parquet(name: str, tbl: pa.Table | None, raw: bytes | None = None) -> None:
        if raw is not None:
            (table / name).write_bytes(raw)
        else:
            pq.write_table(tbl, table / name)

    parquet("empty.parquet", None, b"")
    out.append(BadInput("table", "empty.parquet", "unreadable_unit"))
    parquet("corrupt.parquet", None, b"PAR1" + rng.bytes(300) + b"PAR1")
    out.append(BadInput("table", "corrupt.parquet", "unreadable_unit"))
    parquet("mixed.parquet", pa.table({"image": pa.array([good_jpeg, None, b"plain bytes", good_png],
                                                          pa.binary())}))
    out += [BadInput("table", "mixed.parquet#0", "row"), BadInput("table", "mixed.parquet#1", "empty"),
            BadInput("table", "mixed.parquet#2", "not_image"), BadInput("table", "mixed.parquet#3", "row")]
    parquet("strings.parquet", pa.table({"image": pa.array(["a path, not bytes"])}))
    out.append(BadInput("table", "strings.parquet#0", "bad_row"))

    return out


def _shard_inputs(shards: Path, rng: np.random.Generator, good_jpeg: bytes) -> list[BadInput]:
    """The WebDataset source's bad inputs: a sample without its image, garbage, a truncated tar."""
    out: list[BadInput] = []
    (shards / "good-00000.tar").write_bytes(_tar([("s0.jpg", good_jpeg), ("s0.txt", b"a photo")]))
    out.append(BadInput("shards", "good-00000.tar#s0", "row"))
    (shards / "noimage-00001.tar").write_bytes(_tar([("s1.txt", b"caption only")]))
    out.append(BadInput("shards", "noimage-00001.tar#s1", "no_image_member"))
    (shards / "garbage-00002.tar").write_bytes(rng.bytes(3000))
    out.append(BadInput("shards", "garbage-00002.tar", "unreadable_unit"))
    whole = _tar([("s3.jpg", good_jpeg), ("s4.jpg", good_jpeg)])
    (shards / "truncated-00003.tar").write_bytes(whole[: 512 + len(good_jpeg) + 512 + 2048])  # cut inside s4
    out += [BadInput("shards", "truncated-00003.tar#s3", "row"),
            BadInput("shards", "truncated-00003.tar", "unreadable_unit")]
    return out


def outcome_name(source_dir: str, uri: str) -> str:
    """The ``BadInput.name`` an ingested row's or reject's URI stands for.

    >>> outcome_name("/c/table", "/c/table/mixed.parquet#row=2"), outcome_name("/c/table", "/c/table/x.parquet#rg=0")
    ('mixed.parquet#2', 'x.parquet')
    """
    rel = uri[len(source_dir.rstrip("/")) + 1:] if uri.startswith(source_dir) else uri
    rel = rel.replace("#row=", "#")
    return rel.split("#rg=")[0]
