"""Dagster-free domain code, grouped by pipeline stage (mirroring ``prx_assets/defs``).

- ``config``   the config folder, ``sources.yaml``, where data lives (local or object store)
- ``ingest``   source readers, batch manifests, image normalization, the JPEG q92 experiment
- ``models``   captioners, image embedders, text encoders, ``models.yaml``
- ``enrich``   incremental per-image captions and embeddings, caption quality
- ``lab``      the Lance tables: schema, writes, column sync, queries, maintenance
- ``curate``   recipes, subset selection, persisted subsets
- ``publish``  MDS shard sets and training mixtures
- ``demo``     the demo corpus and tiny offline models (tooling, not pipeline)
- ``lineage``, ``visuals``: cross-stage reports and metadata pictures

Everything here is importable and usable from a notebook without Dagster. Packages do not
re-export: import from the module that defines a name.
"""
