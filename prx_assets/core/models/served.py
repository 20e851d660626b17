"""Captioning through an OpenAI-compatible chat-completions server (``backend: openai``).

Any server that speaks ``POST /v1/chat/completions`` with image parts works: ``vllm serve``,
SGLang, LMDeploy, ``transformers serve``. Each image goes as a base64 PNG data URL (lossless,
so the server sees the pixels the transformers backend would); ``concurrency`` requests are
in flight at once, so the server's own scheduler (continuous batching) fills the GPU. A
request that fails on the way (connection refused or reset, timeout, HTTP 408/409/429/5xx) is
retried with exponential backoff and jitter; a request the server rejects (other 4xx) fails
at once with the server's message. The captioner id does not depend on the backend: the same
model, prompt and generation settings caption the same way through the server.

``transformers serve`` (without continuous batching) runs concurrent requests on one model
object; Qwen-VL keeps per-generation rope state on it, so with that server use
``concurrency: 1`` (it does not batch anyway). vLLM and SGLang batch concurrent requests.

Settings (operational, not part of the captioner id): ``server_url`` (``.../v1``; or the
``PRX_CAPTION_SERVER_URL`` environment variable), ``served_model`` (the name the server knows
the model by; default ``model``), ``api_key_env`` (the environment variable holding the API key;
the key itself is never written anywhere), ``concurrency``, ``request_timeout_s``,
``max_retries``, ``server_api`` (``vllm`` or ``transformers``: how settings outside the OpenAI
schema travel).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import importlib.util
import io
import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from PIL import Image

from prx_assets.core.models.caption_spec import CaptionerSpec, CaptionResult
from prx_assets.errors import PrxError

if TYPE_CHECKING:
    import httpx


log = logging.getLogger(__name__)

#: HTTP statuses worth retrying: the request may succeed once the server has capacity again.
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
#: How generation settings outside the OpenAI schema travel (see :func:`request_body`).
SERVER_APIS = ("vllm", "transformers")
#: Environment variable naming the server when a captioner sets no ``server_url``.
SERVER_URL_ENV = "PRX_CAPTION_SERVER_URL"
#: Set by a SLURM job that started its own server (``SlurmResource.caption_server``); wins over the rest.
JOB_SERVER_URL_ENV = "PRX_JOB_CAPTION_SERVER_URL"


class CaptionServerError(PrxError):
    """The caption server is unreachable or rejected a request; the message names it and the fix."""


def server_url(spec: CaptionerSpec) -> str:
    """The server's base URL (ending in ``/v1``) for ``spec``: the job's own server
    (``$PRX_JOB_CAPTION_SERVER_URL``), else its ``server_url``, else ``$PRX_CAPTION_SERVER_URL``."""
    url = os.environ.get(JOB_SERVER_URL_ENV) or spec.server_url or os.environ.get(SERVER_URL_ENV, "")
    if not url:
        raise CaptionServerError(
            f"captioner {spec.name!r} selects backend 'openai' but no server is set; set server_url: "
            f"(e.g. http://gpu-node:8000/v1) in models.yaml, the captioner resource's server_url, or "
            f"${SERVER_URL_ENV}")
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def image_data_url(image: Image.Image) -> str:
    """``image`` as a ``data:image/png;base64,...`` URL (lossless; fastest zlib level)."""
    buf = io.BytesIO()
    im = image if image.mode in ("RGB", "L") else image.convert("RGB")
    im.save(buf, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def fit_pixels(image: Image.Image, min_pixels: int | None, max_pixels: int | None) -> Image.Image:
    """``image`` resized (aspect kept) into ``[min_pixels, max_pixels]``, as the transformers backend's
    processor bounds would, since a server applies its own bounds, not the captioner's."""
    w, h = image.size
    area = w * h
    target = max_pixels if max_pixels and area > max_pixels else min_pixels if min_pixels and area < min_pixels else None
    if target is None:
        return image
    scale = (target / area) ** 0.5
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC)


def request_body(spec: CaptionerSpec, image_url: str) -> dict[str, Any]:
    """The chat-completions request for one image: the spec's prompts and generation settings.

    Greedy decoding is ``temperature: 0``. Settings outside the OpenAI schema go the way the server
    reads them (``server_api``): ``vllm`` (vLLM, SGLang, LMDeploy) sends ``top_k``,
    ``repetition_penalty`` and ``min_tokens`` as extra fields when set; ``transformers``
    (``transformers serve``) sends every generation setting as its ``generation_config`` JSON."""
    messages: list[dict[str, Any]] = []
    if spec.system_prompt:
        messages.append({"role": "system", "content": spec.system_prompt})
    messages.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                 {"type": "text", "text": spec.prompt}]})
    body: dict[str, Any] = {"model": spec.served_model or spec.model, "messages": messages,
                            "max_tokens": spec.max_new_tokens, "stream": False,
                            "temperature": spec.temperature if spec.do_sample else 0.0}
    if spec.do_sample:
        body.update(top_p=spec.top_p, seed=spec.seed)
    if spec.server_api == "transformers":
        body["generation_config"] = transformers_generation_config(spec)
        return body
    if spec.do_sample and spec.top_k is not None:
        body["top_k"] = spec.top_k
    if spec.repetition_penalty != 1.0:
        body["repetition_penalty"] = spec.repetition_penalty
    if spec.min_new_tokens:
        body["min_tokens"] = spec.min_new_tokens
    return body


@functools.lru_cache(maxsize=16)
def transformers_generation_config(spec: CaptionerSpec) -> str:
    """The ``generation_config`` JSON for ``transformers serve``: the checkpoint's own generation config
    (its end-of-sequence and padding ids) with the spec's settings on top, as the transformers backend
    generates. The server takes this JSON as the whole config, so without the checkpoint's part it
    would not stop at end of sequence. Read from the checkpoint folder or the hub cache (offline)."""
    base: dict[str, Any] = {}
    try:
        from transformers import GenerationConfig

        base = GenerationConfig.from_pretrained(spec.model, local_files_only=True).to_diff_dict()
    except (OSError, ValueError) as e:
        log.warning("captioner %s: cannot read the generation config of %r here (%s); transformers serve will "
                    "not know its end-of-sequence ids: captions run to max_new_tokens", spec.name, spec.model, e)
    for key in ("transformers_version", "_from_model_config"):
        base.pop(key, None)
    return json.dumps({**base, **spec.generate_kwargs()}, sort_keys=True)


def check_settings(spec: CaptionerSpec) -> None:
    """Refuse settings the chosen server API cannot carry (the captions would silently differ from what
    the captioner id promises)."""
    if spec.server_api not in SERVER_APIS:
        raise CaptionServerError(f"captioner {spec.name!r}: server_api {spec.server_api!r} is not one of "
                                 f"{', '.join(SERVER_APIS)}")
    if spec.server_api == "vllm" and spec.no_repeat_ngram_size:
        raise CaptionServerError(
            f"captioner {spec.name!r} sets no_repeat_ngram_size, which vLLM/SGLang requests cannot carry; "
            "drop it, or serve with `transformers serve` and set server_api: transformers")


def parse_completion(response: httpx.Response) -> tuple[str, int | None, str | None]:
    """``(text, completion tokens or None, finish reason)`` from a chat-completions response, whether
    the server answered with one JSON object or streamed server-sent events (some servers stream
    regardless of ``stream: false``). For a stream without usage, the tokens are the content chunks."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        parts: list[str] = []
        tokens: int | None = None
        finish = None
        for line in response.text.splitlines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise ValueError(f"error in stream: {event['error']}")
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    parts.append(piece)
                finish = choice.get("finish_reason") or finish
            usage = event.get("usage") or {}
            if usage.get("completion_tokens") is not None:
                tokens = int(usage["completion_tokens"])
        return "".join(parts), tokens if tokens is not None else len(parts), finish
    doc = response.json()
    choice = doc["choices"][0]
    usage = doc.get("usage") or {}
    tokens = usage.get("completion_tokens")
    return (choice.get("message") or {}).get("content") or "", None if tokens is None else int(tokens), \
        choice.get("finish_reason")


class OpenAICaptioner:
    """A :class:`~prx_assets.core.models.caption_spec.CaptionerSpec` served by an OpenAI-compatible server."""

    def __init__(self, spec: CaptionerSpec, device: str = "auto", ready_timeout_s: float | None = None) -> None:
        import httpx

        check_settings(spec)
        self.spec = spec
        self.url = server_url(spec)
        self.concurrency = max(1, spec.concurrency)
        headers = {}
        key = os.environ.get(spec.api_key_env or "", "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            base_url=self.url, headers=headers,
            timeout=httpx.Timeout(spec.request_timeout_s, connect=min(10.0, spec.request_timeout_s)),
            limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency))
        self._answered = False
        # a server that is still loading its model may refuse connections for minutes
        self.wait_ready(spec.request_timeout_s if ready_timeout_s is None else ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until the server is up: ``GET /health`` (vLLM, SGLang, transformers serve; it may still be
        loading its model), or ``GET /v1/models`` where there is no health route."""
        import httpx

        deadline = time.monotonic() + timeout_s
        last: str = ""
        health = self.url[: -len("/v1")] + "/health"
        while True:
            try:
                r = self._client.get(health, timeout=5.0)
                if r.status_code == 404:
                    r = self._client.get("/models", timeout=5.0)
                if r.status_code < 400:
                    return
                if r.status_code < 500 and r.status_code not in RETRY_STATUSES:
                    raise CaptionServerError(
                        f"caption server {self.url} answered {r.request.url.path} with HTTP {r.status_code}: "
                        f"{r.text[:300]}; check server_url and the API key in ${self.spec.api_key_env}")
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() >= deadline:
                raise CaptionServerError(
                    f"caption server {self.url} is not ready after {timeout_s:.0f} s ({last}); start it "
                    f"(e.g. `vllm serve {self.spec.served_model or self.spec.model}`) or fix server_url")
            time.sleep(0.5)

    def _post(self, body: dict[str, Any]) -> CaptionResult:
        import httpx


        last = ""
        for attempt in range(self.spec.max_retries + 1):
            if attempt:
                delay = min(30.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random())
                log.warning("caption server %s: %s; retry %d of %d in %.1f s", self.url, last, attempt,
                            self.spec.max_retries, delay)
                time.sleep(delay)
            started = time.perf_counter()
            try:
                r = self._client.post("/chat/completions", json=body)
            except httpx.TimeoutException as e:
                last = f"timed out after {self.spec.request_timeout_s:.0f} s ({type(e).__name__})"
                continue
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code in RETRY_STATUSES:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code >= 400:
                raise CaptionServerError(
                    f"caption server {self.url} rejected a request for model {body['model']!r} with HTTP "
                    f"{r.status_code}: {r.text[:500]}; check served_model (the name the server serves) and "
                    f"the captioner's generation settings")
            try:
                text, tokens, finish = parse_completion(r)
            except (ValueError, KeyError, IndexError, TypeError) as e:
                last = f"unreadable response ({e})"
                continue
            n = tokens if tokens is not None else 0
            return CaptionResult(text=text.strip(), tokens=n, seconds=time.perf_counter() - started,
                                 hit_max_tokens=finish == "length" or n >= self.spec.max_new_tokens)
        raise CaptionServerError(
            f"caption server {self.url} failed {self.spec.max_retries + 1} times for one image (last: {last}); "
            f"check the server's log and health, or raise request_timeout_s / max_retries")

    def _one(self, image: Image.Image) -> CaptionResult:
        im = fit_pixels(image, self.spec.min_pixels, self.spec.max_pixels)
        return self._post(request_body(self.spec, image_data_url(im)))

    def caption(self, images: Sequence[Image.Image]) -> list[CaptionResult]:
        """Caption ``images`` in order, ``concurrency`` requests in flight (image encoding included);
        each result's ``seconds`` is the call's wall time per image."""
        if not images:
            return []
        started = time.perf_counter()
        results: list[CaptionResult] = []
        if not self._answered:  # one request alone first: a server that loads the model on demand
            results.append(self._one(images[0]))  # (transformers serve) must not load it N times at once
            self._answered = True
        rest = images[len(results):]
        if self.concurrency == 1 or len(rest) <= 1:
            results += [self._one(im) for im in rest]
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(rest))) as pool:
                results += list(pool.map(self._one, rest))
        share = (time.perf_counter() - started) / len(images)  # wall time per image, as the other backends
        return [dataclasses.replace(r, seconds=share) for r in results]

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


@contextlib.contextmanager
def transformers_server(port: int | None = None, device: str = "cpu", log_path: str | None = None,
                        ready_timeout_s: float = 120.0) -> Iterator[str]:
    """Run ``transformers serve`` on 127.0.0.1 (a free port unless given) for the life of the block
    and yield its base URL (``http://127.0.0.1:PORT/v1``): an OpenAI-compatible server on one machine,
    for tests, the bench and a workstation without vLLM. Needs ``pip install fastapi openai accelerate``.
    It loads the model named by the first request from a local checkpoint folder or the hub cache
    (offline: it never downloads)."""
    import httpx

    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    # The CLI's module moved in transformers 5; run whichever this interpreter has.
    cli = "transformers.cli.transformers" if importlib.util.find_spec("transformers.cli") else \
        "transformers.commands.transformers_cli"
    cmd = [sys.executable, "-c", f"import sys; from {cli} import main; sys.exit(main())", "serve",
           "--host", "127.0.0.1", "--port", str(port), "--device", device]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,  # offline: local folders or the hub cache
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise CaptionServerError(f"`{' '.join(cmd)}` exited with {proc.returncode} before it was ready"
                                         + (f"; see {log_path}" if log_path else "")
                                         + "; install its dependencies with `pip install fastapi openai accelerate`")
            try:
                if httpx.get(url[: -len("/v1")] + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise CaptionServerError(f"`{' '.join(cmd)}` not ready after {ready_timeout_s:.0f} s")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_path:
            log.close()
