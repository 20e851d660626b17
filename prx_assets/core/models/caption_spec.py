"""What a captioner is, apart from how it runs: its spec (model, prompt, generation settings, the
id that follows them), one generated caption, and the protocol every backend meets.

The backends live in :mod:`prx_assets.core.models.captions` (transformers, vLLM) and
:mod:`prx_assets.core.models.served` (an OpenAI-compatible server); both import this module, and
neither imports the other at import time.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from PIL import Image

from prx_assets.core.models.identity import model_identity
from prx_assets.errors import PrxError

DEFAULT_PROMPT = (
    "Describe this image in detail for a text-to-image training caption: the main subjects, "
    "their attributes and positions, the setting, lighting, colors, style and any visible text."
)
BACKENDS = ("transformers", "vllm", "openai")


class ModelLoadError(PrxError):
    """A model path or checkpoint cannot serve the requested role; the message says why and how to fix."""


def slug(text: str) -> str:
    """Lowercase identifier-safe form of a name."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "model"


@dataclass(frozen=True)
class CaptionerSpec:
    """One captioner: model, prompt and generation settings (see module docs)."""

    name: str
    model: str
    prompt: str = DEFAULT_PROMPT
    system_prompt: str | None = None
    max_new_tokens: int = 256
    min_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    seed: int = 0
    min_pixels: int | None = None
    max_pixels: int | None = None
    batch_size: int = 8
    dtype: str = "auto"
    backend: str = "transformers"
    # backend: openai (see prx_assets.core.models.served); operational, not part of the id
    server_url: str | None = None
    served_model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 16
    request_timeout_s: float = 600.0
    max_retries: int = 5
    server_api: str = "vllm"
    #: A hub model's revision (commit, tag or branch) to load and to name in the id.
    revision: str | None = None

    _IDENTITY = ("model", "prompt", "system_prompt", "max_new_tokens", "min_new_tokens", "do_sample",
                 "temperature", "top_p", "top_k", "repetition_penalty", "no_repeat_ngram_size",
                 "seed", "min_pixels", "max_pixels")

    def identity(self) -> dict[str, Any]:
        """The settings that define what this captioner writes."""
        d = {k: getattr(self, k) for k in self._IDENTITY}
        d["model"] = model_identity(self.model, self.revision)
        if not self.do_sample:  # sampling knobs do not matter for greedy decoding
            for k in ("temperature", "top_p", "top_k", "seed"):
                d.pop(k)
        return d

    def captioner_id(self) -> str:
        """``<name>-<8 hex>``: stable across batch size, dtype, device and backend.

        >>> CaptionerSpec(name="detailed", model="Qwen/Qwen3-VL-8B-Instruct").captioner_id()[:9]
        'detailed-'
        """
        digest = hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:8]
        return f"{slug(self.name)}-{digest}"

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``model.generate``."""
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample,
                              "repetition_penalty": self.repetition_penalty}
        if self.min_new_tokens:
            kw["min_new_tokens"] = self.min_new_tokens
        if self.no_repeat_ngram_size:
            kw["no_repeat_ngram_size"] = self.no_repeat_ngram_size
        if self.do_sample:
            kw.update(temperature=self.temperature, top_p=self.top_p)
            if self.top_k is not None:
                kw["top_k"] = self.top_k
        return kw

    def messages(self, image: Image.Image) -> list[dict[str, Any]]:
        """Chat messages for one image."""
        msgs: list[dict[str, Any]] = []
        if self.system_prompt:
            msgs.append({"role": "system", "content": [{"type": "text", "text": self.system_prompt}]})
        msgs.append({"role": "user", "content": [{"type": "image", "image": image},
                                                 {"type": "text", "text": self.prompt}]})
        return msgs


@dataclass(frozen=True)
class CaptionResult:
    """One generated caption."""

    text: str
    tokens: int
    seconds: float
    hit_max_tokens: bool


class Captioner(Protocol):
    """What the recaption stage needs from a backend."""

    spec: CaptionerSpec

    def caption(self, images: Sequence[Image.Image]) -> list[CaptionResult]:
        """Caption images, in order."""
        ...
