"""Storage and configuration resources: where data lives and which sources exist."""


import dagster as dg
from pydantic import Field

from prx_assets.core.config.project import SourcesConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import RecipesConfig
from prx_assets.core.models.config import ModelsConfig
from prx_assets.core.publish.mixture import Mixture
from prx_assets.core.stages.settings import ProjectSettings, StorageSettings


class StorageResource(dg.ConfigurableResource):
    """The data root (local folder or ``s3://bucket/prefix``) holding Lance tables and manifests.

    Object-store credentials and endpoint come from the environment
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``).
    """

    data_root: str | None = Field(
        default=None, description="Data root; defaults to $PRX_DATA_ROOT, else ./data.")

    def settings(self) -> StorageSettings:
        """These settings, for a stage (in-process or in a job)."""
        return StorageSettings(data_root=self.data_root)

    def root(self) -> DataRoot:
        """The data root, resolved now (not at import time)."""
        return self.settings().root()


class ProjectConfigResource(dg.ConfigurableResource):
    """The folder holding sources.yaml / recipes.yaml / mixtures.yaml."""

    config_dir: str | None = Field(
        default=None, description="Config folder; defaults to $PRX_CONFIG_DIR, else ./config.")

    def settings(self) -> ProjectSettings:
        """These settings, for a stage (in-process or in a job)."""
        return ProjectSettings(config_dir=self.config_dir)

    def path(self, name: str) -> str:
        """Path of a config file (``sources.yaml``, ``models.yaml``, ...) in the folder."""
        return self.settings().path(name)

    def sources_path(self) -> str:
        """Path of sources.yaml."""
        return self.settings().sources_path()

    def models_path(self) -> str:
        """Path of models.yaml."""
        return self.settings().models_path()

    def recipes(self) -> RecipesConfig:
        """Parse and validate recipes.yaml."""
        return self.settings().recipes()

    def mixtures(self, known_recipes: list[str] | None = None) -> dict[str, Mixture]:
        """Parse and validate mixtures.yaml (streams checked against ``known_recipes``)."""
        return self.settings().mixtures(known_recipes)

    def models(self) -> ModelsConfig:
        """Parse and validate models.yaml (captioners and embedder)."""
        return self.settings().models()

    def sources(self) -> SourcesConfig:
        """Parse and validate sources.yaml (raises ConfigError naming file, source, fix)."""
        return self.settings().sources()
