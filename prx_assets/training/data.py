"""Training data: a mixture spec -> ``StreamingDataset`` -> bucketed batches.

Each sample is decoded (exact q92 JPEG bytes from the shards), resized and centre-cropped
to its aspect bucket's resolution (about ``resolution``² pixels, sides a multiple of the
patch size), and given one caption key: with a ``caption_mix`` the key is drawn per sample
from the weights with a seeded hash of ``(seed, image_id)``, so on-the-fly and precomputed
modes pick the same caption for the same sample. Batches hold samples of one bucket (one
resolution), filled in stream order.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from prx_assets.core.enrich.decode import decode_rgb
from prx_assets.core.manifests import MixtureSpec
from prx_assets.core.models.text_encoder import latent_column, mask_column
from prx_assets.loader import PrxStreamingDataset


def bucket_size(bucket: str, resolution: int, multiple: int) -> tuple[int, int]:
    """``(width, height)`` for an aspect bucket ``"W:H"`` at about ``resolution``² pixels."""
    w, h = (float(x) for x in bucket.split(":"))
    r = w / h
    width = max(multiple, round(resolution * math.sqrt(r) / multiple) * multiple)
    height = max(multiple, round(resolution / math.sqrt(r) / multiple) * multiple)
    return width, height


def caption_choice(image_id: str, weights: dict[str, float], seed: int) -> str:
    """The caption key of a sample: deterministic in ``(seed, image_id)``, distributed by ``weights``."""
    keys = sorted(weights)
    if len(keys) == 1:
        return keys[0]
    u = int.from_bytes(hashlib.sha256(f"{seed}:{image_id}".encode()).digest()[:8], "big") / 2**64
    total = sum(weights[k] for k in keys)
    acc = 0.0
    for k in keys:
        acc += weights[k] / total
        if u < acc:
            return k
    return keys[-1]


def decode_to_bucket(jpeg: bytes, size: tuple[int, int]) -> np.ndarray:
    """Stored image bytes (JPEG, or PNG/WebP when stored losslessly) -> float32 CHW in [-1, 1] at
    ``size`` (resize to cover, centre crop)."""
    im = decode_rgb(jpeg, 4 * size[0] * size[1])  # never the full bitmap of a large image (JPEG: DCT-scaled)
    scale = max(size[0] / im.width, size[1] / im.height)
    resized = im.resize((max(size[0], round(im.width * scale)), max(size[1], round(im.height * scale))),
                        Image.Resampling.BILINEAR)
    left = (resized.width - size[0]) // 2
    top = (resized.height - size[1]) // 2
    arr = np.asarray(resized.crop((left, top, left + size[0], top + size[1])), dtype=np.float32)
    return (arr.transpose(2, 0, 1) / 127.5) - 1.0


#: Key of a sample that could not be decoded (with why): left out of every batch and counted.
SKIPPED = "skipped"


@dataclass(frozen=True)
class SampleOptions:
    """How samples are prepared (picklable: travels to DataLoader workers)."""

    resolution: int
    multiple: int
    caption_plans: tuple[dict[str, float], ...]  # {caption key: weight} per stream, most keys first
    caption_seed: int = 0
    tower: str | None = None  # precomputed mode: read latents of this text tower


class MixtureDataset(PrxStreamingDataset):
    """A mixture's samples (skip lists honoured), decoded, bucket-sized and captioned."""

    def __init__(self, *, options: SampleOptions, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options

    def get_item(self, idx: int) -> dict[str, Any]:
        raw = super().get_item(idx)
        opts = self.options
        weights = next((w for w in opts.caption_plans if all(k in raw for k in w)), None) \
            or _weights_from_sample(raw)
        key = caption_choice(raw["image_id"], weights, opts.caption_seed) if weights else None
        size = bucket_size(raw["aspect_bucket"], opts.resolution, opts.multiple)
        try:
            pixels = decode_to_bucket(raw["image"], size)
        except Exception as e:  # a corrupt sample is skipped and reported, never the end of a multi-day job
            return {"image_id": raw["image_id"], SKIPPED: f"{type(e).__name__}: {e}"}
        out: dict[str, Any] = {"image_id": raw["image_id"], "bucket": raw["aspect_bucket"],
                               "pixels": pixels, "caption_key": key or "",
                               "caption": raw.get(key, "") if key else ""}
        if opts.tower is not None:
            if key is None or latent_column(key, opts.tower) not in raw:
                raise KeyError(f"sample {raw['image_id']} has no {latent_column(key or 'caption', opts.tower)}; "
                               "write the shards with precomputed_latents (same text tower) or train on the fly")
            out["latent"] = raw[latent_column(key, opts.tower)].astype(np.float32)
            out["mask"] = raw[mask_column(key, opts.tower)].astype(bool)
        return out


def _weights_from_sample(raw: dict[str, Any]) -> dict[str, float]:
    keys = [k for k in raw if k == "caption" or (k.startswith("caption_") and isinstance(raw[k], str))]
    return {k: 1.0 for k in keys}


def caption_plans(spec: MixtureSpec) -> tuple[dict[str, float], ...]:
    """The streams' caption weights, most keys first: a sample uses the first plan whose
    caption columns it has (a sample carries exactly its stream's caption columns)."""
    plans = []
    for s in spec.streams:
        w = {k: float(v) for k, v in ((s.caption_plan or {}).get("weights") or {}).items()}
        if w and w not in plans:
            plans.append(w)
    return tuple(sorted(plans, key=lambda w: -len(w)))


def build_dataset(spec: MixtureSpec, *, batch_size: int, resolution: int, multiple: int, seed: int,
                  caption_seed: int, tower: str | None, cache_root: str | None = None,
                  shuffle: bool = True, min_epoch_size: int = 0, phase: str | None = None) -> MixtureDataset:
    """A :class:`MixtureDataset` over the spec's streams (local folders or ``s3://``), or over its
    ``phase``'s streams for a phased spec.

    ``min_epoch_size`` stretches the epoch (the streams' proportions are kept) so a run of a
    fixed number of steps never crosses an epoch boundary: ``StreamingDataset`` starts each
    epoch with a barrier across the node's ranks, and ranks whose bucketed batching has
    consumed different numbers of samples would otherwise wait there for a rank that has
    already finished.
    """
    options = SampleOptions(resolution=resolution, multiple=multiple, caption_plans=caption_plans(spec),
                            caption_seed=caption_seed, tower=tower)
    chosen = spec.phase(phase)
    epoch = int(chosen.epoch_size if chosen is not None else spec.epoch_size)
    return MixtureDataset(options=options, spec=spec, phase=phase, cache_root=cache_root, batch_size=batch_size,
                          shuffle=shuffle, shuffle_seed=seed, epoch_size=max(epoch, min_epoch_size))


def bucketed_batches(samples: Iterator[dict[str, Any]], batch_size: int,
                     skipped: list[tuple[str, str]] | None = None) -> Iterator[list[dict[str, Any]]]:
    """Group samples by bucket; yield a batch whenever a bucket holds ``batch_size`` samples.
    Samples that could not be decoded are left out and appended to ``skipped`` as ``(id, why)``."""
    pending: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        if SKIPPED in s:
            if skipped is not None:
                skipped.append((s["image_id"], s[SKIPPED]))
            continue
        group = pending.setdefault(s["bucket"], [])
        group.append(s)
        if len(group) == batch_size:
            yield group
            pending[s["bucket"]] = []


def collate_one(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """DataLoader collate: the batch's samples as a list (module-level for spawn)."""
    return batch  # type: ignore[return-value]
