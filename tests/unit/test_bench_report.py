"""docs/benchmarks.md is what ``python -m bench report`` writes from the kept, measured JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report


def test_the_benchmark_page_is_generated_from_the_kept_results() -> None:
    assert report.main(["--check"]) == 0, "docs/benchmarks.md was edited by hand or a result was kept without it"


def test_every_kept_result_says_where_when_and_how_it_was_measured() -> None:
    kept = sorted(report.KEPT.glob("*.json"))
    assert kept, "no kept benchmark results"
    for path in kept:
        record = json.loads(path.read_text())
        assert record["bench"] == path.stem
        assert record["command"].startswith(f"python -m bench {path.stem}")
        assert record["machine"] and record["date"] and isinstance(record["result"], dict)


def test_report_keeps_a_fresh_run_and_renders_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh, kept, page = tmp_path / "fresh", tmp_path / "kept", tmp_path / "benchmarks.md"
    fresh.mkdir()
    monkeypatch.setattr(report, "FRESH", fresh)
    monkeypatch.setattr(report, "KEPT", kept)
    monkeypatch.setattr(report, "PAGE", page)
    loader = json.loads((Path(report.__file__).parents[1] / "docs/benchmarks/results/loader.json").read_text())
    (fresh / "loader.json").write_text(json.dumps(report.envelope("loader", loader["result"], 12.34, ["loader"])))
    (fresh / "faults.json").write_text(json.dumps(report.envelope("faults", {"renamed": 1}, 1.0, ["faults"])))
    assert report.main([]) == 0
    text = page.read_text()
    assert "## loader" in text and "python -m bench loader` on " in text and "(12.3 s)" in text
    assert "max rank batch spread" in text  # the bench's own table
    assert report.STALE.format(name="faults") in text  # a result its bench cannot read: JSON only, said so
    assert report.main(["--check"]) == 0
    page.write_text(text.replace("12.3 s", "1.0 s"))
    assert report.main(["--check"]) == 1


def test_report_refuses_a_bench_that_has_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "FRESH", tmp_path)
    with pytest.raises(SystemExit, match="run `python -m bench scale` first"):
        report.keep(["scale"])
