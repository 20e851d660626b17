"""Fault cases recovered (:mod:`bench.fault_cases`), peak memory of ingesting the bad-input corpus (``prx_assets.core.demo.bad_inputs``) with two
workers, whether every input was accounted for, and the peak memory of every stage on oversized
inputs (:mod:`bench.stage_memory`).

The corpus holds two 9500 x 9500 1-bit PNGs (11 KB files that decode to 90 Mpx each) beside
truncated, corrupt, bomb, link, FIFO, Parquet and tar cases. Each source is ingested in a child
process, as a `raw_images` partition would be, and the child's peak RSS is reported (issue
budget: 2 GB for the whole ingest with two workers), together with the q92 check of the
partition holding the large images (it re-reads and cycles them on tiles).
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = {"folder": "folder", "table": "parquet", "shards": "webdataset"}


def child(base: str, source: str) -> dict[str, Any]:
    """Ingest one source of the corpus under ``base`` (2 workers), then run the q92 experiment the
    check runs on its JPEG-stored rows; return counts, seconds and peak RSS."""
    from prx_assets.core.config.project import IngestSettings, SourceConfig
    from prx_assets.core.config.storage import DataRoot
    from prx_assets.core.ingest.batches import discover, load_manifests
    from prx_assets.core.ingest.images import prepare_rgb
    from prx_assets.core.ingest.jpeg_quality import pick_sample, run_experiment
    from prx_assets.core.ingest.pipeline import ingest_batch
    from prx_assets.core.ingest.readers import reader_for

    root = DataRoot(str(Path(base) / "root"))
    settings = IngestSettings(workers=2)
    cfg = SourceConfig(name=source, kind=KINDS[source], location=str(Path(base) / source), batch_size=100,
                       ingest=settings)
    t = time.perf_counter()
    discover(cfg, reader_for(cfg), root)
    rows = rejects = 0
    check_seconds = 0.0
    for m in load_manifests(root, source):
        res = ingest_batch(m, reader_for(cfg), root, settings)
        rows += res.rows
        rejects += res.rejected
        import lance

        stored = lance.dataset(root.join("lance/images.lance")).to_table(
            columns=["image_id", "uri", "width", "height", "stored_format"], filter=f"batch = '{m.key}'").to_pylist()
        jpeg_rows = [r for r in stored if r["stored_format"] == "jpeg"]
        c = time.perf_counter()
        sample = [(r["uri"], prepare_rgb(reader_for(cfg).read_uri(r["uri"]), settings).rgb)
                  for r in pick_sample(jpeg_rows, settings.q92_sample)]
        run_experiment(sample, settings.jpeg_quality, settings.q92_cycles, settings.q92_min_psnr_db)
        check_seconds += time.perf_counter() - c
    return {"rows": rows, "rejects": rejects, "seconds": round(time.perf_counter() - t, 2),
            "check_seconds": round(check_seconds, 2),
            "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def run() -> dict[str, Any]:
    """Write the corpus, ingest each source in a child process, report peaks and accounting."""
    from prx_assets.core.demo.bad_inputs import write_bad_inputs

    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-faults-"))
    try:
        items = write_bad_inputs(tmp)
        per_source: dict[str, Any] = {}
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
        for source in KINDS:
            out = subprocess.run([sys.executable, "-m", "bench.faults", "child", str(tmp), source],
                                 capture_output=True, text=True, env=env, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"bench.faults child {source} failed:\n{out.stderr[-3000:]}")
            per_source[source] = json.loads(out.stdout.strip().splitlines()[-1])
        outcomes = sum(v["rows"] + v["rejects"] for v in per_source.values())
        from bench import fault_cases, stage_memory

        stages = stage_memory.run()
        cases = fault_cases.run()
        return {"cases_tried": cases["cases_tried"], "cases_recovered": cases["cases_recovered"],
                "bytes_lost": cases["bytes_lost"], "corrupt_samples_published": cases["corrupt_samples_published"],
                "stage_peak_gb": stages["peak_gb_per_stage"], "stages_ok": stages["all_ok"],
                "stages_under_2gb": stages["all_under_budget"],
                "inputs": len(items), "outcomes": outcomes, "accounted": outcomes == len(items),
                "peak_gb": max(v["peak_gb"] for v in per_source.values()), "per_source": per_source,
                "stage_memory": stages, "fault_cases": cases}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    lines = [f"bad-input corpus: {r['inputs']} inputs, {r['outcomes']} rows + rejects "
             f"({'all accounted for' if r['accounted'] else 'NOT all accounted for'})",
             f"  {'source':<10}{'rows':>6}{'rejects':>9}{'ingest s':>10}{'q92 s':>8}{'peak RSS GB':>13}"]
    for name, v in r["per_source"].items():
        lines.append(f"  {name:<10}{v['rows']:>6}{v['rejects']:>9}{v['seconds']:>10}{v['check_seconds']:>8}"
                     f"{v['peak_gb']:>13}")
    lines.append(f"  peak RSS of any ingest: {r['peak_gb']} GB (budget 2 GB with 2 workers)")
    from bench import fault_cases, stage_memory

    lines.append(stage_memory.format_table(r["stage_memory"]))
    lines.append(fault_cases.format_table(r["fault_cases"]))
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        print(format_table(run()))
