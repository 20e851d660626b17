"""Tiny, randomly initialised models built and saved locally (no hub access needed).

They exercise exactly the loading and inference code that real checkpoints use:
``save_pretrained`` writes the same files a hub checkpoint has, and the captioner and
embedder load them with ``from_pretrained`` by path. Throughput measured on them is
honest when the output length is fixed (``min_new_tokens == max_new_tokens``).

- :func:`build_tiny_qwen3_vl` — a Qwen3-VL (``Qwen3VLForConditionalGeneration``) with a
  locally trained byte-level BPE tokenizer, a ``Qwen3VLProcessor`` (image and video
  processors) and a chat template.
- :func:`build_tiny_siglip` — a SigLIP dual encoder with its image processor, for
  ``get_image_features``.
- :func:`build_tiny_qwen3_text` — a Qwen3 language model and tokenizer (text encoder).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# The Qwen chat layout, reduced to what captioning needs: system/user/assistant turns
# whose content is a string or a list of {type: image|text} parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "a photo of a red circle over a smooth blue to green gradient",
    "two yellow squares on a gray background with soft light",
    "a close-up of a teal stripe crossing an orange field",
    "the image shows a landscape with hills, a river and a clear sky",
    "a portrait of a person standing near a window in warm light",
    "three purple circles arranged in a row above a white surface",
    "a city street at night with reflections on wet asphalt",
    "an illustration of a cat sitting on a wooden table next to a cup",
]


def train_tokenizer(vocab_size: int = 512):  # -> Qwen2TokenizerFast
    """A byte-level BPE tokenizer with the Qwen special tokens, trained on a small corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              unk_token=None, bos_token=None)
    fast.padding_side = "left"
    return fast


def build_tiny_qwen3_vl(path: str | Path, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Build and save a tiny random Qwen3-VL checkpoint with processor; return the path.

    Examples
    --------
    >>> import tempfile
    >>> p = build_tiny_qwen3_vl(tempfile.mkdtemp())  # doctest: +SKIP
    """
    import torch
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl import Qwen3VLVideoProcessor

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = 16
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": hidden, "intermediate_size": hidden * 2,
            "num_hidden_layers": layers, "num_attention_heads": hidden // head_dim,
            "num_key_value_heads": max(1, hidden // head_dim // 2), "head_dim": head_dim,
            "max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2],
                             "mrope_interleaved": True},
            "tie_word_embeddings": True, "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 2, "hidden_size": hidden, "intermediate_size": hidden * 2,
            "num_heads": hidden // head_dim, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "out_hidden_size": hidden, "num_position_embeddings": 256,
            "deepstack_visual_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # wide weights: greedy outputs vary with the image instead of looping on "\n"
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3)
    # Both ends of a turn stop generation, as in Qwen3-VL's own generation_config.json
    # (eos_token_id [<|im_end|>, <|endoftext|>]; <|endoftext|> is also the padding token).
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2,
                                              min_pixels=32 * 32, max_pixels=256 * 256),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2),
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    (out / "PRX_TINY_MODEL.json").write_text(json.dumps({"kind": "qwen3_vl", "seed": seed}))
    return out


def build_tiny_siglip(path: str | Path, seed: int = 0, dim: int = 32, image_size: int = 64) -> Path:
    """Build and save a tiny random SigLIP model and image processor; return the path."""
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = SiglipConfig(
        text_config={"vocab_size": 256, "hidden_size": dim, "intermediate_size": dim * 2,
                     "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16},
        vision_config={"hidden_size": dim, "intermediate_size": dim * 2, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": image_size, "patch_size": 16},
    )
    torch.manual_seed(seed)
    SiglipModel(config).eval().save_pretrained(out)
    SiglipImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(out)
    (out / "PRX_TINY_MODEL.json").write_text(json.dumps({"kind": "siglip", "seed": seed}))
    return out


def build_tiny_qwen3_text(path: str | Path, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Build and save a tiny random Qwen3 language model with tokenizer (a text encoder)."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=1024)
    torch.manual_seed(seed)
    Qwen3Model(config).eval().save_pretrained(out)
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(out)
    (out / "PRX_TINY_MODEL.json").write_text(json.dumps({"kind": "qwen3_text", "seed": seed}))
    return out


BUILDERS = {
    "tiny-qwen3-vl": build_tiny_qwen3_vl,
    "tiny-siglip": build_tiny_siglip,
    "tiny-qwen3-text": build_tiny_qwen3_text,
}


def ensure_tiny_models(paths: list[str]) -> list[str]:
    """Build any missing tiny model among ``paths`` (folders named like a key of ``BUILDERS``).

    Paths that are not tiny-model folders are left alone. Returns the paths built.
    """
    built = []
    for p in paths:
        path = Path(p)
        builder = BUILDERS.get(path.name)
        if builder is not None and not (path / "config.json").is_file():
            builder(path)
            built.append(str(path))
    return built


def is_tiny(model: str) -> bool:
    """Whether ``model`` is a folder :data:`BUILDERS` wrote (random weights: its outputs are noise)."""
    return (Path(model).expanduser() / "PRX_TINY_MODEL.json").is_file()
