"""Text latents on the fly vs precomputed: trainer samples/s in both modes, same model and data.

One shard set is written with captions *and* precomputed latents (the same text encoder),
then the reference trainer runs on it alternately in both modes (ABAB..., same seeds, so the
same samples and captions): ``on_the_fly`` encodes each batch's captions with the text
encoder, ``precomputed`` reads the latents from the shards. The overhead is
``precomputed samples/s / on-the-fly samples/s - 1`` (the published figure: 3-4% for a 7B
model on GPUs); the trainer's own timer of the text-encoder share is reported beside it.

Profiles (``PRX_BENCH_TRAIN_PROFILE``):
- ``cpu`` (default): a small Qwen3 text encoder (hidden 256, 4 layers) and a small
  flow transformer (dim 256, 6 blocks) at 64 px; what this 2-core machine can run.
- ``h200``: a Qwen3-VL-2B-shaped text encoder (Qwen3 LM: hidden 2048, 28 layers, 16 heads,
  8 KV heads, MLP 6144) and a ~1B-parameter transformer (dim 2048, 11 blocks) at 256 px
  with 128 caption tokens, random weights (honest throughput); for a lent GPU.
"""

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from prx_assets.core.manifests import MixtureSpec

ROUNDS = int(os.environ.get("PRX_BENCH_ROUNDS", "3"))
PROFILE = os.environ.get("PRX_BENCH_TRAIN_PROFILE", "cpu")
PROFILES: dict[str, dict[str, Any]] = {
    "cpu": {"text_hidden": 256, "text_layers": 4, "text_heads": 4, "text_kv": 2, "text_mlp": 768, "max_len": 64,
            "dim": 256, "depth": 6, "heads": 8, "resolution": 64, "patch": 4, "batch": 8, "steps": 24,
            "samples": 256, "image": 96, "workers": 1},
    "h200": {"text_hidden": 2048, "text_layers": 28, "text_heads": 16, "text_kv": 8, "text_mlp": 6144,
             "max_len": 128, "dim": 2048, "depth": 11, "heads": 16, "resolution": 256, "patch": 8, "batch": 32,
             "steps": 40, "samples": 4096, "image": 320, "workers": 8},
}
_VOCAB = ("a photo of the red blue green small large old new bright dark wooden metal glass person dog cat city "
          "street river mountain window table cup light shadow morning evening close-up portrait landscape with "
          "and on in near under over soft warm cold reflections texture detailed background foreground")
WORDS = tuple(_VOCAB.split(" "))


def build_text_encoder(path: Path, p: dict[str, Any]) -> Path:
    """A random Qwen3 language model of the profile's shape, with the tiny BPE tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    from prx_assets.core.demo.tiny_models import train_tokenizer

    tok = train_tokenizer()
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=p["text_hidden"], intermediate_size=p["text_mlp"],
                      num_hidden_layers=p["text_layers"], num_attention_heads=p["text_heads"],
                      num_key_value_heads=p["text_kv"], head_dim=p["text_hidden"] // p["text_heads"],
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    Qwen3Model(cfg).save_pretrained(path)
    tok.padding_side = "right"
    tok.save_pretrained(path)
    return path


def build_shards(out: Path, encoder_path: Path, p: dict[str, Any]) -> "MixtureSpec":
    """An MDS shard set with captions and precomputed latents; returns a one-stream mixture spec."""
    from streaming import MDSWriter

    from prx_assets.core.demo.corpus import make_scene
    from prx_assets.core.ingest.images import aspect_bucket
    from prx_assets.core.lab.schema import MDS_BASE_COLUMNS
    from prx_assets.core.layout import SHARD_SET_MANIFEST
    from prx_assets.core.manifests import MixtureSpec, MixtureStream, ShardSetManifest
    from prx_assets.core.models.text_encoder import TextEncoder, TextTowerSpec, latent_column, mask_column

    rng = np.random.default_rng(0)
    enc = TextEncoder(TextTowerSpec(model=str(encoder_path), name="bench", max_length=p["max_len"]), device="auto")
    cols = {**MDS_BASE_COLUMNS, "caption": "str",
            latent_column("caption", "bench"): f"ndarray:float16:{p['max_len']},{enc.dim}",
            mask_column("caption", "bench"): f"ndarray:uint8:{p['max_len']}"}
    buckets = ("1:1", "4:3", "3:4")
    import io

    distinct = int(p.get("distinct", p["samples"]))  # generated pictures, reused round-robin beyond that
    pictures: dict[int, tuple[bytes, int, int]] = {}
    with MDSWriter(out=str(out), columns=cols, size_limit=64 << 20) as w:
        for start in range(0, p["samples"], 64):
            n = min(64, p["samples"] - start)
            caps = [" ".join(rng.choice(WORDS, size=int(rng.integers(15, 60)))) for _ in range(n)]
            lat, mask = enc.encode_numpy(caps)
            for i in range(n):
                slot = (start + i) % distinct
                if slot not in pictures:
                    shape = buckets[int(rng.integers(0, 3))]
                    a, b = (int(x) for x in shape.split(":"))
                    width, height = p["image"] * a // max(a, b), p["image"] * b // max(a, b)
                    buf = io.BytesIO()
                    make_scene(rng, width, height).image.save(buf, "JPEG", quality=92)
                    pictures[slot] = (buf.getvalue(), width, height)
                jpeg, width, height = pictures[slot]
                w.write({"image": jpeg, "image_id": f"img{start + i:06d}", "source": "bench",
                         "width": width, "height": height, "original_width": width, "original_height": height,
                         "aspect_bucket": aspect_bucket(width, height, buckets), "caption": caps[i],
                         latent_column("caption", "bench"): lat[i], mask_column("caption", "bench"): mask[i]})
    plan = {"mode": "first_available", "weights": {"caption": 1.0}}
    files = [f for f in out.iterdir() if f.is_file()]
    # What the loader reads of a published set (a shard set is its manifest plus its MDS files).
    (out / SHARD_SET_MANIFEST).write_bytes(ShardSetManifest(
        shard_set_id="bench", recipe="bench", subset_id="bench", lance_uri="", lance_version=0, uri=str(out),
        samples=p["samples"], shards=sum(f.suffix == ".mds" for f in files), bytes=sum(f.stat().st_size for f in files),
        caption_plan=plan, columns=cols).to_json())
    stream = MixtureStream(recipe="bench", shard_set_id="bench", uri=str(out), samples=p["samples"], proportion=1.0,
                           caption_plan=plan)
    return MixtureSpec(name="bench", epoch_size=p["samples"], streams=(stream,),
                       expected_samples_per_stream={"bench": p["samples"]}).versioned()


def run_mode(spec_path: Path, encoder: Path, p: dict[str, Any], precomputed: bool, out: Path) -> dict[str, Any]:
    """One trainer run; returns its metrics."""
    from prx_assets.training.train import parse_args, train

    args = ["--spec", str(spec_path), "--steps", str(p["steps"]), "--batch-size", str(p["batch"]),
            "--resolution", str(p["resolution"]), "--patch", str(p["patch"]), "--dim", str(p["dim"]),
            "--depth", str(p["depth"]), "--heads", str(p["heads"]), "--workers", str(p["workers"]),
            "--warmup-steps", str(p.get("warmup", 4)), "--log-every", "100000", "--text-tower", "bench",
            "--max-text-length", str(p["max_len"]), "--record-samples", str(out)]
    args += ["--precomputed-latents"] if precomputed else ["--text-encoder", str(encoder)]
    return train(parse_args(args))


def run() -> dict[str, Any]:
    """Alternate both modes ``ROUNDS`` times; return samples/s and the overhead."""
    p = PROFILES[PROFILE]
    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-train-"))
    try:
        encoder = build_text_encoder(tmp / "text-encoder", p)
        spec = build_shards(tmp / "shards", encoder, p)
        spec_path = tmp / "spec.json"
        spec_path.write_bytes(spec.to_json())
        fly, pre, share = [], [], []
        same = True
        for r in range(ROUNDS):
            a = run_mode(spec_path, encoder, p, False, tmp / f"fly{r}.json")
            b = run_mode(spec_path, encoder, p, True, tmp / f"pre{r}.json")
            fly.append(a["samples_per_second"])
            pre.append(b["samples_per_second"])
            share.append(a["text_encode_fraction"])
            same &= (tmp / f"fly{r}.json").read_text() == (tmp / f"pre{r}.json").read_text()
        import torch

        return {
            "profile": PROFILE, "settings": p, "rounds": ROUNDS,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "transformer_params": a["params"],
            "on_the_fly_samples_per_s": fly, "precomputed_samples_per_s": pre,
            "median_on_the_fly": statistics.median(fly), "median_precomputed": statistics.median(pre),
            "overhead_pct": round(100 * (statistics.median(pre) / statistics.median(fly) - 1), 2),
            "text_encode_share_pct": round(100 * statistics.median(share), 2),
            "same_samples_both_modes": same,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """A small text table."""
    p = r["settings"]
    return "\n".join([
        f"training text latents, profile {r['profile']} on {r['device']} ({r['rounds']} rounds, alternating): "
        f"text encoder hidden {p['text_hidden']} x {p['text_layers']} layers, {p['max_len']} tokens; "
        f"transformer {r['transformer_params'] / 1e6:.1f}M params at {p['resolution']} px, batch {p['batch']}",
        f"  on the fly   : {r['median_on_the_fly']:8.2f} samples/s  {r['on_the_fly_samples_per_s']}",
        f"  precomputed  : {r['median_precomputed']:8.2f} samples/s  {r['precomputed_samples_per_s']}",
        f"  overhead of on-the-fly encoding: {r['overhead_pct']:.1f}% "
        f"(trainer's timer: text encoding {r['text_encode_share_pct']:.1f}% of step time); "
        f"same samples in both modes: {r['same_samples_both_modes']}",
    ])


if __name__ == "__main__":
    t = time.perf_counter()
    print(format_table(run()), f"({time.perf_counter() - t:.0f}s)")
