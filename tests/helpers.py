"""Helpers shared by the tests (fixtures live in conftest.py): images, corpora, config files, polling,
and the local ``dagster dev`` server. Import them as ``from tests.helpers import ...``."""

import io
import time
from pathlib import Path

import numpy as np
from PIL import Image

from prx_assets.devserver import dagster_dev, free_port, graphql

__all__ = ["dagster_dev", "encode", "free_port", "graphql", "photo", "wait_for", "write_folder_corpus",
           "write_sources_yaml"]


def encode(im: Image.Image, fmt: str, **kw: object) -> bytes:
    """Encode an image to bytes."""
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def photo(w: int = 320, h: int = 240, seed: int = 0) -> Image.Image:
    """A deterministic photo-like RGB image."""
    from prx_assets.core.demo.corpus import make_scene

    return make_scene(np.random.default_rng(seed), w, h).image


def write_folder_corpus(folder: Path, n: int = 6, seed: int = 0, broken: bool = True) -> list[Path]:
    """``n`` good images of mixed formats (plus, optionally, three broken files) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    fmts = [("jpg", "JPEG"), ("png", "PNG"), ("webp", "WEBP")]
    for i in range(n):
        ext, fmt = fmts[i % 3]
        p = folder / ("sub" if i % 2 else "") / f"img_{seed}_{i:03d}.{ext}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(encode(photo(200 + 40 * i, 160 + 10 * i, seed=seed * 100 + i), fmt))
        out.append(p)
    if broken:
        (folder / "zero.jpg").write_bytes(b"")
        (folder / "text.jpg").write_bytes(b"hello, not a jpeg")
        (folder / "tiny.png").write_bytes(encode(photo(20, 20), "PNG"))
        out += [folder / "zero.jpg", folder / "text.jpg", folder / "tiny.png"]
    return out


def write_sources_yaml(config_dir: Path, body: str) -> Path:
    """Write sources.yaml into ``config_dir`` and return its path."""
    config_dir.mkdir(parents=True, exist_ok=True)
    p = config_dir / "sources.yaml"
    p.write_text(body)
    return p


def wait_for(pred, timeout: float, what: str, every: float = 1.0):
    """Poll ``pred`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
