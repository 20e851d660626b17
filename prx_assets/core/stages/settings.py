"""What a stage runs with, without Dagster: the data root, the config folder, the object store
and the model settings, as plain frozen dataclasses that travel to a job as JSON.

The Dagster resources (:mod:`prx_assets.resources`) carry the same fields with their UI
descriptions and hand these settings to the stage (``settings()``); a job rebuilds them from
:meth:`StageResources.to_json`. Loaded models and S3 clients are kept per process, keyed by the
settings, so a run over many partitions loads each model and builds each client once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from prx_assets.core.config.project import SourcesConfig, config_dir, data_root, load_sources
from prx_assets.core.config.storage import DataRoot, ObjectStoreSettings
from prx_assets.core.curate.recipes import RecipesConfig, load_recipes
from prx_assets.core.models.caption_spec import Captioner, CaptionerSpec
from prx_assets.core.models.config import ModelsConfig, load_models
from prx_assets.core.models.embeddings import EmbedderSpec, ImageEmbedder
from prx_assets.core.publish.mixture import Mixture, load_mixtures

#: Fields never written into a job's arguments: credentials reach jobs through their environment.
SECRET = re.compile(r"secret|access_key|session_token|password|token", re.IGNORECASE)
_KEPT: dict[tuple[Any, ...], Any] = {}
_BUILDING: dict[tuple[Any, ...], threading.Lock] = {}
_LOCK = threading.Lock()
T = TypeVar("T")


def kept(key: tuple[Any, ...], build: Callable[[], T]) -> T:
    """The process's object for ``key``, built once (models, clients). Each key is built under its
    own lock: a model that takes minutes to load holds up no S3 client lookup in another thread."""
    with _LOCK:
        if key in _KEPT:
            return _KEPT[key]
        building = _BUILDING.setdefault(key, threading.Lock())
    with building:
        with _LOCK:
            if key in _KEPT:
                return _KEPT[key]
        value = build()
        with _LOCK:
            _KEPT[key] = value
        return value


def is_kept(key: tuple[Any, ...]) -> bool:
    """Whether the process already holds the object for ``key``."""
    return key in _KEPT


@dataclass(frozen=True)
class StorageSettings:
    """The data root (local folder or ``s3://``/``gs://`` prefix); credentials from the environment."""

    data_root: str | None = None

    def root(self) -> DataRoot:
        """The data root, resolved now (``$PRX_DATA_ROOT``, else ./data, when unset)."""
        return DataRoot(self.data_root or data_root(), ObjectStoreSettings.from_env())


@dataclass(frozen=True)
class ProjectSettings:
    """The folder holding sources.yaml, models.yaml, recipes.yaml and mixtures.yaml."""

    config_dir: str | None = None

    def path(self, name: str) -> str:
        """Path of a config file in the folder (``$PRX_CONFIG_DIR``, else ./config, when unset)."""
        base = self.config_dir or str(config_dir())
        return f"{base.rstrip('/')}/{name}"

    def sources_path(self) -> str:
        """Path of sources.yaml."""
        return self.path("sources.yaml")

    def models_path(self) -> str:
        """Path of models.yaml."""
        return self.path("models.yaml")

    def sources(self) -> SourcesConfig:
        """Parse and validate sources.yaml (raises ConfigError naming file, source, fix)."""
        return load_sources(self.sources_path())

    def models(self) -> ModelsConfig:
        """Parse and validate models.yaml (captioners and embedder)."""
        return load_models(self.models_path())

    def recipes(self) -> RecipesConfig:
        """Parse and validate recipes.yaml."""
        return load_recipes(self.path("recipes.yaml"))

    def mixtures(self, known_recipes: list[str] | None = None) -> dict[str, Mixture]:
        """Parse and validate mixtures.yaml (streams checked against ``known_recipes``)."""
        return load_mixtures(self.path("mixtures.yaml"), known_recipes=known_recipes)


@dataclass(frozen=True)
class S3Settings:
    """S3 access (the settings of ``dagster_aws.s3.S3Resource``); credentials from the settings or
    boto3's usual chain."""

    use_unsigned_session: bool = False
    region_name: str | None = None
    endpoint_url: str | None = None
    max_attempts: int = 5
    profile_name: str | None = None
    use_ssl: bool = True
    verify: bool | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None

    def get_client(self) -> Any:
        """The boto3 S3 client for these settings and the current ``AWS_*`` environment, built once
        per process (boto3 clients are thread-safe; refreshable credentials refresh themselves)."""
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
        return kept(("s3", self, env), self._build)

    def _build(self) -> Any:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        config = Config(retries={"max_attempts": self.max_attempts, "mode": "standard"})
        if self.use_unsigned_session:
            config = config.merge(Config(signature_version=UNSIGNED))
        session = boto3.session.Session(profile_name=self.profile_name)
        return session.client("s3", region_name=self.region_name, use_ssl=self.use_ssl, verify=self.verify,
                              endpoint_url=self.endpoint_url, aws_access_key_id=self.aws_access_key_id,
                              aws_secret_access_key=self.aws_secret_access_key,
                              aws_session_token=self.aws_session_token, config=config)


@dataclass(frozen=True)
class CaptionerSettings:
    """How captioners run here: device and overrides of models.yaml's operational settings."""

    device: str = "auto"
    dtype: str | None = None
    batch_size: int | None = None
    backend: str | None = None
    server_url: str | None = None
    concurrency: int | None = None
    server_api: str | None = None
    max_flagged_fraction: float = 0.25
    min_words: int = 5

    def effective(self, spec: CaptionerSpec) -> CaptionerSpec:
        """The spec with these overrides applied (the captioner id is unchanged)."""
        names = ("dtype", "batch_size", "backend", "server_url", "concurrency", "server_api")
        changes = {k: getattr(self, k) for k in names if getattr(self, k)}
        return spec if not changes else dataclasses.replace(spec, **changes)

    def load(self, spec: CaptionerSpec) -> Captioner:
        """The loaded captioner (kept per process)."""
        from prx_assets.core.models.captions import load_captioner

        eff = self.effective(spec)
        return kept(("captioner", eff, self.device), lambda: load_captioner(eff, self.device))

    def is_loaded(self, spec: CaptionerSpec) -> bool:
        """Whether this process already holds the captioner (``load`` returns at once)."""
        return is_kept(("captioner", self.effective(spec), self.device))


@dataclass(frozen=True)
class EmbedderSettings:
    """How the image embedder runs here: device and a batch-size override."""

    device: str = "auto"
    batch_size: int | None = None

    def effective(self, spec: EmbedderSpec) -> EmbedderSpec:
        """The spec with the batch-size override applied; every other field (the stored
        ``vector_dtype`` included, and so the embedder id) is the spec's."""
        return spec if not self.batch_size else dataclasses.replace(spec, batch_size=self.batch_size)

    def load(self, spec: EmbedderSpec) -> ImageEmbedder:
        """The loaded embedder (kept per process)."""
        eff = self.effective(spec)
        return kept(("embedder", eff, self.device), lambda: ImageEmbedder(eff, self.device))

    def is_loaded(self, spec: EmbedderSpec) -> bool:
        """Whether this process already holds the embedder (``load`` returns at once)."""
        return is_kept(("embedder", self.effective(spec), self.device))


def _public(settings: Any) -> dict[str, Any] | None:
    if settings is None:
        return None
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if not SECRET.search(f.name)}


@dataclass(frozen=True)
class StageResources:
    """What a stage runs with, in a form that travels to a job as JSON."""

    storage: StorageSettings
    project: ProjectSettings
    s3: S3Settings | None = None
    captioner: CaptionerSettings | None = None
    embedder: EmbedderSettings | None = None

    def to_json(self) -> str:
        """Every setting (data root and config folder resolved now) but credentials, which reach a
        job through its environment."""
        return json.dumps({
            "storage": {"data_root": self.storage.data_root or data_root()},
            "project": {"config_dir": self.project.config_dir or str(config_dir())},
            "s3": _public(self.s3), "captioner": _public(self.captioner), "embedder": _public(self.embedder),
        })

    @classmethod
    def from_json(cls, text: str) -> StageResources:
        """Rebuild the settings inside a job."""
        d = json.loads(text)
        return cls(storage=StorageSettings(**d["storage"]), project=ProjectSettings(**d["project"]),
                   s3=S3Settings(**{k: v for k, v in d["s3"].items() if v is not None}) if d.get("s3") else None,
                   captioner=CaptionerSettings(**d["captioner"]) if d.get("captioner") else None,
                   embedder=EmbedderSettings(**d["embedder"]) if d.get("embedder") else None)
