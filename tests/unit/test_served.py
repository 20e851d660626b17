"""backend: openai against a real OpenAI-compatible server (`transformers serve` on loopback, tiny Qwen3-VL)."""

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from prx_assets.core.models.caption_spec import CaptionerSpec
from prx_assets.core.models.captions import TransformersCaptioner, load_captioner
from prx_assets.core.models.config import load_models
from prx_assets.core.models.served import (
    SERVER_URL_ENV,
    CaptionServerError,
    OpenAICaptioner,
    fit_pixels,
    request_body,
    transformers_server,
)
from prx_assets.errors import ConfigError
from tests.helpers import photo
from tests.unit.test_captions import mixed_images


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with transformers_server(log_path=str(log)) as url:
        yield url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_captions_equal_the_transformers_backend(server: str, tiny_models: dict[str, str]) -> None:
    spec = CaptionerSpec(name="detailed", model=tiny_models["vl"], max_new_tokens=12, backend="openai",
                         server_url=server, concurrency=1)
    local = CaptionerSpec(name="detailed", model=tiny_models["vl"], max_new_tokens=12, batch_size=1)
    assert spec.captioner_id() == local.captioner_id()  # the backend is not part of the id
    cap = load_captioner(spec)
    assert isinstance(cap, OpenAICaptioner)
    images = mixed_images()
    served = cap.caption(images)
    # The same pixels (lossless PNG) and greedy settings give the words of the transformers backend.
    assert [r.text for r in served] == [r.text for r in TransformersCaptioner(local, "cpu").caption(images)]
    assert len({r.text for r in served}) >= 3  # the server sees each image
    assert all(r.seconds > 0 and r.tokens > 0 for r in served)


def test_generation_settings_reach_transformers_serve(server: str, tiny_models: dict[str, str]) -> None:
    kw = {"name": "d", "model": tiny_models["vl"], "max_new_tokens": 16, "repetition_penalty": 1.3,
          "no_repeat_ngram_size": 2}
    images = mixed_images()
    served = OpenAICaptioner(CaptionerSpec(**kw, backend="openai", server_url=server, concurrency=1,
                                           server_api="transformers")).caption(images)
    local = TransformersCaptioner(CaptionerSpec(**kw, batch_size=1), "cpu").caption(images)
    assert [r.text for r in served] == [r.text for r in local]
    plain = TransformersCaptioner(CaptionerSpec(name="d", model=tiny_models["vl"], max_new_tokens=16), "cpu")
    assert [r.text for r in served] != [r.text for r in plain.caption(images)]  # the settings took effect
    # A vLLM-style request cannot carry no_repeat_ngram_size: refused before any request.
    with pytest.raises(CaptionServerError, match="no_repeat_ngram_size"):
        OpenAICaptioner(CaptionerSpec(**kw, backend="openai", server_url=server))


def test_requests_in_flight_keep_the_order(server: str, tiny_models: dict[str, str]) -> None:
    # One new token: transformers serve generates concurrent requests on one Qwen-VL model object,
    # whose rope state is shared between them, so only the first token is deterministic under load.
    images = mixed_images() + [im.transpose(0) for im in mixed_images()]
    spec = CaptionerSpec(name="d", model=tiny_models["vl"], max_new_tokens=1, backend="openai",
                         server_url=server, concurrency=1)
    one_at_a_time = [r.text for r in OpenAICaptioner(spec).caption(images)]
    assert len(set(one_at_a_time)) >= 3
    wide = OpenAICaptioner(CaptionerSpec(**{**spec.__dict__, "concurrency": 6}))
    assert [r.text for r in wide.caption(images)] == one_at_a_time


def test_server_url_from_the_environment_and_unreachable_server(tiny_models: dict[str, str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    spec = CaptionerSpec(name="d", model=tiny_models["vl"], backend="openai")
    with pytest.raises(CaptionServerError, match="no server is set"):
        OpenAICaptioner(spec)
    dead = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv(SERVER_URL_ENV, dead)
    with pytest.raises(CaptionServerError, match=rf"{dead}/v1 is not ready after 1 s .*ConnectError"):
        OpenAICaptioner(spec, ready_timeout_s=1)


def test_rejected_request_names_the_server_and_is_not_retried(server: str, tiny_models: dict[str, str]) -> None:
    # min_tokens is a vLLM/SGLang extension; transformers serve refuses unknown keys with a 4xx.
    spec = CaptionerSpec(name="d", model=tiny_models["vl"], backend="openai", server_url=server,
                         min_new_tokens=3, max_new_tokens=4, max_retries=3)
    cap = OpenAICaptioner(spec)
    with pytest.raises(CaptionServerError, match=rf"{server} rejected a request .* HTTP 4\d\d.*min_tokens"):
        cap.caption([photo(64, 64, 1)])


def test_failing_requests_are_retried_then_reported(server: str, tmp_path: Path) -> None:
    # A checkpoint folder the server cannot load: HTTP 500 each time, retried, then one clear error.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    spec = CaptionerSpec(name="d", model=str(broken), backend="openai", server_url=server, max_retries=1)
    with pytest.raises(CaptionServerError, match=r"failed 2 times for one image \(last: HTTP 500"):
        OpenAICaptioner(spec).caption([photo(32, 32, 1)])


def test_request_body_and_pixel_bounds() -> None:
    spec = CaptionerSpec(name="d", model="Qwen/Qwen3-VL-8B-Instruct", served_model="qwen", system_prompt="Be brief.",
                         max_new_tokens=64, backend="openai")
    body = request_body(spec, "data:image/png;base64,AAAA")
    assert body["model"] == "qwen" and body["max_tokens"] == 64 and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert not {"top_k", "repetition_penalty", "min_tokens", "seed"} & set(body)
    sampled = request_body(CaptionerSpec(name="d", model="m", do_sample=True, top_k=5, seed=3), "u")
    assert sampled["seed"] == 3 and sampled["top_k"] == 5 and sampled["top_p"] == 1.0
    tf = request_body(CaptionerSpec(name="d", model="m", repetition_penalty=1.1, server_api="transformers"), "u")
    assert "repetition_penalty" not in tf and '"repetition_penalty": 1.1' in tf["generation_config"]
    big = photo(2000, 1000, 1)
    w, h = fit_pixels(big, None, 500_000).size
    assert abs(w * h - 500_000) < 3_000 and abs(w / h - 2.0) < 0.01
    assert fit_pixels(big, 100, 10_000_000) is big
    assert fit_pixels(photo(20, 10, 1), 20_000, None).size == (200, 100)


def test_models_yaml_accepts_the_openai_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPTION_HOST", "gpu7")
    cfg = tmp_path / "models.yaml"
    cfg.write_text("captioners:\n  - name: d\n    model: Qwen/Qwen3-VL-8B-Instruct\n    backend: openai\n"
                   "    server_url: http://${CAPTION_HOST}:8000/v1\n    concurrency: 32\n")
    spec = load_models(cfg).captioners[0]
    assert spec.server_url == "http://gpu7:8000/v1" and spec.concurrency == 32
    assert spec.captioner_id() == CaptionerSpec(name="d", model="Qwen/Qwen3-VL-8B-Instruct").captioner_id()
    cfg.write_text("captioners:\n  - name: d\n    model: m\n    backend: openai\n    concurrency: 0\n")
    with pytest.raises(ConfigError, match="concurrency must be >= 1"):
        load_models(cfg)
    cfg.write_text("captioners:\n  - name: d\n    model: m\n    backend: openai\n    server_api: tgi\n")
    with pytest.raises(ConfigError, match="unknown server_api 'tgi'"):
        load_models(cfg)
