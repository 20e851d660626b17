"""The stages that run as jobs, Dagster-free: a stage is a function
``(StageResources, partition_key, log) -> result dataclass``, the whole work of one partition.

``STAGES`` is the one table of them; a job imports only the module of the stage it runs
(:func:`load_stage`), so an ingest job never imports model code. The Dagster layer
(:mod:`prx_assets.infra.remote`) runs a stage in-process or submits it as a SLURM job running
:mod:`prx_assets.stage_job`; either way the same function runs with the same settings.
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable
from typing import Any

from prx_assets.core.stages.settings import StageResources

StageFn = Callable[[StageResources, str, Callable[[str], None]], Any]

#: Stage name (the asset it materializes) -> ``module:function``.
STAGES: dict[str, str] = {
    "raw_images": "prx_assets.core.stages.ingest:ingest_stage",
    "recaptions": "prx_assets.core.stages.enrich:recaption_stage",
    "image_embeddings": "prx_assets.core.stages.enrich:embedding_stage",
}


class UnknownStage(ValueError):
    """A stage name that is not in :data:`STAGES`."""


def load_stage(name: str) -> tuple[StageFn, type]:
    """The function of stage ``name`` and the result dataclass it returns (from its annotation)."""
    if name not in STAGES:
        raise UnknownStage(f"unknown stage {name!r}; stages: {', '.join(sorted(STAGES))}")
    module, _, function = STAGES[name].partition(":")
    fn = getattr(importlib.import_module(module), function)
    return fn, typing.get_type_hints(fn)["return"]
