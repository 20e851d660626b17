"""Image embeddings from a Hugging Face vision model (SigLIP or CLIP ``get_image_features``).

Only the image half of a dual encoder is loaded where its model type has one
(:data:`VISION_TOWERS`): the text tower is never used for image embeddings, and in
``google/siglip2-so400m-patch14-384`` it holds about 62% of the weights (its 256k-token
vocabulary), so loading the vision tower alone reads and holds about a third of the bytes. The
vectors are those of the whole model's ``get_image_features``, bit for bit.

Vectors are L2-normalized, stored per image with the embedder id (float32, or float16 with
``vector_dtype: float16``: half the bytes in the embeddings table and the lab, a cosine
changed by about 1e-3), for vector search and semantic dedup. The same ``from_pretrained`` code loads
``google/siglip2-so400m-patch14-384`` on a user's machine and the tiny random
checkpoint the tests build.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from prx_assets.core.models.caption_spec import ModelLoadError, slug
from prx_assets.core.models.captions import check_model_path, resolve_device, resolve_dtype
from prx_assets.core.models.identity import hub_kwargs, model_identity


@dataclass(frozen=True)
class EmbedderSpec:
    """The image embedding model and how to run it."""

    model: str
    name: str = "siglip"
    batch_size: int = 32
    dtype: str = "auto"
    #: How vectors are stored: ``float32`` or ``float16`` (half the bytes; at 10^8 images of
    #: 1,152 dimensions, 230 GB instead of 460 GB per copy).
    vector_dtype: str = "float32"
    #: A hub model's revision (commit, tag or branch) to load and to name in the id.
    revision: str | None = None

    def embedder_id(self) -> str:
        """``<name>-<8 hex>`` over the model and, when not float32, the stored precision (the
        stored vectors change only when one of them does; float32 ids are those of before)."""
        ident: dict[str, str] = {"model": model_identity(self.model, self.revision)}
        if self.vector_dtype != "float32":
            ident["vector_dtype"] = self.vector_dtype
        digest = hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:8]
        return f"{slug(self.name)}-{digest}"


#: Model types whose image features come from a vision tower that loads alone from the whole
#: model's checkpoint, with the class that holds it: SigLIP's ``get_image_features`` is its vision
#: model's pooled output, CLIP's the projected one (``image_embeds``). Other types load whole.
VISION_TOWERS = {"siglip": "SiglipVisionModel", "clip": "CLIPVisionModelWithProjection"}


def load_image_model(path: str, config: Any, dtype: Any, **hub: str) -> Any:
    """The model whose forward pass gives image features: the vision tower of ``path`` when its
    model type (``config``, the whole model's) has one in :data:`VISION_TOWERS` (the text tower's
    weights are never read), else the whole model, which must have ``get_image_features``. ``hub``:
    a pinned revision (see :func:`~.identity.hub_kwargs`)."""
    import copy

    import transformers
    from transformers import AutoModel

    tower = VISION_TOWERS.get(config.model_type)
    vision = getattr(config, "vision_config", None)
    if tower is not None and vision is not None and hasattr(transformers, tower):
        vision = copy.deepcopy(vision)
        if getattr(config, "projection_dim", None):  # CLIP keeps the projection's width at the top
            vision.projection_dim = config.projection_dim
        return getattr(transformers, tower).from_pretrained(path, config=vision, dtype=dtype, **hub)
    model = AutoModel.from_pretrained(path, dtype=dtype, **hub)
    if not hasattr(model, "get_image_features"):
        raise ModelLoadError(
            f"embedder model {path!r} ({config.model_type!r}) has no get_image_features; use a "
            "SigLIP or CLIP checkpoint such as google/siglip2-so400m-patch14-384")
    return model


def image_features(model: Any, pixel_values: Any) -> Any:
    """Image features as the whole model's ``get_image_features`` gives them, from either the
    whole model or a vision tower of :data:`VISION_TOWERS`."""
    import torch

    if hasattr(model, "get_image_features"):
        out = model.get_image_features(pixel_values=pixel_values)
    else:
        out = model(pixel_values=pixel_values)
    if isinstance(out, torch.Tensor):
        return out
    for name in ("image_embeds", "pooler_output"):  # CLIP's projected features; SigLIP's pooled ones
        value = getattr(out, name, None)
        if value is not None:
            return value
    return out[0]


class ImageEmbedder:
    """Loads the model once; :meth:`embed` returns an ``(n, dim)`` float32 array, rows of norm 1."""

    def __init__(self, spec: EmbedderSpec, device: str = "auto") -> None:
        from transformers import AutoConfig, AutoImageProcessor

        self.spec = spec
        self.device = resolve_device(device)
        path = check_model_path(spec.model, "embedder", "google/siglip2-so400m-patch14-384")
        hub = hub_kwargs(spec.model, spec.revision)
        try:
            config = AutoConfig.from_pretrained(path, **hub)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot read the config of embedder model {path!r}: {e}") from e
        model = load_image_model(path, config, resolve_dtype(spec.dtype, self.device), **hub)
        self.model = model.to(self.device).eval()
        self.processor = AutoImageProcessor.from_pretrained(path, **hub)
        self.dim = int(self._probe_dim())

    def _probe_dim(self) -> int:
        cfg = self.model.config
        for attr in ("projection_dim",):
            if getattr(cfg, attr, None):
                return getattr(cfg, attr)
        return self.embed([Image.new("RGB", (32, 32))]).shape[1]

    def embed(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Embed images in batches of ``spec.batch_size``."""
        import torch

        out: list[np.ndarray] = []
        for i in range(0, len(images), max(1, self.spec.batch_size)):
            chunk = [im.convert("RGB") for im in images[i:i + self.spec.batch_size]]
            inputs: Any = self.processor(images=chunk, return_tensors="pt").to(self.device)
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
            with torch.inference_mode():
                feats = image_features(self.model, inputs["pixel_values"])
            v = feats.float().cpu().numpy()
            v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
            out.append(v.astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, getattr(self, "dim", 0)), np.float32)
