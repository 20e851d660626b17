"""Storage and configuration resources: where data lives and which sources exist."""


import dagster as dg
from pydantic import Field

from prx_assets.core.config.project import SourcesConfig, config_dir, data_root, load_sources
from prx_assets.core.config.storage import DataRoot, ObjectStoreSettings
from prx_assets.core.curate.recipes import RecipesConfig, load_recipes
from prx_assets.core.models.config import ModelsConfig, load_models
from prx_assets.core.publish.mixture import Mixture, load_mixtures


class StorageResource(dg.ConfigurableResource):
    """The data root (local folder or ``s3://bucket/prefix``) holding Lance tables and manifests.

    Object-store credentials and endpoint come from the environment
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``).
    """

    data_root: str | None = Field(
        default=None, description="Data root; defaults to $PRX_DATA_ROOT, else ./data.")

    def root(self) -> DataRoot:
        """The data root, resolved now (not at import time)."""
        return DataRoot(self.data_root or data_root(), ObjectStoreSettings.from_env())


class ProjectConfigResource(dg.ConfigurableResource):
    """The folder holding sources.yaml / recipes.yaml / mixtures.yaml."""

    config_dir: str | None = Field(
        default=None, description="Config folder; defaults to $PRX_CONFIG_DIR, else ./config.")

    def path(self, name: str) -> str:
        """Path of a config file (``sources.yaml``, ``models.yaml``, ...) in the folder."""
        base = self.config_dir or str(config_dir())
        return f"{base.rstrip('/')}/{name}"

    def sources_path(self) -> str:
        """Path of sources.yaml."""
        return self.path("sources.yaml")

    def models_path(self) -> str:
        """Path of models.yaml."""
        return self.path("models.yaml")

    def recipes(self) -> RecipesConfig:
        """Parse and validate recipes.yaml."""
        return load_recipes(self.path("recipes.yaml"))

    def mixtures(self, known_recipes: list[str] | None = None) -> dict[str, Mixture]:
        """Parse and validate mixtures.yaml (streams checked against ``known_recipes``)."""
        return load_mixtures(self.path("mixtures.yaml"), known_recipes=known_recipes)

    def models(self) -> ModelsConfig:
        """Parse and validate models.yaml (captioners and embedder)."""
        return load_models(self.models_path())

    def sources(self) -> SourcesConfig:
        """Parse and validate sources.yaml (raises ConfigError naming file, source, fix)."""
        return load_sources(self.sources_path())
