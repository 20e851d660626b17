"""``models.yaml``: the captioners (several, side by side) and the image embedder.

::

    captioners:
      - name: detailed
        model: Qwen/Qwen3-VL-8B-Instruct      # hub id, or a local checkpoint folder
        prompt: "Describe this image in detail ..."
        max_new_tokens: 256
        batch_size: 16
      - name: short
        model: Qwen/Qwen3-VL-2B-Instruct
        prompt: "Caption this image in one sentence."
        max_new_tokens: 64
    embedder:
      model: google/siglip2-so400m-patch14-384
      batch_size: 64
      vector_dtype: float16                 # stored precision (default float32)
    text_encoder:                           # what the trainer conditions on (computed on the fly)
      name: qwen3vl2b                       # tower name in MDS latent column names
      model: Qwen/Qwen3-VL-2B-Instruct      # its language model's hidden states are used
      max_length: 128

Values may use ``${VAR}`` / ``${VAR:-default}``; relative local paths (``./``, ``../``)
are resolved against the config file's folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prx_assets.core.config.project import config_dir, expand_env, read_yaml
from prx_assets.core.config.schema import STRICT, mapping, model_of, validate
from prx_assets.core.lab.schema import VECTOR_DTYPES
from prx_assets.core.models.caption_spec import BACKENDS, CaptionerSpec
from prx_assets.core.models.embeddings import EmbedderSpec
from prx_assets.core.models.identity import looks_local, model_identity
from prx_assets.core.models.served import SERVER_APIS
from prx_assets.core.models.text_encoder import TextTowerSpec
from prx_assets.errors import ConfigError


@dataclass(frozen=True)
class ModelsConfig:
    """The parsed ``models.yaml``."""

    path: str
    captioners: tuple[CaptionerSpec, ...]
    embedder: EmbedderSpec | None
    text_encoder: TextTowerSpec | None = None

    def captioner(self, captioner_id: str) -> CaptionerSpec:
        """The spec whose id is ``captioner_id``; the error lists the configured ids."""
        for c in self.captioners:
            if c.captioner_id() == captioner_id:
                return c
        known = ", ".join(c.captioner_id() for c in self.captioners) or "(none)"
        raise ConfigError(f"no captioner with id {captioner_id!r}; configured: {known}", path=self.path,
                          fix="the captioner was removed or its settings changed (which changes its id); "
                              "restore it in models.yaml or use a configured id")

    def captioner_ids(self) -> list[str]:
        """Ids of the configured captioners, in file order."""
        return [c.captioner_id() for c in self.captioners]


#: The strict models of the specs (their schema; validation goes through :func:`validate`).
CaptionerSpecModel, EmbedderSpecModel, TextTowerSpecModel = (model_of(c) for c in (CaptionerSpec, EmbedderSpec,
                                                                                   TextTowerSpec))


class ModelsFile(BaseModel):
    """``models.yaml``: the captioners (several side by side), the image embedder and the text encoder
    that precomputes latents. A relative ``model:`` folder is read from the file's folder."""

    model_config = STRICT
    captioners: list[CaptionerSpecModel] = Field(default_factory=list)  # type: ignore[valid-type]
    embedder: EmbedderSpecModel | None = None  # type: ignore[valid-type]
    text_encoder: TextTowerSpecModel | None = None  # type: ignore[valid-type]


def _expand(value: str, cfg_path: Path, where: str) -> str:
    try:
        return expand_env(value)
    except KeyError as e:
        raise ConfigError(f"environment variable {e.args[0]} is not set", path=str(cfg_path), entry=where,
                          fix=f"export {e.args[0]} or write ${{{e.args[0]}:-default}}") from None


def _resolve_model(value: Any, cfg_path: Path, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError("missing 'model'", path=str(cfg_path), entry=where,
                          fix="set model: to a hub id (Qwen/Qwen3-VL-8B-Instruct) or a checkpoint folder")
    value = _expand(value, cfg_path, where)
    if looks_local(value) and not os.path.isabs(os.path.expanduser(value)):
        return str((cfg_path.parent / value).resolve())
    return os.path.expanduser(value) if value.startswith("~") else value


def _check_local(spec: Any, spath: str, where: str) -> None:
    """A local model folder must exist and hold a checkpoint: its id is a digest of those files."""
    try:
        model_identity(spec.model, getattr(spec, "revision", None))
    except FileNotFoundError as e:
        raise ConfigError(str(e), path=spath, entry=where,
                          fix="build the demo's tiny models with `prx-assets models`, or point model: at a checkpoint "
                              "folder (a relative path is read from the folder of models.yaml) or a hub id") from None


def load_models(path: str | os.PathLike[str] | None = None, check_paths: bool = True) -> ModelsConfig:
    """Parse and validate ``models.yaml`` (default ``$PRX_CONFIG_DIR/models.yaml``). With
    ``check_paths`` (the default) every local model folder must exist (their ids are digests of
    their files); ``prx-assets models``, which builds the demo's folders, reads it without.

    Raises
    ------
    ConfigError
        Naming the file, the captioner and the fix.
    """
    cfg_path = Path(path) if path is not None else config_dir() / "models.yaml"
    spath = str(cfg_path)
    doc = read_yaml(cfg_path, "create it (see docs/captioners.md) or point PRX_CONFIG_DIR at its folder") or {}
    if not isinstance(doc, Mapping) or set(doc) - {"captioners", "embedder", "text_encoder"}:
        raise ConfigError("expected a mapping with 'captioners:' and optionally 'embedder:' and 'text_encoder:'", path=spath,
                          fix="see docs/captioners.md")
    specs: list[CaptionerSpec] = []
    for i, raw in enumerate(doc.get("captioners") or []):
        where = f"captioners[{i}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise ConfigError("each captioner needs a 'name'", path=spath, entry=where,
                              fix="write {name: detailed, model: ..., prompt: ...}")
        where = f"captioner {raw['name']!r}"
        values = dict(raw)
        values["model"] = _resolve_model(raw.get("model"), cfg_path, where)
        for key in ("server_url", "served_model"):
            if isinstance(values.get(key), str):
                values[key] = _expand(values[key], cfg_path, where)
        spec = validate(CaptionerSpec, values, spath, where)
        if spec.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {spec.backend!r}", path=spath, entry=where,
                              fix=f"use one of: {', '.join(BACKENDS)}")
        if spec.server_api not in SERVER_APIS:
            raise ConfigError(f"unknown server_api {spec.server_api!r}", path=spath, entry=where,
                              fix=f"use one of: {', '.join(SERVER_APIS)} (vllm also covers SGLang and LMDeploy)")
        if spec.max_new_tokens < 1 or spec.batch_size < 1 or spec.concurrency < 1 or spec.max_retries < 0 \
                or spec.request_timeout_s <= 0:
            raise ConfigError("max_new_tokens, batch_size and concurrency must be >= 1, max_retries >= 0 and "
                              "request_timeout_s > 0", path=spath, entry=where,
                              fix="use e.g. max_new_tokens: 256, batch_size: 8, concurrency: 16")
        if check_paths and looks_local(spec.model):
            _check_local(spec, spath, where)
        if any(s.name == spec.name or (check_paths and s.captioner_id() == spec.captioner_id()) for s in specs):
            raise ConfigError("duplicate captioner (same name or same settings)", path=spath, entry=where,
                              fix="give each captioner a unique name and distinct settings")
        specs.append(spec)
    embedder = None
    raw_e = doc.get("embedder")
    if raw_e is not None:
        if not isinstance(raw_e, Mapping):
            raise ConfigError("'embedder' must be a mapping", path=spath, entry="embedder",
                              fix="write embedder: {model: google/siglip2-so400m-patch14-384}")
        values = dict(raw_e)
        values["model"] = _resolve_model(raw_e.get("model"), cfg_path, "embedder")
        embedder = validate(EmbedderSpec, values, spath, "embedder")
        if embedder.batch_size < 1:
            raise ConfigError(f"batch_size={embedder.batch_size!r} must be >= 1", path=spath, entry="embedder",
                              fix="use e.g. batch_size: 64")
        if embedder.vector_dtype not in VECTOR_DTYPES:
            raise ConfigError(f"unknown vector_dtype {embedder.vector_dtype!r}", path=spath, entry="embedder",
                              fix=f"use one of: {', '.join(VECTOR_DTYPES)}")
    text_encoder = None
    raw_t = doc.get("text_encoder")
    if raw_t is not None:
        values = dict(mapping(raw_t, spath, "text_encoder", "text_encoder: {model: Qwen/Qwen3-VL-2B-Instruct}"))
        values["model"] = _resolve_model(raw_t.get("model"), cfg_path, "text_encoder")
        text_encoder = validate(TextTowerSpec, values, spath, "text_encoder")
        if text_encoder.max_length < 1:
            raise ConfigError("text_encoder.max_length must be >= 1", path=spath, entry="text_encoder",
                              fix="use e.g. max_length: 128")
    if check_paths:
        for where, spec in (("embedder", embedder), ("text_encoder", text_encoder)):
            if spec is not None and looks_local(spec.model):
                _check_local(spec, spath, where)
    return ModelsConfig(path=spath, captioners=tuple(specs), embedder=embedder, text_encoder=text_encoder)
