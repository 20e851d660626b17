"""Run every benchmark in this folder and print their tables.

Usage: ``python -m bench [name ...] [--json]`` (names: ingest, peer, captions, served, one_load, embedder_load, lab, shards, training,
incremental, scale, dagster_overhead, faults, loader). Results are also written as JSON under ``bench/results/``;
``--json`` ends the output with one JSON line per benchmark.
"""

import importlib
import json
import sys
import time
from pathlib import Path

BENCHES = ("ingest", "peer", "captions", "served", "one_load", "embedder_load", "lab", "shards", "training", "incremental", "scale", "dagster_overhead", "faults", "loader")


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all by default)."""
    as_json = "--json" in argv
    names = [a for a in argv if a != "--json"] or list(BENCHES)
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    for name in names:
        mod = importlib.import_module(f"bench.{name}")
        started = time.perf_counter()
        result = mod.run()
        print(mod.format_table(result))
        print(f"({name}: {time.perf_counter() - started:.1f}s)\n")
        (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
        if as_json:
            print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
