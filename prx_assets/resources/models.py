"""Captioner and embedder resources: how and where models run.

What a captioner writes (model, prompt, generation settings) lives in ``models.yaml``;
these resources hold the operational side (device, dtype and batch-size overrides) and
keep loaded models for the life of the process, so a run over many partitions loads each
model once.
"""

import dataclasses
from typing import Any

import dagster as dg
from pydantic import Field

from prx_assets.core.models.caption_spec import Captioner, CaptionerSpec
from prx_assets.core.models.embeddings import EmbedderSpec, ImageEmbedder
from prx_assets.core.stages.settings import CaptionerSettings, EmbedderSettings


def settings_of(resource: dg.ConfigurableResource, cls: type) -> Any:
    """The core settings ``cls`` (a dataclass with the resource's fields) of a configured resource."""
    return cls(**{f.name: getattr(resource, f.name) for f in dataclasses.fields(cls)})


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

    def settings(self) -> CaptionerSettings:
        """These settings, for a stage (in-process or in a job)."""
        return settings_of(self, CaptionerSettings)

    def effective(self, spec: CaptionerSpec) -> CaptionerSpec:
        """The spec with this resource's overrides applied (the captioner id is unchanged)."""
        return self.settings().effective(spec)

    def load(self, spec: CaptionerSpec) -> Captioner:
        """The loaded captioner (kept per process)."""
        return self.settings().load(spec)

    def is_loaded(self, spec: CaptionerSpec) -> bool:
        """Whether this process already holds the captioner (``load`` returns at once)."""
        return self.settings().is_loaded(spec)


class EmbedderResource(dg.ConfigurableResource):
    """Runs the image embedder of models.yaml (SigLIP / CLIP ``get_image_features``)."""

    device: str = Field(default="auto", description="auto (CUDA when available), cpu, cuda ...")
    batch_size: int | None = Field(default=None, description="Override the embedder's batch size.")

    def settings(self) -> EmbedderSettings:
        """These settings, for a stage (in-process or in a job)."""
        return settings_of(self, EmbedderSettings)

    def effective(self, spec: EmbedderSpec) -> EmbedderSpec:
        """The spec with this resource's batch-size override applied (the embedder id is unchanged)."""
        return self.settings().effective(spec)

    def load(self, spec: EmbedderSpec) -> ImageEmbedder:
        """The loaded embedder (kept per process)."""
        return self.settings().load(spec)

    def is_loaded(self, spec: EmbedderSpec) -> bool:
        """Whether this process already holds the embedder (``load`` returns at once)."""
        return self.settings().is_loaded(spec)
