"""Decode, validate and normalize one image into JPEG bytes plus its metadata.

The steps, in order, for every file:

1. sniff the bytes and parse the header only (no pixels yet);
2. reject decompression bombs, too-small and too-elongated images from the header;
3. decode (for JPEGs with ``max_side`` set, Pillow's DCT-domain draft mode decodes at
   a reduced size directly);
4. apply the EXIF orientation;
5. convert any mode to RGB: ICC profiles to sRGB, 16-bit and float to 8-bit,
   transparency composited on white;
6. optional downscale so the longer side is at most ``max_side``;
7. encode JPEG at the configured quality (92 by default), measure its first-generation PSNR
   and, with ``lossless_fallback`` on, store losslessly (PNG or WebP) instead when the JPEG
   loses more than the bound or the image is synthetic (see :func:`store`);
8. compute a 64-bit DCT perceptual hash and the aspect-ratio bucket.

Any failure raises :class:`ImageRejected` with a :class:`RejectReason`; the caller
records it as a reject row and carries on.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
import zlib
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import numpy as np
from PIL import Image, ImageChops, ImageCms, ImageOps, UnidentifiedImageError

from prx_assets.compat.pillow import jpeg_encoder
from prx_assets.core.config.project import IngestSettings, bucket_ratios
from prx_assets.core.ingest.pixel_error import mosaic_squared_errors
from prx_assets.errors import PrxError


class RejectReason(str, Enum):
    """Why a file was not ingested. Stored as the ``reason`` column of the rejects table."""

    EMPTY = "empty"
    NOT_IMAGE = "not_image"
    CORRUPT = "corrupt"
    TRUNCATED = "truncated"
    DECOMPRESSION_BOMB = "decompression_bomb"
    TOO_SMALL = "too_small"
    BAD_ASPECT = "bad_aspect"
    UNSUPPORTED_MODE = "unsupported_mode"
    READ_ERROR = "read_error"
    NO_IMAGE_MEMBER = "no_image_member"
    NOT_A_FILE = "not_a_file"  # a FIFO, socket or device where a file was listed
    OUTSIDE_SOURCE = "outside_source"  # a link out of a folder source (follow_links is off)
    UNREADABLE_UNIT = "unreadable_unit"  # a whole Parquet file / tar shard that cannot be opened
    BAD_ROW = "bad_row"  # a row whose image cell is not image bytes
    ERASED = "erased"  # erased on a removal request (`prx-assets optout --erase`): never stored again


class ImageRejected(PrxError):
    """An input that is not ingested, with the reason code and a message naming the value."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(f"{reason.value}: {message}")


@dataclass(frozen=True)
class NormalizedImage:
    """The result of normalizing one image. ``jpeg`` holds the stored bytes: JPEG, or PNG/WebP
    when ``stored_format`` says the image was stored losslessly (``lossless_reason`` says why)."""

    jpeg: bytes
    width: int
    height: int
    orig_width: int
    orig_height: int
    orig_format: str
    orig_mode: str
    orig_bytes: int
    sha256: str
    phash: int
    aspect_ratio: float
    aspect_bucket: str
    rgb: Image.Image | None = None
    stored_format: str = "jpeg"
    q92_psnr_db: float | None = None
    lossless_reason: str | None = None
    #: sha256 of ``jpeg``, the stored bytes: what every later read of them is checked against.
    stored_sha256: str = ""


_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def sniff_format(data: bytes) -> str | None:
    """Name the image format from magic bytes, or ``None`` if it is not a known image."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def open_header(data: bytes, settings: IngestSettings) -> Image.Image:
    """Parse the header and apply the size limits without decoding any pixel.

    Raises
    ------
    ImageRejected
        ``empty``, ``not_image``, ``corrupt``, ``decompression_bomb``, ``too_small``
        or ``bad_aspect``.
    """
    if not data:
        raise ImageRejected(RejectReason.EMPTY, "zero-byte file")
    sniffed = sniff_format(data)
    try:
        im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        # Pillow's own guard (2x Image.MAX_IMAGE_PIXELS) fires inside Image.open, before ours.
        m = re.search(r"\((\d+) pixels\)", str(e))
        declared = int(m.group(1)) if m else -1
        if declared > settings.max_pixels:
            msg = (f"header declares {declared} pixels > max_pixels={settings.max_pixels} "
                   "(raise ingest.max_pixels to accept larger images)")
        else:
            msg = (f"header declares {declared} pixels, above Pillow's guard "
                   f"(2 x PIL.Image.MAX_IMAGE_PIXELS = {2 * (Image.MAX_IMAGE_PIXELS or 0)}); raise "
                   "PIL.Image.MAX_IMAGE_PIXELS as well as ingest.max_pixels to accept it")
        raise ImageRejected(RejectReason.DECOMPRESSION_BOMB, msg) from None
    except UnidentifiedImageError:
        if sniffed is None:
            head = data[:16]
            raise ImageRejected(RejectReason.NOT_IMAGE,
                                f"not an image file ({len(data)} bytes starting {head!r})") from None
        raise ImageRejected(RejectReason.CORRUPT,
                            f"{sniffed} signature but the header cannot be parsed") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageRejected(RejectReason.CORRUPT, f"header unreadable: {e}") from None
    w, h = im.size
    if w * h > settings.max_pixels:
        raise ImageRejected(
            RejectReason.DECOMPRESSION_BOMB,
            f"header declares {w}x{h} = {w * h} pixels > max_pixels={settings.max_pixels} "
            "(raise ingest.max_pixels to accept larger images)")
    if min(w, h) < settings.min_side:
        raise ImageRejected(RejectReason.TOO_SMALL,
                            f"{w}x{h} has a side below min_side={settings.min_side}")
    if max(w, h) / min(w, h) > settings.max_aspect:
        raise ImageRejected(
            RejectReason.BAD_ASPECT,
            f"{w}x{h} has aspect {max(w, h) / min(w, h):.2f} > max_aspect={settings.max_aspect}")
    return im


def decode(im: Image.Image, settings: IngestSettings) -> Image.Image:
    """Decode the pixels of a header-parsed image (first frame of animations)."""
    if settings.max_side and im.format == "JPEG" and max(im.size) > settings.max_side:
        # DCT-domain downscale by a power of two, never below the target size.
        scale = settings.max_side / max(im.size)
        im.draft(im.mode if im.mode != "CMYK" else "CMYK",
                 (math.ceil(im.size[0] * scale), math.ceil(im.size[1] * scale)))
    try:
        if getattr(im, "n_frames", 1) > 1:
            im.seek(0)
        im.load()
    except OSError as e:
        text = str(e)
        reason = RejectReason.TRUNCATED if "truncated" in text or "broken data" in text else \
            RejectReason.CORRUPT
        raise ImageRejected(reason, f"decode failed: {text}") from None
    except (SyntaxError, ValueError, EOFError, zlib.error, Image.DecompressionBombError) as e:
        raise ImageRejected(RejectReason.CORRUPT, f"decode failed: {e}") from None
    return im


@lru_cache(maxsize=1)
def _srgb_profile() -> ImageCms.ImageCmsProfile:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def _apply_icc(im: Image.Image) -> Image.Image:
    """Convert pixels with an embedded non-sRGB ICC profile to sRGB."""
    icc = im.info.get("icc_profile")
    if not icc or im.mode not in ("RGB", "RGBA", "CMYK", "L", "LA"):
        return im
    try:
        src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        desc = (ImageCms.getProfileDescription(src) or "").lower()
    except (OSError, ImageCms.PyCMSError):
        return im  # unreadable profile: fall back to the plain conversion
    if "srgb" in desc and im.mode in ("RGB", "RGBA"):
        return im
    if im.mode in ("L", "LA"):
        return im  # gray profiles are near-identity for 8-bit gray; keep the fast path
    out_mode = "RGBA" if im.mode == "RGBA" else "RGB"
    try:
        return ImageCms.profileToProfile(im, src, _srgb_profile(), outputMode=out_mode)
    except (OSError, ImageCms.PyCMSError, ValueError):
        return im


def _to_8bit(arr: np.ndarray, sixteen_bit: bool) -> np.ndarray:
    arr = arr.astype(np.float64)
    if sixteen_bit or arr.max(initial=0) > 255:
        arr = arr / 257.0
    elif arr.dtype.kind == "f" and arr.max(initial=0) <= 1.0:
        arr = arr * 255.0
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def to_rgb(im: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB; transparency is composited on white.

    Raises
    ------
    ImageRejected
        ``unsupported_mode`` for modes with no defined conversion.
    """
    im = _apply_icc(im)
    mode = im.mode
    if mode == "RGB":
        return im
    if mode.startswith("I;16") or mode in ("I", "F"):
        arr = np.asarray(im)
        return Image.fromarray(_to_8bit(arr, mode.startswith("I;16")), "L").convert("RGB")
    if mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        out = Image.new("RGB", rgba.size, (255, 255, 255))
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    if mode == "LAB":
        try:
            lab = ImageCms.createProfile("LAB")
            return ImageCms.profileToProfile(im, lab, _srgb_profile(), outputMode="RGB")
        except (OSError, ImageCms.PyCMSError, ValueError) as e:
            raise ImageRejected(RejectReason.UNSUPPORTED_MODE, f"LAB conversion failed: {e}") from None
    if mode in ("1", "L", "P", "CMYK", "YCbCr", "HSV", "RGBX"):
        return im.convert("RGB")
    raise ImageRejected(RejectReason.UNSUPPORTED_MODE,
                        f"image mode {mode!r} has no RGB conversion")


def encode_jpeg(rgb: Image.Image, quality: int, subsampling: str = "4:2:0") -> bytes:
    """Encode an RGB image as baseline JPEG without metadata: no EXIF, ICC profile or comment, also
    when the image carries them in its ``info`` (Pillow's ``save`` writes a decoded source JPEG's
    comment back unless told not to).

    The settings are turned into libjpeg's arguments once (:func:`_jpeg_arguments`) and the encoder is
    called directly (:func:`prx_assets.compat.pillow.jpeg_encoder`): the same bytes as ``save`` with ``comment=b""``, without its Python work per call
    (a third of the time of encoding a 160-pixel tile, which the q92 check does dozens of times per
    sampled image)."""
    arguments = _jpeg_arguments(quality, subsampling) if rgb.mode == "RGB" else None
    encoder = jpeg_encoder(arguments) if arguments is not None else None
    if encoder is None:  # another mode, or a Pillow whose JPEG writer is not laid out as read here
        buf = io.BytesIO()
        rgb.save(buf, "JPEG", quality=quality, subsampling=subsampling, optimize=False, comment=b"")
        return buf.getvalue()
    rgb.load()
    try:
        encoder.setimage(rgb.im, (0, 0, *rgb.size))
        chunks = []
        bufsize = max(_ENCODE_BLOCK, rgb.size[0] * 4)  # Pillow's: a tile's output in one call, a large image's in a few
        while True:
            _, status, data = encoder.encode(bufsize)
            chunks.append(data)
            if status:
                break
    finally:
        encoder.cleanup()
    if status < 0:
        raise OSError(f"libjpeg could not encode a {rgb.size[0]}x{rgb.size[1]} image (error {status})")
    return b"".join(chunks)


#: Smallest output buffer handed to the JPEG encoder per call (Pillow's own).
_ENCODE_BLOCK = 65536


@lru_cache(maxsize=16)
def _jpeg_arguments(quality: int, subsampling: str) -> tuple[object, ...] | None:
    """libjpeg's arguments for :func:`encode_jpeg`'s settings, as Pillow's JPEG writer builds them (read
    back from an encode of a small image: they do not depend on the image's size or pixels), or ``None``
    when this Pillow does not leave them where they are read (then ``save`` is used)."""
    probe = Image.new("RGB", (16, 16))
    probe.save(io.BytesIO(), "JPEG", quality=quality, subsampling=subsampling, optimize=False, comment=b"")
    arguments = getattr(probe, "encoderconfig", None)
    return arguments if isinstance(arguments, tuple) else None


def decode_rgb(data: bytes) -> Image.Image:
    """Decode encoded image bytes (the JPEGs this module writes) into loaded RGB pixels."""
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return im if im.mode == "RGB" else im.convert("RGB")


def decode_own_jpeg(data: bytes, size: tuple[int, int]) -> Image.Image:
    """Decode a JPEG that :func:`encode_jpeg` made from an RGB image of ``size``, by libjpeg directly:
    the same pixels as :func:`decode_rgb`, without Pillow parsing the file's markers in Python first
    (about a quarter of the time for a 160-pixel tile, which the q92 check decodes dozens of times)."""
    return Image.frombytes("RGB", size, data, "jpeg", "RGB", "")


#: A synthetic image (few colors, PSNR above the bound) is stored losslessly only while its lossless
#: bytes are at most this many times its JPEG bytes; an image below the PSNR bound always is.
LOSSLESS_MAX_GROWTH = 2.0
#: Stored bytes may exceed the source's by at most this factor: an image below the PSNR bound whose
#: lossless encoding would be larger (camera noise, already-compressed textures: 11 MB of PNG stored
#: as 39 MB) is stored as the best JPEG of :data:`FALLBACK_QUALITIES` that fits instead, else as the
#: configured JPEG, each with its reason recorded (``lossless_oversize_q98``, ``lossless_oversize``).
SOURCE_MAX_GROWTH = 1.5
FALLBACK_JPEG_QUALITY = 98
#: Qualities tried, highest first, for an image whose lossless bytes break the size bound.
FALLBACK_QUALITIES = (FALLBACK_JPEG_QUALITY, 95, 90, 80, 70, 50)
#: PSNR reported for an encode that reproduces every pixel (MSE 0).
EXACT_PSNR_DB = 99.0
#: Rows compared at a time by ``psnr_db`` (bounds its extra memory on large images).
PSNR_BAND_ROWS = 512


def psnr_db(a: Image.Image, b: Image.Image) -> float:
    """PSNR (dB, 8-bit) between two RGB images of one size, from the histogram of their absolute
    difference (no float copies of the pixels).

    >>> round(psnr_db(Image.new("RGB", (4, 4), (10, 10, 10)), Image.new("RGB", (4, 4), (12, 10, 10))), 2)
    46.88
    """
    w, h = a.size
    hist = np.zeros((len(a.getbands()), 256), dtype=np.float64)
    for top in range(0, h, PSNR_BAND_ROWS):  # in bands: no full-size difference image on large inputs
        box = (0, top, w, min(h, top + PSNR_BAND_ROWS))
        band = a if box == (0, 0, w, h) else a.crop(box)
        other = b if box == (0, 0, w, h) else b.crop(box)
        hist += np.asarray(ImageChops.difference(band, other).histogram(), dtype=np.float64).reshape(-1, 256)
    mse = float((hist * np.arange(256, dtype=np.float64) ** 2).sum()) / max(1, w * h * len(hist))
    return EXACT_PSNR_DB if mse == 0 else min(EXACT_PSNR_DB, 10.0 * math.log10(255.0 ** 2 / mse))


#: Side of the tiles an image's first-generation PSNR is estimated on at ingest (a multiple of the
#: 16-pixel MCU, so a tile's JPEG blocks are the image's), and the pixels measured per image.
PSNR_TILE = 64
PSNR_PIXELS = 16 * PSNR_TILE * PSNR_TILE
#: Pixels of the image kept around each tile when it is encoded (a multiple of 16): the chroma
#: upsampling of a tile's border reads its neighbours, so with this margin a tile decodes to
#: exactly the pixels it has in the whole image's JPEG (a test checks it bit for bit).
PSNR_MARGIN = 16
#: An estimate this far above the bound is taken as it is; below, the whole image is measured
#: (the tiles' error is the image's error on those pixels exactly, so what is left is sampling:
#: an image whose loss sits outside every tile).
PSNR_FULL_MARGIN_DB = 2.0
#: Images of at most this many pixels are measured whole, never estimated: encoding and decoding the
#: tile mosaic (about 2.1x ``PSNR_PIXELS`` with the margins) costs about 2 ms at any image size,
#: while decoding and comparing the whole JPEG costs about 7 ns a pixel, so up to about 300,000
#: pixels the exact figure is also the cheaper one (0.71 against 1.87 ms at 320x320, 1.75 against
#: 1.96 ms at 512x512; 2.56 against 2.13 ms at 640x640); the limit sits just under that crossover.
PSNR_WHOLE_MAX_PIXELS = 4 * PSNR_PIXELS


def psnr_tiles(width: int, height: int, budget: int = PSNR_PIXELS,
               inset: int = PSNR_MARGIN) -> tuple[int, list[tuple[int, int]]]:
    """``(columns, top-left corners)`` of MCU-aligned ``PSNR_TILE`` tiles spread over the image in a
    grid, about ``budget`` pixels in all, at least ``inset`` pixels inside its borders.

    >>> psnr_tiles(1024, 768)[0], len(psnr_tiles(1024, 768)[1])
    (5, 15)
    """
    t = PSNR_TILE
    n = max(1, budget // (t * t))
    cols = max(1, min(n, round(math.sqrt(n * width / height)), (width - 2 * inset) // t))
    rows = max(1, min(n // cols, (height - 2 * inset) // t))

    def spread(count: int, size: int) -> list[int]:
        lo, hi = inset, size - t - inset
        return [min(hi // 16 * 16, -(-(lo + round(i * (hi - lo) / max(1, count - 1))) // 16) * 16)
                for i in range(count)]

    xs, ys = spread(cols, width), spread(rows, height)
    return cols, [(x, y) for y in ys for x in xs]


def jpeg_psnr(rgb: Image.Image, jpeg: bytes, quality: int = 92, subsampling: str = "4:2:0",
              bound: float | None = None) -> float:
    """First-generation PSNR (dB) of ``jpeg``, the image's JPEG at ``quality``.

    With a ``bound``, an image larger than ``PSNR_WHOLE_MAX_PIXELS`` is first estimated on MCU-aligned
    tiles spread over it, each encoded with a ``PSNR_MARGIN`` of its neighbourhood at the same settings, so
    each tile decodes to exactly its pixels in the whole image's JPEG: the estimate is the image's
    error on those pixels, without a decode of the whole image. An estimate at least
    ``PSNR_FULL_MARGIN_DB`` above the bound, with no single tile below the bound (loss that
    gathers in places), is returned as it is, so only images near or below it pay for decoding the
    whole JPEG."""
    w, h = rgb.size
    room = PSNR_TILE + 2 * PSNR_MARGIN
    if bound is not None and w * h > PSNR_WHOLE_MAX_PIXELS and w >= room and h >= room:
        estimate, worst = tiles_psnr(rgb, quality, subsampling)
        if estimate >= bound + PSNR_FULL_MARGIN_DB and worst >= bound:
            return estimate
    return psnr_db(rgb, decode_rgb(jpeg))


def tiles_psnr(rgb: Image.Image, quality: int, subsampling: str) -> tuple[float, float]:
    """PSNR (dB) of the image's JPEG over the :func:`psnr_tiles` tiles together, and of its worst
    tile, measured on one encode of a mosaic of the tiles with their margins (see :func:`jpeg_psnr`)."""
    w, h = rgb.size
    cols, corners = psnr_tiles(w, h)
    rows = -(-len(corners) // cols)
    t, m = PSNR_TILE, PSNR_MARGIN
    cell = t + 2 * m
    mosaic = Image.new("RGB", (cols * cell, rows * cell))
    for i, (x, y) in enumerate(corners):
        mosaic.paste(rgb.crop((x - m, y - m, x + t + m, y + t + m)), ((i % cols) * cell, (i // cols) * cell))
    decoded = decode_own_jpeg(encode_jpeg(mosaic, quality, subsampling), mosaic.size)
    squared = mosaic_squared_errors(ImageChops.difference(mosaic, decoded), rows, cols, t, m)[:len(corners)].tolist()

    def db(mse: float) -> float:
        return EXACT_PSNR_DB if mse == 0 else min(EXACT_PSNR_DB, 10.0 * math.log10(255.0 ** 2 / mse))

    return db(sum(squared) / (len(corners) * t * t * 3)), db(max(squared) / (t * t * 3))


#: Lossless WebP up to this many pixels (libwebp holds about 6 bytes per pixel while it encodes, and
#: WebP sides stop at 16,383); a larger image is stored as PNG (zlib streams: no extra memory).
WEBP_MAX_PIXELS = 16 * 2**20
WEBP_MAX_SIDE = 16_383


def encode_lossless(rgb: Image.Image, fmt: str) -> tuple[bytes, str]:
    """Encode losslessly as ``webp`` or ``png`` (no metadata); return the bytes and the format used.
    WebP uses libwebp's fastest effort (method 0): on the demo's fallback images it encoded faster
    than PNG at zlib level 1 and came out 1.2-4x smaller than PNG at level 6. Past
    ``WEBP_MAX_PIXELS`` or ``WEBP_MAX_SIDE`` it is PNG at zlib level 1 (bounded memory, and fast)."""
    buf = io.BytesIO()
    w, h = rgb.size
    if fmt == "webp" and w * h <= WEBP_MAX_PIXELS and max(w, h) <= WEBP_MAX_SIDE:
        rgb.save(buf, "WEBP", lossless=True, method=0, quality=0)
        return buf.getvalue(), "webp"
    rgb.save(buf, "PNG", compress_level=6 if fmt == "png" else 1)
    return buf.getvalue(), "png"


@dataclass(frozen=True)
class Stored:
    """The bytes an image is stored as, their format, its JPEG's first-generation PSNR and why
    it is stored losslessly (``None`` when stored as JPEG)."""

    data: bytes
    fmt: str
    psnr_db: float | None
    lossless_reason: str | None


def store(rgb: Image.Image, settings: IngestSettings, source_bytes: int | None = None) -> Stored:
    """Content-aware storage: the JPEG at the configured quality, unless ``lossless_fallback`` is on
    and the JPEG's first-generation PSNR is below ``q92_min_psnr_db`` (``psnr``: the quality bound
    would not hold) or the image has at most ``lossless_max_colors`` colors and its lossless bytes
    are at most ``LOSSLESS_MAX_GROWTH`` times the JPEG's (``few_colors``: line art, text renders,
    palettes, where JPEG rings around every edge). With ``source_bytes`` (the original file's size),
    the stored bytes stay within :data:`SOURCE_MAX_GROWTH` of it (see :func:`_oversize`).

    >>> s = store(Image.new("RGB", (64, 64), (200, 30, 30)), IngestSettings())
    >>> (s.fmt, s.lossless_reason)
    ('webp', 'few_colors')
    >>> store(Image.new("RGB", (64, 64)), IngestSettings(lossless_fallback="off")).fmt
    'jpeg'
    """
    jpeg = encode_jpeg(rgb, settings.jpeg_quality, settings.jpeg_subsampling)
    if settings.lossless_fallback == "off":
        return Stored(jpeg, "jpeg", None, None)
    psnr = jpeg_psnr(rgb, jpeg, settings.jpeg_quality, settings.jpeg_subsampling, bound=settings.q92_min_psnr_db)
    reason = None
    if psnr < settings.q92_min_psnr_db:
        reason = "psnr"
    elif settings.lossless_max_colors and rgb.getcolors(settings.lossless_max_colors) is not None:
        reason = "few_colors"
    if reason is not None:
        lossless, fmt = encode_lossless(rgb, settings.lossless_fallback)
        limit = SOURCE_MAX_GROWTH * source_bytes if source_bytes else None
        if limit is not None and reason == "psnr" and len(lossless) > limit:
            return _oversize(rgb, jpeg, psnr, limit, settings)
        if reason == "psnr" or len(lossless) <= LOSSLESS_MAX_GROWTH * len(jpeg):
            return Stored(lossless, fmt, round(psnr, 3), reason)
    return Stored(jpeg, "jpeg", round(psnr, 3), None)


def _oversize(rgb: Image.Image, jpeg: bytes, psnr: float, limit: float, settings: IngestSettings) -> Stored:
    """An image the PSNR bound sends to lossless storage whose lossless bytes would exceed ``limit``
    (see :data:`SOURCE_MAX_GROWTH`): the JPEG (4:4:4) at the highest of :data:`FALLBACK_QUALITIES`
    above the configured quality that fits, else the configured JPEG; ``lossless_reason`` records
    which (``lossless_oversize_q<quality>``, ``lossless_oversize``)."""
    for quality in (q for q in FALLBACK_QUALITIES if q > settings.jpeg_quality):
        better = encode_jpeg(rgb, quality, "4:4:4")
        if len(better) <= limit:
            return Stored(better, "jpeg", round(psnr, 3), f"lossless_oversize_q{quality}")
    return Stored(jpeg, "jpeg", round(psnr, 3), "lossless_oversize")


@lru_cache(maxsize=1)
def _dct_matrix(n: int = 32) -> np.ndarray:
    k = np.arange(n)[:, None]
    x = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * x + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0, :] /= np.sqrt(2.0)
    return m


def perceptual_hash(rgb: Image.Image) -> int:
    """64-bit DCT perceptual hash (pHash): 32x32 gray, low 8x8 frequencies vs their median.

    Near-duplicates (re-encodes, small resizes) differ in a few bits; the Hamming
    distance between two hashes measures visual difference.
    """
    gray = rgb.convert("L").resize((32, 32), Image.Resampling.LANCZOS, reducing_gap=2.0)
    d = _dct_matrix()
    coeffs = d @ np.asarray(gray, dtype=np.float64) @ d.T
    low = coeffs[:8, :8].ravel()
    return int.from_bytes(np.packbits(low > np.median(low)).tobytes(), "big")


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two 64-bit hashes."""
    return (a ^ b).bit_count()


def aspect_bucket(width: int, height: int, buckets: tuple[str, ...]) -> str:
    """The bucket (``"W:H"``) nearest to ``width/height`` in log ratio."""
    r = math.log(width / height)
    return min(bucket_ratios(buckets), key=lambda b: abs(math.log(b[1]) - r))[0]


def resize_max_side(rgb: Image.Image, max_side: int | None) -> Image.Image:
    """Downscale (Lanczos) so the longer side is at most ``max_side``."""
    if not max_side or max(rgb.size) <= max_side:
        return rgb
    scale = max_side / max(rgb.size)
    size = (max(1, round(rgb.size[0] * scale)), max(1, round(rgb.size[1] * scale)))
    return rgb.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)


@dataclass(frozen=True)
class Prepared:
    """Pixels ready to encode plus what the header said about the original."""

    rgb: Image.Image
    orig_size: tuple[int, int]
    orig_format: str
    orig_mode: str


def _oriented_size(im: Image.Image) -> tuple[int, int]:
    w, h = im.size
    try:
        orientation = im.getexif().get(0x0112, 1)
    except Exception:  # malformed EXIF never blocks ingest; orientation then stays as stored
        orientation = 1
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


def prepare_rgb(data: bytes, settings: IngestSettings) -> Prepared:
    """Steps 1-6: header checks, decode, orientation, RGB conversion, downscale.

    ``orig_size`` is the original size as displayed (after EXIF orientation, before any
    downscale).
    """
    im = open_header(data, settings)
    orig_size, orig_format, orig_mode = _oriented_size(im), im.format or "unknown", im.mode
    decode(im, settings)
    try:
        ImageOps.exif_transpose(im, in_place=True)  # no full-size copy when already upright
    except Exception as e:  # Pillow raises assorted errors on malformed EXIF blocks
        raise ImageRejected(RejectReason.CORRUPT, f"EXIF orientation unreadable: {e}") from None
    rgb = to_rgb(im)
    return Prepared(resize_max_side(rgb, settings.max_side), orig_size, orig_format, orig_mode)


def normalize(data: bytes, settings: IngestSettings, keep_rgb: bool = False) -> NormalizedImage:
    """Validate and normalize one encoded image.

    Parameters
    ----------
    data:
        The original file bytes.
    settings:
        Limits and encoding settings.
    keep_rgb:
        Keep the normalized RGB pixels (before JPEG) on the result, e.g. for the JPEG
        quality experiment.

    Raises
    ------
    ImageRejected
        With the reason code and a message naming the offending value.

    Examples
    --------
    >>> from PIL import Image; import io
    >>> buf = io.BytesIO(); Image.new("RGBA", (120, 80), (255, 0, 0, 128)).save(buf, "PNG")
    >>> out = normalize(buf.getvalue(), IngestSettings())
    >>> (out.width, out.height, out.orig_format, out.aspect_bucket)
    (120, 80, 'PNG', '3:2')
    """
    prep = prepare_rgb(data, settings)
    rgb = prep.rgb
    stored = store(rgb, settings, source_bytes=len(data))
    w, h = rgb.size
    return NormalizedImage(
        jpeg=stored.data,
        stored_sha256=hashlib.sha256(stored.data).hexdigest(),
        stored_format=stored.fmt,
        q92_psnr_db=stored.psnr_db,
        lossless_reason=stored.lossless_reason,
        width=w,
        height=h,
        orig_width=prep.orig_size[0],
        orig_height=prep.orig_size[1],
        orig_format=prep.orig_format,
        orig_mode=prep.orig_mode,
        orig_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        phash=perceptual_hash(rgb),
        aspect_ratio=w / h,
        aspect_bucket=aspect_bucket(w, h, settings.aspect_buckets),
        rgb=rgb if keep_rgb else None,
    )

