"""Erasure: a removal request carried out in every place the data root holds an image.

An opt-out hides images from every new subset and shard set; an erasure also removes their bytes
(``prx-assets optout --erase``), in this order:

1. the ids are recorded in ``erased/<request id>.json`` first, so an ingest running meanwhile, or
   any later one, records those files as ``erased`` rejects instead of storing them again;
2. the lab: their rows are deleted from every table, the data files that held them rewritten and
   older versions removed past the retention (:mod:`prx_assets.core.lab.purge`);
3. the shard sets: the samples are blanked in the shards that hold them and every set version that
   would still yield one is withdrawn (:mod:`prx_assets.core.publish.tombstone`);
4. the report: where each image was (source URI, lab tables, streams), what was erased, which
   mixture specs named a withdrawn set and which training runs read them (their checkpoints may
   have learnt from the images: the report lists them, it does not delete them).

The next ``prx-assets run`` re-cuts the subsets without the images (the request is also an
opt-out) and publishes new set versions whose skip lists hide the blanked samples.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.optout import OptOutRequest
from prx_assets.core.lab.purge import purge_lab
from prx_assets.core.lab.schema import IMAGES_TABLE, REJECTS_TABLE
from prx_assets.core.lab.sql import chunks, where_in
from prx_assets.core.lab.table import open_table, table_uri
from prx_assets.core.manifests import MixtureSpec
from prx_assets.core.publish.tombstone import blank_streams, withdraw_sets

#: Ids or URIs per ``IN`` list when looking images up.
LOOKUP_CHUNK = 512


def locate(root: DataRoot, request: OptOutRequest) -> dict[str, str]:
    """``image id -> source URI`` of every image the request names that the lab holds (as an
    image or a reject); ids it names that the lab does not hold map to ``""``."""
    found: dict[str, str] = {i: "" for i in request.image_ids}
    for name in (IMAGES_TABLE, REJECTS_TABLE):
        ds = open_table(table_uri(root, name), root.storage_options())
        if ds is None:
            continue
        for column, values in (("image_id", request.image_ids), ("uri", request.uris)):
            for part in chunks(list(values), LOOKUP_CHUNK):
                t = ds.to_table(columns=["image_id", "uri"], filter=where_in(column, part))
                found.update(zip(t.column("image_id").to_pylist(), t.column("uri").to_pylist(), strict=True))
    return found


def specs_naming(root: DataRoot, withdrawn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mixture specs that name a withdrawn set, each with the training runs recorded on it."""
    sets = {(w["recipe"], w["shard_set_id"]) for w in withdrawn}
    out = []
    for mixture in root.folders(layout.MIXTURE_DIR):
        for rel in root.list(f"{layout.MIXTURE_DIR}/{mixture}"):
            if not rel.endswith(".json"):
                continue
            spec = MixtureSpec.from_json(root.read_bytes(rel), root.join(rel))
            if not any((s.recipe, s.shard_set_id) in sets for s in spec.streams):
                continue
            version = rel.rsplit("/", 1)[-1][: -len(".json")]
            runs = [json.loads(root.read_bytes(r)) for r in root.list(layout.training_dir(mixture, version))
                    if r.rsplit("/", 1)[-1].startswith("trained-")]
            out.append({"mixture": mixture, "version": version, "spec": root.join(rel),
                        "training_runs": [{"run_id": r.get("run_id"), "checkpoint_dir": r.get("metadata", {}).get(
                            "checkpoint_dir")} for r in runs],
                        "training_folder": root.join(layout.training_dir(mixture, version))})
    return out


def erase(root: DataRoot, request: OptOutRequest, retention: timedelta = timedelta(0)) -> dict[str, Any]:
    """Carry out ``request`` as an erasure (see the module docs); the report, also written to
    ``erased/<request id>.json``."""
    if root.remote:  # refused before anything is removed: the shard rewrite needs local files
        blank_streams(root, set())
    started = time.time()
    where = locate(root, request)
    ids = sorted(where)
    record = {"request_id": request.request_id, "reason": request.reason, "image_ids": ids,
              "uris_not_in_lab": sorted(set(request.uris) - set(where.values())), "status": "erasing"}
    root.write_bytes(layout.erasure(request.request_id), json.dumps(record, indent=1).encode())
    lab = purge_lab(root, ids, retention)
    streams = blank_streams(root, set(ids))
    withdrawn = withdraw_sets(root, streams, request.request_id)
    record.update({
        "status": "erased", "seconds": round(time.time() - started, 3),
        "retention_hours": retention.total_seconds() / 3600,
        "sources": {i: u for i, u in where.items() if u},
        "lab": lab,
        "streams": [{"stream": s.stream, "samples_blanked": len(s.positions),
                     "shards_rewritten": list(s.shards_rewritten), "shards_total": s.shards_total} for s in streams],
        "withdrawn_sets": withdrawn,
        "mixture_specs": specs_naming(root, withdrawn),
    })
    root.write_bytes(layout.erasure(request.request_id), json.dumps(record, indent=1).encode())
    return record
