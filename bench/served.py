"""Captions/s through ``backend: openai`` vs a bare client against the same server.

One ``transformers serve`` on loopback with the tiny random Qwen3-VL (CPU), the same decoded demo
images, the same request (prompt, ``max_tokens``, greedy) and the same number of requests in
flight. The bare client is what a script would do: encode each image as a PNG data URL and POST it
with httpx from a thread pool, reading ``choices[0]``. Ours is ``OpenAICaptioner.caption`` (pixel
bounds, retries, response parsing, results in order). Sides alternate (ABAB) after a warm-up of both;
the figure is the median of the rounds' ratios of captions/s (ours / bare), with their range. ``transformers serve`` generates one
request at a time on CPU and Qwen-VL is not safe for concurrent requests there (see
``prx_assets.core.models.served``), so concurrency 1 is the clean figure; 4 shows the in-flight path.
"""

import base64
import io
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.corpus import generate_demo_corpus
from prx_assets.core.demo.tiny_models import build_tiny_qwen3_vl
from prx_assets.core.models.caption_spec import DEFAULT_PROMPT, CaptionerSpec
from prx_assets.core.models.served import OpenAICaptioner, transformers_server

TOKENS = int(os.environ.get("PRX_BENCH_TOKENS", "24"))
IMAGES = int(os.environ.get("PRX_BENCH_SERVED_IMAGES", "32"))
ROUNDS = int(os.environ.get("PRX_BENCH_ROUNDS", "3"))
CONCURRENCY = (1, 4)


def bare_client(url: str, model: str, images: list[Image.Image], concurrency: int) -> int:
    """A plain client: PNG data URL, POST, first choice's text."""
    with httpx.Client(base_url=url, timeout=600) as client:
        def one(im: Image.Image) -> str:
            buf = io.BytesIO()
            im.save(buf, format="PNG", compress_level=1)
            body = {"model": model, "max_tokens": TOKENS, "temperature": 0.0, "stream": False, "messages": [
                {"role": "user", "content": [
                    {"type": "image_url",
                     "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}},
                    {"type": "text", "text": DEFAULT_PROMPT}]}]}
            r = client.post("/chat/completions", json=body)
            r.raise_for_status()
            return r.text

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return len(list(pool.map(one, images)))


def run() -> dict[str, Any]:
    """Run the benchmark and return its figures."""
    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-served-"))
    model = str(build_tiny_qwen3_vl(tmp / "tiny-qwen3-vl"))
    generate_demo_corpus(DataRoot(str(tmp)), n_photos=IMAGES, n_catalog=0, n_web=0)
    images = []
    for f in sorted(p for p in (tmp / "demo" / "photos").rglob("*") if p.is_file() and "broken" not in p.parts):
        try:  # the demo corpus plants broken files on purpose
            with Image.open(f) as im:
                images.append(im.convert("RGB"))
        except (OSError, ValueError, Image.DecompressionBombError):
            continue
    images = images[:IMAGES]
    results: dict[str, Any] = {"images": len(images), "tokens": TOKENS, "rounds": ROUNDS, "by_concurrency": {}}
    try:
        with transformers_server(log_path=str(tmp / "serve.log")) as url:
            for conc in CONCURRENCY:
                spec = CaptionerSpec(name="bench", model=model, max_new_tokens=TOKENS, backend="openai",
                                     server_url=url, concurrency=conc)
                ours = OpenAICaptioner(spec)
                ours.caption(images[:2])  # warm-up: the server loads the model on the first request
                bare_client(url, model, images, conc)
                ours.caption(images)
                t_bare, t_ours = [], []
                for r in range(ROUNDS):
                    sides = [("bare", lambda c=conc: bare_client(url, model, images, c)),
                             ("ours", lambda o=ours: len(o.caption(images)))]
                    for name, fn in sides if r % 2 == 0 else sides[::-1]:
                        t = time.perf_counter()
                        if fn() != len(images):
                            raise RuntimeError(f"{name}: not every image was captioned")
                        (t_bare if name == "bare" else t_ours).append(time.perf_counter() - t)
                ours.close()
                b, o = statistics.median(t_bare), statistics.median(t_ours)
                ratios = [tb / to for tb, to in zip(t_bare, t_ours, strict=True)]  # per round
                results["by_concurrency"][conc] = {
                    "bare_captions_per_s": round(len(images) / b, 2), "ours_captions_per_s": round(len(images) / o, 2),
                    "ratio": round(statistics.median(ratios), 3),
                    "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    lines = [f"captions/s through transformers serve (tiny Qwen3-VL, CPU), {r['images']} images, up to "
             f"{r['tokens']} tokens, median of {r['rounds']} alternating rounds",
             f"  {'in flight':>9} {'bare client':>12} {'backend openai':>15} {'ratio':>7} {'spread':>14}"]
    for c, v in r["by_concurrency"].items():
        lines.append(f"  {c:>9} {v['bare_captions_per_s']:>12} {v['ours_captions_per_s']:>15} {v['ratio']:>7} "
                     f"{v['ratio_spread'][0]:>6}-{v['ratio_spread'][1]:<6}")
    lines.append("  target: ratio >= 0.9")
    return "\n".join(lines)
