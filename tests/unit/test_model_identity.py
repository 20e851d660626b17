"""Model ids follow the model's content: configs, weights and tokenizer files, or a hub name and
revision; never the path they are read from. A missing model folder is a config error naming the
file and the entry."""

import os
import shutil
from pathlib import Path

import pytest

from prx_assets.core.models.caption_spec import CaptionerSpec
from prx_assets.core.models.config import load_models
from prx_assets.core.models.embeddings import EmbedderSpec
from prx_assets.core.models.identity import file_digest, model_identity
from prx_assets.core.models.text_encoder import TextTowerSpec
from prx_assets.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_a_copied_or_moved_checkpoint_keeps_its_id_and_a_changed_file_does_not(
        tiny_models: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRX_CACHE_DIR", str(tmp_path / "cache"))
    vl = Path(tiny_models["vl"])
    copy = tmp_path / "other" / "renamed-folder"
    shutil.copytree(vl, copy)
    (copy / "README.md").write_text("notes")  # decides nothing
    assert model_identity(str(copy)) == model_identity(str(vl))
    specs = [(CaptionerSpec(name="d", model=str(vl)), CaptionerSpec(name="d", model=str(copy))),
             (EmbedderSpec(model=str(vl)), EmbedderSpec(model=str(copy))),
             (TextTowerSpec(model=str(vl), name="t"), TextTowerSpec(model=str(copy), name="t"))]
    assert specs[0][0].captioner_id() == specs[0][1].captioner_id()
    assert specs[1][0].embedder_id() == specs[1][1].embedder_id()
    assert specs[2][0].identity() == specs[2][1].identity()
    tok = next(p for p in copy.iterdir() if p.name.startswith("tokenizer") and p.suffix == ".json")
    tok.write_text(tok.read_text().replace("<|image_pad|>", "<|image_pad_|>", 1))
    assert model_identity(str(copy)) != model_identity(str(vl))
    weights = next(copy.glob("*.safetensors"))
    before = model_identity(str(vl))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the same size, other bytes
    weights.write_bytes(bytes(data))
    assert model_identity(str(copy)) not in (before, model_identity(str(vl)))


def test_a_hub_model_is_named_with_its_revision() -> None:
    assert model_identity("Qwen/Qwen3-VL-8B-Instruct") == "Qwen/Qwen3-VL-8B-Instruct"
    a = CaptionerSpec(name="d", model="Qwen/Qwen3-VL-8B-Instruct").captioner_id()
    b = CaptionerSpec(name="d", model="Qwen/Qwen3-VL-8B-Instruct", revision="0123abcd").captioner_id()
    assert a != b and b == CaptionerSpec(name="d", model="Qwen/Qwen3-VL-8B-Instruct", revision="0123abcd").captioner_id()


def test_file_digests_are_cached_by_path_size_and_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import prx_assets.core.models.identity as identity

    monkeypatch.setenv("PRX_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x" * 1000)
    first = file_digest(f)
    assert (tmp_path / "cache" / "file_digests.json").is_file()
    identity._MEMO.clear()
    reads: list[str] = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: reads.append(str(p)) or real_open(p, *a, **k))
    assert file_digest(f) == first and str(f) not in reads  # from the cache file, not the weights
    monkeypatch.undo()
    monkeypatch.setenv("PRX_CACHE_DIR", str(tmp_path / "cache"))
    f.write_bytes(b"y" * 1000)
    os.utime(f, ns=(1, 2))
    assert file_digest(f) != first


def test_a_config_folder_and_its_models_copied_elsewhere_give_the_same_ids(
        tiny_models: dict[str, str], tmp_path: Path) -> None:
    """models.yaml names its models relative to itself: copying both changes no id; copying the
    config alone is an error that names models.yaml, the entry and the missing folder."""
    for name, where in (("a", tmp_path / "a"), ("b", tmp_path / "deeper" / "b")):
        (where / ".models").mkdir(parents=True)
        for key, folder in (("vl", "tiny-qwen3-vl"), ("siglip", "tiny-siglip"), ("text", "tiny-qwen3-text")):
            shutil.copytree(tiny_models[key], where / ".models" / folder)
        shutil.copytree(REPO / "config", where / "config")
        assert name
    ids = [load_models(w / "config" / "models.yaml") for w in (tmp_path / "a", tmp_path / "deeper" / "b")]
    assert ids[0].captioner_ids() == ids[1].captioner_ids()
    assert ids[0].embedder.embedder_id() == ids[1].embedder.embedder_id()
    assert ids[0].text_encoder.identity() == ids[1].text_encoder.identity()
    alone = tmp_path / "alone" / "config"
    shutil.copytree(REPO / "config", alone)
    with pytest.raises(ConfigError) as err:
        load_models(alone / "models.yaml")
    text = str(err.value)
    assert str(alone / "models.yaml") in text and "captioner 'detailed'" in text and ".models/tiny-qwen3-vl" in text
    assert "prx-assets models" in text
    assert load_models(alone / "models.yaml", check_paths=False).captioners  # what `prx-assets models` reads
