"""Text encoders: captions -> text latents (hidden states + attention mask).

The trainer encodes captions on the fly (the default), so the text encoder can be swapped
without rewriting shards; ``mds_shards`` can also precompute latents into the shards
(``precomputed_latents``) with the same code, for comparison and for fixed encoders.

A Qwen3-VL checkpoint contributes its language model (``AutoModel`` gives the VL model;
its ``language_model`` is used); any other ``AutoModel`` (Qwen3, T5 encoder, ...) is used
as is. Latents are the hidden states of layer ``layer`` (default the last), padded to
``max_length`` tokens, with a 0/1 mask. Column names follow PRX's MDS conventions:
``latent_{caption_key}_{text_tower}`` and ``attention_mask_{caption_key}_{text_tower}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prx_assets.core.models.identity import hub_kwargs, model_identity
from prx_assets.errors import PrxError


class TextEncoderError(PrxError):
    """A text encoder cannot be loaded or used."""


@dataclass(frozen=True)
class TextTowerSpec:
    """Which text encoder, which layer, how many tokens."""

    model: str
    name: str | None = None
    max_length: int = 64
    layer: int = -1
    dtype: str = "float32"
    #: A hub model's revision (commit, tag or branch) to load and to name in the identity.
    revision: str | None = None

    def tower(self) -> str:
        """Short tower name used in MDS column names (``qwen3``, ``tiny_qwen3_text``)."""
        base = self.name or Path(self.model.rstrip("/")).name
        return re.sub(r"[^a-z0-9_]", "_", base.lower())

    def identity(self) -> str:
        """What determines the latents: model identity, layer and length (not dtype of compute)."""
        return f"{model_identity(self.model, self.revision)}|layer={self.layer}|len={self.max_length}"


def latent_column(caption_key: str, tower: str) -> str:
    """PRX's MDS column name for a caption key's precomputed latents."""
    return f"latent_{caption_key}_{tower}"


def mask_column(caption_key: str, tower: str) -> str:
    """PRX's MDS column name for a caption key's attention mask."""
    return f"attention_mask_{caption_key}_{tower}"


class TextEncoder:
    """A loaded text encoder (tokenizer + model) on one device."""

    def __init__(self, spec: TextTowerSpec, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.spec = spec
        self.device = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        local = Path(spec.model).expanduser()
        if (spec.model.startswith(("/", "./", "../", "~")) and not (local / "config.json").is_file()):
            raise TextEncoderError(f"text encoder folder {spec.model!r} has no config.json; run `prx-assets models` "
                                   "for the tiny offline encoder or set text_encoder.model in models.yaml")
        try:
            hub = hub_kwargs(spec.model, spec.revision)
            self.tokenizer = AutoTokenizer.from_pretrained(spec.model, **hub)
            model = AutoModel.from_pretrained(spec.model, dtype=getattr(torch, spec.dtype), **hub)
        except (OSError, ValueError) as e:
            raise TextEncoderError(f"cannot load text encoder {spec.model!r}: {e}; use a hub id or a folder with "
                                   "config.json and tokenizer files") from e
        self.model = getattr(model, "language_model", model).to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def encode(self, captions: list[str]) -> tuple[Any, Any]:
        """``(latents [B, max_length, dim] float, mask [B, max_length] bool)`` as torch tensors."""
        import torch

        tok = self.tokenizer(captions, padding="max_length", truncation=True, max_length=self.spec.max_length,
                             return_tensors="pt")
        ids = tok["input_ids"].to(self.device)
        mask = tok["attention_mask"].to(self.device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=self.spec.layer != -1)
            hidden = out.last_hidden_state if self.spec.layer == -1 else out.hidden_states[self.spec.layer]
        hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
        return hidden.float(), mask.bool()

    def encode_numpy(self, captions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`encode`, as float16 latents and uint8 masks (what shards store)."""
        lat, mask = self.encode(captions)
        return lat.cpu().numpy().astype(np.float16), mask.cpu().numpy().astype(np.uint8)
