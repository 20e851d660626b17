"""Incremental shard sets: what a 1% change and 100 opt-outs cost next to a full publish.

On a synthetic lab of ``PRX_BENCH_INCREMENTAL_ROWS`` rows (default 20,200: a 20,000-sample
set plus 1% new; small real JPEGs, no pixels decoded), through ``write_shard_set``:

- full publish of the 20,000-sample subset vs publishing the same subset plus 1% new images
  as a delta on top of it (alternating, after a warm-up of each): bytes written and wall time;
- opting out 100 images: no file of the published streams changes, and one epoch read with
  DataLoader workers (2) and with 2 ranks (two processes) never yields them;
- a new caption column (a second captioner added to the recipe's caption mix): the sidecar
  publish next to writing the wider set whole (alternating): bytes and time, image bytes
  rewritten (must be 0), and a read-back of joined samples against the lab.

``python -m bench incremental`` prints a table; ``--json`` ends with one JSON line.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from PIL import Image

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.digests import content_digest
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.lab.schema import IMAGES_SCHEMA
from prx_assets.core.lab.table import table_uri
from prx_assets.core.manifests import ShardSetManifest, SubsetManifest
from prx_assets.core.publish.shards import ShardSettings, verify_shard_set, write_shard_set

ROWS = int(os.environ.get("PRX_BENCH_INCREMENTAL_ROWS", "20200"))
ROUNDS = int(os.environ.get("PRX_BENCH_ROUNDS", "3"))


def build_lab(root: DataRoot, n: int) -> lance.LanceDataset:
    """``n`` rows with small real JPEGs (256 distinct images, reused) and every images column."""
    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(256):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (96, 96, 3), dtype=np.uint8)).save(buf, "JPEG", quality=92)
        jpegs.append(buf.getvalue())
    uri = table_uri(root, "images")
    for start in range(0, n, 5000):
        rows = [{"image_id": f"{i:016x}", "source": "bench", "batch": "bench-00001", "uri": f"/bench/{i}.jpg",
                 "jpeg": jpegs[i % 256], "jpeg_bytes": len(jpegs[i % 256]), "width": 96, "height": 96,
                 "orig_width": 96, "orig_height": 96, "orig_format": "JPEG", "orig_mode": "RGB", "orig_bytes": 1,
                 "sha256": hashlib.sha256(str(i).encode()).hexdigest(), "phash": i, "aspect_ratio": 1.0,
                 "aspect_bucket": "1:1", "original_caption": None, "license": None, "extra": None,
                 "ingest_config": "q92"} for i in range(start, min(n, start + 5000))]
        lance.write_dataset(pa.Table.from_pylist(rows, schema=IMAGES_SCHEMA), uri,
                            mode="create" if start == 0 else "append")
    ds = lance.dataset(uri)
    ds.create_scalar_index("image_id", "BTREE")  # as the lab has (lance_table indexes it)
    return lance.dataset(uri)


def _digests(ds: lance.LanceDataset, ids: list[str], caption_columns: tuple[str, ...] = ()) -> pa.Table:
    """The subset's ``ids.parquet`` as curation writes it: image id and content digest per image."""
    t = ds.to_table(columns=["image_id", "sha256", "ingest_config", *caption_columns])
    caps = [t.column(c).to_pylist() for c in caption_columns]
    by_id = {i: content_digest(s, c, {col: vals[k] for col, vals in zip(caption_columns, caps, strict=True)})
             for k, (i, s, c) in enumerate(zip(t.column(0).to_pylist(), t.column(1).to_pylist(),
                                               t.column(2).to_pylist(), strict=True))}
    return pa.table({"image_id": ids, "digest": [by_id[i] for i in ids]})


def _subset(ds: lance.LanceDataset, name: str, n: int, caption_columns: tuple[str, ...] = ()) -> SubsetManifest:
    return SubsetManifest(subset_id=name, recipe="bench", recipe_hash="", lance_uri=ds.uri,
                          lance_version=ds.version, ids="", selected=n, caption_columns=caption_columns)


def caption_column_cost(ds: lance.LanceDataset, root: DataRoot, ids: list[str],
                        settings: ShardSettings) -> dict[str, Any]:
    """Publish a set captioned by ``a``, then add captioner ``b`` to its mix: the sidecar publish vs
    writing the wider set whole, alternating over the rounds (after a warm-up of each)."""
    ds.add_columns({"caption__a_1": "concat('a photo of item ', image_id)",
                    "caption__b_1": "concat('tags: bench, item ', image_id, ', square')"})
    ds = lance.dataset(ds.uri)
    one, two = ("caption__a_1",), ("caption__a_1", "caption__b_1")
    narrow_recipe = Recipe(name="cap", caption_mix=(("a", 1.0),))
    wide_recipe = Recipe(name="cap", caption_mix=(("a", 0.5), ("b", 0.5)))
    d_one, d_two = _digests(ds, ids, one), _digests(ds, ids, two)
    times: dict[str, list[float]] = {"whole": [], "sidecar": []}
    for r in range(ROUNDS + 1):
        narrow = write_shard_set(root, ds, Recipe(name=f"cap{r}", caption_mix=narrow_recipe.caption_mix),
                                 _subset(ds, f"narrow{r}", len(ids), one), ids, ["a-1", "b-1"], settings,
                                 digests=d_one)
        before = _files(narrow)
        t = time.perf_counter()
        wide = write_shard_set(root, ds, Recipe(name=f"cap{r}", caption_mix=wide_recipe.caption_mix),
                               _subset(ds, f"wide{r}", len(ids), two), ids, ["a-1", "b-1"], settings,
                               previous=narrow, digests=d_two)
        t_side = time.perf_counter() - t
        assert wide.layout == "delta" and wide.extra["sidecar_columns"] == ["caption_b"], wide.extra
        t = time.perf_counter()
        whole = write_shard_set(root, ds, Recipe(name=f"whole{r}", caption_mix=wide_recipe.caption_mix),
                                _subset(ds, f"wide{r}", len(ids), two), ids, ["a-1", "b-1"], settings,
                                digests=d_two)
        t_whole = time.perf_counter() - t
        if r:
            times["sidecar"].append(t_side)
            times["whole"].append(t_whole)
    image_bytes = sum(p.stat().st_size for p in Path(wide.uri).rglob("*.mds") if "columns" not in p.parts)
    readback = verify_shard_set(wide, ds, sample=64)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"samples": len(ids), "sidecar_seconds": round(med["sidecar"], 3),
            "whole_seconds": round(med["whole"], 3), "time_share": round(med["sidecar"] / med["whole"], 4),
            "sidecar_bytes": wide.bytes_written, "whole_bytes": whole.bytes_written,
            "bytes_share": round(wide.bytes_written / whole.bytes_written, 4),
            "image_bytes_rewritten": image_bytes, "existing_files_unchanged": _files(narrow) == before,
            "readback_passed": readback.passed, "readback_checked": readback.checked,
            "spread": {k: [round(x, 3) for x in v] for k, v in times.items()}}


def _files(manifest: ShardSetManifest) -> dict[str, str]:
    """sha256 of every file of a published set: its folder and the folders of the streams it reads."""
    folders = {Path(manifest.uri), *(Path(s["uri"]) for s in manifest.physical_streams())}
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def _rank_epoch(manifest_uri: str, rank: int, port: int, out: str) -> None:
    """One rank of a 2-rank run (torch.distributed over loopback): its share of one epoch, as image ids."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    from prx_assets.core.publish.shards import open_shard_set

    with open_shard_set(manifest_uri, shuffle=True, shuffle_seed=5, batch_size=8) as ds:
        Path(out).write_text(json.dumps([s["image_id"] for s in ds]))


def epoch_with_workers(manifest: ShardSetManifest, workers: int = 2) -> list[str]:
    """Every image id of one epoch through a DataLoader with spawned workers."""
    import torch

    from prx_assets.core.publish.shards import open_shard_set

    with open_shard_set(manifest, shuffle=True, shuffle_seed=5, batch_size=8) as ds:
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context="spawn")
        return [s["image_id"] for s in loader]


def epoch_on_two_ranks(manifest: ShardSetManifest, tmp: Path) -> list[str]:
    """Every image id of one epoch split over two rank processes (no duplicate across ranks)."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ctx = mp.get_context("spawn")
    outs = [str(tmp / f"rank{r}.json") for r in range(2)]
    from prx_assets.devserver import free_port

    port = free_port()
    procs = [ctx.Process(target=_rank_epoch, args=(manifest.uri, r, port, outs[r])) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            raise RuntimeError(f"rank process exited with {p.exitcode}")
    return [i for o in outs for i in json.loads(Path(o).read_text())]


def run() -> dict[str, Any]:
    """Measure; returns the figures (see module docs)."""
    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-incremental-"))
    try:
        root = DataRoot(str(tmp / "root"))
        ds = build_lab(root, ROWS)
        all_ids = sorted(ds.to_table(columns=["image_id"]).column(0).to_pylist())
        n_base = round(len(all_ids) / 1.01)
        base_ids, grown = all_ids[:n_base], all_ids
        settings = ShardSettings(workers=1)
        base_digests, grown_digests = _digests(ds, base_ids), _digests(ds, grown)
        times: dict[str, list[float]] = {"full": [], "delta": []}
        bytes_: dict[str, int] = {}
        last_delta: ShardSetManifest | None = None
        for r in range(ROUNDS + 1):  # round 0 warms both sides up
            recipe = Recipe(name=f"r{r}")
            t = time.perf_counter()
            base = write_shard_set(root, ds, recipe, _subset(ds, f"base{r}", len(base_ids)), base_ids, [], settings,
                                   digests=base_digests)
            t_full = time.perf_counter() - t
            t = time.perf_counter()
            delta = write_shard_set(root, ds, recipe, _subset(ds, f"grown{r}", len(grown)), grown, [], settings,
                                    previous=base, digests=grown_digests)
            t_delta = time.perf_counter() - t
            assert delta.layout == "delta", delta.layout
            if r:
                times["full"].append(t_full)
                times["delta"].append(t_delta)
            bytes_ = {"full": base.bytes_written, "delta": delta.bytes_written}
            last_delta = delta
        assert last_delta is not None
        med = {k: statistics.median(v) for k, v in times.items()}

        # 100 opt-outs on top of the grown set: a skip list, no shard rewritten, never yielded.
        before = _files(last_delta)
        gone = set(grown[:: max(1, len(grown) // 100)][:100])
        kept = [i for i in grown if i not in gone]
        recipe = Recipe(name=f"r{ROUNDS}")
        optout = write_shard_set(root, ds, recipe, _subset(ds, "optout", len(kept)), kept, [], settings,
                                 previous=last_delta, digests=_digests(ds, kept))
        unchanged = _files(last_delta) == before
        by_workers = epoch_with_workers(optout)
        by_ranks = epoch_on_two_ranks(optout, tmp)
        never = not (gone & set(by_workers)) and not (gone & set(by_ranks))
        complete = sorted(by_workers) == kept and sorted(by_ranks) == kept
        return {
            "samples": n_base, "added": len(grown) - n_base, "rounds": ROUNDS,
            "full_seconds": round(med["full"], 3), "delta_seconds": round(med["delta"], 3),
            "time_share": round(med["delta"] / med["full"], 4),
            "full_bytes": bytes_["full"], "delta_bytes": bytes_["delta"],
            "bytes_share": round(bytes_["delta"] / bytes_["full"], 4),
            "optout": {"removed": len(gone), "layout": optout.layout, "skipped": optout.skipped,
                       "existing_files_unchanged": unchanged, "never_yielded_2_workers_2_ranks": never,
                       "epoch_complete": complete, "bytes_written": optout.bytes_written},
            "new_caption_column": caption_column_cost(ds, root, base_ids, settings),
            "spread": {k: [round(x, 3) for x in v] for k, v in times.items()},
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    o, c = r["optout"], r["new_caption_column"]
    return "\n".join([
        f"Incremental shard sets, {r['samples']} samples + {r['added']} new (1%), median of {r['rounds']} rounds "
        "(alternating, after a warm-up)",
        f"  full publish            {r['full_seconds']:>8} s  {r['full_bytes']:>12} bytes",
        f"  1% delta on top of it   {r['delta_seconds']:>8} s  {r['delta_bytes']:>12} bytes",
        f"  delta / full: time {r['time_share']:.2%} (target <= 10%), bytes {r['bytes_share']:.2%} (target <= 3%)",
        f"  opt out {o['removed']}: layout {o['layout']}, {o['skipped']} skipped, existing files unchanged "
        f"{o['existing_files_unchanged']}, never yielded (2 workers, 2 ranks) {o['never_yielded_2_workers_2_ranks']}, "
        f"epoch complete {o['epoch_complete']}, {o['bytes_written']} bytes written",
        f"  new caption column (sidecar vs whole, {c['samples']} samples): time {c['time_share']:.2%} "
        f"({c['sidecar_seconds']} s vs {c['whole_seconds']} s), bytes {c['bytes_share']:.2%} "
        f"({c['sidecar_bytes']} vs {c['whole_bytes']}), image bytes rewritten {c['image_bytes_rewritten']}, "
        f"existing files unchanged {c['existing_files_unchanged']}, read-back vs lab {c['readback_passed']} "
        f"({c['readback_checked']} samples)",
    ])


if __name__ == "__main__":
    result = run()
    print(format_table(result))
    if "--json" in sys.argv:
        print(json.dumps(result))
