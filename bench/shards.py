"""Shard writing: the mds_shards code path vs a bare MDSWriter loop over the same rows, and
read-back samples/s through StreamingDataset + DataLoader (2 workers) with JPEG decode."""

import dataclasses
import io
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
from PIL import Image

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.recipes import Dedup, Recipe
from prx_assets.core.demo.corpus import generate_demo_corpus
from prx_assets.core.ingest.batches import discover, load_manifests
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.schema import MDS_BASE_COLUMNS, MDS_FROM_LAB
from prx_assets.core.lab.table import table_uri
from prx_assets.core.manifests import SubsetManifest
from prx_assets.core.publish.shards import ShardSettings, open_stream, write_shard_set

ROUNDS = int(os.environ.get("PRX_BENCH_ROUNDS", "3"))
COPIES = int(os.environ.get("PRX_BENCH_COPIES", "4"))


def bare_writer(ds: lance.LanceDataset, out: str) -> int:
    """Read the rows and write them with MDSWriter, nothing else."""
    from streaming import MDSWriter

    t = ds.to_table(columns=list(MDS_FROM_LAB.values())).to_pylist()
    with MDSWriter(out=out, columns=dict(MDS_BASE_COLUMNS), hashes=["xxh64"], size_limit=64 << 20) as w:
        for r in t:
            w.write({k: r[v] for k, v in MDS_FROM_LAB.items()})
    return len(t)


def decode(sample: dict[str, Any]) -> tuple[int, int]:
    """What a trainer's dataloader does first: decode the JPEG."""
    im = Image.open(io.BytesIO(sample["image"]))
    im.load()
    return im.size


def decode_batch(batch: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Collate that decodes every JPEG of the batch (runs in the loader workers)."""
    return [decode(s) for s in batch]


def run() -> dict[str, Any]:
    """Run the benchmark and return its figures."""
    import torch

    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-mds-"))
    generate_demo_corpus(DataRoot(str(tmp)), n_photos=96, n_catalog=0, n_web=0)
    folder = tmp / "files"
    for c in range(COPIES):
        shutil.copytree(tmp / "demo" / "photos", folder / f"copy{c}", copy_function=os.link)
    root = DataRoot(str(tmp / "root"))
    cfg = SourceConfig(name="b", kind="folder", location=str(folder), batch_size=10**6, ingest=IngestSettings())
    discover(cfg, reader_for(cfg), root)
    (m,) = load_manifests(root, "b")
    ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    ds = lance.dataset(table_uri(root, "images"))
    ids = sorted(ds.to_table(columns=["image_id"]).column(0).to_pylist())
    n = len(ids)
    subset = SubsetManifest(subset_id="bench", recipe="bench", recipe_hash="", lance_uri=ds.uri,
                            lance_version=ds.version, ids="", selected=n)
    times: dict[str, list[float]] = {"bare": [], "ours_1": []}
    last_uri = ""
    bare_writer(ds, str(tmp / "bare_warm"))  # warm the page cache and imports for both sides
    for r in range(ROUNDS):
        t = time.perf_counter()
        bare_writer(ds, str(tmp / f"bare{r}"))
        times["bare"].append(time.perf_counter() - t)
        for w in (1,):
            recipe = Recipe(name=f"r{r}w{w}", dedup=Dedup(exact=False))
            t = time.perf_counter()
            man = write_shard_set(root, ds, recipe, dataclasses.replace(subset, subset_id=f"bench{r}{w}"), ids, [],
                                  ShardSettings(workers=w))
            times[f"ours_{w}"].append(time.perf_counter() - t)
            last_uri = man.uri
    med = {k: statistics.median(v) for k, v in times.items()}
    # read-back with JPEG decode, 2 spawn workers
    loader = torch.utils.data.DataLoader(open_stream(last_uri, batch_size=32), batch_size=32, num_workers=2,
                                         multiprocessing_context="spawn", collate_fn=decode_batch,
                                         persistent_workers=True)
    for _ in loader:  # warm-up epoch: workers start, index and shards load
        pass
    t = time.perf_counter()
    seen = sum(len(b) for b in loader)
    read_s = time.perf_counter() - t
    bytes_total = int(np.sum(ds.to_table(columns=["jpeg_bytes"]).column(0).to_numpy()))
    shutil.rmtree(tmp, ignore_errors=True)
    return {"samples": n, "mb": round(bytes_total / 2**20, 1), "rounds": ROUNDS,
            "samples_per_s": {k: round(n / v, 1) for k, v in med.items()},
            "ratio_ours_vs_bare": round(med["bare"] / med["ours_1"], 3),
            "readback_samples_per_s": round(seen / read_s, 1), "readback_samples": seen}


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    s = r["samples_per_s"]
    return "\n".join([
        f"MDS shard writing, {r['samples']} samples ({r['mb']} MiB of JPEG), median of {r['rounds']} rounds",
        f"  bare MDSWriter loop           {s['bare']:>8} samples/s",
        f"  mds_shards path, 1 writer     {s['ours_1']:>8} samples/s  ratio {r['ratio_ours_vs_bare']} (target >= 0.9)",
        f"  read-back StreamingDataset + DataLoader(2 workers) + JPEG decode: "
        f"{r['readback_samples_per_s']} samples/s ({r['readback_samples']} samples)",
    ])
