"""Captioner and embedder resources: how and where models run.

What a captioner writes (model, prompt, generation settings) lives in ``models.yaml``;
these resources hold the operational side (device, dtype and batch-size overrides) and
keep loaded models for the life of the process, so a run over many partitions loads each
model once.
"""

import dataclasses
import threading
from typing import Any

import dagster as dg
from pydantic import Field

from prx_assets.core.models.captions import Captioner, CaptionerSpec, load_captioner
from prx_assets.core.models.embeddings import EmbedderSpec, ImageEmbedder

_CACHE: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


def _cached(key: tuple[Any, ...], build: Any) -> Any:
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = build()
        return _CACHE[key]


class CaptionerResource(dg.ConfigurableResource):
    """Runs the captioners of models.yaml (Qwen3-VL through transformers, vLLM, or an OpenAI-compatible server)."""

    device: str = Field(default="auto", description="auto (CUDA when available), cpu, cuda, cuda:1 ...")
    dtype: str | None = Field(default=None, description="Override every captioner's dtype.")
    batch_size: int | None = Field(default=None, description="Override every captioner's batch size.")
    backend: str | None = Field(default=None, description="Override the backend: transformers, vllm or openai.")
    server_url: str | None = Field(
        default=None, description="backend openai: the OpenAI-compatible server (http://host:8000/v1) for every "
                                  "captioner; use dg.EnvVar to take it from the environment.")
    concurrency: int | None = Field(default=None, description="backend openai: requests in flight per captioner.")
    server_api: str | None = Field(default=None, description="backend openai: vllm (vLLM, SGLang, LMDeploy) or "
                                                             "transformers (transformers serve).")
    max_flagged_fraction: float = Field(
        default=0.25, description="caption_quality warns when more captions than this are flagged.")
    min_words: int = Field(default=5, description="Captions with fewer words are flagged too_short.")

    def effective(self, spec: CaptionerSpec) -> CaptionerSpec:
        """The spec with this resource's overrides applied (the captioner id is unchanged)."""
        changes: dict[str, Any] = {}
        if self.dtype:
            changes["dtype"] = self.dtype
        if self.batch_size:
            changes["batch_size"] = self.batch_size
        if self.backend:
            changes["backend"] = self.backend
        if self.server_url:
            changes["server_url"] = self.server_url
        if self.concurrency:
            changes["concurrency"] = self.concurrency
        if self.server_api:
            changes["server_api"] = self.server_api
        return spec if not changes else type(spec)(**{**spec.__dict__, **changes})

    def load(self, spec: CaptionerSpec) -> Captioner:
        """The loaded captioner (cached per process)."""
        eff = self.effective(spec)
        return _cached(("captioner", eff, self.device), lambda: load_captioner(eff, self.device))

    def is_loaded(self, spec: CaptionerSpec) -> bool:
        """Whether this process already holds the captioner (``load`` returns at once)."""
        return ("captioner", self.effective(spec), self.device) in _CACHE


class EmbedderResource(dg.ConfigurableResource):
    """Runs the image embedder of models.yaml (SigLIP / CLIP ``get_image_features``)."""

    device: str = Field(default="auto", description="auto (CUDA when available), cpu, cuda ...")
    batch_size: int | None = Field(default=None, description="Override the embedder's batch size.")

    def effective(self, spec: EmbedderSpec) -> EmbedderSpec:
        """The spec with this resource's batch-size override applied; every other field (the stored
        ``vector_dtype`` included, and so the embedder id) is the spec's."""
        return spec if not self.batch_size else dataclasses.replace(spec, batch_size=self.batch_size)

    def load(self, spec: EmbedderSpec) -> ImageEmbedder:
        """The loaded embedder (cached per process)."""
        eff = self.effective(spec)
        return _cached(("embedder", eff, self.device), lambda: ImageEmbedder(eff, self.device))

    def is_loaded(self, spec: EmbedderSpec) -> bool:
        """Whether this process already holds the embedder (``load`` returns at once)."""
        return ("embedder", self.effective(spec), self.device) in _CACHE
