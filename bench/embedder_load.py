"""The embedder's load: the vision tower alone against the whole dual encoder, at full size.

A random checkpoint of ``google/siglip2-so400m-patch14-384``'s shape (1.136B parameters, its text
tower with a 256k-token vocabulary; 2.2 GB in bf16, built once and cached under the bench cache) is
loaded in float32 on CPU in fresh processes, sides alternated after a warm-up of each: the whole
model by ``AutoModel.from_pretrained`` (how the embedder loaded before) against
``load_image_model`` (the vision tower alone). Reported per side: load seconds (median and spread),
peak memory added by the load and one 384x384 image embedded, parameters held; and whether both
gave the same features bit for bit.
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.peer import CACHE, ROUNDS, status_kb

SIDES = ("whole", "tower")


def checkpoint() -> Path:
    """The random so400m-shaped SigLIP checkpoint (built on first use, about a minute)."""
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    path = CACHE / "siglip-so400m-shape-v1"
    if (path / "DONE").exists():
        return path
    config = SiglipConfig(
        text_config={"vocab_size": 256000, "hidden_size": 1152, "intermediate_size": 4304,
                     "num_hidden_layers": 27, "num_attention_heads": 16, "max_position_embeddings": 64},
        vision_config={"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                       "num_attention_heads": 16, "image_size": 384, "patch_size": 14})
    torch.manual_seed(0)
    SiglipModel._from_config(config, dtype=torch.bfloat16).save_pretrained(path)
    SiglipImageProcessor(size={"height": 384, "width": 384}).save_pretrained(path)
    (path / "DONE").write_text("1")
    return path


def child(side: str, path: str, features_out: str) -> dict[str, Any]:
    """Load one side in this (fresh) process, embed one image, save the features."""
    import torch
    from transformers import AutoConfig, AutoModel

    from prx_assets.core.models.embeddings import image_features, load_image_model

    before = status_kb("VmRSS")
    t = time.perf_counter()
    if side == "whole":
        model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    else:
        model = load_image_model(path, AutoConfig.from_pretrained(path), torch.float32).eval()
    load = time.perf_counter() - t
    pixels = torch.randn(1, 3, 384, 384, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.save(image_features(model, pixels), features_out)
    return {"side": side, "load_s": load, "params": sum(p.numel() for p in model.parameters()),
            "peak_extra_gb": (status_kb("VmHWM") - before) / 2**20}


def run() -> dict[str, Any]:
    """Run the benchmark and return its figures."""
    import torch

    path = checkpoint()
    tmp = Path(tempfile.mkdtemp(prefix="prx-embedder-load-"))
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    for i in range(1 + ROUNDS):  # the first round warms the page cache and both code paths up
        for side in SIDES:
            out = subprocess.run([sys.executable, "-W", "ignore", "-m", "bench.embedder_load", side, str(path),
                                  str(tmp / f"{side}.pt")], check=True, capture_output=True, text=True,
                                 cwd=Path(__file__).resolve().parents[1])
            if i:
                runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    same = torch.equal(torch.load(tmp / "whole.pt"), torch.load(tmp / "tower.pt"))
    result: dict[str, Any] = {"checkpoint": "google/siglip2-so400m-patch14-384 shape, random, bf16 on disk, "
                                            "loaded in float32 on CPU", "rounds": ROUNDS, "same_features": same}
    for side in SIDES:
        loads = [r["load_s"] for r in runs[side]]
        result[side] = {"load_s": round(statistics.median(loads), 2), "load_spread_s": [round(x, 2) for x in loads],
                        "peak_extra_gb": round(max(r["peak_extra_gb"] for r in runs[side]), 2),
                        "params": runs[side][0]["params"]}
    result["load_ratio_tower_vs_whole"] = round(result["tower"]["load_s"] / result["whole"]["load_s"], 3)
    return result


def format_table(r: dict[str, Any]) -> str:
    """The figures as text."""
    rows = [f"embedder load, {r['checkpoint']}, {r['rounds']} alternated rounds after a warm-up:"]
    for side, label in (("whole", "whole model (AutoModel)"), ("tower", "vision tower alone")):
        s = r[side]
        rows.append(f"  {label:<24} load {s['load_s']:.2f} s (spread {s['load_spread_s']}), "
                    f"peak +{s['peak_extra_gb']:.2f} GB, {s['params'] / 1e6:,.0f}M parameters")
    rows.append(f"  tower / whole load time {r['load_ratio_tower_vs_whole']:.3f}; "
                f"same features bit for bit: {r['same_features']}")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        print(json.dumps(child(*sys.argv[1:4])))
    else:
        print(format_table(run()))
