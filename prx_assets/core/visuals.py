"""Pictures for metadata: contact sheets, bar charts and line charts as small inline images.

The Dagster UI renders Markdown metadata, including images given as ``data:`` URIs, so a
materialization can show thumbnails with their captions, histograms and curves without any
file server. Everything is drawn with Pillow (no plotting dependency) and kept small:
contact sheets are JPEG, charts PNG, typically 10-60 KB.
"""

from __future__ import annotations

import base64
import io
import textwrap
from collections.abc import Mapping, Sequence

from PIL import Image, ImageDraw, ImageFont

from prx_assets.core.enrich.decode import decode_rgb

BG = (255, 255, 255)
FG = (40, 40, 40)
BAR = (79, 67, 221)  # Dagster-ish violet
GRID = (225, 225, 225)


def _font(size: int = 11) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def contact_sheet(items: Sequence[tuple[bytes, str]], thumb: int = 128, cols: int = 4,
                  caption_lines: int = 4) -> bytes:
    """A grid of thumbnails (``thumb`` px boxes) each with the start of its caption; JPEG bytes."""
    if not items:
        raise ValueError("contact_sheet needs at least one image")
    font = _font(10)
    line_h = 12
    cell_w, cell_h = thumb + 8, thumb + 8 + caption_lines * line_h
    rows = (len(items) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * cell_w, rows * cell_h), BG)
    draw = ImageDraw.Draw(sheet)
    chars = max(8, thumb // 6)
    for i, (data, caption) in enumerate(items):
        x, y = (i % cols) * cell_w + 4, (i // cols) * cell_h + 4
        try:
            im = decode_rgb(data, 4 * thumb * thumb)  # never the full bitmap of a large image, no bomb warning
            im.thumbnail((thumb, thumb))
            sheet.paste(im, (x + (thumb - im.width) // 2, y + (thumb - im.height) // 2))
        except (OSError, ValueError):
            draw.rectangle((x, y, x + thumb, y + thumb), outline=(200, 0, 0))
            draw.text((x + 4, y + 4), "undecodable", fill=(200, 0, 0), font=font)
        lines = textwrap.wrap(caption or "(no caption)", chars)[:caption_lines]
        for j, line in enumerate(lines):
            draw.text((x, y + thumb + 2 + j * line_h), line, fill=FG, font=font)
    buf = io.BytesIO()
    sheet.save(buf, "JPEG", quality=80, optimize=True)
    return buf.getvalue()


def bar_chart(counts: Mapping[str, float], title: str, width: int = 420, bar_h: int = 18) -> bytes:
    """Horizontal bars, one per key (in the mapping's order), labelled with the value; PNG bytes."""
    font = _font(11)
    items = list(counts.items()) or [("(none)", 0)]
    label_w = min(160, 8 + 7 * max(len(str(k)) for k, _ in items))
    height = 28 + len(items) * (bar_h + 4) + 6
    im = Image.new("RGB", (width, height), BG)
    d = ImageDraw.Draw(im)
    d.text((6, 6), title, fill=FG, font=_font(12))
    top = max((float(v) for _, v in items), default=0.0) or 1.0
    span = width - label_w - 60
    for i, (k, v) in enumerate(items):
        y = 28 + i * (bar_h + 4)
        d.text((6, y + 3), str(k)[:22], fill=FG, font=font)
        w = int(span * float(v) / top)
        d.rectangle((label_w, y, label_w + max(w, 1), y + bar_h), fill=BAR)
        d.text((label_w + w + 4, y + 3), f"{v:g}" if isinstance(v, float) else str(v), fill=FG, font=font)
    return _png(im)


def line_chart(values: Sequence[float], title: str, y_label: str = "", x_label: str = "",
               width: int = 420, height: int = 220, threshold: float | None = None) -> bytes:
    """A line with points over ``1..n`` (optionally a dashed threshold line); PNG bytes."""
    font = _font(10)
    im = Image.new("RGB", (width, height), BG)
    d = ImageDraw.Draw(im)
    d.text((6, 6), title, fill=FG, font=_font(12))
    left, right, top, bottom = 48, width - 12, 28, height - 28
    vals = [float(v) for v in values] or [0.0]
    lo = min(vals + ([threshold] if threshold is not None else []))
    hi = max(vals + ([threshold] if threshold is not None else []))
    if hi - lo < 1e-9:
        lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.08
    lo, hi = lo - pad, hi + pad

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + (right - left) * (i / max(1, len(vals) - 1))
        return x, bottom - (bottom - top) * (v - lo) / (hi - lo)

    for k in range(5):
        yv = lo + (hi - lo) * k / 4
        y = bottom - (bottom - top) * k / 4
        d.line((left, y, right, y), fill=GRID)
        d.text((4, y - 6), f"{yv:.3g}", fill=FG, font=font)
    if threshold is not None:
        y = xy(0, threshold)[1]
        for x in range(left, right, 8):
            d.line((x, y, x + 4, y), fill=(200, 60, 60))
    pts = [xy(i, v) for i, v in enumerate(vals)]
    if len(pts) > 1:
        d.line(pts, fill=BAR, width=2)
    for x, y in pts:
        d.ellipse((x - 2.5, y - 2.5, x + 2.5, y + 2.5), fill=BAR)
    d.text((left, bottom + 8), f"1 .. {len(vals)} {x_label}".strip(), fill=FG, font=font)
    if y_label:
        d.text((right - 7 * len(y_label), 8), y_label, fill=FG, font=font)
    return _png(im)


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", optimize=True)
    return buf.getvalue()


def md_image(data: bytes, alt: str) -> str:
    """Markdown that shows ``data`` (PNG or JPEG bytes) inline in the Dagster UI."""
    mime = "image/jpeg" if data[:2] == b"\xff\xd8" else "image/png"
    return f"![{alt}](data:{mime};base64,{base64.b64encode(data).decode()})"
