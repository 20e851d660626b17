"""The lab on a generated 1M-row metadata table (small synthetic blobs), side by side:

- a selective filter with the BTREE index vs the same filter as a full scan;
- ``take`` of 1,000 random rows vs the same rows from a Parquet file written by pyarrow
  (reading only the row groups that hold them);
- vector search on 1M x 256-d clustered vectors with IVF_PQ (+ refine): recall@10 against
  exact search, and p50 latency;
- adding a column through schema evolution vs rewriting the table with the column.

``PRX_BENCH_LAB_ROWS`` shrinks the table for a quick look.
"""

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = int(os.environ.get("PRX_BENCH_LAB_ROWS", "1000000"))
DIM = 256
BLOB = 512
QUERIES = 50
NPROBES = int(os.environ.get("PRX_BENCH_NPROBES", "40"))
REFINE = int(os.environ.get("PRX_BENCH_REFINE", "20"))
os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")


INTRINSIC = 24


def make_vectors(rows: int, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors with low intrinsic dimension, like image embeddings: a 24-d latent mapped
    into 256-d plus small isotropic noise. (Isotropic Gaussian vectors, where all distances
    concentrate, are the known worst case for any ANN index and unlike real embeddings.)"""
    latent = rng.standard_normal((rows, INTRINSIC)).astype(np.float32)
    proj = rng.standard_normal((INTRINSIC, DIM)).astype(np.float32) / np.sqrt(INTRINSIC)
    vecs = latent @ proj + 0.02 * rng.standard_normal((rows, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs


def make_table(rows: int, seed: int = 0) -> tuple[pa.Table, np.ndarray]:
    """Metadata columns, a small blob per row, and unit vectors."""
    rng = np.random.default_rng(seed)
    vecs = make_vectors(rows, rng)
    blobs = rng.integers(0, 256, rows * BLOB, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, (rows + 1) * BLOB, BLOB, dtype=np.int64))
    table = pa.table({
        "image_id": pa.array([f"{i:016x}" for i in rng.permutation(rows)]),
        "width": pa.array(rng.integers(64, 8192, rows).astype(np.int32)),
        "height": pa.array(rng.integers(64, 8192, rows).astype(np.int32)),
        "source": pa.array(rng.choice([f"src{i}" for i in range(12)], rows)),
        "jpeg": pa.LargeBinaryArray.from_buffers(pa.large_binary(), rows, [None, offsets.buffers()[1],
                                                                           pa.py_buffer(blobs)]),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM),
    })
    return table, vecs


def _median_time(fn: Any, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run() -> dict[str, Any]:
    """Run the benchmark and return its figures."""
    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-lab-"))
    out: dict[str, Any] = {"rows": ROWS, "dim": DIM, "blob_bytes": BLOB}
    t = time.perf_counter()
    table, vecs = make_table(ROWS)
    out["generate_s"] = round(time.perf_counter() - t, 2)

    t = time.perf_counter()
    ds = lance.write_dataset(table, str(tmp / "lab.lance"), max_rows_per_file=ROWS // 8 or ROWS)
    out["lance_write_s"] = round(time.perf_counter() - t, 2)
    pq_path = tmp / "lab.parquet"
    t = time.perf_counter()
    pq.write_table(table, pq_path, row_group_size=64 * 1024)
    out["parquet_write_s"] = round(time.perf_counter() - t, 2)

    # 1. selective filter: BTREE vs full scan
    t = time.perf_counter()
    ds.create_scalar_index("width", "BTREE")
    ds.create_scalar_index("source", "BITMAP")
    out["scalar_index_build_s"] = round(time.perf_counter() - t, 2)
    ds.create_scalar_index("image_id", "BTREE")
    some_id = table.column("image_id")[ROWS // 3].as_py()
    out["filters"] = []
    for pred in (f"image_id = '{some_id}'", "width = 4242"):
        indexed = _median_time(lambda pred=pred: ds.to_table(columns=["image_id", "width", "jpeg"],
                                                             filter=pred))
        scan = _median_time(lambda pred=pred: ds.scanner(columns=["image_id", "width", "jpeg"], filter=pred,
                                                         use_scalar_index=False).to_table())
        out["filters"].append({"predicate": pred, "hits": ds.count_rows(filter=pred),
                               "indexed_ms": round(indexed * 1e3, 2), "full_scan_ms": round(scan * 1e3, 2),
                               "speedup": round(scan / indexed, 1)})

    # 2. take 1,000 random rows vs Parquet
    rng = np.random.default_rng(1)
    idx = np.sort(rng.choice(ROWS, 1000, replace=False))
    cols = ["image_id", "width", "height", "jpeg"]
    lance_take = _median_time(lambda: ds.take(idx, columns=cols))
    pf = pq.ParquetFile(pq_path)
    rg_rows = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
    starts = np.cumsum([0, *rg_rows[:-1]])

    def parquet_take() -> pa.Table:
        groups = sorted(set(np.searchsorted(starts, idx, side="right") - 1))
        part = pq.ParquetFile(pq_path).read_row_groups(groups, columns=cols)
        base = np.concatenate([np.arange(starts[g], starts[g] + rg_rows[g]) for g in groups])
        return part.take(pa.array(np.searchsorted(base, idx)))

    assert parquet_take().column("image_id").to_pylist() == ds.take(idx, columns=["image_id"]).column(
        "image_id").to_pylist()
    pq_take = _median_time(parquet_take, reps=3)
    out["take_1000"] = {"lance_ms": round(lance_take * 1e3, 2), "parquet_ms": round(pq_take * 1e3, 2),
                        "speedup": round(pq_take / lance_take, 1)}

    # 3. vector search: IVF_PQ + refine vs exact ground truth
    parts = min(256, int(np.sqrt(ROWS)))  # k-means on 2 cores: keep the build to minutes
    t = time.perf_counter()
    ds.create_index("emb", index_type="IVF_PQ", num_partitions=parts, num_sub_vectors=DIM // 8,
                    metric="cosine")
    out["ivf_pq_build_s"] = round(time.perf_counter() - t, 2)
    queries = vecs[rng.choice(ROWS, QUERIES, replace=False)] + 0.05 * rng.standard_normal(
        (QUERIES, DIM)).astype(np.float32)
    ids = table.column("image_id").to_numpy(zero_copy_only=False)
    recalls, lat = [], []
    for q in queries:
        truth = set(ids[np.argsort(-(vecs @ q))[:10]])
        t = time.perf_counter()
        res = ds.to_table(columns=["image_id"], nearest={"column": "emb", "q": q, "k": 10, "nprobes": NPROBES,
                                                         "refine_factor": REFINE})
        lat.append(time.perf_counter() - t)
        recalls.append(len(truth & set(res.column("image_id").to_pylist())) / 10)
    out["vector"] = {"num_partitions": parts, "nprobes": NPROBES, "refine_factor": REFINE,
                     "recall_at_10": round(float(np.mean(recalls)), 4),
                     "p50_ms": round(statistics.median(lat) * 1e3, 2),
                     "p95_ms": round(float(np.percentile(lat, 95)) * 1e3, 2)}

    # 4. add a column: schema evolution vs rewriting the table
    t = time.perf_counter()
    ds.add_columns({"pixels": "CAST(width AS BIGINT) * CAST(height AS BIGINT)"})
    evolve = time.perf_counter() - t
    t = time.perf_counter()
    full = table.append_column("pixels", pa.array(table.column("width").to_numpy().astype(np.int64) *
                                                 table.column("height").to_numpy().astype(np.int64)))
    lance.write_dataset(full, str(tmp / "rewrite.lance"), max_rows_per_file=ROWS // 8 or ROWS)
    rewrite = time.perf_counter() - t
    out["add_column"] = {"schema_evolution_s": round(evolve, 3), "rewrite_s": round(rewrite, 3),
                         "speedup": round(rewrite / evolve, 1)}
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    tk, v, a = r["take_1000"], r["vector"], r["add_column"]
    return "\n".join([
        f"lab on {r['rows']:,} rows ({r['blob_bytes']} B blobs, {r['dim']}-d vectors); "
        f"write lance {r['lance_write_s']}s, parquet {r['parquet_write_s']}s",
        *[f"  selective filter ({f['predicate']}, {f['hits']} hits): BTREE {f['indexed_ms']} ms vs "
          f"full scan {f['full_scan_ms']} ms -> {f['speedup']}x  (target >= 10x)" for f in r["filters"]],
        f"  take 1,000 random rows: lance {tk['lance_ms']} ms vs parquet {tk['parquet_ms']} ms -> "
        f"{tk['speedup']}x  (target >= 10x)",
        f"  vector search IVF_PQ({v['num_partitions']} partitions, nprobes {v['nprobes']}, refine "
        f"{v['refine_factor']}): recall@10 {v['recall_at_10']} (target >= 0.95), p50 {v['p50_ms']} ms "
        f"(target < 20), p95 {v['p95_ms']} ms; index build {r['ivf_pq_build_s']} s",
        f"  add a column: schema evolution {a['schema_evolution_s']} s vs rewrite {a['rewrite_s']} s -> "
        f"{a['speedup']}x",
    ])
