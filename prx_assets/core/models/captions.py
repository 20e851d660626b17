"""Vision-language captioners: specs, ids, and the transformers and vLLM backends.

A :class:`CaptionerSpec` names a model (hub id or local path), a prompt and generation
settings. Its :meth:`~CaptionerSpec.captioner_id` hashes exactly what changes the words
produced (model, prompts, generation settings, image resizing bounds), so captions from
different captioners coexist and a changed prompt is a new captioner. Operational
settings (batch size, dtype, device, backend, server) are not part of the id.

The transformers backend loads ``AutoProcessor`` + ``AutoModelForImageTextToText`` with
``from_pretrained`` — the same code loads ``Qwen/Qwen3-VL-8B-Instruct`` on a GPU machine
and the tiny random checkpoints the tests build — with SDPA attention (FlashAttention 2 when
``flash_attn`` is installed). Generation is batched with left padding through the
checkpoint's chat template (the vision tower's patch convolution computed as one matrix product:
:mod:`~prx_assets.core.models.patch_embed`); on a GPU the next batch's preprocessing (chat template, image
patches, pinned host memory) runs in a producer thread while the current one generates, and
on out-of-memory the batch is halved and retried. The vLLM backend (``pip install 'prx_assets[vllm]'``) is imported
only when selected. ``backend: openai`` sends the same requests to any OpenAI-compatible
server (:mod:`prx_assets.core.models.served`).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from prx_assets.core.models.caption_spec import (
    BACKENDS,
    Captioner,
    CaptionerSpec,
    CaptionResult,
    ModelLoadError,
)
from prx_assets.core.models.identity import hub_kwargs, looks_local
from prx_assets.core.models.patch_embed import linearize_patch_convs

log = logging.getLogger(__name__)

def check_model_path(model: str, role: str, example: str) -> str:
    """Fail early, naming the path and the fix, when a local checkpoint folder is missing."""
    if looks_local(model):
        path = Path(model).expanduser()
        if not path.is_dir():
            raise ModelLoadError(
                f"{role} model path {str(path)!r} does not exist; build the tiny offline models with "
                f"`prx-assets models` or point 'model:' in models.yaml at a checkpoint folder or a "
                f"hub id such as {example!r}")
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{role} model path {str(path)!r} has no config.json, so it is not a Hugging Face "
                "checkpoint folder; point 'model:' at the folder that save_pretrained wrote")
        return str(path)
    return model


def resolve_device(device: str) -> str:
    """``auto`` picks CUDA when available."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str) -> Any:
    """``auto``: bfloat16 on CUDA, float32 on CPU; or a torch dtype name."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return getattr(torch, dtype)
    except AttributeError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from None


def _is_oom(err: BaseException) -> bool:
    import torch

    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    return isinstance(err, oom_types) or "out of memory" in str(err).lower()


def attention_implementation() -> str:
    """``flash_attention_2`` when the ``flash_attn`` package is importable, else ``sdpa``."""
    import importlib.util

    return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"


class TransformersCaptioner:
    """Qwen3-VL (or any image-text-to-text checkpoint) through transformers ``generate``.

    ``overlap`` (default: on a GPU) prepares the next batch in a producer thread while the
    current one generates; the captions are the same either way."""

    def __init__(self, spec: CaptionerSpec, device: str = "auto", overlap: bool | None = None) -> None:
        self.spec = spec
        self.device = resolve_device(device)
        self.overlap = (not self.device.startswith("cpu")) if overlap is None else overlap
        self.model_path = check_model_path(spec.model, "captioner", "Qwen/Qwen3-VL-8B-Instruct")
        self._hub = hub_kwargs(spec.model, spec.revision)
        self._load()

    def _load(self) -> None:
        from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

        try:
            config = AutoConfig.from_pretrained(self.model_path, **self._hub)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot read the config of captioner model {self.model_path!r}: {e}") from e
        if getattr(config, "vision_config", None) is None:
            raise ModelLoadError(
                f"captioner model {self.model_path!r} is a {config.model_type!r} checkpoint without a "
                "vision tower; captioners need an image-text-to-text model such as "
                "Qwen/Qwen3-VL-8B-Instruct")
        try:
            processor = AutoProcessor.from_pretrained(self.model_path, **self._hub)
        except (OSError, ValueError) as e:
            raise ModelLoadError(
                f"cannot load the processor of captioner model {self.model_path!r} ({e}); a checkpoint "
                "folder needs preprocessor_config.json and the tokenizer files next to config.json") from e
        if not hasattr(processor, "image_processor"):
            raise ModelLoadError(
                f"AutoProcessor for {self.model_path!r} returned a bare {type(processor).__name__}, so "
                "generate would never see the image; install torchvision (the Qwen3-VL video "
                "processor needs it) and check the checkpoint ships preprocessor_config.json")
        ip = processor.image_processor
        if self.spec.min_pixels or self.spec.max_pixels:
            size = dict(getattr(ip, "size", None) or {})
            if self.spec.min_pixels:
                ip.min_pixels = size["shortest_edge"] = self.spec.min_pixels
            if self.spec.max_pixels:
                ip.max_pixels = size["longest_edge"] = self.spec.max_pixels
            ip.size = size
        processor.tokenizer.padding_side = "left"
        if processor.tokenizer.pad_token is None:
            processor.tokenizer.pad_token = processor.tokenizer.eos_token
        dtype = resolve_dtype(self.spec.dtype, self.device)
        attn = attention_implementation() if self.device.startswith("cuda") else "sdpa"
        try:
            model = AutoModelForImageTextToText.from_pretrained(self.model_path, dtype=dtype, attn_implementation=attn,
                                                                **self._hub)
        except (ValueError, ImportError):  # an architecture without that kernel: transformers' default
            model = AutoModelForImageTextToText.from_pretrained(self.model_path, dtype=dtype, **self._hub)
        self.model = model.to(self.device).eval()
        # Qwen-VL's patch embedding as one GEMM, not a cuDNN Conv3d (slow on several stacks, and the
        # likely cause of the H200 run's cost per new batch shape: core/models/patch_embed.py).
        self.patch_convs_linearized = linearize_patch_convs(self.model)
        self.processor = processor
        # transformers 5 takes the processor's own arguments in processor_kwargs (and warns on every
        # batch when they come loose); 4.x has no such parameter.
        self._padding: dict[str, Any] = \
            {"processor_kwargs": {"padding": True}} if "processor_kwargs" in inspect.signature(
                processor.apply_chat_template).parameters else {"padding": True}
        gen = self.model.generation_config
        self.eos_ids = set(gen.eos_token_id if isinstance(gen.eos_token_id, list) else
                           [gen.eos_token_id] if gen.eos_token_id is not None else [])
        self.pad_id = processor.tokenizer.pad_token_id

    def _inputs(self, images: Sequence[Image.Image]) -> Any:
        """The model inputs of one batch on the host (pinned when they go to a GPU)."""
        inputs = self.processor.apply_chat_template(
            [self.spec.messages(im) for im in images], tokenize=True, add_generation_prompt=True,
            return_dict=True, return_tensors="pt", **self._padding)
        if self.device.startswith("cuda"):
            for k, v in inputs.items():
                if hasattr(v, "pin_memory"):
                    inputs[k] = v.pin_memory()
        return inputs

    def _generate(self, images: Sequence[Image.Image], inputs: Any = None) -> list[CaptionResult]:
        import torch

        host = inputs if inputs is not None else self._inputs(images)
        inputs = host.to(self.device, non_blocking=True)
        started = time.perf_counter()
        with torch.inference_mode():
            if self.spec.do_sample:
                torch.manual_seed(self.spec.seed)
            out = self.model.generate(**inputs, **self.spec.generate_kwargs(),
                                      pad_token_id=self.pad_id)
        seconds = (time.perf_counter() - started) / max(1, len(images))
        new = out[:, inputs["input_ids"].shape[1]:].tolist()
        results = []
        for seq in new:
            # A caption ends at its first end-of-sequence token (a finished row of a batch is padded
            # after it). A padding token generated mid-caption is an ordinary (special) token, as
            # every server treats it: decoding skips it and generation goes on.
            n = next((i for i, tok in enumerate(seq) if tok in self.eos_ids), len(seq))
            text = self.processor.tokenizer.decode(seq[:n], skip_special_tokens=True).strip()
            results.append(CaptionResult(text=text, tokens=n, seconds=seconds,
                                         hit_max_tokens=n >= self.spec.max_new_tokens))
        return results

    def caption(self, images: Sequence[Image.Image]) -> list[CaptionResult]:
        """Caption in batches of ``spec.batch_size``; halve the batch on out-of-memory.

        Images are grouped by pixel count before batching (the vision token count follows
        it), so a batch pads little; results come back in input order.
        """
        order = sorted(range(len(images)), key=lambda i: images[i].size[0] * images[i].size[1])
        ordered = [images[i] for i in order]
        results_sorted = self._caption_in_order(ordered)
        results: list[CaptionResult | None] = [None] * len(images)
        for pos, idx in enumerate(order):
            results[idx] = results_sorted[pos]
        return [r for r in results if r is not None]

    def _caption_in_order(self, images: Sequence[Image.Image]) -> list[CaptionResult]:
        from concurrent.futures import Future, ThreadPoolExecutor

        results: list[CaptionResult] = []
        batch = max(1, self.spec.batch_size)
        i = 0
        # The next batch's inputs, prepared by a producer thread: (start, size, future).
        ahead: tuple[int, int, Future[Any]] | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prx-caption-prep") as pool:
            while i < len(images):
                chunk = images[i:i + batch]
                ready = ahead[2].result() if ahead is not None and ahead[:2] == (i, len(chunk)) else None
                nxt = i + len(chunk)
                ahead = None
                if self.overlap and nxt < len(images):
                    upcoming = images[nxt:nxt + batch]
                    ahead = (nxt, len(upcoming), pool.submit(self._inputs, upcoming))
                try:
                    results.extend(self._generate(chunk, ready))
                except (RuntimeError, MemoryError) as e:
                    if not _is_oom(e) or batch == 1:
                        raise
                    import torch

                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                    batch = max(1, batch // 2)
                    log.warning("out of memory captioning %d images; retrying with batch size %d",
                                len(chunk), batch)
                    continue
                i = nxt
        return results


class VLLMCaptioner:
    """The same prompt and settings through vLLM's offline ``LLM.generate`` (GPU scale)."""

    def __init__(self, spec: CaptionerSpec, device: str = "auto", **llm_kwargs: Any) -> None:
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise ModelLoadError(
                f"captioner {spec.name!r} selects backend 'vllm' but vLLM is not installed; "
                "install it with `pip install 'prx_assets[vllm]'` on a CUDA machine or use "
                "backend: transformers") from None
        from transformers import AutoProcessor

        self.spec = spec
        self.model_path = check_model_path(spec.model, "captioner", "Qwen/Qwen3-VL-8B-Instruct")
        self.processor = AutoProcessor.from_pretrained(self.model_path, **hub_kwargs(spec.model, spec.revision))
        mm_kwargs = {k: v for k, v in (("min_pixels", spec.min_pixels), ("max_pixels", spec.max_pixels))
                     if v}
        if spec.revision and not looks_local(spec.model):
            llm_kwargs = {"revision": spec.revision, **llm_kwargs}
        self.llm = LLM(model=self.model_path, dtype="auto" if spec.dtype == "auto" else spec.dtype,
                       limit_mm_per_prompt={"image": 1}, mm_processor_kwargs=mm_kwargs or None,
                       seed=spec.seed, **llm_kwargs)
        self.params = SamplingParams(
            max_tokens=spec.max_new_tokens, min_tokens=spec.min_new_tokens or 0,
            temperature=spec.temperature if spec.do_sample else 0.0,
            top_p=spec.top_p if spec.do_sample else 1.0, top_k=spec.top_k or -1,
            repetition_penalty=spec.repetition_penalty, seed=spec.seed)

    def caption(self, images: Sequence[Image.Image]) -> list[CaptionResult]:
        """Caption all images in one vLLM call (it schedules batches itself)."""
        prompts = [{"prompt": self.processor.apply_chat_template(
            self.spec.messages(im), tokenize=False, add_generation_prompt=True),
            "multi_modal_data": {"image": im}} for im in images]
        started = time.perf_counter()
        outputs = self.llm.generate(prompts, self.params, use_tqdm=False)
        seconds = (time.perf_counter() - started) / max(1, len(images))
        results = []
        for out in outputs:
            c = out.outputs[0]
            n = len(c.token_ids)
            results.append(CaptionResult(text=c.text.strip(), tokens=n, seconds=seconds,
                                         hit_max_tokens=n >= self.spec.max_new_tokens))
        return results


def load_captioner(spec: CaptionerSpec, device: str = "auto") -> Captioner:
    """Instantiate the spec's backend."""
    if spec.backend == "vllm":
        return VLLMCaptioner(spec, device)
    if spec.backend == "transformers":
        return TransformersCaptioner(spec, device)
    if spec.backend == "openai":
        from prx_assets.core.models.served import OpenAICaptioner

        return OpenAICaptioner(spec, device)
    raise ModelLoadError(f"captioner {spec.name!r}: unknown backend {spec.backend!r}; use one of {BACKENDS}")


def spec_from_dict(raw: dict[str, Any]) -> CaptionerSpec:
    """Build a spec from a models.yaml entry (unknown keys raise TypeError)."""
    fields = {f.name for f in dataclasses.fields(CaptionerSpec)}
    unknown = set(raw) - fields
    if unknown:
        raise TypeError(f"unknown captioner keys {sorted(unknown)}; use: {', '.join(sorted(fields))}")
    return CaptionerSpec(**raw)
