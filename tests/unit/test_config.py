"""sources.yaml parsing: valid forms, env expansion, and errors that name file, source and fix."""

from pathlib import Path

import pytest

from prx_assets.core.config.project import load_sources
from prx_assets.core.ingest.readers import reader_for
from prx_assets.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sources.yaml"
    p.write_text(text)
    return p


def test_minimal_form_and_defaults(tmp_path: Path, data_root: Path) -> None:
    p = write(tmp_path, """
sources:
  - {name: photos, kind: folder, path: /data/photos}
  - {name: pub, kind: s3, uri: s3://b/p}
  - {name: cat, kind: parquet, path: rel/cat}
  - {name: web, kind: webdataset, path: "${PRX_DATA_ROOT}/web"}
""")
    cfg = load_sources(p)
    assert [s.name for s in cfg.sources] == ["photos", "pub", "cat", "web"]
    assert cfg.get("pub").location == "s3://b/p/"
    assert cfg.get("cat").location == str(tmp_path / "rel" / "cat")
    assert cfg.get("web").location == f"{data_root}/web"
    assert cfg.get("photos").ingest.jpeg_quality == 92


def test_ingest_overrides_and_fingerprint(tmp_path: Path) -> None:
    p = write(tmp_path, """
ingest: {jpeg_quality: 90, max_side: 2048}
sources:
  - {name: a, kind: folder, path: /x}
  - {name: b, kind: folder, path: /x, ingest: {jpeg_quality: 95}}
""")
    cfg = load_sources(p)
    a, b = cfg.get("a"), cfg.get("b")
    assert (a.ingest.jpeg_quality, a.ingest.max_side) == (90, 2048)
    assert (b.ingest.jpeg_quality, b.ingest.max_side) == (95, 2048)
    assert a.ingest.normalization_fingerprint() != b.ingest.normalization_fingerprint()


@pytest.mark.parametrize(("text", "pattern"), [
    ("sources:\n  - {name: x, kind: ftp, path: /x}\n",
     r"sources.yaml: source 'x': unknown source kind 'ftp' \(fix: use one of: folder, s3, gcs, parquet"),
    ("sources: [\n  - {name: x\n", r"sources.yaml: malformed YAML at line 2, column 3: .*\(fix: fix the YAML syntax\)"),
    ("sources:\n  - {name: x, kind: folder}\n", r"source 'x': missing 'path'"),
    ("sources:\n  - {name: Bad-Name, kind: folder, path: /x}\n", r"source name 'Bad-Name' is invalid"),
    ("sources:\n  - {name: x, kind: folder, path: /x, colour: red}\n", r"source 'x': unknown key 'colour' \(fix: use one of: .*caption_field"),
    ("sources:\n  - {name: x, kind: folder, path: /x}\n  - {name: x, kind: folder, path: /y}\n",
     r"source 'x': duplicate source name"),
    ("sources:\n  - {name: x, kind: s3, uri: /local}\n", r"uri '/local' is not an s3:// URI"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {jpeg_quality: 0}}\n",
     r"jpeg_quality=0 is outside 1..100"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {qualty: 9}}\n", r"unknown ingest setting 'qualty'"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {lossless_fallback: gif}}\n",
     r"source 'x': lossless_fallback='gif' is not supported \(fix: use one of: webp, png, off\)"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {fallback_warn_share: 2}}\n",
     r"fallback_warn_share=2.0 within 0..1"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {lossless_fallback: true}}\n",
     r"lossless_fallback=True: expected a str, got bool \(fix: write lossless_fallback:"),
    ("sources:\n  - {name: x, kind: folder, path: '${NOPE_NOT_SET}/x'}\n",
     r"environment variable NOPE_NOT_SET is not set"),
    ("ingest: {aspect_buckets: ['16x9']}\nsources: []\n", r"aspect bucket '16x9' is not of the form"),
    ("just a string\n", r"expected a mapping with a 'sources:' list"),
    ("ingest: {jpeg_quality: high}\nsources: []\n",
     r"sources.yaml: ingest: jpeg_quality='high': expected an int, got str \(fix: write jpeg_quality: 92"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {max_aspect: wide}}\n",
     r"source 'x': max_aspect='wide': expected a float, got str"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {max_side: [1]}}\n",
     r"max_side=\[1\]: expected an int or null, got list"),
    ("sources:\n  - {name: x, kind: folder, path: /x, ingest: {workers: true}}\n", r"workers=True: expected an int"),
    ("ingest: {aspect_buckets: '16:9'}\nsources: []\n", r"aspect_buckets='16:9': expected a list"),
    ("sources:\n  - {name: x, kind: folder, path: /x, follow_links: sometimes}\n",
     r"follow_links='sometimes': expected a bool, got str \(fix: write follow_links: true \(default False\)"),
])
def test_bad_config_names_file_source_and_fix(tmp_path: Path, text: str, pattern: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=pattern) as exc:
        load_sources(p)
    assert str(p) in str(exc.value)
    assert "fix:" in str(exc.value)


def test_missing_file_and_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope/sources.yaml: file not found.*PRX_CONFIG_DIR"):
        load_sources(tmp_path / "nope" / "sources.yaml")
    cfg = load_sources(write(tmp_path, f"sources:\n  - {{name: x, kind: folder, path: {tmp_path}/missing}}\n"))
    with pytest.raises(ConfigError, match=r"source 'x': folder .*missing' does not exist.*fix: create"):
        reader_for(cfg.get("x")).list_units()


def test_unknown_source_lookup_lists_known(tmp_path: Path) -> None:
    cfg = load_sources(write(tmp_path, "sources:\n  - {name: a, kind: folder, path: /x}\n"))
    with pytest.raises(ConfigError, match=r"no source named 'zz'; known sources: a"):
        cfg.get("zz")


def test_shipped_demo_config_is_valid() -> None:
    cfg = load_sources(Path(__file__).parents[2] / "config" / "sources.yaml")
    assert {s.kind for s in cfg.sources} == {"folder", "parquet", "webdataset"}


def test_a_bare_off_turns_lossless_fallback_off(tmp_path: Path) -> None:
    from prx_assets.core.config.project import load_sources

    p = tmp_path / "sources.yaml"
    p.write_text("sources:\n  - {name: x, kind: folder, path: /x, ingest: {lossless_fallback: off}}\n")
    assert load_sources(p).get("x").ingest.lossless_fallback == "off"


@pytest.mark.parametrize(("name", "text", "pattern"), [
    ("sources.yaml", "sources:\n  - {name: x, kind: folder, path: /x, batch_size: true}\n",
     r"source 'x': batch_size=True: expected an int or null, got bool"),
    ("sources.yaml", "sources:\n  - {name: x, kind: folder, path: /x, batch_size: 0}\n",
     r"source 'x': batch_size=0 must be >= 1"),
    ("models.yaml", "captioners:\n  - {name: d, model: Qwen/Qwen3-VL-2B-Instruct, max_new_tokens: sixteen}\n",
     r"models.yaml: captioner 'd': max_new_tokens='sixteen': expected an int, got str \(fix: write max_new_tokens:"),
    ("models.yaml", "captioners:\n  - {name: d, model: Qwen/Qwen3-VL-2B-Instruct, batch_size: true}\n",
     r"captioner 'd': batch_size=True: expected an int, got bool"),
    ("models.yaml", "captioners: []\nembedder: {model: google/siglip2-so400m-patch14-384, batch_size: 0}\n",
     r"embedder: batch_size=0 must be >= 1"),
    ("models.yaml", "captioners: []\nembedder: {model: google/siglip2-so400m-patch14-384, batch_size: true}\n",
     r"embedder: batch_size=True: expected an int, got bool"),
    ("models.yaml", "captioners: []\ntext_encoder: {model: Qwen/Qwen3-0.6B, max_length: '128'}\n",
     r"text_encoder: max_length='128': expected an int, got str"),
    ("recipes.yaml", "recipes:\n  - {name: r, min_side: big}\n",
     r"recipes.yaml: recipe 'r': min_side='big': expected an int or null, got str \(fix: write min_side:"),
    ("recipes.yaml", "recipes:\n  - {name: r, aspect_buckets: ['1:0', x]}\n",
     r"recipe 'r': aspect bucket '1:0' is not of the form 'W:H' with positive sides"),
    ("recipes.yaml", "recipes:\n  - {name: r, aspect_buckets: '1:1'}\n", r"aspect_buckets='1:1' must be a list"),
    ("recipes.yaml", "recipes:\n  - {name: r, dedup: {exact: maybe}}\n", r"exact='maybe': expected a bool"),
    ("recipes.yaml", "recipes:\n  - {name: r, seed: 1.5}\n", r"seed=1.5: expected an int, got float"),
    ("recipes.yaml", "recipes:\n  - {name: r, caption_mix: {short: lots}}\n", r"caption_mix.short='lots': expected a float, got str"),
    ("mixtures.yaml", "mixtures:\n  - {name: m, epoch_size: many, streams: [{recipe: r, proportion: 1}]}\n",
     r"mixture 'm': epoch_size='many': expected an int or null, got str"),
    ("mixtures.yaml", "mixtures:\n  - {name: m, streams: [{recipe: r, choose: 2.5}]}\n",
     r"streams\[0\].choose=2.5: expected an int or null, got float"),
])
def test_every_config_file_types_its_values_up_front(tmp_path: Path, name: str, text: str, pattern: str) -> None:
    """Each of these once gave a traceback, a bare ValueError or was accepted silently (a published
    set, a training job, an IndexError later): now a ConfigError naming file, entry, value and fix."""
    from prx_assets.core.curate.recipes import load_recipes
    from prx_assets.core.models.config import load_models
    from prx_assets.core.publish.mixture import load_mixtures

    p = tmp_path / name
    p.write_text(text)
    load = {"sources.yaml": load_sources, "models.yaml": load_models, "recipes.yaml": load_recipes,
            "mixtures.yaml": load_mixtures}[name]
    with pytest.raises(ConfigError, match=pattern) as exc:
        load(p)
    assert str(p) in str(exc.value) and "fix:" in str(exc.value)


def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    p = tmp_path / "sources.yaml"
    p.write_bytes(b"sources:\n  - {name: x, kind: folder, path: /caf\xe9}\n")
    with pytest.raises(ConfigError, match=r"sources.yaml: not UTF-8 text: byte b'\\xe9' at offset \d+ \(fix: save"):
        load_sources(p)
