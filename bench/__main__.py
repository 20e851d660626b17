"""Run every benchmark in this folder and print their tables.

Usage: ``python -m bench [name ...] [--json]`` (names: ingest, peer, captions, served, one_load, embedder_load, lab, shards, training,
incremental, scale, dagster_overhead, faults, loader). Each result is written to ``bench/results/<name>.json``
with the command, machine and date (:func:`bench.report.envelope`); ``--json`` ends the output with one
JSON line per benchmark (its figures). ``python -m bench report`` keeps results and writes
``docs/benchmarks.md`` from them (see :mod:`bench.report`).
"""

import importlib
import json
import sys
import time
from pathlib import Path

BENCHES = ("ingest", "peer", "captions", "served", "one_load", "embedder_load", "lab", "shards", "training", "incremental", "scale", "dagster_overhead", "faults", "loader")


def main(argv: list[str]) -> int:
    """Run the named benchmarks (all by default)."""
    if argv[:1] == ["report"]:
        from bench.report import main as report

        return report(argv[1:])
    from bench.report import envelope

    as_json = "--json" in argv
    names = [a for a in argv if a != "--json"] or list(BENCHES)
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    for name in names:
        mod = importlib.import_module(f"bench.{name}")
        started = time.perf_counter()
        result = mod.run()
        seconds = time.perf_counter() - started
        print(mod.format_table(result))
        print(f"({name}: {seconds:.1f}s)\n")
        (out_dir / f"{name}.json").write_text(json.dumps(envelope(name, result, seconds, [name]), indent=1))
        if as_json:
            print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
