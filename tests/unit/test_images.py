"""Pixel-level tests of decoding, orientation, mode conversion, and every reject reason."""

import io
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from prx_assets.core.config.project import IngestSettings
from prx_assets.core.demo.corpus import exif_rotated_jpeg, pixel_bomb_png
from prx_assets.core.ingest.images import (
    ImageRejected,
    RejectReason,
    aspect_bucket,
    hamming,
    normalize,
    perceptual_hash,
    to_rgb,
)
from tests.helpers import encode, photo

S = IngestSettings()
RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def rgb_of(data: bytes, settings: IngestSettings = S) -> Image.Image:
    out = normalize(data, settings, keep_rgb=True)
    assert out.rgb is not None
    # The stored JPEG decodes to the same size as the normalized pixels.
    assert Image.open(io.BytesIO(out.jpeg)).size == out.rgb.size
    return out.rgb


def close(px: tuple[int, ...], want: tuple[int, ...], tol: int = 3) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(px, want, strict=True))


def quadrants(w: int = 160, h: int = 96) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    arr = np.zeros((h, w, 3), np.uint8)
    arr[: h // 2, : w // 2] = RED
    arr[: h // 2, w // 2:] = GREEN
    arr[h // 2:, : w // 2] = BLUE
    arr[h // 2:, w // 2:] = WHITE
    return Image.fromarray(arr, "RGB")


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_restores_the_upright_image(orientation: int) -> None:
    upright = quadrants()
    data = encode(upright, "JPEG", quality=95) if orientation == 1 else \
        exif_rotated_jpeg(upright, orientation)
    stored = Image.open(io.BytesIO(data))
    if orientation in (5, 6, 7, 8):
        assert stored.size == (96, 160)  # stored sideways
    out = normalize(data, S, keep_rgb=True)
    assert (out.width, out.height) == (160, 96)
    assert (out.orig_width, out.orig_height) == (160, 96)
    rgb = out.rgb
    assert close(rgb.getpixel((20, 12)), RED, 12)
    assert close(rgb.getpixel((140, 12)), GREEN, 12)
    assert close(rgb.getpixel((20, 84)), BLUE, 12)
    assert close(rgb.getpixel((140, 84)), WHITE, 12)


def test_rgba_composited_on_white() -> None:
    im = Image.new("RGBA", (100, 100), (255, 0, 0, 128))
    im.paste((0, 0, 255, 0), (0, 0, 50, 100))  # left half fully transparent
    rgb = rgb_of(encode(im, "PNG"))
    assert close(rgb.getpixel((10, 50)), WHITE)
    assert close(rgb.getpixel((80, 50)), (255, 127, 127), 4)


def test_la_and_pa_and_palette_transparency() -> None:
    la = Image.new("LA", (80, 80), (100, 255))
    la.paste((0, 0), (0, 0, 40, 80))
    rgb = rgb_of(encode(la, "PNG"))
    assert close(rgb.getpixel((10, 40)), WHITE)
    assert close(rgb.getpixel((70, 40)), (100, 100, 100))

    p = Image.new("P", (80, 80), 1)
    p.putpalette([0, 0, 0, 200, 30, 30] + [0] * 762)
    p.paste(0, (0, 0, 40, 80))
    rgb = rgb_of(encode(p, "GIF", transparency=0))
    assert close(rgb.getpixel((10, 40)), WHITE)
    assert close(rgb.getpixel((70, 40)), (200, 30, 30), 6)

    pa = to_rgb(p.convert("PA"))
    assert pa.mode == "RGB"


def test_palette_without_transparency_and_animated_gif_first_frame() -> None:
    frames = [Image.new("RGB", (80, 80), c).convert("P") for c in (RED, BLUE)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100)
    rgb = rgb_of(buf.getvalue())
    assert close(rgb.getpixel((40, 40)), RED, 6)


def test_cmyk_jpeg_and_tiff() -> None:
    cmyk = Image.new("RGB", (80, 80), RED).convert("CMYK")
    assert close(rgb_of(encode(cmyk, "JPEG", quality=95)).getpixel((40, 40)), RED, 8)
    assert close(rgb_of(encode(cmyk, "TIFF")).getpixel((40, 40)), RED, 3)


def test_sixteen_bit_and_32bit_and_float_gray() -> None:
    a16 = np.full((80, 80), 40000, np.uint16)
    out = normalize(encode(Image.fromarray(a16), "PNG"), S, keep_rgb=True)
    assert out.orig_mode.startswith("I;16")
    assert close(out.rgb.getpixel((5, 5)), (156, 156, 156), 1)  # 40000 / 257
    assert to_rgb(Image.new("I", (4, 4), 200)).getpixel((0, 0)) == (200, 200, 200)
    assert to_rgb(Image.new("I", (4, 4), 40000)).getpixel((0, 0)) == (156, 156, 156)
    assert to_rgb(Image.new("F", (4, 4), 0.5)).getpixel((0, 0)) == (128, 128, 128)


def test_one_bit_gray_ycbcr_hsv_lab() -> None:
    mono = Image.new("1", (80, 80), 1)
    mono.paste(0, (0, 0, 40, 80))
    rgb = rgb_of(encode(mono, "PNG"))
    assert close(rgb.getpixel((10, 40)), (0, 0, 0)) and close(rgb.getpixel((70, 40)), WHITE)
    assert close(rgb_of(encode(Image.new("L", (80, 80), 77), "PNG")).getpixel((1, 1)), (77, 77, 77))
    assert close(to_rgb(Image.new("YCbCr", (4, 4), (76, 85, 255))).getpixel((0, 0)), RED, 2)
    assert close(to_rgb(Image.new("HSV", (4, 4), (0, 255, 255))).getpixel((0, 0)), RED, 1)
    assert close(to_rgb(Image.new("LAB", (4, 4), (255, 128, 128))).getpixel((0, 0)), WHITE, 2)
    assert close(to_rgb(Image.new("LAB", (4, 4), (0, 128, 128))).getpixel((0, 0)), (0, 0, 0), 2)


def test_webp_with_alpha_and_bmp_and_tiff() -> None:
    rgba = Image.new("RGBA", (80, 80), (0, 0, 255, 0))
    assert close(rgb_of(encode(rgba, "WEBP", lossless=True)).getpixel((5, 5)), WHITE)
    assert close(rgb_of(encode(Image.new("RGB", (80, 80), GREEN), "BMP")).getpixel((5, 5)), GREEN, 3)
    assert close(rgb_of(encode(Image.new("RGB", (80, 80), BLUE), "TIFF")).getpixel((5, 5)), BLUE, 3)


def test_output_is_jpeg_at_configured_quality_without_metadata() -> None:
    im = photo(300, 200)
    out = normalize(encode(im, "PNG"), S)
    stored = Image.open(io.BytesIO(out.jpeg))
    assert stored.format == "JPEG" and stored.mode == "RGB"
    assert "exif" not in stored.info and "icc_profile" not in stored.info
    q50 = normalize(encode(im, "PNG"), IngestSettings(jpeg_quality=50))
    assert len(q50.jpeg) < len(out.jpeg)
    assert out.sha256 == __import__("hashlib").sha256(encode(im, "PNG")).hexdigest()



def test_a_source_jpegs_comment_is_not_stored() -> None:
    # Pillow's save writes a decoded JPEG's comment back; the stored JPEG must not carry it.
    buf = io.BytesIO()
    photo(300, 200).save(buf, "JPEG", quality=95, comment=b"internal path /mnt/team/private")
    out = normalize(buf.getvalue(), S, keep_rgb=True)
    assert out.rgb is not None and out.rgb.info.get("comment")  # the pixels still carry it
    assert b"internal path" not in out.jpeg and b"\xff\xfe" not in out.jpeg  # no COM marker


@pytest.mark.parametrize("size", [(1, 1), (16, 16), (160, 160), (1001, 777), (2400, 1600)])
@pytest.mark.parametrize(("quality", "subsampling"), [(92, "4:2:0"), (95, "4:4:4"), (50, "4:2:2")])
def test_encode_jpeg_is_pillows_save_byte_for_byte(size: tuple[int, int], quality: int, subsampling: str) -> None:
    # encode_jpeg calls libjpeg directly with the arguments Pillow's writer builds; noise makes the
    # large sizes overflow the first output buffer, so the encoder is called more than once.
    from prx_assets.core.ingest.images import encode_jpeg

    rgb = Image.fromarray(np.random.default_rng(size[0]).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    rgb.save(buf, "JPEG", quality=quality, subsampling=subsampling, optimize=False)
    assert encode_jpeg(rgb, quality, subsampling) == buf.getvalue()
    gray = rgb.convert("L")  # another mode goes through save
    buf = io.BytesIO()
    gray.save(buf, "JPEG", quality=quality, subsampling=subsampling, optimize=False)
    assert encode_jpeg(gray, quality, subsampling) == buf.getvalue()

def test_max_side_downscale_and_jpeg_draft() -> None:
    big = photo(1600, 1000)
    s = IngestSettings(max_side=400)
    for data in (encode(big, "PNG"), encode(big, "JPEG", quality=95)):
        out = normalize(data, s)
        assert (out.width, out.height) == (400, 250)
        assert (out.orig_width, out.orig_height) == (1600, 1000)


@pytest.mark.parametrize(
    ("data", "settings", "reason"),
    [
        (b"", S, RejectReason.EMPTY),
        (b"plain text that is not an image\n" * 3, S, RejectReason.NOT_IMAGE),
        (b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 10, S, RejectReason.CORRUPT),
        (encode(photo(400, 300), "JPEG")[:1500], S, RejectReason.TRUNCATED),
        (encode(photo(400, 300), "PNG")[:5000], S, RejectReason.TRUNCATED),
        (pixel_bomb_png(), S, RejectReason.DECOMPRESSION_BOMB),
        (encode(photo(200, 200), "PNG"), IngestSettings(max_pixels=10_000), RejectReason.DECOMPRESSION_BOMB),
        (encode(photo(40, 100), "PNG"), S, RejectReason.TOO_SMALL),
        (encode(photo(1000, 100), "PNG"), S, RejectReason.BAD_ASPECT),
    ],
    ids=["empty", "not_image", "corrupt", "truncated_jpeg", "truncated_png", "bomb_header",
         "bomb_configured", "too_small", "bad_aspect"],
)
def test_reject_reasons(data: bytes, settings: IngestSettings, reason: RejectReason) -> None:
    with pytest.raises(ImageRejected) as exc:
        normalize(data, settings)
    assert exc.value.reason is reason
    assert exc.value.message


def test_reject_messages_name_the_value() -> None:
    with pytest.raises(ImageRejected, match=r"2500000000 pixels > max_pixels=1000000 "):
        normalize(pixel_bomb_png(), IngestSettings(max_pixels=10**6))
    with pytest.raises(ImageRejected, match=r"2500000000 pixels, above Pillow's guard"):
        normalize(pixel_bomb_png(), IngestSettings(max_pixels=10**12))
    with pytest.raises(ImageRejected, match=r"3000x2000 = 6000000 pixels > max_pixels=1000000"):
        normalize(pixel_bomb_png(3000, 2000), IngestSettings(max_pixels=10**6))
    with pytest.raises(ImageRejected, match=r"40x100 .*min_side=64"):
        normalize(encode(photo(40, 100), "PNG"), S)


def test_bomb_is_judged_from_the_header_with_bounded_memory() -> None:
    data = pixel_bomb_png(60_000, 60_000)  # 3.6 Gpx declared, ~1 KiB on disk
    tracemalloc.start()
    with pytest.raises(ImageRejected) as exc:
        normalize(data, IngestSettings(max_pixels=10**12 // 1000))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert exc.value.reason is RejectReason.DECOMPRESSION_BOMB
    assert peak < 5 * 2**20


def test_unsupported_mode_is_rejected() -> None:
    im = Image.new("RGB", (4, 4))
    im._mode = "XYZ"  # no such Pillow mode: the defensive branch must reject, not crash
    with pytest.raises(ImageRejected) as exc:
        to_rgb(im)
    assert exc.value.reason is RejectReason.UNSUPPORTED_MODE


def test_perceptual_hash_is_stable_under_reencode_and_resize() -> None:
    a = photo(640, 480, seed=1)
    b = photo(640, 480, seed=2)
    h = perceptual_hash(a)
    reencoded = Image.open(io.BytesIO(encode(a, "JPEG", quality=70))).convert("RGB")
    assert hamming(h, perceptual_hash(reencoded)) <= 4
    assert hamming(h, perceptual_hash(a.resize((320, 240)))) <= 4
    assert hamming(h, perceptual_hash(b)) > 12
    assert 0 <= h < 2**64


@pytest.mark.parametrize(("w", "h", "bucket"), [
    (1024, 1024, "1:1"), (1920, 1080, "16:9"), (1080, 1920, "9:16"), (1200, 900, "4:3"),
    (900, 1350, "2:3"), (2520, 1080, "21:9"), (1000, 980, "1:1")])
def test_aspect_bucket(w: int, h: int, bucket: str) -> None:
    assert aspect_bucket(w, h, S.aspect_buckets) == bucket
