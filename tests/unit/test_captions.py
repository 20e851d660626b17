"""Captioners through the real processor/generate path on a tiny random Qwen3-VL."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prx_assets.core.models.caption_spec import CaptionerSpec, ModelLoadError
from prx_assets.core.models.captions import TransformersCaptioner, load_captioner
from prx_assets.core.models.embeddings import (
    VISION_TOWERS,
    EmbedderSpec,
    ImageEmbedder,
    image_features,
    load_image_model,
)
from tests.helpers import photo


def mixed_images() -> list[Image.Image]:
    return [photo(320, 240, 1), photo(96, 300, 2), photo(640, 360, 3), Image.new("RGB", (64, 64), "red"),
            photo(150, 150, 4)]


def test_captioner_id_tracks_what_changes_the_words(tiny_models: dict[str, str], tmp_path: Path) -> None:
    base = CaptionerSpec(name="detailed", model=tiny_models["vl"])
    assert base.captioner_id().startswith("detailed-")
    same = [CaptionerSpec(name="detailed", model=tiny_models["vl"], batch_size=32, dtype="bfloat16",
                          backend="vllm")]
    moved = tmp_path / "elsewhere" / "tiny-qwen3-vl"
    shutil.copytree(tiny_models["vl"], moved)
    same.append(CaptionerSpec(name="detailed", model=str(moved)))
    same.append(CaptionerSpec(name="detailed", model=tiny_models["vl"], temperature=0.3))  # greedy ignores it
    assert {s.captioner_id() for s in same} == {base.captioner_id()}
    different = [CaptionerSpec(name="detailed", model=tiny_models["vl"], prompt="Say hi."),
                 CaptionerSpec(name="detailed", model=tiny_models["vl"], max_new_tokens=9),
                 CaptionerSpec(name="detailed", model=tiny_models["vl"], do_sample=True),
                 CaptionerSpec(name="detailed", model="Qwen/Qwen3-VL-8B-Instruct")]
    assert len({d.captioner_id() for d in different} | {base.captioner_id()}) == 5


def test_batched_captions_equal_one_by_one_and_see_the_image(tiny_models: dict[str, str]) -> None:
    cap = TransformersCaptioner(CaptionerSpec(name="t", model=tiny_models["vl"], max_new_tokens=20, batch_size=5))
    assert cap.processor.tokenizer.padding_side == "left"
    images = mixed_images()
    batched = cap.caption(images)
    single = [cap.caption([im])[0] for im in images]
    assert [r.text for r in batched] == [r.text for r in single]
    assert [r.tokens for r in batched] == [r.tokens for r in single]
    assert all(r.tokens > 0 and r.seconds > 0 for r in batched)
    # The image reaches the model: different pictures give different captions.
    assert len({r.text for r in batched}) >= 3


def test_producer_thread_gives_the_same_captions(tiny_models: dict[str, str]) -> None:
    """The next batch prepared while one generates (on by default on a GPU): same words, same order."""
    spec = CaptionerSpec(name="t", model=tiny_models["vl"], max_new_tokens=12, batch_size=2)
    plain, overlapped = TransformersCaptioner(spec, overlap=False), TransformersCaptioner(spec, overlap=True)
    assert not plain.overlap and overlapped.overlap and TransformersCaptioner(spec, device="cpu").overlap is False
    images = mixed_images()
    assert [r.text for r in overlapped.caption(images)] == [r.text for r in plain.caption(images)]


def test_fixed_output_length(tiny_models: dict[str, str]) -> None:
    cap = TransformersCaptioner(CaptionerSpec(name="t", model=tiny_models["vl"], max_new_tokens=7,
                                              min_new_tokens=7, batch_size=2))
    out = cap.caption(mixed_images()[:3])
    assert [r.tokens for r in out] == [7, 7, 7] and all(r.hit_max_tokens for r in out)


@pytest.mark.parametrize("overlap", [False, True])
def test_out_of_memory_halves_the_batch(tiny_models: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                        overlap: bool) -> None:
    """With the producer thread too: inputs it prepared for the old batch size are not used."""
    cap = TransformersCaptioner(CaptionerSpec(name="t", model=tiny_models["vl"], max_new_tokens=8, batch_size=4),
                                overlap=overlap)
    images = mixed_images()
    expected = [cap.caption([im])[0].text for im in images]
    real = cap._generate
    sizes: list[int] = []

    def flaky(chunk: list[Image.Image], inputs: object = None) -> list:
        sizes.append(len(chunk))
        if len(chunk) > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(chunk, inputs)

    monkeypatch.setattr(cap, "_generate", flaky)
    assert [r.text for r in cap.caption(images)] == expected
    assert sizes[:3] == [4, 2, 1]
    monkeypatch.setattr(cap, "_generate", lambda chunk, inputs=None: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        cap.caption(images)


def test_missing_path_non_vlm_and_bare_processor_fail_clearly(tiny_models: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"captioner model path '/nope/tiny' does not exist.*prx-assets models"):
        load_captioner(CaptionerSpec(name="t", model="/nope/tiny"))
    with pytest.raises(ModelLoadError, match=r"'qwen3' checkpoint without a vision tower.*Qwen3-VL"):
        load_captioner(CaptionerSpec(name="t", model=tiny_models["text"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"has no config.json"):
        load_captioner(CaptionerSpec(name="t", model=str(tmp_path / "empty")))
    stripped = tmp_path / "no-processor"
    shutil.copytree(tiny_models["vl"], stripped)
    for f in ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json"):
        (stripped / f).unlink(missing_ok=True)
    with pytest.raises(ModelLoadError, match=r"cannot load the processor .*preprocessor_config.json"):
        load_captioner(CaptionerSpec(name="t", model=str(stripped)))


def test_bare_tokenizer_processor_is_refused(tiny_models: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Without torchvision, AutoProcessor silently returns a tokenizer; generate would never see the image.
    import transformers

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained",
                        lambda *a, **k: transformers.AutoTokenizer.from_pretrained(tiny_models["vl"]))
    with pytest.raises(ModelLoadError, match=r"returned a bare .*Tokenizer.*torchvision"):
        load_captioner(CaptionerSpec(name="t", model=tiny_models["vl"]))


def test_vllm_backend_is_optional() -> None:
    pytest.importorskip("PIL")
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ModelLoadError, match=r"pip install 'prx_assets\[vllm\]'"):
            load_captioner(CaptionerSpec(name="t", model="Qwen/Qwen3-VL-8B-Instruct", backend="vllm"))
    else:  # pragma: no cover - only on machines with vLLM
        pytest.skip("vLLM installed: covered by the GPU bench script")


def test_embeddings_shape_norm_and_determinism(tiny_models: dict[str, str]) -> None:
    emb = ImageEmbedder(EmbedderSpec(model=tiny_models["siglip"], batch_size=3))
    images = mixed_images()
    v = emb.embed(images)
    assert v.shape == (5, emb.dim) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    again = emb.embed([images[2]])
    assert np.allclose(again[0], v[2], atol=1e-6)
    assert not np.allclose(v[0], v[1])
    with pytest.raises(ModelLoadError, match="get_image_features"):
        ImageEmbedder(EmbedderSpec(model=tiny_models["text"]))


def _tiny_clip(path: Path) -> str:
    import torch
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(
        text_config={"vocab_size": 99, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 16},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 16},
        projection_dim=24)
    torch.manual_seed(1)
    CLIPModel(config).eval().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("kind", ["siglip", "clip"])
def test_the_vision_tower_alone_gives_the_whole_models_image_features(
        kind: str, tiny_models: dict[str, str], tmp_path: Path) -> None:
    """The embedder loads only the image half of a dual encoder: no text weights in memory, and
    vectors equal, bit for bit, to the whole model's ``get_image_features``."""
    import torch
    from transformers import AutoModel

    path = tiny_models["siglip"] if kind == "siglip" else _tiny_clip(tmp_path / "tiny-clip")
    whole = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    tower = load_image_model(path, whole.config, torch.float32).eval()
    assert type(tower).__name__ == VISION_TOWERS[kind]
    assert not any("text" in name for name, _ in tower.named_parameters())
    assert sum(p.numel() for p in tower.parameters()) < sum(p.numel() for p in whole.parameters())
    size = whole.config.vision_config.image_size
    pixels = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = whole.get_image_features(pixel_values=pixels)
        expected = expected if isinstance(expected, torch.Tensor) else expected.pooler_output
        assert torch.equal(image_features(tower, pixels), expected)
        assert torch.equal(image_features(whole, pixels), expected)


def test_embedder_batch_override_keeps_the_stored_precision() -> None:
    """A batch-size override changes how the model runs, never what is stored: the effective spec
    keeps ``vector_dtype`` (and so the embedder id) of the configured one."""
    from prx_assets.resources.models import EmbedderResource

    spec = EmbedderSpec(model="google/siglip2-so400m-patch14-384", name="siglip", batch_size=32, dtype="bfloat16",
                        vector_dtype="float16")
    eff = EmbedderResource(batch_size=4).effective(spec)
    assert (eff.batch_size, eff.vector_dtype, eff.dtype, eff.name) == (4, "float16", "bfloat16", "siglip")
    assert eff.embedder_id() == spec.embedder_id()
    assert EmbedderResource().effective(spec) is spec


def test_patch_convolutions_become_one_linear_layer(tiny_models: dict[str, str]) -> None:
    """Qwen3-VL's kernel-equals-stride Conv3d patch embedding is computed as a GEMM (cuDNN's
    convolution is slow for it on several GPU stacks): same parameters and state dict, outputs equal
    to rounding, other inputs still convolved, and the captioner loads it so."""
    import torch

    from prx_assets.core.models.patch_embed import _is_patch_conv, linearize_patch_convs

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4)),
                                torch.nn.Conv3d(3, 8, kernel_size=3))  # the second overlaps: kept
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    patches, volume = torch.randn(5, 3, 2, 4, 4), torch.randn(2, 3, 4, 8, 8)
    want_patches, want_volume = model[0](patches), model[0](volume)
    assert linearize_patch_convs(model) == 1 and not _is_patch_conv(model[0]) and isinstance(model[1], torch.nn.Conv3d)
    assert model.state_dict().keys() == keys.keys() and all(torch.equal(model.state_dict()[k], v) for k, v in keys.items())
    torch.testing.assert_close(model[0](patches), want_patches)
    torch.testing.assert_close(model[0](volume), want_volume)  # several windows: the convolution itself
    cap = TransformersCaptioner(CaptionerSpec(name="t", model=tiny_models["vl"], max_new_tokens=4))
    assert cap.patch_convs_linearized >= 1
    assert not any(_is_patch_conv(m) for m in cap.model.modules())
