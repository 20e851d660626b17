"""Peak memory of every stage on oversized inputs (part of ``python -m bench faults``).

Three images under the default ``max_pixels`` that once took every stage after ingest past 2 GB
(two 9500 x 9500 1-bit PNGs, a 9999 x 9999 PNG of 0.3 MB) and an 11 MB noise PNG, beside a few
ordinary photos, go through the whole graph, one ``prx-assets run --select <stage>`` process per
stage (the training job is that process's child). Each process's peak resident memory, its
children's included, is read with ``os.wait4``. Budget: 2 GB per stage.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

STAGES = ("raw_images", "image_embeddings", "recaptions", "lance_table", "curated_subsets", "mds_shards",
          "training_mixture", "training_run")
BUDGET_GB = 2.0


def write_inputs(folder: Path) -> int:
    """The oversized images and six ordinary photos; returns how many files."""
    from prx_assets.core.demo.corpus import make_scene

    folder.mkdir(parents=True)
    for i in range(2):
        Image.new("1", (9500, 9500), 1).save(folder / f"scan_{i}.png", optimize=True)
    big = Image.new("RGB", (9999, 9999), (200, 180, 160))
    big.paste((20, 40, 60), (1000, 1000, 3000, 3000))
    big.save(folder / "big_flat.png", optimize=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (1900, 1900, 3), dtype=np.uint8)).save(folder / "noise.png")
    for i in range(6):
        buf = io.BytesIO()
        make_scene(rng, 640, 480).image.save(buf, "JPEG", quality=92)
        (folder / f"photo_{i}.jpg").write_bytes(buf.getvalue())
    return 10


def _config(base: Path, models: dict[str, str]) -> Path:
    cfg = base / "config"
    cfg.mkdir()
    (cfg / "sources.yaml").write_text(f"sources:\n  - {{name: big, kind: folder, path: {base / 'in'}}}\n")
    (cfg / "models.yaml").write_text(
        f"captioners:\n  - {{name: short, model: {models['vl']}, max_new_tokens: 8, batch_size: 8}}\n"
        f"embedder: {{name: siglip, model: {models['siglip']}, batch_size: 32}}\n"
        f"text_encoder: {{name: qwen3, model: {models['text']}, max_length: 16}}\n")
    (cfg / "recipes.yaml").write_text("recipes:\n  - {name: all, captions: [short]}\n")
    (cfg / "mixtures.yaml").write_text("mixtures:\n  - {name: mix, streams: [{recipe: all, proportion: 1}]}\n")
    return cfg


def _stage(exe: str, stage: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.Popen([exe, "run", "--select", stage], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"ok": proc.returncode == 0, "seconds": round(time.perf_counter() - started, 1),
            "peak_gb": round(usage.ru_maxrss / 2**20, 3), "tail": out[-600:] if proc.returncode else ""}


def run() -> dict[str, Any]:
    """The whole graph on the oversized inputs, one process per stage; peak memory per stage."""
    from prx_assets.core.demo.tiny_models import build_tiny_qwen3_text, build_tiny_qwen3_vl, build_tiny_siglip

    base = Path(tempfile.mkdtemp(prefix="prx-bench-stage-memory-"))
    try:
        files = write_inputs(base / "in")
        models = {"vl": str(build_tiny_qwen3_vl(base / "m" / "vl")), "siglip": str(build_tiny_siglip(base / "m" / "s")),
                  "text": str(build_tiny_qwen3_text(base / "m" / "t"))}
        cfg = _config(base, models)
        (base / "home").mkdir()
        env = {**os.environ, "PRX_DATA_ROOT": str(base / "data"), "PRX_CONFIG_DIR": str(cfg),
               "DAGSTER_HOME": str(base / "home"), "HF_HUB_OFFLINE": "1"}
        exe = str(Path(sys.executable).parent / "prx-assets")
        stages = {s: _stage(exe, s, env, base) for s in STAGES}
        peaks = {s: v["peak_gb"] for s, v in stages.items()}
        return {"inputs": files, "stages": stages, "peak_gb_per_stage": peaks, "budget_gb": BUDGET_GB,
                "all_ok": all(v["ok"] for v in stages.values()),
                "all_under_budget": all(p <= BUDGET_GB for p in peaks.values())}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    lines = [f"oversized inputs ({r['inputs']} files) through the graph, one process per stage:",
             f"  {'stage':<18}{'ok':>4}{'seconds':>9}{'peak GB':>9}"]
    for s, v in r["stages"].items():
        lines.append(f"  {s:<18}{'yes' if v['ok'] else 'NO':>4}{v['seconds']:>9}{v['peak_gb']:>9}")
    lines.append(f"  every stage under {r['budget_gb']} GB: {r['all_under_budget']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(run()))
