"""The GPU figures in one command: captioning and training throughput on a lent accelerator.

::

    python bench/gpu.py [--smoke] [--out gpu.json] [--wheels DIR] [--budget-s 420] [--only captions,trainer]
                        [--shapes 2b,8b] [--images N] [--points 1b_256px,2b_512px] [--no-sequential-side]

Made for one H200 with Python 3.12, torch and transformers preinstalled and no network: nothing is
downloaded. Random-weight checkpoints are built on the device in bf16 (``_from_config`` under
``torch.device("cuda")``) with the real models' shapes and vocabularies, saved with
``save_pretrained`` and loaded back through the project's own loaders, so throughput is honest
(outputs have a fixed length: ``min_new_tokens == max_new_tokens``). Each figure is measured with
the sides alternating (ABAB) after a warm-up of both:

- **captions**: Qwen3-VL-2B- and -8B-shaped checkpoints, 128 new tokens per image, images of
  480x360 to 1024x768. Ours is the recaptions code path from stored JPEG bytes: decode, then
  :class:`~prx_assets.core.models.captions.TransformersCaptioner` (batches grouped by size, the
  producer thread preparing the next batch, pinned host memory, SDPA or FlashAttention 2); the bare
  side is a plain ``generate`` loop on the same decoded images in the same batches; a third side is
  ours with the producer thread off, which isolates what the thread does. Images/s and tokens/s
  for each, and their ratios to bare. Every batch of a measurement has its own shapes (Qwen3-VL
  concatenates the images' patches), and the first H200 run showed that a side meeting a batch's
  shapes for the first time is 2-3x slower than one meeting them again: so one whole untimed pass
  of ours comes first (its time is reported as ``first_pass``), then the sides alternate.
- **trainer**: the reference trainer (``prx_assets.training.train``: bf16 autocast, TF32, fused
  AdamW) on an MDS shard set written here, at a 1B/256 px and a 2.1B/512 px point (1,024 image
  tokens each), with a Qwen3-VL-2B-shaped text encoder: samples/s and MFU with text latents
  computed on the fly and read precomputed from the shards, and the on-the-fly overhead.

The JSON (``--out``, also the last line printed) holds the figures, the goals and whether each was
met, the versions and the device. ``--smoke`` runs the same code paths on the CPU with tiny shapes
in under 3 minutes (the tests run it). ``--wheels DIR`` installs the wheels in DIR (``--no-deps``,
offline) into a private folder first: mosaicml-streaming 0.13 and what it imports are not on the GPU
machine (``make gpu-wheels`` downloads them here, about 8 MB). ``--budget-s`` stops starting new
measurements once that many seconds have passed (what was measured is still written).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a bare working tree (nothing installed)
    sys.path.insert(0, str(ROOT))

#: Qwen3-VL shapes (text and vision towers as in the published configs), plus a tiny one for --smoke.
QWEN3_VL_SHAPES: dict[str, dict[str, Any]] = {
    "2b": {"text": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True},
           "vision": {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
                      "out_hidden_size": 2048, "deepstack_visual_indexes": [5, 11, 17]},
           "vocab": 151_936, "mrope": [24, 20, 20]},
    "8b": {"text": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False},
           "vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                      "out_hidden_size": 4096, "deepstack_visual_indexes": [8, 16, 24]},
           "vocab": 151_936, "mrope": [24, 20, 20]},
    "tiny": {"text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True},
             "vision": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4,
                        "out_hidden_size": 64, "deepstack_visual_indexes": [1]},
             "vocab": 4096, "mrope": [4, 2, 2]},
}

#: What each run measures: (shape, batch sizes, images, new tokens, image sizes).
CAPTION_PLAN = {
    "full": {"shapes": {"2b": (16, 64), "8b": (64,)}, "images": 128, "tokens": 128,
             "sizes": ((480, 360), (640, 480), (800, 600), (1024, 768), (360, 480), (768, 1024))},
    "smoke": {"shapes": {"tiny": (2, 4)}, "images": 8, "tokens": 8, "sizes": ((96, 64), (64, 96), (128, 96)),
              "overlap": True},  # the producer thread is a GPU default; the smoke run exercises it on the CPU
}
#: Trainer points: transformer width/depth, resolution and patch (1,024 image tokens each), batch, steps.
TRAINER_PLAN = {
    "full": {"text": {"text_hidden": 2048, "text_layers": 28, "text_heads": 16, "text_kv": 8, "text_mlp": 6144,
                      "max_len": 128},
             "points": {"1b_256px": {"dim": 2048, "depth": 11, "heads": 16, "resolution": 256, "patch": 8,
                                     "batch": 32, "image": 320},
                        "2b_512px": {"dim": 2048, "depth": 23, "heads": 16, "resolution": 512, "patch": 16,
                                     "batch": 32, "image": 576}},
             "steps": 14, "warmup": 4, "samples": 1024, "distinct": 64, "workers": 8, "rounds": 1},
    "smoke": {"text": {"text_hidden": 64, "text_layers": 2, "text_heads": 4, "text_kv": 2, "text_mlp": 128,
                       "max_len": 16},
              "points": {"tiny_64px": {"dim": 64, "depth": 2, "heads": 4, "resolution": 64, "patch": 8,
                                       "batch": 4, "image": 80}},
              "steps": 6, "warmup": 2, "samples": 64, "distinct": 8, "workers": 1, "rounds": 2},
}
GOALS = {"captions_8b_images_per_s": 20.0, "trainer_mfu": 0.35, "on_the_fly_overhead_pct_2b_512px": 4.0}
#: The wheels mosaicml-streaming 0.13 needs where it is not installed (cp312 manylinux; ``make gpu-wheels``).
WHEELS = ("mosaicml-streaming==0.13.0", "brotli==1.2.1", "zstd==1.5.6.1", "python-snappy==0.7.3",
          "cramjam==2.14.0", "catalogue==2.0.10", "pyroaring==1.2.0")


class Budget:
    """Seconds since start, and whether another measurement may start."""

    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    def elapsed(self) -> float:
        """Seconds since the run began."""
        return time.perf_counter() - self.start

    def left(self) -> bool:
        """Whether there is time for another measurement."""
        return self.elapsed() < self.seconds


def install_wheels(folder: Path) -> Path:
    """Install every wheel in ``folder`` (no dependencies, no index) into a private folder on sys.path."""
    target = Path(tempfile.mkdtemp(prefix="prx-gpu-site-"))
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"--wheels {folder}: no .whl files there; run `make gpu-wheels` on a machine with the "
                         "package index and carry the folder")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(target), *wheels], check=True)
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return target


def environment(device: str) -> dict[str, Any]:
    """Versions, the device and its dense bf16 peak."""
    import numpy as np
    import torch
    import transformers

    from prx_assets.training.model import peak_tflops

    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "numpy": np.__version__, "device": device, "device_name": name,
           "peak_bf16_tflops": peak_tflops(name) if device == "cuda" else None}
    try:
        import streaming

        out["mosaicml_streaming"] = streaming.__version__
    except ImportError as e:
        out["mosaicml_streaming"] = f"missing ({e}); pass --wheels"
    return out


def sync(device: str) -> None:
    """Wait for the device's queued work (timings end on the device, not at the launch)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def free(device: str) -> None:
    """Release a dropped model's memory before the next one is built."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def build_qwen3_vl(path: Path, shape: str, device: str) -> dict[str, Any]:
    """A random-weight Qwen3-VL checkpoint of ``shape`` built on ``device`` (bf16 on a GPU), saved
    with its processor; returns how long building and saving took and the parameter count."""
    import torch
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl import Qwen3VLVideoProcessor

    from prx_assets.core.demo.tiny_models import CHAT_TEMPLATE, SPECIAL_TOKENS, train_tokenizer

    s = QWEN3_VL_SHAPES[shape]
    tokenizer = train_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config={**s["text"], "vocab_size": s["vocab"], "max_position_embeddings": 262_144, "rope_theta": 5e6,
                     "rope_scaling": {"rope_type": "default", "mrope_section": s["mrope"], "mrope_interleaved": True},
                     "bos_token_id": None, "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]},
        vision_config={**s["vision"], "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "num_position_embeddings": 2304},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=s["text"]["tie_word_embeddings"])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    started = time.perf_counter()
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration._from_config(config, torch_dtype=dtype)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.do_sample = False
    params = sum(p.numel() for p in model.parameters())
    built = time.perf_counter() - started
    model.save_pretrained(path)
    del model
    free(device)
    pixels = (256 * 256, 16_777_216) if shape != "tiny" else (32 * 32, 128 * 128)
    Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2,
                                                           min_pixels=pixels[0], max_pixels=pixels[1]),
                     tokenizer=tokenizer, video_processor=Qwen3VLVideoProcessor(patch_size=16, merge_size=2,
                                                                                temporal_patch_size=2),
                     chat_template=CHAT_TEMPLATE).save_pretrained(path)
    return {"params": params, "build_seconds": round(built, 2), "save_seconds": round(time.perf_counter() - started
                                                                                     - built, 2)}


def jpeg_corpus(n: int, sizes: tuple[tuple[int, int], ...], seed: int = 0) -> list[bytes]:
    """``n`` generated photos (gradients, shapes, texture) as JPEG q92 bytes, sizes cycling."""
    import numpy as np

    from prx_assets.core.demo.corpus import make_scene

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        buf = io.BytesIO()
        make_scene(rng, w, h).image.save(buf, "JPEG", quality=92)
        out.append(buf.getvalue())
    return out


def decode(jpegs: list[bytes]) -> list[Any]:
    """Stored bytes to RGB images, as the enrichment stage decodes them."""
    from PIL import Image

    return [Image.open(io.BytesIO(b)).convert("RGB") for b in jpegs]


def bare_generate(cap: Any, images: list[Any], batch_size: int, tokens: int) -> int:
    """What a script would do: chat template, ``generate``, decode, batch after batch (no overlap)."""
    import torch

    proc, model = cap.processor, cap.model
    padding = cap._padding  # the same padding argument (transformers 5 wants it in processor_kwargs)
    done = 0
    for i in range(0, len(images), batch_size):
        msgs = [[{"role": "user", "content": [{"type": "image", "image": im}, {"type": "text", "text": cap.spec.prompt}]}]
                for im in images[i:i + batch_size]]
        inputs = proc.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=True,
                                          return_tensors="pt", **padding).to(cap.device)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        done += len(proc.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    return done


def measure_captions(plan: dict[str, Any], device: str, work: Path, budget: Budget) -> dict[str, Any]:
    """Ours vs bare per shape and batch size (see module docs)."""
    from prx_assets.core.models.caption_spec import CaptionerSpec
    from prx_assets.core.models.captions import TransformersCaptioner

    jpegs = jpeg_corpus(plan["images"], plan["sizes"])
    tokens = plan["tokens"]
    results: dict[str, Any] = {"images": len(jpegs), "new_tokens": tokens, "sizes": [list(s) for s in plan["sizes"]]}
    for shape, batch_sizes in plan["shapes"].items():
        if not budget.left():
            results[shape] = {"skipped": f"time budget spent after {budget.elapsed():.0f} s"}
            continue
        path = work / f"qwen3-vl-{shape}"
        entry: dict[str, Any] = {**build_qwen3_vl(path, shape, device), "by_batch_size": {}}
        started = time.perf_counter()
        cap = TransformersCaptioner(CaptionerSpec(name="bench", model=str(path), max_new_tokens=tokens,
                                                  min_new_tokens=tokens, batch_size=max(batch_sizes)), device=device,
                                    overlap=plan.get("overlap"))
        entry["load_seconds"] = round(time.perf_counter() - started, 2)
        entry["attention"] = getattr(cap.model.config, "_attn_implementation", None)
        entry["producer_thread"] = cap.overlap
        for bs in batch_sizes:
            if not budget.left():
                entry["by_batch_size"][str(bs)] = {"skipped": "time budget"}
                continue
            cap.spec = CaptionerSpec(name="bench", model=str(path), max_new_tokens=tokens, min_new_tokens=tokens,
                                     batch_size=bs)
            # The bare side gets the images in the order ours batches them (grouped by size), so both
            # sides run the same batches with the same padding; ours also decodes the bytes.
            order = sorted(range(len(jpegs)), key=lambda i: _pixels(jpegs[i]))
            decoded = decode([jpegs[i] for i in order])

            def ours(cap: Any = cap) -> int:
                return len(cap.caption(decode(jpegs)))

            def ours_sequential(cap: Any = cap) -> int:  # the same path with the producer thread off
                overlap, cap.overlap = cap.overlap, False
                try:
                    return len(cap.caption(decode(jpegs)))
                finally:
                    cap.overlap = overlap

            def bare(cap: Any = cap, bs: int = bs, decoded: list[Any] = decoded) -> int:
                return bare_generate(cap, decoded, bs, tokens)

            # Warm-up: one whole untimed pass, so every batch's shapes have been seen once (the
            # first H200 run warmed one batch only, and whichever side went first paid 2-3x).
            sync(device)
            t = time.perf_counter()
            ours()
            sync(device)
            first_pass = time.perf_counter() - t
            bare_generate(cap, decoded[:bs], bs, tokens)
            t = time.perf_counter()
            cap._inputs(decoded[-bs:])  # one batch of the largest images, prepared alone
            prep = time.perf_counter() - t
            sides = {"ours": ours, "bare": bare,
                     **({"ours_sequential": ours_sequential} if cap.overlap and plan.get("sequential_side", True)
                        else {})}
            times = alternate(sides, rounds=2, device=device, budget=budget)
            n = len(jpegs)
            row = {side: {"seconds": [round(t, 3) for t in ts], "images_per_s": round(n / statistics.median(ts), 3),
                          "tokens_per_s": round(n * tokens / statistics.median(ts), 1)} for side, ts in times.items()}
            row["first_pass"] = {"seconds": round(first_pass, 3), "images_per_s": round(n / first_pass, 3)}
            row["ratio"] = round(row["ours"]["images_per_s"] / row["bare"]["images_per_s"], 4)
            if "ours_sequential" in row:
                row["ratio_sequential"] = round(row["ours_sequential"]["images_per_s"] / row["bare"]["images_per_s"], 4)
            row["prepare_batch_seconds"] = round(prep, 3)
            entry["by_batch_size"][str(bs)] = row
        del cap
        free(device)
        shutil.rmtree(path, ignore_errors=True)
        results[shape] = entry
    return results


def _pixels(jpeg: bytes) -> int:
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        return im.width * im.height


def alternate(sides: dict[str, Callable[[], int]], rounds: int, device: str, budget: Budget) -> dict[str, list[float]]:
    """Seconds per side, ABAB (the first side alternates each round); at least one round each."""
    names = list(sides)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        if r and not budget.left():
            break
        for name in (names if r % 2 == 0 else names[::-1]):
            sync(device)
            t = time.perf_counter()
            sides[name]()
            sync(device)
            times[name].append(time.perf_counter() - t)
    return times


def measure_trainer(plan: dict[str, Any], device: str, work: Path, budget: Budget) -> dict[str, Any]:
    """On-the-fly vs precomputed text latents at each point (see module docs)."""
    from bench.training import build_shards, build_text_encoder, run_mode

    text = plan["text"]
    encoder = build_text_encoder(work / "text-encoder", text)
    results: dict[str, Any] = {"text_encoder": {**text, "shape": "Qwen3-VL-2B language model" if
                                                text["text_hidden"] == 2048 else "tiny"}, "points": {}}
    for name, point in plan["points"].items():
        if not budget.left():
            results["points"][name] = {"skipped": f"time budget spent after {budget.elapsed():.0f} s"}
            continue
        p = {**text, **point, "steps": plan["steps"], "samples": plan["samples"], "workers": plan["workers"],
             "distinct": plan["distinct"], "warmup": plan["warmup"]}
        shards = work / f"shards-{name}"
        spec = build_shards(shards, encoder, p)
        spec_path = work / f"spec-{name}.json"
        spec_path.write_bytes(spec.to_json())
        runs: dict[str, list[dict[str, Any]]] = {"on_the_fly": [], "precomputed": []}
        for r in range(plan["rounds"]):
            if r and not budget.left():
                break
            for mode in (("on_the_fly", "precomputed") if r % 2 == 0 else ("precomputed", "on_the_fly")):
                with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints its Pipes messages
                    runs[mode].append(run_mode(spec_path, encoder, p, mode == "precomputed",
                                               work / f"{name}-{mode}{r}.json"))
                free(device)
        med = {m: statistics.median(x["samples_per_second"] for x in rs) for m, rs in runs.items()}
        last = runs["on_the_fly"][-1]
        results["points"][name] = {
            "settings": point, "params": last["params"], "precision": last["precision"],
            "samples_per_s": {m: [x["samples_per_second"] for x in rs] for m, rs in runs.items()},
            "mfu": {m: [x.get("mfu") for x in rs] for m, rs in runs.items()},
            "model_tflops_per_s": {m: [x["model_tflops_per_second"] for x in rs] for m, rs in runs.items()},
            "text_encode_share_pct": round(100 * statistics.median(x["text_encode_fraction"] for x in runs["on_the_fly"]), 2),
            "on_the_fly_overhead_pct": round(100 * (med["precomputed"] / med["on_the_fly"] - 1), 2),
            "same_samples_both_modes": (work / f"{name}-on_the_fly0.json").read_text()
            == (work / f"{name}-precomputed0.json").read_text(),
        }
        shutil.rmtree(shards, ignore_errors=True)
    return results


def goals(result: dict[str, Any]) -> dict[str, Any]:
    """Each goal of the GPU issue with its measured figure (``None`` where it was not measured)."""
    cap8 = ((result.get("captions") or {}).get("8b") or {}).get("by_batch_size", {})
    best8 = max((v["ours"]["images_per_s"] for v in cap8.values() if "ours" in v), default=None)
    points = (result.get("trainer") or {}).get("points", {})
    mfus = [m for v in points.values() if "mfu" in v for m in v["mfu"].get("precomputed", []) if m is not None]
    over = (points.get("2b_512px") or {}).get("on_the_fly_overhead_pct")

    def met(value: float | None, goal: float, higher: bool = True) -> bool | None:
        return None if value is None else (value >= goal if higher else value <= goal)

    return {
        "captions_8b_images_per_s": {"goal": GOALS["captions_8b_images_per_s"], "value": best8,
                                     "met": met(best8, GOALS["captions_8b_images_per_s"])},
        "trainer_mfu": {"goal": GOALS["trainer_mfu"], "value": max(mfus) if mfus else None,
                        "met": met(max(mfus) if mfus else None, GOALS["trainer_mfu"])},
        "on_the_fly_overhead_pct_2b_512px": {"goal": GOALS["on_the_fly_overhead_pct_2b_512px"], "value": over,
                                             "met": met(over, GOALS["on_the_fly_overhead_pct_2b_512px"], False)},
    }


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    """A scratch folder removed afterwards (checkpoints of the 8B shape are 17.5 GB)."""
    path = Path(tempfile.mkdtemp(prefix="prx-gpu-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(smoke: bool = False, budget_s: float = 420.0, only: tuple[str, ...] = ("captions", "trainer"),
        shapes: tuple[str, ...] | None = None, images: int | None = None, points: tuple[str, ...] | None = None,
        sequential_side: bool = True) -> dict[str, Any]:
    """Measure (see module docs) and return the figures; ``shapes``, ``images``, ``points`` and
    ``sequential_side`` narrow the plan (e.g. one shape on fewer images, to fit a short lease)."""
    import torch

    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    kind = "smoke" if smoke else "full"
    budget = Budget(budget_s)
    result: dict[str, Any] = {"mode": kind, "env": environment(device), "budget_s": budget_s}
    plan = dict(CAPTION_PLAN[kind])
    if shapes:
        plan["shapes"] = {k: v for k, v in plan["shapes"].items() if k in shapes}
    if images:
        plan["images"] = images
    plan["sequential_side"] = sequential_side
    trainer_plan = dict(TRAINER_PLAN[kind])
    if points:
        trainer_plan["points"] = {k: v for k, v in trainer_plan["points"].items() if k in points}
    with workdir() as work:
        if "captions" in only:
            result["captions"] = measure_captions(plan, device, work, budget)
        if "trainer" in only:
            try:
                import streaming  # noqa: F401
            except ImportError as e:
                result["trainer"] = {"skipped": f"mosaicml-streaming is not importable ({e}); pass --wheels DIR"}
            else:
                result["trainer"] = measure_trainer(trainer_plan, device, work, budget)
    result["goals"] = goals(result)
    result["elapsed_s"] = round(budget.elapsed(), 1)
    return result


def format_table(r: dict[str, Any]) -> str:
    """A short human-readable summary."""
    lines = [f"GPU bench ({r['mode']}) on {r['env']['device_name']} ({r['env']['device']}), torch {r['env']['torch']}, "
             f"transformers {r['env']['transformers']}, {r['elapsed_s']} s"]
    for shape, v in (r.get("captions") or {}).items():
        if not isinstance(v, dict) or "by_batch_size" not in v:
            continue
        for bs, row in v["by_batch_size"].items():
            if "ours" in row:
                lines.append(f"  captions {shape} bs {bs}: ours {row['ours']['images_per_s']} img/s "
                             f"({row['ours']['tokens_per_s']} tok/s), bare {row['bare']['images_per_s']} img/s, "
                             f"ratio {row['ratio']}"
                             + (f"; producer thread off {row['ours_sequential']['images_per_s']} img/s, "
                                f"ratio {row['ratio_sequential']}" if "ours_sequential" in row else "")
                             + f"; first (cold) pass {row['first_pass']['images_per_s']} img/s"
                             + f"; one batch prepared in {row['prepare_batch_seconds']} s")
    for name, v in ((r.get("trainer") or {}).get("points") or {}).items():
        if "samples_per_s" in v:
            lines.append(f"  trainer {name} ({v['params'] / 1e9:.2f}B): on the fly {v['samples_per_s']['on_the_fly']}, "
                         f"precomputed {v['samples_per_s']['precomputed']} samples/s, MFU {v['mfu']}, overhead "
                         f"{v['on_the_fly_overhead_pct']}%")
    for goal, g in r["goals"].items():
        lines.append(f"  goal {goal}: {g['value']} (goal {g['goal']}, met: {g['met']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: the same code paths, fast")
    ap.add_argument("--out", type=Path, help="write the JSON here")
    ap.add_argument("--wheels", type=Path, help="install the wheels in this folder first (offline, --no-deps)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new measurement after this many seconds")
    ap.add_argument("--only", default="captions,trainer", help="comma-separated: captions, trainer")
    ap.add_argument("--shapes", help="comma-separated caption shapes to measure (default: all of the plan)")
    ap.add_argument("--images", type=int, help="images per caption measurement (default: the plan's)")
    ap.add_argument("--points", help="comma-separated trainer points to measure (default: all of the plan)")
    ap.add_argument("--no-sequential-side", action="store_true",
                    help="leave out the side with the producer thread off")
    args = ap.parse_args(argv)
    if args.wheels:
        install_wheels(args.wheels)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run(smoke=args.smoke, budget_s=args.budget_s, only=tuple(args.only.split(",")),
                 shapes=tuple(args.shapes.split(",")) if args.shapes else None, images=args.images,
                 points=tuple(args.points.split(",")) if args.points else None,
                 sequential_side=not args.no_sequential_side)
    print(format_table(result))
    text = json.dumps(result, default=str)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
