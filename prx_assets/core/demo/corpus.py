"""A deterministic demo corpus: varied images across three source kinds, plus broken files.

Layout under ``<data root>/demo``::

    photos/      folder source: JPEG, PNG (RGB, RGBA, LA, 16-bit, 1-bit), WebP, CMYK JPEG,
                 palette GIF with transparency, EXIF-rotated JPEGs, TIFF, BMP; sizes from
                 tiny to several megapixels; sidecar .txt captions; broken files
                 (truncated, zero-byte, text named .jpg, a pixel bomb, a 10:1 strip)
    catalog/     Parquet source: image bytes + caption, license and url columns
    webshards/   WebDataset source: tar shards of jpg/png + txt + json samples

The same seed gives byte-identical files.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageFilter

from prx_assets.core.config.storage import DataRoot

COLORS = {
    "red": (200, 40, 40), "orange": (230, 130, 30), "yellow": (230, 210, 60),
    "green": (50, 160, 70), "teal": (40, 150, 150), "blue": (40, 80, 200),
    "purple": (120, 60, 170), "pink": (230, 130, 170), "brown": (120, 80, 40),
    "gray": (128, 128, 128), "white": (245, 245, 245), "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "stripe")


@dataclass
class Scene:
    """A generated picture and the caption that describes it."""

    image: Image.Image
    caption: str


def fractal_texture(rng: np.random.Generator, width: int, height: int,
                    amplitude: float = 40.0) -> np.ndarray:
    """Sum of upsampled random grids with amplitude ~ 1/frequency (a 1/f spectrum)."""
    out = np.zeros((height, width), np.float32)
    cells = 4
    while cells <= max(width, height) // 2:
        grid = rng.uniform(-1, 1, (cells, cells)).astype(np.float32)
        layer = Image.fromarray(grid, "F").resize((width, height), Image.Resampling.BICUBIC)
        out += np.asarray(layer) * (amplitude * 2.0 / np.sqrt(cells))
        cells *= 2
    return out


def make_scene(rng: np.random.Generator, width: int, height: int) -> Scene:
    """A smooth gradient background with a few shapes and mild sensor-like noise."""
    names = list(COLORS)
    c1, c2, c3 = (names[i] for i in rng.choice(len(names), 3, replace=False))
    yy = np.arange(height, dtype=np.float32)[:, None]
    xx = np.arange(width, dtype=np.float32)[None, :]
    angle = rng.uniform(0, np.pi)
    t = (xx / max(width - 1, 1)) * np.cos(angle) + (yy / max(height - 1, 1)) * np.sin(angle)
    t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    a, b = np.array(COLORS[c1], np.float32), np.array(COLORS[c2], np.float32)
    img = a[None, None, :] * (1 - t[..., None]) + b[None, None, :] * t[..., None]
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    count = int(rng.integers(1, 4))
    col = np.array(COLORS[c3], np.float32)
    for _ in range(count):
        cx, cy = rng.uniform(0.2, 0.8) * width, rng.uniform(0.2, 0.8) * height
        r = rng.uniform(0.08, 0.25) * min(width, height)
        if shape == "circle":
            mask = (xx - cx) ** 2 + (yy - cy) ** 2 <= r**2
        elif shape == "square":
            mask = (np.abs(xx - cx) <= r) & (np.abs(yy - cy) <= r)
        else:
            mask = np.abs((xx - cx) * 0.7 + (yy - cy) * 0.7) <= r / 3
        img[np.broadcast_to(mask, (height, width))] = col
    # Natural-image statistics: a 1/f fractal texture, edges softened like a lens would,
    # and mild sensor noise.
    img += fractal_texture(rng, width, height)[..., None]
    soft = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").filter(
        ImageFilter.GaussianBlur(0.8))
    noisy = np.asarray(soft, np.float32) + rng.standard_normal(img.shape, dtype=np.float32) * 1.5
    pixels = np.clip(noisy, 0, 255).astype(np.uint8)
    plural = "s" if count > 1 else ""
    caption = (f"{count} {c3} {shape}{plural} over a smooth {c1} to {c2} gradient, "
               f"{width}x{height} pixels")
    return Scene(Image.fromarray(pixels, "RGB"), caption)


def _encode(im: Image.Image, fmt: str, **kw: Any) -> bytes:
    if fmt == "PNG":
        kw.setdefault("compress_level", 1)  # noisy pixels compress poorly; keep generation fast
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pixel_bomb_png(width: int = 50_000, height: int = 50_000) -> bytes:
    """A tiny PNG whose header declares ``width x height`` pixels (a decompression bomb)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + \
        _png_chunk(b"IEND", b"")


def exif_rotated_jpeg(im: Image.Image, orientation: int) -> bytes:
    """JPEG of ``im`` stored so that applying EXIF ``orientation`` restores ``im``."""
    inverse = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
               4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
               6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
               8: Image.Transpose.ROTATE_270}
    stored = im.transpose(inverse[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encode(stored, "JPEG", quality=95, exif=exif.tobytes())


# (name pattern, format, mode transform) cycled over the folder source
_VARIANTS = (
    ("jpg", "rgb_jpeg"), ("png", "rgb_png"), ("webp", "webp"), ("jpg", "cmyk_jpeg"),
    ("gif", "palette_gif"), ("jpg", "exif6"), ("png", "rgba_png"), ("png", "gray16_png"),
    ("jpg", "rgb_jpeg"), ("png", "la_png"), ("jpg", "exif3"), ("tif", "tiff"),
    ("png", "mono_png"), ("bmp", "bmp"), ("jpg", "exif8"), ("webp", "webp_alpha"),
)


def _variant_bytes(kind: str, im: Image.Image, rng: np.random.Generator) -> bytes:
    if kind == "rgb_jpeg":
        return _encode(im, "JPEG", quality=int(rng.integers(85, 98)))
    if kind == "rgb_png":
        return _encode(im, "PNG", compress_level=1)
    if kind == "webp":
        return _encode(im, "WEBP", quality=90)
    if kind == "webp_alpha":
        rgba = im.convert("RGBA")
        rgba.putalpha(Image.linear_gradient("L").resize(im.size))
        return _encode(rgba, "WEBP", quality=90)
    if kind == "cmyk_jpeg":
        return _encode(im.convert("CMYK"), "JPEG", quality=95)
    if kind == "palette_gif":
        p = im.quantize(64)
        return _encode(p, "GIF", transparency=0)
    if kind.startswith("exif"):
        return exif_rotated_jpeg(im, int(kind[4:]))
    if kind == "rgba_png":
        rgba = im.convert("RGBA")
        alpha = np.full(im.size[::-1], 255, np.uint8)
        alpha[: im.size[1] // 4, :] = 0
        rgba.putalpha(Image.fromarray(alpha, "L"))
        return _encode(rgba, "PNG")
    if kind == "gray16_png":
        g = np.asarray(im.convert("L"), np.uint16) * 257
        return _encode(Image.fromarray(g), "PNG")  # uint16 -> mode I;16
    if kind == "la_png":
        la = im.convert("LA")
        return _encode(la, "PNG")
    if kind == "tiff":
        return _encode(im, "TIFF", compression="tiff_lzw")
    if kind == "mono_png":
        return _encode(im.convert("1"), "PNG")
    if kind == "bmp":
        return _encode(im, "BMP")
    raise ValueError(f"unknown demo variant {kind!r}")


def _size(rng: np.random.Generator, i: int) -> tuple[int, int]:
    if i % 37 == 0:
        return (2400, 1600) if i % 2 else (1536, 2304)  # several megapixels
    side = int(rng.integers(256, 900))
    ratio = float(rng.choice([1.0, 4 / 3, 3 / 4, 16 / 9, 9 / 16, 3 / 2, 2 / 3]))
    return (side, max(64, int(side / ratio))) if ratio >= 1 else (max(64, int(side * ratio)), side)


@dataclass
class CorpusSummary:
    """What the generator wrote."""

    root: str
    files: Counter[str] = field(default_factory=Counter)
    broken: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"root": self.root, "files": dict(self.files), "broken": self.broken}


def generate_demo_corpus(root: DataRoot, prefix: str = "demo", n_photos: int = 176,
                         n_catalog: int = 80, n_web: int = 60, seed: int = 1234) -> CorpusSummary:
    """Write the demo corpus under ``<root>/<prefix>`` and return what was written."""
    rng = np.random.default_rng(seed)
    summary = CorpusSummary(root=root.join(prefix))

    def put(rel: str, data: bytes, source: str) -> None:
        root.write_bytes(f"{prefix}/{rel}", data)
        summary.files[source] += 1

    _write_photos(rng, put, summary, n_photos)
    _write_catalog(rng, put, summary, n_catalog)
    _write_webshards(rng, put, summary, n_web)
    return summary


_Put = Callable[[str, bytes, str], None]
_LICENSES = ("cc-by-4.0", "cc0-1.0", "internal")


def _write_photos(rng: np.random.Generator, put: _Put, summary: CorpusSummary, n_photos: int) -> None:
    """The folder source: photos in several formats, half with sidecar captions, and broken files."""
    for i in range(n_photos):
        ext, kind = _VARIANTS[i % len(_VARIANTS)]
        w, h = _size(rng, i)
        scene = make_scene(rng, w, h)
        folder = ("people", "places", "things")[i % 3]
        name = f"photos/{folder}/img_{i:04d}.{ext}"
        put(name, _variant_bytes(kind, scene.image, rng), "photos")
        if i % 2 == 0:
            put(name.rsplit(".", 1)[0] + ".txt", scene.caption.encode(), "photos_captions")
    tiny = make_scene(rng, 24, 24).image
    good = _encode(make_scene(rng, 640, 480).image, "JPEG", quality=90)
    broken = {
        "broken/tiny_24px.png": _encode(tiny, "PNG"),
        "broken/strip_10to1.jpg": _encode(make_scene(rng, 2000, 200).image, "JPEG", quality=90),
        "broken/truncated.jpg": good[: len(good) // 3],
        "broken/empty.jpg": b"",
        "broken/notes_named_like_a_photo.jpg": b"This is a text file, not a JPEG.\n" * 4,
        "broken/pixel_bomb.png": pixel_bomb_png(),
    }
    for rel, data in broken.items():
        put(f"photos/{rel}", data, "photos")
        summary.broken.append(f"photos/{rel}")



def _write_catalog(rng: np.random.Generator, put: _Put, summary: CorpusSummary, n_catalog: int) -> None:
    """The Parquet source: two files of image bytes with captions, licenses and URLs (one row truncated)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    per_file = (n_catalog + 1) // 2
    for part in range(2):
        rows: dict[str, list[Any]] = {"image": [], "caption": [], "license": [], "url": []}
        for j in range(part * per_file, min(n_catalog, (part + 1) * per_file)):
            w, h = _size(rng, j + 1000)
            scene = make_scene(rng, w, h)
            fmt = ("JPEG", "PNG", "WEBP")[j % 3]
            data = _encode(scene.image, fmt, **({"quality": 93} if fmt != "PNG" else {}))
            if j == 7:
                data = data[: len(data) // 4]
                summary.broken.append(f"catalog row {j} (truncated)")
            rows["image"].append(data)
            rows["caption"].append(scene.caption)
            rows["license"].append(_LICENSES[j % 3])
            rows["url"].append(f"https://example.org/catalog/{j}")
        table = pa.table(rows)
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=20, compression="zstd")
        put(f"catalog/part-{part:04d}.parquet", buf.getvalue(), "catalog")



def _write_webshards(rng: np.random.Generator, put: _Put, summary: CorpusSummary, n_web: int) -> None:
    """The WebDataset source: tar shards of 20 samples (a few without their image member)."""
    per_shard = 20
    for shard in range((n_web + per_shard - 1) // per_shard):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            for k in range(shard * per_shard, min(n_web, (shard + 1) * per_shard)):
                w, h = _size(rng, k + 2000)
                scene = make_scene(rng, w, h)
                key = f"sample_{k:06d}"
                members: dict[str, bytes] = {
                    "txt": scene.caption.encode(),
                    "json": json.dumps({"license": _LICENSES[k % 3],
                                        "url": f"https://example.org/web/{k}"}).encode(),
                }
                if k % 19 != 5:  # a few samples lack their image member
                    ext = "jpg" if k % 2 else "png"
                    members[ext] = _encode(scene.image, "JPEG" if ext == "jpg" else "PNG")
                else:
                    summary.broken.append(f"webshards {key} (no image member)")
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o644
                    tf.addfile(info, io.BytesIO(data))
        put(f"webshards/shard-{shard:05d}.tar", buf.getvalue(), "webshards")
