"""``prx-assets run``'s discovery and first read-ahead, before the CLI imports Dagster.

The console script (:mod:`prx_assets.entry`) starts the ingest workers' forkserver, then calls
:func:`begin` before the CLI's imports (Dagster and the definitions: 1.2-1.4 s on one core, while
the other core idled, measured on ``python -m bench peer``'s corpus). :func:`begin` runs discovery,
as ``prx-assets run`` would first thing, and hands the first new batch's first images to the
workers through the process's read-ahead (:mod:`.readahead`), so they decode while the process
imports, opens the Dagster instance and plans.

Until then the process does not know which resources its runs get (the definitions'), nor whether
it ingests at all (the selection, ``raw_images`` as SLURM jobs). So the read-ahead is made with the
settings this process's environment gives (data root and config folder, :func:`local_resources`),
and :func:`settle` later keeps it only when the run's resources hold the same ones, dropping it
otherwise (at most ``readahead`` images decoded for nothing; a selection that names assets, none of
them ``raw_images``, reads nothing ahead, see :func:`may_ingest`). Only with a local data root and
sources on local paths: an object-store source is read with the client its resource configures.
Discovery's result is handed over (:func:`take_found`) so that the command does not list the
sources twice.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from prx_assets.core.config.project import config_dir, data_root, load_sources
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import discover_sources, load_manifest, parse_batch_key
from prx_assets.core.ingest.readahead import READAHEAD, BatchInputs
from prx_assets.core.ingest.readers import reader_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    """What :func:`begin` did: discovery's summaries (as ``discover_sources`` returns them) and the
    resource settings the read-ahead used (:func:`local_resources`)."""

    reports: list[dict[str, Any]]
    resources: str


_found: Found | None = None


def local_resources() -> str:
    """The storage and project settings of this process's environment, in the form of
    :meth:`~prx_assets.core.stages.settings.StageResources.to_json` (its ``storage`` and ``project``)."""
    return json.dumps({"storage": {"data_root": data_root()}, "project": {"config_dir": str(config_dir())}})


#: An asset selection that names assets only (no ``+``/``*`` graph steps, no ``key:``/``group:``
#: filters or functions): which assets it holds is then known without the definitions.
_NAMES_ONLY = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*([\s,]+[A-Za-z_][A-Za-z0-9_]*)*[\s,]*$")


def may_ingest(select: str | None) -> bool:
    """Whether a ``prx-assets run --select`` may include ``raw_images``: false only for a selection
    that names assets, none of them ``raw_images``.

    >>> may_ingest(None), may_ingest("raw_images"), may_ingest("*training_mixture"), may_ingest("lance_table")
    (True, True, True, False)
    >>> may_ingest("lance_table, raw_images"), may_ingest("lance_table curated_subsets")
    (True, False)
    >>> may_ingest("recaptions or image_embeddings")
    True
    """
    if select is None or not _NAMES_ONLY.match(select) or re.search(r"\b(or|and|not)\b", select):
        return True
    return "raw_images" in set(re.split(r"[\s,]+", select.strip()))


def begin(read_ahead: bool = True) -> Found | None:
    """Discover every source and, with ``read_ahead``, read the first new batch ahead; ``None`` (and
    nothing read ahead) when discovery fails: the command discovers again and reports the problem
    itself."""
    global _found
    _found = None
    try:
        sources = load_sources()
        root = DataRoot(data_root())
        reports = discover_sources(root, sources)
    except Exception as e:  # a configuration or storage error: the command meets it again and says so
        log.info("no discovery before start-up: %s: %s", type(e).__name__, e)
        return None
    _found = Found(reports=reports, resources=local_resources())
    new = [k for r in reports for k in r["new_batches"]]
    if not read_ahead or not new or root.remote:
        return _found
    resources = _found.resources

    def resolve(key: str) -> BatchInputs:
        cfg = sources.get(parse_batch_key(key)[0])
        if "://" in cfg.location:
            raise ValueError(f"{cfg.location} is read with the client the run's resources configure")
        return BatchInputs(resources=resources, source=cfg, manifest=load_manifest(root, key), reader=reader_for(cfg))

    READAHEAD.expect(new, resolve)
    READAHEAD.start()
    return _found


def take_found() -> Found | None:
    """:func:`begin`'s result, once (``None`` when it did not run or failed)."""
    global _found
    found, _found = _found, None
    return found


def settle(found: Found | None, resources: str | None) -> None:
    """Keep what :func:`begin` read ahead for runs with ``resources`` (their
    :meth:`~prx_assets.core.stages.settings.StageResources.to_json`) when those hold the same storage and
    project settings it was read with; drop it otherwise, and when ``resources`` is ``None`` (this
    process ingests nothing)."""
    if found is None:
        return
    if resources is None:
        READAHEAD.clear()
        return
    early, now = json.loads(found.resources), json.loads(resources)
    same = all(now.get(part) == early[part] for part in ("storage", "project"))
    READAHEAD.rebind(found.resources, resources if same else None)
